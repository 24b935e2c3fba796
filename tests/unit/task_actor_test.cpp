// Durable tasks on virtual time: CAF's test coordinator runs every actor of
// the scheduler on this thread, its clock drives the delayed messages, the
// scheduler's clock reads the same virtual time, and handlers run only when
// the test drains them (so a run "in progress" is a job not yet drained).

#include <doctest/doctest.h>

#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <botmesh/actors/scheduler.hpp>
#include <botmesh/runtime/core/error.hpp>

#include "forwarding_schedule_store.hpp"
#include <botmesh/scheduler/cron.hpp>
#include <botmesh/stores/memory_schedule_store.hpp>

using namespace std::chrono_literals;
using botmesh::missed_policy;
using botmesh::scheduled_run;

namespace {

// An actor system on CAF's deterministic scheduler, a botmesh clock that
// reads its virtual time, and an executor the test drains.
struct virtual_time final : botmesh::clock {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;
  botmesh::time_point base;
  caf::actor_clock::time_point caf_base;
  std::deque<std::function<void()>> jobs;

  explicit virtual_time(botmesh::time_point start) : base(start) {
    cfg.set("scheduler.policy", caf::atom("testing"));
    cfg.set("logger.file-verbosity", caf::atom("quiet"));
    sys = std::make_unique<caf::actor_system>(cfg);
    sched = &dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
    sched->clock().current_time += std::chrono::hours(1);
    caf_base = sched->clock().current_time;
  }

  ~virtual_time() override {
    sched->run();
  }

  botmesh::time_point now() const override {
    return base
           + std::chrono::duration_cast<std::chrono::milliseconds>(
             sched->clock().current_time - caf_base);
  }

  std::function<void(std::function<void()>)> executor() {
    return [this](std::function<void()> job) { jobs.push_back(std::move(job)); };
  }

  // Runs actors and handlers until nothing is left to do now.
  void settle(bool run_handlers = true) {
    for (;;) {
      sched->run();
      if (!run_handlers || jobs.empty())
        return;
      while (!jobs.empty()) {
        auto job = std::move(jobs.front());
        jobs.pop_front();
        job();
      }
    }
  }

  // Lets `d` pass in steps of `step`, settling after each.
  void pass(std::chrono::milliseconds d, std::chrono::milliseconds step = 1s,
            bool run_handlers = true) {
    for (std::chrono::milliseconds t{0}; t < d; t += step) {
      sched->clock().advance_time(step);
      settle(run_handlers);
    }
  }
};

// The memory store, declared blocking: its calls go through the store-I/O
// actor, as a SQLite or Redis store's would.
class io_store final : public test::forwarding_schedule_store {
 public:
  bool blocks() const noexcept override {
    return true;
  }
  std::optional<botmesh::schedule_claim>
  claim(std::string_view id, std::string_view owner, botmesh::time_point now,
        std::chrono::milliseconds lease) override {
    ++calls;
    return inner.claim(id, owner, now, lease);
  }
  bool renew(std::string_view id, std::string_view owner, std::uint64_t token,
             botmesh::time_point now, std::chrono::milliseconds lease) override {
    ++calls;
    if (failing_renewals)
      throw botmesh::error(botmesh::errc::store_error, "renewal refused");
    return inner.renew(id, owner, token, now, lease);
  }
  bool commit(std::string_view id, std::string_view owner, std::uint64_t token,
              botmesh::time_point next_run_at, bool done,
              botmesh::time_point now) override {
    ++calls;
    return inner.commit(id, owner, token, next_run_at, done, now);
  }
  int calls = 0; // claims, renewals and commits
  bool failing_renewals = false; // every renewal throws
};

botmesh::time_point t0() {
  return botmesh::parse_iso8601("2026-06-01T10:00:00Z");
}

struct journal {
  std::vector<scheduled_run> runs;
  std::vector<std::string> logs;

  std::function<void(std::string_view)> logger() {
    return [this](std::string_view s) { logs.emplace_back(s); };
  }

