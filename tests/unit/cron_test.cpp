#include <doctest/doctest.h>

#include <cstdio>
#include <random>
#include <vector>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/scheduler/cron.hpp>

using botmesh::cron_expr;
using botmesh::cron_schedule;

namespace {

std::string field_of(const std::string& expr) {
  try {
    cron_expr::parse(expr);
  } catch (const botmesh::invalid_argument_error& e) {
    return e.field();
  }
  return "ok";
}

// The next `n` run instants after `from`, formatted in `zone`.
std::vector<std::string> next_runs(const std::string& expr,
                                   const std::string& zone,
                                   const std::string& from, int n) {
  auto t = botmesh::parse_iso8601(from, zone);
  cron_schedule s{expr, zone, t};
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    auto next = s.next_after(t);
    REQUIRE(next);
    out.push_back(botmesh::format_iso8601(*next, zone));
    t = *next;
  }
  return out;
}

using v = std::vector<std::string>;

} // namespace

TEST_CASE("cron fields accept *, numbers, ranges, steps and lists") {
  auto e = cron_expr::parse("*/15 9-17 1,15 */3 1-5");
  CHECK(e.minute(0));
  CHECK(e.minute(45));
  CHECK_FALSE(e.minute(50));
  CHECK(e.hour(9));
  CHECK(e.hour(17));
  CHECK_FALSE(e.hour(18));
  // A step over * counts from the field minimum: months 1, 4, 7, 10.
  CHECK(e.month(1));
  CHECK(e.month(4));
  CHECK(e.month(10));
  CHECK_FALSE(e.month(3));
  CHECK(cron_expr::parse("1-30/5 * * * *").minute(26));
  CHECK_FALSE(cron_expr::parse("1-30/5 * * * *").minute(30));
  // */2 in day of month are the odd days.
  auto odd = cron_expr::parse("0 0 */2 * *");
  CHECK(odd.day(1, 3));
  CHECK_FALSE(odd.day(2, 3));
  // Day of week 0 and 7 are both Sunday.
  CHECK(cron_expr::parse("0 0 * * 7").day(10, 0));
  CHECK(cron_expr::parse("0 0 * * 5-7").day(10, 0));
  CHECK_FALSE(cron_expr::parse("0 0 * * 7").day(10, 1));
  CHECK(cron_expr::parse("0 */2 * * *").hour_is_wildcard());
  CHECK_FALSE(cron_expr::parse("0 2 * * *").hour_is_wildcard());
}

TEST_CASE("restricted day of month and day of week match either, a * in "
          "one means both must match") {
  auto either = cron_expr::parse("0 9 13 * 5");
  CHECK(either.day(13, 2));  // the 13th, a Tuesday
  CHECK(either.day(20, 5));  // a Friday
  CHECK_FALSE(either.day(20, 4));
  auto mondays = cron_expr::parse("0 9 * * 1");
  CHECK(mondays.day(20, 1));
  CHECK_FALSE(mondays.day(20, 2));
  auto odd_mondays = cron_expr::parse("0 9 */2 * 1");
  CHECK(odd_mondays.day(21, 1));
  CHECK_FALSE(odd_mondays.day(20, 1));
  CHECK_FALSE(odd_mondays.day(21, 2));
}

