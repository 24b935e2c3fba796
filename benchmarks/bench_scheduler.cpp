// bench_scheduler: cost of next-time computation for typical crons with and
// without a zone, 100k in-memory timers armed and fired, and durable claims
// per second on the memory store; each next to a baseline measured in the
// same run.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <queue>
#include <vector>

#include <cctz/civil_time.h>
#include <cctz/time_zone.h>

#include <botmesh/scheduler/cron.hpp>
#include <botmesh/actors/scheduler.hpp>
#include <botmesh/stores/memory_schedule_store.hpp>

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

double seconds_since(clk::time_point t0) {
  return std::chrono::duration<double>(clk::now() - t0).count();
}

// Printed at the end, so the compiler cannot drop the baseline loop.
std::int64_t sink = 0;

// One case per expression and zone of the cron test vectors.
struct cron_case {
  const char* name;
  const char* expr;
  const char* zone;
};

constexpr cron_case cron_cases[] = {
  {"every_15m_utc", "*/15 * * * *", "UTC"},
  {"every_15m_madrid", "*/15 * * * *", "Europe/Madrid"},
  {"every_15m_lord_howe", "*/15 * * * *", "Australia/Lord_Howe"},
  {"every_30m_new_york", "*/30 * * * *", "America/New_York"},
  {"weekdays_9_utc", "0 9 * * 1-5", "UTC"},
  {"weekdays_9_madrid", "0 9 * * 1-5", "Europe/Madrid"},
  {"daily_0230_utc", "30 2 * * *", "UTC"},
  {"daily_0230_madrid", "30 2 * * *", "Europe/Madrid"},
  {"daily_0230_new_york", "30 2 * * *", "America/New_York"},
  {"daily_0130_new_york", "30 1 * * *", "America/New_York"},
  {"hours_2_3_new_york", "30 2,3 * * *", "America/New_York"},
  {"hourly_new_york", "0 * * * *", "America/New_York"},
  {"hourly_santiago", "0 * * * *", "America/Santiago"},
  {"hourly_15_madrid", "15 * * * *", "Europe/Madrid"},
  {"every_20m_at_2_madrid", "*/20 2 * * *", "Europe/Madrid"},
  {"midnight_santiago", "0 0 * * *", "America/Santiago"},
  {"sundays_midnight_santiago", "0 0 * * 0", "America/Santiago"},
  {"daily_0215_lord_howe", "15 2 * * *", "Australia/Lord_Howe"},
  {"daily_0145_lord_howe", "45 1 * * *", "Australia/Lord_Howe"},
  {"every_2h_apia", "0 */2 * * *", "Pacific/Apia"},
  {"thirteenth_or_friday_utc", "0 9 13 * 5", "UTC"},
  {"feb_29_utc", "0 0 29 2 *", "UTC"},
  {"feb_29_madrid", "0 0 29 2 *", "Europe/Madrid"},
  {"feb_29_new_york", "0 0 29 2 *", "America/New_York"},
};

void next_times() {
  constexpr int n = 300'000;
  auto start = botmesh::parse_iso8601("2026-01-01T00:00:00Z");
  auto year_end = start + 24h * 365;
  // Baseline: one instant -> civil time conversion plus one civil -> instant
  // lookup in the zone, the least any zone-aware next-time must do.
  cctz::time_zone madrid;
  cctz::load_time_zone("Europe/Madrid", &madrid);
  auto baseline_ns = [&] {
    auto t0 = clk::now();
    auto tp = std::chrono::time_point_cast<cctz::seconds>(start);
    for (int i = 0; i < n; ++i) {
      auto cs = cctz::convert(tp + cctz::seconds(i * 61), madrid);
      sink += madrid.lookup(cs).pre.time_since_epoch().count();
    }
    return seconds_since(t0) * 1e9 / n;
  };
  double base_ns = baseline_ns();
  std::printf("bench cctz_convert_lookup_ns %.1f ns\n", base_ns);
  for (auto& c : cron_cases) {
    botmesh::cron_schedule s{c.expr, c.zone, start};
    // Walk forward through a year (both offset changes included), restarting
    // each year so every call is a real search.
    auto t = start;
    auto t1 = clk::now();
    for (int i = 0; i < n; ++i) {
      auto next = s.next_after(t);
      t = (next && *next < year_end) ? *next : start;
      sink += botmesh::to_unix_ms(t) & 1;
    }
    double ns = seconds_since(t1) * 1e9 / n;
    std::printf("bench cron_next_per_s_%s %.0f per_s\n", c.name, 1e9 / ns);
    std::printf("ratio cron_next_vs_cctz_lookup_%s %.2f\n", c.name,
                ns / base_ns);
  }
}