  botmesh::run_handler handler(std::string who = {}) {
    return [this, who](const scheduled_run& r) {
      runs.push_back(r);
      if (!who.empty())
        runs.back().task_id = who + "/" + r.task_id;
    };
  }

  std::size_t logs_containing(std::string_view s) const {
    std::size_t n = 0;
    for (auto& l : logs)
      n += l.find(s) != std::string::npos ? 1 : 0;
    return n;
  }
};

botmesh::scheduler_options options(virtual_time& vt,
                                   std::shared_ptr<botmesh::schedule_store> store,
                                   journal& j, std::string owner = "me") {
  return {.store = std::move(store),
          .owner = std::move(owner),
          .clock = &vt,
          .executor = vt.executor(),
          .system = vt.sys.get(),
          .log = j.logger()};
}

} // namespace

TEST_CASE("task options default to max_catch_up 10 and a 60 s lease renewed "
          "every third while the handler runs") {
  botmesh::task_options defaults;
  CHECK(defaults.max_catch_up == 10);
  CHECK(defaults.lease.ms() == 60s);
  CHECK(defaults.missed == missed_policy::skip);
  virtual_time vt{t0()};
  auto store = std::make_shared<io_store>();
  journal j;
  botmesh::scheduler s{options(vt, store, j)};
  s.every("5m", {.id = "report"}, j.handler());
  s.start();
  vt.settle();
  // The slot falls due; the handler is held (not drained): it runs on.
  vt.pass(5min, 1s, false);
  REQUIRE(vt.jobs.size() == 1);
  auto claimed = t0() + 5min;
  CHECK(store->get("report")->lease_until == claimed + 60s);
  vt.pass(19s, 1s, false);
  CHECK(store->get("report")->lease_until == claimed + 60s);
  vt.pass(1s, 1s, false); // a third of the lease: renewed
  CHECK(store->get("report")->lease_until == claimed + 20s + 60s);
  vt.pass(20s, 1s, false);
  CHECK(store->get("report")->lease_until == claimed + 40s + 60s);
  vt.pass(100s, 1s, false); // well past the first lease: still held
  CHECK(store->get("report")->lease_until > vt.now());
  vt.settle(); // the handler returns: commit, no lease left
  REQUIRE(j.runs.size() == 1);
  CHECK(store->get("report")->lease_owner.empty());
  CHECK(store->get("report")->next_run_at == t0() + 10min);
  // Nothing renews once the run ended.
  auto updated = store->get("report")->updated_at;
  auto calls = store->calls;
  vt.pass(60s, 10s);
  CHECK(store->get("report")->updated_at == updated);
  CHECK(store->calls == calls);
  s.stop();
}

TEST_CASE("a run whose renewals fail is asked to stop when its lease ends, "
          "not at the next retry a tick later") {
  virtual_time vt{t0()};
  auto store = std::make_shared<io_store>();
  journal j;
  botmesh::scheduler s{options(vt, store, j)}; // a tick of 1 s
  s.every("1m", {.id = "job", .lease = "2s"}, j.handler());
  s.start();
  vt.settle();
  vt.pass(1min, 100ms, false); // claimed at t0 + 1 min; the handler runs on
  REQUIRE(vt.jobs.size() == 1);
  store->failing_renewals = true;
  // Renewals fail at +0.7 s and +1.7 s. The next retry, a tick later, came
  // at +2.7 s: past the store's lease (+2 s), when another replica may
  // claim the slot, the run went on unstopped.
  vt.pass(1900ms, 100ms, false);
  CHECK(j.logs_containing("lease of job (token 1) ran out") == 1);
  CHECK(store->get("job")->lease_until == t0() + 1min + 2s); // never renewed
  vt.pass(2s, 100ms, false);
  CHECK(j.logs_containing("ran out") == 1); // said once
  store->failing_renewals = false;
  vt.settle();
  s.stop();
}

