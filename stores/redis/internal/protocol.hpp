#pragma once

// Internal: the pure parts of the Redis client — URL parsing and the
// conversion of hiredis replies — so tests and fuzz targets can reach them
// without a server. Not installed.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/redis_client.hpp>

struct redisReply;
struct redisReader;

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

/// The URL `parse_url` reads back as `host`:`port` with these credentials
/// (none when `password` is empty). The user part is always written, even
/// empty: a password holding ':' would otherwise be read as user:password.
std::string node_url(std::string_view user, std::string_view password,
                     std::string_view host, int port);

/// Appends `cmd` to `out` in the Redis protocol (RESP: `*<count>` then
/// `$<length>` and the bytes of each argument, every line ended by CRLF),
/// the bytes hiredis' own formatter makes. Ours skips its printf-style
/// formatting, which was a visible share of a busy client's CPU.
void append_command(std::string& out, const redis_client::command& cmd);

/// `EVALSHA <sha> <#keys> <keys...> <args...>` for `script`.
redis_client::command script_command(const redis_script& script,
                                     std::vector<std::string> keys,
                                     std::vector<std::string> args);

/// After NOSCRIPT: turns a `script_command` of `script` into its EVAL form
/// (the body instead of the SHA; the server also caches it by its SHA).
/// False, and `cmd` untouched, when `cmd` is not an EVALSHA.
bool to_eval(redis_client::command& cmd, const redis_script& script);

/// Copies a reply read by hiredis (any depth) into a `redis_reply`.
redis_reply convert(const redisReply* r);

/// The bound on what a reply may make the reader allocate: an array header
/// announcing more than `max_elements` (or a negative count) fails the
/// reader instead of allocating its element table; `refused` then holds
/// the count, for the error message.
struct reader_guard {
  std::size_t max_elements = 0;
  long long refused = -1;
};

/// Makes `reader` (a hiredis reader) honour `guard`, which must outlive it.
void bound_reader(redisReader* reader, reader_guard* guard);

/// `errc::store_error` for a command that was never written to its server
/// (unreachable, refused): resending it cannot run it twice. Any other
/// failure of a sent command means its reply was lost.
class unsent_error : public error {
 public:
  using error::error;
};

/// A TIME reply ([seconds, microseconds] as decimal strings) as Unix
/// milliseconds; nothing for any other reply (an error, another shape,
/// negative or non-decimal parts, seconds whose milliseconds overflow).
std::optional<std::int64_t> time_reply_ms(const redis_reply& r);

/// The client (an address compared, never dereferenced) whose connection
/// or subscriber thread is the calling thread; null on other threads.
const void* calling_client() noexcept;

} // namespace botmesh::internal