TEST_CASE("invalid cron expressions name the bad field") {
  CHECK(field_of("60 * * * *") == "minute");
  CHECK(field_of("* 24 * * *") == "hour");
  CHECK(field_of("* * 0 * *") == "day_of_month");
  CHECK(field_of("* * 32 * *") == "day_of_month");
  CHECK(field_of("* * * 13 *") == "month");
  CHECK(field_of("* * * 0 *") == "month");
  CHECK(field_of("* * * * 8") == "day_of_week");
  CHECK(field_of("*/0 * * * *") == "minute");
  CHECK(field_of("5-1 * * * *") == "minute");
  CHECK(field_of("0 0 30 2 *") == "day_of_month");
  CHECK(field_of("0 0 31 4,6,9,11 *") == "day_of_month");
  CHECK(field_of("0 9 * * mon") == "day_of_week");
  CHECK(field_of("0 9 * jan *") == "month");
  CHECK(field_of("@daily") == "cron");
  CHECK(field_of("* * * *") == "cron");
  CHECK(field_of("* * * * * *") == "cron");
  CHECK(field_of("") == "cron");
  CHECK(field_of("1,,2 * * * *") == "minute");
  CHECK(field_of("5/10 * * * *") == "minute");
  CHECK(field_of("*/ * * * *") == "minute");
  CHECK(field_of("-1 * * * *") == "minute");
  CHECK(field_of("0 0 30 2 1") == "ok"); // OR rule: Mondays in February
  CHECK(field_of("0 0 29 2 *") == "ok");
  try {
    cron_expr::parse("0 9 * * mon");
  } catch (const botmesh::invalid_argument_error& e) {
    CHECK(std::string{e.what()}.find("\"mon\"") != std::string::npos);
  }
}

TEST_CASE("an unknown time zone is rejected naming time_zone") {
  try {
    cron_schedule s{"0 9 * * *", "Mars/Olympus"};
    FAIL("accepted an unknown zone");
  } catch (const botmesh::invalid_argument_error& e) {
    CHECK(e.field() == "time_zone");
    CHECK(std::string{e.what()}.find("Mars/Olympus") != std::string::npos);
  }
  CHECK_NOTHROW(cron_schedule{"0 9 * * *", "local"});
  CHECK_NOTHROW(cron_schedule{"0 9 * * *", "UTC"});
  CHECK(cron_schedule{"0 9 * * *", "Europe/Madrid"}.spec()
        == "TZ=Europe/Madrid 0 9 * * *");
  CHECK(cron_schedule{"0 9 * * *", "local"}.spec() == "0 9 * * *");
}

TEST_CASE("a time zone that is a file path is rejected, not read") {
  // These files exist and are valid zone files: a path must not reach them.
  for (const char* zone :
       {"/usr/share/zoneinfo/Europe/Madrid", "../zoneinfo/Europe/Madrid",
        "Europe/../Europe/Madrid", "Europe//Madrid", "Europe/Madrid/",
        "Europe/Madrid ", "./UTC"}) {
    CAPTURE(zone);
    try {
      cron_schedule s{"0 9 * * *", zone};
      FAIL("accepted a path as a zone");
    } catch (const botmesh::invalid_argument_error& e) {
      CHECK(e.field() == "time_zone");
      CHECK(std::string{e.what()}.find("not an IANA name")
            != std::string::npos);
    }
  }
  // Names with '-', '+', '_' and digits stay valid.
  CHECK_NOTHROW(cron_schedule{"0 9 * * *", "America/Port-au-Prince"});
  CHECK_NOTHROW(cron_schedule{"0 9 * * *", "Etc/GMT+5"});
  CHECK_NOTHROW(cron_schedule{"0 9 * * *", "America/Argentina/Buenos_Aires"});
}

TEST_CASE("Feb 29 runs inside the horizon, also across 2100 and on one "
          "weekday") {
  CHECK(next_runs("0 0 29 2 *", "UTC", "2026-03-01T00:00:00Z", 2)
        == v{"2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"});
  // 2100 is no leap year: eight years between runs.
  CHECK(next_runs("0 0 29 2 *", "UTC", "2096-03-01T00:00:00Z", 1)
        == v{"2104-02-29T00:00:00Z"});
  // Feb 29 on a Sunday, Tuesday, Thursday or Saturday (both fields
  // restricted with a step: the AND rule): 2032, then 2048.
  CHECK(next_runs("0 0 29 2 */2", "UTC", "2032-03-01T00:00:00Z", 1)
        == v{"2048-02-29T00:00:00Z"});
  // Feb 29 on a Sunday only (*/7 is 0): 2032, then 28 years later.
  CHECK(next_runs("0 0 29 2 */7", "UTC", "2020-03-01T00:00:00Z", 2)
        == v{"2032-02-29T00:00:00Z", "2060-02-29T00:00:00Z"});
  // 13th or Friday: the OR rule.
  CHECK(next_runs("0 9 13 * 5", "UTC", "2026-11-11T00:00:00Z", 3)
        == v{"2026-11-13T09:00:00Z", "2026-11-20T09:00:00Z",
             "2026-11-27T09:00:00Z"});
}