TEST_CASE("a run during which the clock stepped back does not run its slot "
          "again: durable, in memory with an id, or a plain job") {
  for (int kind : {0, 1, 2}) { // a schedule store, none, a plain job
    CAPTURE(kind);
    virtual_time vt{t0()};
    std::shared_ptr<io_store> store;
    if (kind == 0)
      store = std::make_shared<io_store>();
    journal j;
    botmesh::scheduler s{options(vt, store, j)};
    std::vector<botmesh::time_point> ran; // when each run began
    auto step_back = [&] {
      ran.push_back(vt.now());
      if (ran.size() == 1)
        vt.base -= 40s; // an NTP step back, during the run
    };
    if (kind == 2)
      s.every("1m", step_back);
    else
      s.every("1m", {.id = "job"}, [&](const scheduled_run& r) {
        CHECK(r.scheduled_at == t0() + 1min * static_cast<int>(ran.size() + 1));
        step_back();
      });
    s.start();
    vt.settle();
    vt.pass(1min, 1s); // the slot at t0 + 1 min runs; the clock reads +20 s
    REQUIRE(ran.size() == 1);
    CHECK(ran[0] == t0() + 1min);
    if (store)
      CHECK(store->get("job")->next_run_at == t0() + 2min);
    vt.pass(50s, 1s); // the clock reads +1 min 10 s again
    CHECK(ran.size() == 1); // before, the slot at +1 min ran twice
    vt.pass(60s, 1s);
    REQUIRE(ran.size() == 2);
    CHECK(ran[1] == t0() + 2min);
    s.stop();
  }
}

TEST_CASE("a catch-up runs at most 10 missed slots by default") {
  virtual_time vt{t0()};
  auto store = std::make_shared<io_store>();
  // Stored by an earlier process: due 15 minutes ago.
  store->register_task("sync", "every 60000", t0() - 15min, t0() - 16min);
  journal j;
  botmesh::scheduler s{options(vt, store, j)};
  s.every("1m", {.id = "sync", .missed = missed_policy::catch_up}, j.handler());
  s.start();
  vt.settle();
  REQUIRE(j.runs.size() == 10);
  CHECK(j.runs.front().scheduled_at == t0() - 15min);
  CHECK(j.runs.back().scheduled_at == t0() - 6min);
  for (auto& r : j.runs) {
    CHECK(r.missed);
    CHECK(r.fencing_token == j.runs.front().fencing_token);
  }
  CHECK(j.logs_containing("skips 6 more") == 1); // -5 min ... now
  CHECK(store->get("sync")->next_run_at == t0() + 1min);
  s.stop();
}

TEST_CASE("slots falling due while a run is in progress are claimed next "
          "with run-once and catch-up, skip goes on after the run's end") {
  for (auto policy : {missed_policy::skip, missed_policy::run_once,
                      missed_policy::catch_up}) {
    CAPTURE(botmesh::to_string(policy));
    virtual_time vt{t0()};
    auto store = std::make_shared<io_store>();
    journal j;
    botmesh::scheduler s{options(vt, store, j)};
    s.every("1m", {.id = "slow", .missed = policy}, j.handler());
    s.start();
    vt.settle();
    vt.pass(1min, 1s, false);
    REQUIRE(vt.jobs.size() == 1); // the 10:01 run starts and takes 3.5 min
    vt.pass(3min + 30s, 1s, false);
    CHECK(vt.jobs.size() == 1); // never two runs of the task at once
    vt.settle(); // it ends at 10:04:30
    std::vector<botmesh::time_point> slots;
    std::vector<bool> missed;
    for (auto& r : j.runs) {
      slots.push_back(r.scheduled_at);
      missed.push_back(r.missed);
    }
    switch (policy) {
      case missed_policy::skip:
        CHECK(slots == std::vector{t0() + 1min});
        CHECK(store->get("slow")->next_run_at == t0() + 5min);
        break;
      case missed_policy::run_once:
        // 10:02 claimed right after, late: one missed run for 10:02-10:04.
        CHECK(slots == std::vector{t0() + 1min, t0() + 2min});
        CHECK(missed == std::vector{false, true});
        CHECK(store->get("slow")->next_run_at == t0() + 5min);
        break;
      case missed_policy::catch_up:
        CHECK(slots
              == std::vector{t0() + 1min, t0() + 2min, t0() + 3min,
                             t0() + 4min});
        CHECK(missed == std::vector{false, true, true, true});
        CHECK(j.runs[1].fencing_token == j.runs[3].fencing_token);
        CHECK(j.runs[1].fencing_token > j.runs[0].fencing_token);
        CHECK(store->get("slow")->next_run_at == t0() + 5min);
        break;
    }
    // Every policy runs 10:05 on time.
    auto before = j.runs.size();
    vt.pass(30s);
    REQUIRE(j.runs.size() == before + 1);
    CHECK(j.runs.back().scheduled_at == t0() + 5min);
    CHECK_FALSE(j.runs.back().missed);
    s.stop();
  }
}

