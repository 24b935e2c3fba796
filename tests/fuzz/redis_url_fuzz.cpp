// Redis URLs as `redis_options.url` takes them (from configuration).
//
// Contract checked: parse_url throws only invalid_argument_error naming
// "url"; an accepted URL has a host, a port in 1-65535 and a database in
// 0-1000000, and the URL rebuilt from its parts parses to the same parts.

#include <cstddef>
#include <cstdint>
#include <string>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/internal/protocol.hpp>

#include "fuzz_check.hpp"

using botmesh::internal::endpoint_info;

namespace {

std::string describe(const endpoint_info& ep) {
  return "host \"" + ep.host + "\" port " + std::to_string(ep.port) + " db "
         + std::to_string(ep.db) + " user \"" + ep.user + "\" password \""
         + ep.password + "\"";
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  std::string_view url{reinterpret_cast<const char*>(data), size};
  endpoint_info ep;
  try {
    ep = botmesh::internal::parse_url(url);
  } catch (const botmesh::invalid_argument_error& e) {
    FUZZ_CHECK(e.field() == "url", e.field());
    return 0;
  }
  FUZZ_CHECK(!ep.host.empty(), describe(ep));
  FUZZ_CHECK(ep.port >= 1 && ep.port <= 65535, describe(ep));
  FUZZ_CHECK(ep.db >= 0 && ep.db <= 1'000'000, describe(ep));
  std::string rebuilt = "redis://";
  if (!ep.user.empty() || !ep.password.empty())
    rebuilt += ep.user + ":" + ep.password + "@";
  rebuilt += ep.host + ":" + std::to_string(ep.port) + "/"
             + std::to_string(ep.db);
  endpoint_info again;
  try {
    again = botmesh::internal::parse_url(rebuilt);
  } catch (const botmesh::invalid_argument_error& e) {
    FUZZ_CHECK(false, rebuilt + ": " + e.what());
  }
  FUZZ_CHECK(again.host == ep.host && again.port == ep.port
               && again.db == ep.db && again.user == ep.user
               && again.password == ep.password,
             rebuilt + " -> " + describe(again) + " vs " + describe(ep));
  return 0;
}