TEST_CASE("America/New_York: a fixed hour in the spring gap runs once, "
          "shifted forward, a wildcard hour skips the gap") {
  CHECK(next_runs("30 2 * * *", "America/New_York",
                  "2026-03-07T12:00:00-05:00", 2)
        == v{"2026-03-08T03:30:00-04:00", "2026-03-09T02:30:00-04:00"});
  CHECK(next_runs("*/30 * * * *", "America/New_York",
                  "2026-03-08T01:00:00-05:00", 3)
        == v{"2026-03-08T01:30:00-05:00", "2026-03-08T03:00:00-04:00",
             "2026-03-08T03:30:00-04:00"});
  // 02:30 shifts onto 03:30, which is also a slot: it runs once.
  CHECK(next_runs("30 2,3 * * *", "America/New_York",
                  "2026-03-08T00:00:00-05:00", 3)
        == v{"2026-03-08T03:30:00-04:00", "2026-03-09T02:30:00-04:00",
             "2026-03-09T03:30:00-04:00"});
}

TEST_CASE("America/New_York: in the autumn overlap a fixed hour runs once, "
          "a wildcard hour in both passes") {
  CHECK(next_runs("30 1 * * *", "America/New_York",
                  "2026-10-31T12:00:00-04:00", 2)
        == v{"2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"});
  CHECK(next_runs("0 * * * *", "America/New_York",
                  "2026-11-01T00:30:00-04:00", 3)
        == v{"2026-11-01T01:00:00-04:00", "2026-11-01T01:00:00-05:00",
             "2026-11-01T02:00:00-05:00"});
}

TEST_CASE("Europe/Madrid follows the same policy") {
  CHECK(next_runs("30 2 * * *", "Europe/Madrid", "2026-03-28T12:00:00+01:00", 2)
        == v{"2026-03-29T03:30:00+02:00", "2026-03-30T02:30:00+02:00"});
  CHECK(next_runs("30 2 * * *", "Europe/Madrid", "2026-10-24T12:00:00+02:00", 2)
        == v{"2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"});
  CHECK(next_runs("15 * * * *", "Europe/Madrid", "2026-10-25T01:00:00+02:00", 4)
        == v{"2026-10-25T01:15:00+02:00", "2026-10-25T02:15:00+02:00",
             "2026-10-25T02:15:00+01:00", "2026-10-25T03:15:00+01:00"});
  CHECK(next_runs("*/20 2 * * *", "Europe/Madrid", "2026-03-29T00:00:00+01:00", 3)
        == v{"2026-03-29T03:00:00+02:00", "2026-03-29T03:20:00+02:00",
             "2026-03-29T03:40:00+02:00"});
}

TEST_CASE("America/Santiago: a midnight transition runs 0 0 * * * at 01:00 "
          "with the calendar's day") {
  CHECK(next_runs("0 0 * * *", "America/Santiago", "2026-09-04T12:00:00-04:00",
                  3)
        == v{"2026-09-05T00:00:00-04:00", "2026-09-06T01:00:00-03:00",
             "2026-09-07T00:00:00-03:00"});
  // 2026-09-06 is a Sunday: the day of week is the calendar's.
  CHECK(next_runs("0 0 * * 0", "America/Santiago", "2026-09-01T00:00:00-04:00",
                  2)
        == v{"2026-09-06T01:00:00-03:00", "2026-09-13T00:00:00-03:00"});
  CHECK(next_runs("0 * * * *", "America/Santiago", "2026-04-04T22:30:00-03:00",
                  3)
        == v{"2026-04-04T23:00:00-03:00", "2026-04-04T23:00:00-04:00",
             "2026-04-05T00:00:00-04:00"});
}

