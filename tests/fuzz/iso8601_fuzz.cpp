// ISO-8601 instants as `botmesh cron next --from` reads them.
//
// Input: line 1 the text; line 2 the zone a text without offset is read in
// (see zones.hpp).
//
// Contract checked: parse_iso8601 throws only invalid_argument_error naming
// "from"; an accepted instant prints back (to_iso_utc, format_iso8601) as
// text that parses to the same instant (to the millisecond, or to the
// second for format_iso8601, which prints seconds).

#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/scheduler/cron.hpp>

#include "fuzz_check.hpp"
#include "zones.hpp"

namespace {

botmesh::time_point reparse(const std::string& text, std::string_view zone) {
  try {
    return botmesh::parse_iso8601(text, zone);
  } catch (const botmesh::invalid_argument_error& e) {
    FUZZ_CHECK(false, "printed \"" + text + "\" does not parse: " + e.what());
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  std::string_view in{reinterpret_cast<const char*>(data), size};
  auto [text, rest] = botmesh::fuzz::next_line(in);
  auto [zone_line, ignored] = botmesh::fuzz::next_line(rest);
  auto zone = botmesh::fuzz::pick_zone(zone_line);
  botmesh::time_point t;
  try {
    t = botmesh::parse_iso8601(text, zone);
  } catch (const botmesh::invalid_argument_error& e) {
    FUZZ_CHECK(e.field() == "from", e.field());
    return 0;
  }
  auto utc = botmesh::to_iso_utc(t);
  auto back = reparse(utc, "UTC");
  FUZZ_CHECK(back == t, utc + " parses to " + botmesh::to_iso_utc(back));
  auto seconds = std::chrono::floor<std::chrono::seconds>(t);
  for (auto z : {std::string_view{"UTC"}, zone}) {
    auto local = botmesh::format_iso8601(t, z);
    auto again = reparse(local, z);
    FUZZ_CHECK(again == seconds, local + " parses to "
                                   + botmesh::to_iso_utc(again) + ", not "
                                   + botmesh::to_iso_utc(seconds));
  }
  return 0;
}
