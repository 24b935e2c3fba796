// bench_scheduler: cost of next-time computation for typical crons with and
// without a zone, 100k in-memory timers armed and fired, and durable claims
// per second on the memory store; each next to a baseline measured in the
// same run.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <cctz/civil_time.h>
#include <cctz/time_zone.h>

#include <botmesh/scheduler/cron.hpp>
#include <botmesh/actors/scheduler.hpp>
#include <botmesh/actors/system_setup.hpp>
#include <botmesh/runtime/core/internal/worker_pool.hpp>
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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Waits until `done` reaches `n` (jobs finishing on pool threads).
void await_count(const std::atomic<long>& done, long n) {
  while (done.load(std::memory_order_acquire) < n)
    std::this_thread::yield();
}

// 100k in-memory timers armed and fired. The mandatory work of a fired
// timer is its handler run on the handler pool (handlers may block), so the
// baseline is a bare priority queue of (due, job) whose due jobs are posted
// to an identical pool, and waited for.
void timers() {
  constexpr int n = 100'000;
  constexpr int rounds = 5;
  std::vector<double> ratios;
  std::vector<double> bare_ratios;
  std::vector<double> batched_ratios;
  std::vector<double> rates;
  for (int round = 0; round < rounds; ++round) {
    std::atomic<long> fired{0};
    // Baseline without the pool: arm, then call each job inline.
    using item = std::pair<std::int64_t, std::function<void()>>;
    auto cmp = [](const item& a, const item& b) { return a.first > b.first; };
    auto t0 = clk::now();
    {
      std::priority_queue<item, std::vector<item>, decltype(cmp)> q{cmp};
      for (int i = 0; i < n; ++i)
        q.emplace(1 + i % 100, [&] { fired.fetch_add(1); });
      while (!q.empty()) {
        q.top().second();
        q.pop();
      }
    }
    double bare = seconds_since(t0);
    // Baselines: the same queue, its due jobs run on the handler pool,
    // posted one by one or in batches of 256 (one lock and only the
    // wake-ups needed per batch, as the timer actor posts).
    auto on_pool = [&](std::size_t batch_size) {
      fired = 0;
      botmesh::internal::worker_pool pool{2, 8};
      auto t1 = clk::now();
      std::priority_queue<item, std::vector<item>, decltype(cmp)> q{cmp};
      for (int i = 0; i < n; ++i)
        q.emplace(1 + i % 100, [&] { fired.fetch_add(1); });
      std::vector<std::function<void()>> batch;
      while (!q.empty()) {
        auto& job = const_cast<item&>(q.top()).second;
        if (batch_size == 1) {
          pool.post(std::move(job));
        } else {
          batch.push_back(std::move(job));
          if (batch.size() == batch_size || q.size() == 1)
            pool.post_batch(batch);
        }
        q.pop();
      }
      await_count(fired, n);
      return seconds_since(t1);
    };
    double base = on_pool(1);
    double batched = on_pool(256);
    // The scheduler: arm through the facade, fire through the timer actor.
    botmesh::manual_clock mc{botmesh::parse_iso8601("2026-01-01T00:00:00Z")};
    botmesh::scheduler s{{.clock = &mc, .threads = 8}};
    fired = 0;
    auto t2 = clk::now();
    for (int i = 0; i < n; ++i)
      s.delay(std::chrono::milliseconds{1 + i % 100}, [&] { fired.fetch_add(1); });
    double armed = seconds_since(t2);
    mc.advance(100ms);
    s.poll();
    double took = seconds_since(t2);
    std::printf("# timers round %d: pool baseline %.3f s, batched %.3f s, "
                "bare %.3f s, scheduler arm %.3f s + fire %.3f s\n",
                round, base, batched, bare, armed, took - armed);
    if (fired.load() != n)
      std::printf("# timers: only %ld of %d fired\n", fired.load(), n);
    ratios.push_back(took / base);
    batched_ratios.push_back(took / batched);
    bare_ratios.push_back(took / bare);
    rates.push_back(n / took);
  }
  std::printf("bench timers_arm_fire_per_s %.0f per_s\n", median(rates));
  std::printf("ratio timers_vs_priority_queue %.2f\n", median(ratios));
  std::printf("ratio timers_vs_batched_priority_queue %.2f\n",
              median(batched_ratios));
  std::printf("ratio timers_vs_bare_priority_queue %.2f\n", median(bare_ratios));
}