TEST_CASE("Australia/Lord_Howe: a 30-minute shift") {
  CHECK(next_runs("15 2 * * *", "Australia/Lord_Howe",
                  "2026-10-03T12:00:00+10:30", 2)
        == v{"2026-10-04T02:45:00+11:00", "2026-10-05T02:15:00+11:00"});
  CHECK(next_runs("*/15 * * * *", "Australia/Lord_Howe",
                  "2026-10-04T01:40:00+10:30", 2)
        == v{"2026-10-04T01:45:00+10:30", "2026-10-04T02:30:00+11:00"});
  CHECK(next_runs("*/15 * * * *", "Australia/Lord_Howe",
                  "2026-04-05T01:20:00+11:00", 5)
        == v{"2026-04-05T01:30:00+11:00", "2026-04-05T01:45:00+11:00",
             "2026-04-05T01:30:00+10:30", "2026-04-05T01:45:00+10:30",
             "2026-04-05T02:00:00+10:30"});
  CHECK(next_runs("45 1 * * *", "Australia/Lord_Howe",
                  "2026-04-04T12:00:00+11:00", 2)
        == v{"2026-04-05T01:45:00+11:00", "2026-04-06T01:45:00+10:30"});
}

TEST_CASE("run times strictly increase through whole years in every zone") {
  for (auto zone : {"America/New_York", "Europe/Madrid", "America/Santiago",
                    "Australia/Lord_Howe", "UTC", "Pacific/Apia"}) {
    for (auto expr : {"*/15 * * * *", "30 2 * * *", "0 0 * * *", "0 */2 * * *",
                      "45 1 * * 0", "0,30 1-3 * * *"}) {
      CAPTURE(zone);
      CAPTURE(expr);
      auto t = botmesh::parse_iso8601("2026-01-01T00:00:00Z");
      auto end = botmesh::parse_iso8601("2027-01-01T00:00:00Z");
      cron_schedule s{expr, zone, t};
      int runs = 0;
      while (t < end) {
        auto n = s.next_after(t);
        REQUIRE(n);
        REQUIRE(*n > t);
        t = *n;
        ++runs;
      }
      CHECK(runs > 40);
    }
  }
}

TEST_CASE("in UTC every next time equals a minute-by-minute brute force") {
  std::mt19937 rng{12345};
  const char* exprs[] = {"*/7 * * * *",  "0 9 * * 1-5",  "15,45 */3 * * *",
                         "0 0 1 * *",    "30 12 13 * 5", "0 0 * 2 *",
                         "5 4 */2 * 0",  "59 23 31 * *", "0 0 29 2 *"};
  for (auto expr : exprs) {
    CAPTURE(expr);
    auto e = cron_expr::parse(expr);
    cron_schedule s{expr, "UTC", botmesh::parse_iso8601("2026-01-01T00:00:00Z")};
    for (int trial = 0; trial < 5; ++trial) {
      auto from = botmesh::from_unix_ms(
        1'767'225'600'000 + static_cast<std::int64_t>(rng() % 31'536'000) * 1000);
      auto got = s.next_after(from);
      REQUIRE(got);
      // Brute force: the first whole minute after `from` that matches.
      auto t = std::chrono::floor<std::chrono::minutes>(from)
               + std::chrono::minutes(1);
      for (int guard = 0; guard < 6'000'000; ++guard, t += std::chrono::minutes(1)) {
        auto days = std::chrono::floor<std::chrono::days>(t);
        std::chrono::year_month_day ymd{days};
        std::chrono::hh_mm_ss hms{t - days};
        int wd = std::chrono::weekday{days}.c_encoding();
        if (e.minute(static_cast<int>(hms.minutes().count()))
            && e.hour(static_cast<int>(hms.hours().count()))
            && e.month(static_cast<int>(static_cast<unsigned>(ymd.month())))
            && e.day(static_cast<int>(static_cast<unsigned>(ymd.day())), wd))
          break;
      }
      CHECK(botmesh::to_unix_ms(*got)
            == std::chrono::duration_cast<std::chrono::milliseconds>(
                 t.time_since_epoch())
                 .count());
    }
  }
}