TEST_CASE("a durable task registered after start runs on its slots") {
  virtual_time vt{t0()};
  auto store = std::make_shared<io_store>();
  journal j;
  botmesh::scheduler s{options(vt, store, j)};
  s.start();
  vt.pass(10s);
  s.every("1m", {.id = "late"}, j.handler());
  vt.settle();
  CHECK(j.runs.empty());
  vt.pass(2min + 5s);
  REQUIRE(j.runs.size() == 2);
  CHECK(j.runs[0].scheduled_at == t0() + 10s + 1min);
  CHECK(j.runs[1].scheduled_at == t0() + 10s + 2min);
  CHECK_FALSE(j.runs[0].missed);
  s.stop();
}

TEST_CASE("without a schedule store the warning is logged once") {
  virtual_time vt{t0()};
  journal j;
  botmesh::scheduler s{options(vt, nullptr, j)};
  s.every("1m", [] {}); // in-memory tasks need no store: no warning
  CHECK(j.logs_containing("no schedule store configured") == 0);
  s.every("1m", {.id = "a"}, j.handler());
  s.every("2m", {.id = "b"}, j.handler());
  s.delay("1m", {.id = "c"}, j.handler());
  s.start();
  vt.pass(3min);
  CHECK(j.runs.size() == 5); // a x3, b x1, c x1
  CHECK(j.logs_containing("no schedule store configured") == 1);
  s.stop();
}

TEST_CASE("two replicas agree on the slots of a zoned task across DST "
          "changes in New York and Madrid, run each once, and catch up "
          "after both were down") {
  struct zone_case {
    const char* zone;
    const char* from;
    std::vector<const char*> slots; // fixed hour: the gap slot shifted
  };
  for (auto& c : {zone_case{"America/New_York", "2026-03-07T00:00:00-05:00",
                            {"2026-03-07T02:30:00-05:00",
                             "2026-03-08T03:30:00-04:00",
                             "2026-03-09T02:30:00-04:00",
                             "2026-03-10T02:30:00-04:00"}},
                  zone_case{"Europe/Madrid", "2026-03-28T00:00:00+01:00",
                            {"2026-03-28T02:30:00+01:00",
                             "2026-03-29T03:30:00+02:00",
                             "2026-03-30T02:30:00+02:00",
                             "2026-03-31T02:30:00+02:00"}}}) {
    CAPTURE(c.zone);
    virtual_time vt{botmesh::parse_iso8601(c.from)};
    auto store = std::make_shared<io_store>();
    journal j;
    auto make = [&](std::string owner) {
      auto o = options(vt, store, j, std::move(owner));
      o.tick = "1m";
      return std::make_unique<botmesh::scheduler>(std::move(o));
    };
    auto a = make("a");
    auto b = make("b");
    for (auto [s, who] : {std::pair{a.get(), "a"}, std::pair{b.get(), "b"}})
      s->schedule("30 2 * * *",
                  {.id = "nightly", .missed = missed_policy::catch_up,
                   .time_zone = c.zone},
                  j.handler(who));
    a->start();
    b->start();
    vt.pass(std::chrono::hours{48}, 1min); // through the change
    REQUIRE(j.runs.size() == 2);
    for (std::size_t i = 0; i < 2; ++i) {
      CHECK(botmesh::format_iso8601(j.runs[i].scheduled_at, c.zone)
            == c.slots[i]);
      CHECK_FALSE(j.runs[i].missed);
    }
    CHECK(j.runs[1].fencing_token > j.runs[0].fencing_token);
    // Both replicas down for two nights; a comes back alone and catches up
    // with the slots both computed (the second one shifted by the gap).
    a->stop();
    b->stop();
    j.runs.clear();
    vt.pass(std::chrono::hours{48}, 10min);
    CHECK(j.runs.empty());
    a->start();
    vt.settle();
    REQUIRE(j.runs.size() == 2);
    CHECK(botmesh::format_iso8601(j.runs[0].scheduled_at, c.zone) == c.slots[2]);
    CHECK(botmesh::format_iso8601(j.runs[1].scheduled_at, c.zone) == c.slots[3]);
    CHECK(j.runs[0].missed);
    CHECK(j.runs[0].task_id == "a/nightly");
    CHECK(j.runs[0].occurrence_key
          == "nightly@" + botmesh::to_iso_utc(j.runs[0].scheduled_at));
    a->stop();
  }
}

