// Durations as options take them ("30s", "1.5 minutes", "250"):
// parse_duration either returns a non-negative value that formats and
// parses back to itself, or throws invalid_argument_error naming
// "duration". Anything else (another exception, UB, a crash) is a bug.

#include <cstddef>
#include <cstdint>
#include <string>

#include <botmesh/runtime/core/duration.hpp>
#include <botmesh/runtime/core/error.hpp>

#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  std::string_view text{reinterpret_cast<const char*>(data), size};
  std::chrono::milliseconds ms;
  try {
    ms = botmesh::parse_duration(text);
  } catch (const botmesh::invalid_argument_error& e) {
    FUZZ_CHECK(e.field() == "duration", e.field());
    return 0;
  }
  FUZZ_CHECK(ms.count() >= 0, std::to_string(ms.count()));
  auto formatted = botmesh::format_duration(ms);
  std::chrono::milliseconds back{-1};
  try {
    back = botmesh::parse_duration(formatted);
  } catch (const botmesh::invalid_argument_error& e) {
    FUZZ_CHECK(false, formatted + ": " + e.what());
  }
  FUZZ_CHECK(back == ms, formatted + " parses as " + std::to_string(back.count())
                           + " ms, not " + std::to_string(ms.count()));
  botmesh::duration option{text};
  FUZZ_CHECK(option.ms() == ms, "botmesh::duration disagrees");
  return 0;
}