TEST_CASE("ISO-8601 parsing and formatting for occurrence keys") {
  auto t = botmesh::parse_iso8601("2026-03-29T01:00:00Z");
  CHECK(botmesh::to_iso_utc(t) == "2026-03-29T01:00:00.000Z");
  CHECK(botmesh::to_iso_utc(t + std::chrono::milliseconds(7))
        == "2026-03-29T01:00:00.007Z");
  CHECK(botmesh::parse_iso8601("2026-03-29T03:00:00+02:00") == t);
  CHECK(botmesh::parse_iso8601("2026-03-29T03:00", "Europe/Madrid") == t);
  CHECK(botmesh::format_iso8601(t, "Europe/Madrid") == "2026-03-29T03:00:00+02:00");
  CHECK_THROWS_AS(botmesh::parse_iso8601("yesterday"),
                  botmesh::invalid_argument_error);
}

TEST_CASE("a step wider than its field is rejected naming the field") {
  // Near INT_MAX, `v += step` used to overflow and select wrong values.
  CHECK(field_of("1-5/2147483647 * * * *") == "minute");
  CHECK(field_of("1 1-3/2147483647 * * *") == "hour");
  CHECK(field_of("0 0 */99999999999 * *") == "day_of_month");
  CHECK(field_of("0 0 * */13 *") == "month");
  CHECK(field_of("0 0 * * */9") == "day_of_week");
  CHECK(field_of("*/60 * * * *") == "ok");  // the field's whole span
  CHECK(field_of("*/61 * * * *") == "minute");
  CHECK(field_of("0 */24 * * *") == "ok");
  try {
    cron_expr::parse("1-5/2147483647 * * * *");
    FAIL("accepted");
  } catch (const botmesh::invalid_argument_error& e) {
    CHECK(std::string{e.what()}.find("from 1 to 60") != std::string::npos);
  }
  // */60 selects only the first minute.
  cron_schedule s{"*/60 * * * *", "UTC",
                  botmesh::parse_iso8601("2026-01-01T00:00:00Z")};
  CHECK(botmesh::format_iso8601(
          *s.next_after(botmesh::parse_iso8601("2026-01-01T00:00:00Z")), "UTC")
        == "2026-01-01T01:00:00Z");
}

TEST_CASE("ISO-8601 years outside 1-9999 are rejected instead of wrapping") {
  auto year_error = [](const char* text) {
    try {
      botmesh::parse_iso8601(text);
    } catch (const botmesh::invalid_argument_error& e) {
      CHECK(e.field() == "from");
      return std::string{e.what()};
    }
    return std::string{"accepted"};
  };
  CHECK(year_error("999999999-01-01T00:00:00Z").find("outside the supported "
                                                     "range 1-9999")
        != std::string::npos);
  CHECK(year_error("-5-01-01T00:00:00Z") != "accepted");
  CHECK(year_error("10000-01-01T00:00:00Z") != "accepted");
  CHECK(botmesh::to_iso_utc(botmesh::parse_iso8601("9999-12-31T23:59:59Z"))
        == "9999-12-31T23:59:59.000Z");
  CHECK(botmesh::to_iso_utc(botmesh::parse_iso8601("0001-01-01T00:00:00Z"))
        == "0001-01-01T00:00:00.000Z");
}

