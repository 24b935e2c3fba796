#include <doctest/doctest.h>

#include <type_traits>

#include <botmesh/runtime/core/duration.hpp>
#include <botmesh/runtime/core/error.hpp>

using namespace std::chrono_literals;
using botmesh::parse_duration;

TEST_CASE("durations parse the spec's formats, singular and plural") {
  CHECK(parse_duration("30s") == 30'000ms);
  CHECK(parse_duration("30 seconds") == 30'000ms);
  CHECK(parse_duration("1 second") == 1'000ms);
  CHECK(parse_duration("5m") == 300'000ms);
  CHECK(parse_duration("5 minutes") == 300'000ms);
  CHECK(parse_duration("1 minute") == 60'000ms);
  CHECK(parse_duration("2h") == 7'200'000ms);
  CHECK(parse_duration("2 hours") == 7'200'000ms);
  CHECK(parse_duration("1 hour") == 3'600'000ms);
  CHECK(parse_duration("1d") == 86'400'000ms);
  CHECK(parse_duration("1 day") == 86'400'000ms);
  CHECK(parse_duration("3 days") == 259'200'000ms);
  CHECK(parse_duration("250ms") == 250ms);
  CHECK(parse_duration("250") == 250ms);
  CHECK(parse_duration("60000") == 60'000ms);
  CHECK(parse_duration("0") == 0ms);
  CHECK(parse_duration(" 15S ") == 15'000ms);
  CHECK(parse_duration("1.5s") == 1'500ms);
  CHECK(parse_duration("0.5 minutes") == 30'000ms);
}

TEST_CASE("an invalid duration is rejected with a message that quotes it") {
  for (const char* bad : {"", "   ", "abc", "5x", "5 parsecs", "-5s", "1.5",
                          "s", "5 m s", "1.s", "99999999999999999999d",
                          "36501d", "200000d", "9223372036854775807",
                          "1.0001s", "0.0000000001s"}) {
    CAPTURE(bad);
    try {
      parse_duration(bad);
      FAIL("accepted an invalid duration");
    } catch (const botmesh::invalid_argument_error& e) {
      CHECK(e.field() == "duration");
      CHECK(std::string{e.what()}.find(std::string{"\""} + bad + "\"")
            != std::string::npos);
      CHECK(e.code() == botmesh::errc::invalid_argument);
    }
  }
}

// `.lease = 15` meant 15 ms where 15 s was meant: numbers without a unit
// are a compile error.
static_assert(!std::is_convertible_v<int, botmesh::duration>);
static_assert(!std::is_convertible_v<long, botmesh::duration>);
static_assert(!std::is_convertible_v<double, botmesh::duration>);
static_assert(std::is_convertible_v<std::chrono::seconds, botmesh::duration>);
static_assert(std::is_convertible_v<const char*, botmesh::duration>);

TEST_CASE("a duration option converts from chrono and text, never a bare "
          "number") {
  botmesh::duration a = "15s";
  botmesh::duration b = 15s;
  botmesh::duration c = "15000"; // text: a bare number is milliseconds
  CHECK(a == b);
  CHECK(b == c);
  CHECK(a.ms() == 15'000ms);
  CHECK_THROWS_AS(botmesh::duration{"soon"}, botmesh::invalid_argument_error);
  CHECK_THROWS_AS(botmesh::duration{-5s}, botmesh::invalid_argument_error);
  CHECK_THROWS_AS(botmesh::duration{std::chrono::hours{36500 * 24 + 1}},
                  botmesh::invalid_argument_error);
  CHECK(botmesh::duration{"36500d"}.ms() == 36500 * 24h);
  // Counts no millisecond count holds are refused, not wrapped: seconds::max()
  // became -1000 ms ("negative"), 5124095576031 hours about 34 minutes.
  auto refusal = [](auto d) {
    try {
      botmesh::duration x{d};
      return "accepted " + std::to_string(x.count()) + "ms";
    } catch (const botmesh::invalid_argument_error& e) {
      return std::string{e.what()};
    }
  };
  CHECK(refusal(std::chrono::seconds::max()).find("at most 36500d")
        != std::string::npos);
  CHECK(refusal(std::chrono::hours{5124095576031}).find("at most 36500d")
        != std::string::npos);
  CHECK(refusal(std::chrono::nanoseconds::min()).find("negative")
        != std::string::npos);
  CHECK(refusal(-5s).find("-5000ms: negative") != std::string::npos);
  CHECK(botmesh::duration{1500us}.ms() == 1ms); // toward zero, as documented
  CHECK(botmesh::duration{-500us}.ms() == 0ms);
  CHECK(botmesh::duration{std::chrono::hours{36500 * 24} + 500us}.ms()
        == 36500 * 24h);
  CHECK(botmesh::duration{std::chrono::hours{36500 * 24}}.ms() == 36500 * 24h);
  CHECK(botmesh::format_duration(15s) == "15s");
  CHECK(botmesh::format_duration(90s) == "90s");
  CHECK(botmesh::format_duration(2h) == "2h");
  CHECK(botmesh::format_duration(1500ms) == "1500ms");
  CHECK(parse_duration(botmesh::format_duration(86'400'000ms)) == 86'400'000ms);
}