namespace {

// A store whose records can vanish (tombstones purged by hand, a Redis that
// restarted without its data): while `vanished`, claims and reads find no
// record; a registration makes it again. Counts the claims meanwhile.
class vanishing_store final : public test::forwarding_schedule_store {
 public:
  bool vanished = false;
  int claims_while_vanished = 0;

  bool blocks() const noexcept override {
    return true;
  }
  std::optional<botmesh::schedule_record> get(std::string_view id) override {
    if (vanished)
      return std::nullopt;
    return inner.get(id);
  }
  botmesh::schedule_record register_task(std::string_view id,
                                         std::string_view spec,
                                         botmesh::time_point first_run,
                                         botmesh::time_point now) override {
    vanished = false;
    return inner.register_task(id, spec, first_run, now);
  }
  std::optional<botmesh::schedule_claim>
  claim(std::string_view id, std::string_view owner, botmesh::time_point now,
        std::chrono::milliseconds lease) override {
    if (vanished) {
      // (Comes back by itself past a bound: a test that fails, not one
      // that spins for good.)
      if (++claims_while_vanished >= 1000)
        vanished = false;
      return std::nullopt;
    }
    return inner.claim(id, owner, now, lease);
  }
};

} // namespace

TEST_CASE("a durable task whose stored record vanished registers it again "
          "and runs its due slot, without claiming in a loop") {
  virtual_time vt{t0()};
  auto store = std::make_shared<vanishing_store>();
  journal j;
  botmesh::scheduler s{options(vt, store, j)};
  s.every("1m", {.id = "v"}, j.handler());
  s.start();
  vt.pass(1min + 5s);
  REQUIRE(j.runs.size() == 1);
  store->vanished = true;
  vt.pass(1min, 100ms);
  vt.pass(5s);
  CHECK(store->claims_while_vanished == 1);
  CHECK(j.logs_containing("has no stored record") == 1);
  REQUIRE(j.runs.size() == 2);
  CHECK(j.runs[1].scheduled_at == t0() + 2min);
  s.stop();
}

TEST_CASE("a one-shot task whose stored record vanished is taken as done, "
          "not run") {
  // Its tombstone may have been what said it ran: run again, a reminder
  // would go out twice.
  virtual_time vt{t0()};
  auto store = std::make_shared<vanishing_store>();
  journal j;
  botmesh::scheduler s{options(vt, store, j)};
  auto h = s.delay("1m", {.id = "once"}, j.handler());
  s.start();
  vt.pass(10s);
  store->vanished = true;
  vt.pass(1min);
  CHECK(j.runs.empty());
  CHECK(store->claims_while_vanished == 1);
  CHECK(j.logs_containing("taken as done") == 1);
  CHECK_FALSE(h.active());
  s.stop();
}