void timers() {
  constexpr int n = 100'000;
  // Baseline: a bare priority queue of (due, function) armed and drained.
  using item = std::pair<std::int64_t, std::function<void()>>;
  auto cmp = [](const item& a, const item& b) { return a.first > b.first; };
  std::atomic<int> fired{0};
  auto t0 = clk::now();
  {
    std::priority_queue<item, std::vector<item>, decltype(cmp)> q{cmp};
    for (int i = 0; i < n; ++i)
      q.emplace(i % 100, [&] { fired.fetch_add(1); });
    while (!q.empty()) {
      q.top().second();
      q.pop();
    }
  }
  double base = seconds_since(t0);
  botmesh::manual_clock mc{botmesh::parse_iso8601("2026-01-01T00:00:00Z")};
  botmesh::scheduler s{{.clock = &mc, .threads = 2}};
  fired = 0;
  auto t1 = clk::now();
  for (int i = 0; i < n; ++i)
    s.delay(std::chrono::milliseconds{1 + i % 100}, [&] { fired.fetch_add(1); });
  double arm = seconds_since(t1);
  auto t2 = clk::now();
  mc.advance(100ms);
  s.poll();
  double fire = seconds_since(t2);
  std::printf("100k in-memory timers: armed in %.3f s, fired in %.3f s "
              "(%d fired)\n",
              arm, fire, fired.load());
  std::printf("baseline priority queue arm+fire:   %.3f s   ratio %.1fx\n",
              base, (arm + fire) / base);
}

void durable_claims() {
  constexpr int tasks = 2'000;
  constexpr int rounds = 20;
  auto start = botmesh::parse_iso8601("2026-01-01T00:00:00Z");
  // Baseline: the store's own claim + commit, no engine around it.
  botmesh::memory_schedule_store raw;
  for (int i = 0; i < tasks; ++i)
    raw.register_task("t" + std::to_string(i), "every 1000", start, start);
  auto t0 = clk::now();
  for (int r = 0; r < rounds; ++r) {
    auto now = start + std::chrono::seconds(r);
    for (int i = 0; i < tasks; ++i) {
      auto id = "t" + std::to_string(i);
      if (auto c = raw.claim(id, "me", now, 60s))
        raw.commit(id, "me", c->token, now + 1s, false, now);
    }
  }
  double base_rate = tasks * rounds / seconds_since(t0);
  botmesh::manual_clock mc{start};
  auto store = std::make_shared<botmesh::memory_schedule_store>();
  botmesh::scheduler s{{.store = store, .clock = &mc, .threads = 2}};
  std::atomic<long> runs{0};
  for (int i = 0; i < tasks; ++i)
    s.every("1s", {.id = "t" + std::to_string(i)},
            [&](const botmesh::scheduled_run&) { runs.fetch_add(1); });
  auto t1 = clk::now();
  for (int r = 0; r < rounds; ++r) {
    mc.advance(1s);
    s.poll();
  }
  double rate = static_cast<double>(runs.load()) / seconds_since(t1);
  std::printf("durable claims (claim, run, commit) on the memory store: "
              "%.0f/s (%ld runs)\n",
              rate, runs.load());
  std::printf("baseline raw store claim+commit:                         "
              "%.0f/s   ratio %.3f\n",
              base_rate, rate / base_rate);
}

} // namespace

int main() {
  std::printf("bench_scheduler\n");
  next_times();
  timers();
  durable_claims();
  std::printf("(checksum %lld)\n", static_cast<long long>(sink % 1000));
  return 0;
}