TEST_CASE("occurrence-key times agree with the zone library from year 1 to 9999") {
  // to_iso_utc does its own calendar arithmetic; format_iso8601 goes
  // through the zone library. Instants spread over the whole range, both
  // sides of 1970 and of leap days, with every millisecond remainder.
  auto lo = botmesh::to_unix_ms(botmesh::parse_iso8601("0001-01-01T00:00:00Z"));
  auto hi = botmesh::to_unix_ms(botmesh::parse_iso8601("9999-12-31T23:59:59Z"));
  std::mt19937_64 rng{20261201};
  std::vector<std::int64_t> at{lo, hi, -1, 0, 1, -86'400'000, 951'782'400'000,
                               951'868'799'999, -2'208'988'800'001};
  for (int i = 0; i < 20'000; ++i)
    at.push_back(lo + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(hi - lo)));
  for (auto ms : at) {
    auto t = botmesh::time_point{std::chrono::milliseconds{ms}};
    auto whole = botmesh::format_iso8601(t, "UTC"); // "...:SSZ"
    auto frac = ((ms % 1000) + 1000) % 1000;
    char tail[8];
    std::snprintf(tail, sizeof tail, ".%03dZ", static_cast<int>(frac));
    CAPTURE(ms);
    REQUIRE(botmesh::to_iso_utc(t) == whole.substr(0, whole.size() - 1) + tail);
  }
  CHECK(botmesh::to_iso_utc(botmesh::parse_iso8601("2024-02-29T23:59:59.999Z"))
        == "2024-02-29T23:59:59.999Z");
  CHECK(botmesh::to_iso_utc(botmesh::parse_iso8601("1969-12-31T23:59:59.999Z"))
        == "1969-12-31T23:59:59.999Z");
  // Four-digit years also in previews, so what is printed parses back.
  auto early = botmesh::parse_iso8601("0999-06-01T12:00:00Z");
  CHECK(botmesh::format_iso8601(early, "UTC") == "0999-06-01T12:00:00Z");
  CHECK(botmesh::parse_iso8601(botmesh::format_iso8601(early, "Europe/Madrid"))
        == early);
}

TEST_CASE("counting the runs of a long stretch equals counting them one by one") {
  // Windows that start and end anywhere (also inside a gap or an overlap)
  // in zones with ordinary, midnight and 30-minute offset changes.
  std::mt19937 rng{777};
  for (auto zone : {"UTC", "America/New_York", "Europe/Madrid",
                    "America/Santiago", "Australia/Lord_Howe"}) {
    for (auto expr : {"*/15 * * * *", "30 2 * * *", "0 0 * * *", "0 */2 * * *",
                      "45 1 * * 0", "0,30 1-3 * * *", "30 2,3 * * *",
                      "0 0 29 2 *", "* 2 * * *"}) {
      CAPTURE(zone);
      CAPTURE(expr);
      cron_schedule s{expr, zone, botmesh::parse_iso8601("2024-01-01T00:00:00Z")};
      for (int trial = 0; trial < 3; ++trial) {
        auto from = botmesh::from_unix_ms(
          1'704'067'200'000
          + static_cast<std::int64_t>(rng() % (3u * 31'536'000u)) * 1000 + 17);
        auto until = from + std::chrono::hours(24 * (1 + rng() % 500))
                     + std::chrono::minutes(rng() % 1440);
        CAPTURE(botmesh::to_iso_utc(from));
        CAPTURE(botmesh::to_iso_utc(until));
        std::uint64_t walked = 0;
        for (auto t = s.next_after(from); t && *t <= until; t = s.next_after(*t))
          ++walked;
        CHECK(s.count_between(from, until) == walked);
      }
    }
  }
  cron_schedule every_minute{"* * * * *", "Europe/Madrid",
                             botmesh::parse_iso8601("1970-01-01T00:00:00Z")};
  // 1970 -> 2026 without a walk: exact with the policy (wildcard hour:
  // spring gaps skipped, autumn overlaps run twice, so it equals the
  // elapsed minutes).
  auto a = botmesh::parse_iso8601("1970-01-01T00:00:00Z");
  auto b = botmesh::parse_iso8601("2026-11-30T00:00:00Z");
  CHECK(every_minute.count_between(a, b)
        == static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::minutes>(b - a).count()));
  CHECK(every_minute.count_between(b, a) == 0);
}

TEST_CASE("an offset with seconds is printed with them and parses back") {
  // Africa/Monrovia was -00:44:30 until 1972.
  auto t = botmesh::parse_iso8601("1971-06-01T00:00:30Z");
  auto text = botmesh::format_iso8601(t, "Africa/Monrovia");
  CHECK(text == "1971-05-31T23:16:00-00:44:30");
  CHECK(botmesh::parse_iso8601(text) == t);
  CHECK(botmesh::format_iso8601(t, "Europe/Madrid") == "1971-06-01T01:00:30+01:00");
}
