#pragma once

// Internal: the pure parts of the Redis client — URL parsing and the
// conversion of hiredis replies — so tests and fuzz targets can reach them
// without a server. Not installed.

#include <string>
#include <string_view>

#include <botmesh/stores/redis/redis_client.hpp>

struct redisReply;

namespace botmesh::internal {

/// Where a `redis://` URL points.
struct endpoint_info {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string user;
  std::string password;
  int db = 0;
};

/// Parses `redis://[user:password@]host[:port][/db]`. Throws
/// `invalid_argument_error` (field "url") naming what is wrong: another
/// scheme, no host, a port outside 1-65535, a database outside 0-1000000.
endpoint_info parse_url(std::string_view url);

/// Copies a reply read by hiredis (any depth) into a `redis_reply`.
redis_reply convert(const redisReply* r);

} // namespace botmesh::internal