// Durable claim + run + commit through the actors on the memory store. The
// mandatory work of a run is the store's claim, the handler on the handler
// pool, and the store's commit; the baseline does exactly that with no
// engine around it (claim on this thread, handler and commit on the pool).
void durable_claims() {
  constexpr int tasks = 2'000;
  constexpr int steps = 10;
  // Many short rounds, the baseline and the scheduler in alternating order:
  // this machine's speed drifts within a second, and the median of per-round
  // ratios should not depend on which of the two ran first.
  constexpr int rounds = 11;
  auto start = botmesh::parse_iso8601("2026-01-01T00:00:00Z");
  std::vector<std::string> ids;
  for (int i = 0; i < tasks; ++i)
    ids.push_back("t" + std::to_string(i));
  // One owner for all three, as long as a scheduler's default (a random
  // 32-character token): the store copies it with every claim.
  const std::string owner(32, 'o');
  // Raw store calls alone (the figure the ratio started from).
  auto raw_calls = [&] {
    botmesh::memory_schedule_store raw;
    for (auto& id : ids)
      raw.register_task(id, "every 1000", start, start);
    auto t0 = clk::now();
    for (int r = 0; r < steps; ++r) {
      auto now = start + std::chrono::seconds(r);
      for (auto& id : ids)
        if (auto c = raw.claim(id, owner, now, 60s))
          raw.commit(id, owner, c->token, now + 1s, false, now);
    }
    return tasks * steps / seconds_since(t0);
  };
  // Baseline: claim, handler on the pool, commit from the pool.
  auto baseline = [&] {
    botmesh::memory_schedule_store base_store;
    for (auto& id : ids)
      base_store.register_task(id, "every 1000", start, start);
    std::atomic<long> done{0};
    botmesh::internal::worker_pool pool{2, 8};
    auto t1 = clk::now();
    for (int r = 0; r < steps; ++r) {
      auto now = start + std::chrono::seconds(r);
      long expected = static_cast<long>(tasks) * (r + 1);
      for (auto& id : ids)
        if (auto c = base_store.claim(id, owner, now, 60s))
          pool.post([&, id = std::string_view{id}, token = c->token, now] {
            botmesh::scheduled_run run;
            run.fencing_token = token;
            sink += static_cast<std::int64_t>(run.fencing_token & 1);
            base_store.commit(id, owner, token, now + 1s, false, now);
            done.fetch_add(1, std::memory_order_release);
          });
      await_count(done, expected);
    }
    return tasks * steps / seconds_since(t1);
  };
  // The scheduler: one task actor per id, polled once per second.
  auto actors = [&] {
    botmesh::manual_clock mc{start};
    auto store = std::make_shared<botmesh::memory_schedule_store>();
    botmesh::scheduler s{
      {.store = store, .owner = owner, .clock = &mc, .threads = 8}};
    std::atomic<long> runs{0};
    for (auto& id : ids)
      s.every("1s", {.id = id},
              [&](const botmesh::scheduled_run&) { runs.fetch_add(1); });
    auto t2 = clk::now();
    for (int r = 0; r < steps; ++r) {
      mc.advance(1s);
      s.poll();
    }
    return static_cast<double>(runs.load()) / seconds_since(t2);
  };
  // The floor of any actor-per-task engine: per run, one message to an
  // actor (its wake-up), a job posted to the same pool, a message back when
  // the job ends; no store, no handler, no plan. The actors live in a
  // system set up as the scheduler sets up its own.
  caf::actor_system_config floor_cfg;
  botmesh::configure_scheduler(
    floor_cfg, std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 2),
    64);
  floor_cfg.set("logger.file-verbosity", caf::atom("quiet"));
  floor_cfg.set("logger.console-verbosity", caf::atom("quiet"));
  caf::actor_system floor_sys{floor_cfg};
  using wake_atom = caf::atom_constant<caf::atom("wake")>;
  using ended_atom = caf::atom_constant<caf::atom("ended")>;
  auto floor = [&] {
    botmesh::internal::worker_pool pool{2, 8};
    std::atomic<long> left{0};
    std::promise<void>* all_ended = nullptr;
    std::vector<caf::actor> as;
    for (int i = 0; i < tasks; ++i)
      as.push_back(floor_sys.spawn([&](caf::event_based_actor* self) -> caf::behavior {
        return {
          [=, &pool](wake_atom, std::uint64_t token) {
            pool.post([me = caf::actor_cast<caf::actor>(self), token] {
              caf::anon_send(me, ended_atom::value, token);
            });
          },
          [&](ended_atom, std::uint64_t) {
            if (left.fetch_sub(1, std::memory_order_acq_rel) == 1)
              all_ended->set_value();
          },
        };
      }));
    auto t3 = clk::now();
    for (int r = 0; r < steps; ++r) {
      // Waits as poll() does (on a future, not spinning).
      std::promise<void> ended;
      all_ended = &ended;
      left = tasks;
      for (auto& a : as)
        caf::anon_send(a, wake_atom::value, std::uint64_t(r));
      ended.get_future().wait();
    }
    double rate = tasks * steps / seconds_since(t3);
    for (auto& a : as)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    return rate;
  };
  std::vector<double> ratios;
  std::vector<double> rates;
  std::vector<double> raw_ratios;
  std::vector<double> floor_rates;
  std::vector<double> floor_ratios;
  std::vector<double> vs_floor;
  for (int round = 0; round < rounds; ++round) {
    double floor_rate = round % 2 == 0 ? floor() : 0;
    double raw_rate = raw_calls();
    double base_rate = 0;
    double rate = 0;
    if (round % 2 == 0) {
      base_rate = baseline();
      rate = actors();
    } else {
      rate = actors();
      base_rate = baseline();
    }
    if (round % 2 == 1)
      floor_rate = floor();
    std::printf("# durable round %d: raw store %.0f/s, baseline %.0f/s, "
                "scheduler %.0f/s, actor floor %.0f/s\n",
                round, raw_rate, base_rate, rate, floor_rate);
    ratios.push_back(rate / base_rate);
    raw_ratios.push_back(rate / raw_rate);
    rates.push_back(rate);
    floor_rates.push_back(floor_rate);
    floor_ratios.push_back(floor_rate / base_rate);
    vs_floor.push_back(rate / floor_rate);
  }
  std::printf("bench durable_runs_per_s %.0f per_s\n", median(rates));
  std::printf("ratio durable_vs_raw_store %.3f\n", median(ratios));
  std::printf("ratio durable_vs_bare_store_calls %.3f\n", median(raw_ratios));
  // What the actors' messages alone allow: durable_vs_raw_store cannot pass
  // actor_floor_vs_raw_store, whatever the engine does per run.
  std::printf("bench durable_actor_floor_per_s %.0f per_s\n", median(floor_rates));
  std::printf("ratio actor_floor_vs_raw_store %.3f\n", median(floor_ratios));
  std::printf("ratio durable_vs_actor_floor %.3f\n", median(vs_floor));
}

} // namespace

// Runs every part, or only those named on the command line (cron, timers,
// durable).
int main(int argc, char** argv) {
  auto wanted = [&](std::string_view part) {
    if (argc < 2)
      return true;
    for (int i = 1; i < argc; ++i)
      if (part == argv[i])
        return true;
    return false;
  };
  std::printf("bench_scheduler\n");
  if (wanted("cron"))
    next_times();
  if (wanted("timers"))
    timers();
  if (wanted("durable"))
    durable_claims();
  std::printf("(checksum %lld)\n", static_cast<long long>(sink % 1000));
  return 0;
}
