// Cron expressions as `bot.schedule` and `botmesh cron next` take them.
//
// Input: line 1 the expression; line 2 a time zone (see zones.hpp);
// line 3 the start instant in Unix seconds (default 2023-11-14).
//
// Contract checked: parsing throws only invalid_argument_error naming a
// field; a schedule's run instants strictly increase after the start; in
// UTC every run instant matches the expression's fields (minute, hour, day
// rule, month).

#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/scheduler/cron.hpp>

#include "fuzz_check.hpp"
#include "zones.hpp"

namespace {

using namespace std::chrono;

const std::set<std::string> fields{"minute", "hour", "day_of_month", "month",
                                   "day_of_week", "cron", "time_zone"};

void check_fields(const botmesh::cron_expr& e, botmesh::time_point t) {
  auto day = floor<days>(t);
  year_month_day ymd{day};
  hh_mm_ss hms{t - day};
  weekday wd{day};
  auto text = botmesh::to_iso_utc(t) + " for \"" + e.text() + "\"";
  FUZZ_CHECK(hms.seconds().count() == 0 && hms.subseconds().count() == 0,
             text);
  FUZZ_CHECK(e.minute(static_cast<int>(hms.minutes().count())), text);
  FUZZ_CHECK(e.hour(static_cast<int>(hms.hours().count())), text);
  FUZZ_CHECK(e.month(static_cast<int>(unsigned{ymd.month()})), text);
  FUZZ_CHECK(e.day(static_cast<int>(unsigned{ymd.day()}),
                   static_cast<int>(wd.c_encoding())),
             text);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  std::string_view in{reinterpret_cast<const char*>(data), size};
  auto [expr, rest] = botmesh::fuzz::next_line(in);
  auto [zone_line, rest2] = botmesh::fuzz::next_line(rest);
  auto [from_line, ignored] = botmesh::fuzz::next_line(rest2);
  auto zone = botmesh::fuzz::pick_zone(zone_line);
  std::int64_t from_s = 1'700'000'000;
  if (!from_line.empty()) {
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(from_line.data(),
                                   from_line.data() + from_line.size(), v);
    // 1970 to 2200: the range a scheduler meets.
    if (ec == std::errc{} && v >= 0 && v <= 7'258'118'400)
      from_s = v;
  }
  auto from = botmesh::time_point{milliseconds{from_s * 1000}};

  std::optional<botmesh::cron_expr> e;
  try {
    e = botmesh::cron_expr::parse(expr);
  } catch (const botmesh::invalid_argument_error& err) {
    FUZZ_CHECK(fields.count(err.field()) == 1, err.field());
    return 0;
  }
  std::optional<botmesh::cron_schedule> sched;
  try {
    sched.emplace(expr, zone, from);
  } catch (const botmesh::invalid_argument_error& err) {
    FUZZ_CHECK(fields.count(err.field()) == 1, err.field());
    return 0;
  }
  FUZZ_CHECK(sched->expr().text() == e->text(), e->text());
  auto t = from;
  for (int n = 0; n < 8; ++n) {
    auto next = sched->next_after(t);
    if (!next)
      break;
    FUZZ_CHECK(*next > t, botmesh::to_iso_utc(*next) + " after "
                            + botmesh::to_iso_utc(t));
    if (zone == "UTC")
      check_fields(*e, *next);
    t = *next;
  }
  return 0;
}
