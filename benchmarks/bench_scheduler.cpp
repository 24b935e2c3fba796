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
#include <botmesh/scheduler/scheduler.hpp>
#include <botmesh/stores/memory_schedule_store.hpp>

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

double seconds_since(clk::time_point t0) {
  return std::chrono::duration<double>(clk::now() - t0).count();
}

// Printed at the end, so the compiler cannot drop the baseline loop.
std::int64_t sink = 0;

void next_times() {
  constexpr int n = 1'000'000;
  auto start = botmesh::parse_iso8601("2026-01-01T00:00:00Z");
  // Baseline: one instant -> civil time conversion plus one civil -> instant
  // lookup in the zone, the least any zone-aware next-time must do.
  cctz::time_zone madrid;
  cctz::load_time_zone("Europe/Madrid", &madrid);
  auto t0 = clk::now();
  auto tp = std::chrono::time_point_cast<cctz::seconds>(start);
  for (int i = 0; i < n; ++i) {
    auto cs = cctz::convert(tp + cctz::seconds(i * 61), madrid);
    sink += madrid.lookup(cs).pre.time_since_epoch().count();
  }
  double base_ns = seconds_since(t0) * 1e9 / n;
  std::printf("baseline: one cctz convert + lookup            %8.1f ns\n",
              base_ns);
  for (auto expr : {"*/15 * * * *", "0 9 * * 1-5", "30 2 * * *", "0 0 29 2 *"}) {
    for (auto zone : {"UTC", "Europe/Madrid"}) {
      botmesh::cron_schedule s{expr, zone, start};
      auto t = start;
      auto t1 = clk::now();
      for (int i = 0; i < n; ++i) {
        auto next = s.next_after(t);
        // Walk forward, but restart each year so every call is a real search.
        t = (next && *next < start + 24h * 365) ? *next : start;
      }
      double ns = seconds_since(t1) * 1e9 / n;
      std::printf("next_after %-14s %-14s %8.1f ns  (%5.2fx baseline)\n", expr,
                  zone, ns, ns / base_ns);
    }
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
