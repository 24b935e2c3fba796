// The cron search against a minute-by-minute reference that applies the DST
// policy literally: every matching civil minute is resolved in the zone
// (unique: its instant; skipped: shifted forward for a fixed hour, dropped
// for a wildcard hour; repeated: the first pass, and the second for a
// wildcard hour), and the runs are those instants in order.

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <vector>

#include <cctz/civil_time.h>
#include <cctz/time_zone.h>

#include <botmesh/scheduler/cron.hpp>

namespace {

using sec_tp = cctz::time_point<cctz::seconds>;

std::vector<sec_tp> reference_runs(const botmesh::cron_expr& e,
                                   const cctz::time_zone& tz,
                                   cctz::civil_minute from,
                                   cctz::civil_minute to) {
  std::vector<sec_tp> out;
  for (cctz::civil_day d{from}; d <= cctz::civil_day{to}; ++d) {
    int weekday = (static_cast<int>(cctz::get_weekday(d)) + 1) % 7;
    if (!e.month(d.month()) || !e.day(d.day(), weekday))
      continue;
    for (cctz::civil_minute m{d}; cctz::civil_day{m} == d; ++m) {
      if (m < from || m > to || !e.hour(m.hour()) || !e.minute(m.minute()))
        continue;
      auto cl = tz.lookup(cctz::civil_second{m});
      switch (cl.kind) {
        case cctz::time_zone::civil_lookup::UNIQUE:
          out.push_back(cl.pre);
          break;
        case cctz::time_zone::civil_lookup::SKIPPED:
          if (!e.hour_is_wildcard())
            out.push_back(cl.pre);
          break;
        case cctz::time_zone::civil_lookup::REPEATED:
          out.push_back(cl.pre);
          if (e.hour_is_wildcard())
            out.push_back(cl.post);
          break;
      }
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

} // namespace

TEST_CASE("next times near every offset change of 2026-2027 equal a "
          "minute-by-minute reference with the DST policy") {
  std::mt19937 rng{2026};
  for (auto zone : {"America/New_York", "Europe/Madrid", "America/Santiago",
                    "Australia/Lord_Howe", "Pacific/Apia"}) {
    cctz::time_zone tz;
    REQUIRE(cctz::load_time_zone(zone, &tz));
    for (auto expr : {"*/15 * * * *", "30 2 * * *", "0 0 * * *", "0 * * * *",
                      "0,30 1-3 * * *", "30 2,3 * * *", "*/20 2 * * *",
                      "15 2 * * *", "45 1 * * 0", "* 2 * * *",
                      "0 0 * * 0", "0 23 * * *"}) {
      CAPTURE(zone);
      CAPTURE(expr);
      auto e = botmesh::cron_expr::parse(expr);
      auto begin = botmesh::parse_iso8601("2026-01-01T00:00:00Z");
      botmesh::cron_schedule s{expr, zone, begin};
      sec_tp at = std::chrono::time_point_cast<cctz::seconds>(begin);
      auto end = std::chrono::time_point_cast<cctz::seconds>(
        botmesh::parse_iso8601("2028-01-01T00:00:00Z"));
      cctz::time_zone::civil_transition tr;
      while (tz.next_transition(at, &tr)) {
        auto change = tz.lookup(tr.to).trans;
        if (change >= end)
          break;
        at = change;
        // Runs from four days before to four days after the change.
        auto first = cctz::civil_minute{tr.from} - 4 * 1440;
        auto last = cctz::civil_minute{tr.to} + 4 * 1440;
        auto runs = reference_runs(e, tz, first, last);
        // Starting points: 300 spread over the three days around it, some
        // on the runs themselves and at their last second.
        for (int i = 0; i < 300; ++i) {
          sec_tp from = change - std::chrono::hours{36}
                        + cctz::seconds{static_cast<long>(rng() % (72 * 3600))};
          if (i % 3 == 1 && !runs.empty())
            from = runs[rng() % runs.size()];
          if (i % 3 == 2 && !runs.empty())
            from = runs[rng() % runs.size()] - cctz::seconds{1};
          auto want = std::upper_bound(runs.begin(), runs.end(), from);
          if (want == runs.end() || *want > change + std::chrono::hours{60})
            continue; // beyond the reference window
          CAPTURE(botmesh::to_iso_utc(from));
          auto got = s.next_after(from);
          REQUIRE(got);
          CHECK(botmesh::to_iso_utc(*got) == botmesh::to_iso_utc(*want));
        }
      }
    }
  }
}

TEST_CASE("a sparse expression finds its day across offset changes in every "
          "zone") {
  // Feb 29 and the 31st of 31-day months, from points all over the years
  // between (also just around offset changes).
  std::mt19937 rng{29};
  for (auto zone : {"UTC", "America/New_York", "Europe/Madrid",
                    "America/Santiago", "Australia/Lord_Howe"}) {
    for (auto expr : {"0 0 29 2 *", "30 2 29 2 *", "59 23 31 * *",
                      "0 12 13 * 5"}) {
      CAPTURE(zone);
      CAPTURE(expr);
      auto e = botmesh::cron_expr::parse(expr);
      cctz::time_zone tz;
      REQUIRE(cctz::load_time_zone(zone, &tz));
      auto base = botmesh::parse_iso8601("2025-01-01T00:00:00Z");
      botmesh::cron_schedule s{expr, zone, base};
      for (int i = 0; i < 40; ++i) {
        auto from = base + std::chrono::seconds(rng() % (3u * 31'536'000u));
        auto got = s.next_after(from);
        REQUIRE(got);
        auto from_s = std::chrono::time_point_cast<cctz::seconds>(from);
        auto got_s = std::chrono::time_point_cast<cctz::seconds>(*got);
        // The reference over the civil minutes between both, widened by a
        // day on each side.
        auto runs = reference_runs(
          e, tz, cctz::civil_minute{cctz::convert(from_s, tz)} - 1440,
          cctz::civil_minute{cctz::convert(got_s, tz)} + 1440);
        auto want = std::upper_bound(runs.begin(), runs.end(), from_s);
        REQUIRE(want != runs.end());
        CAPTURE(botmesh::to_iso_utc(from));
        CHECK(botmesh::to_iso_utc(*got) == botmesh::to_iso_utc(*want));
      }
    }
  }
}
