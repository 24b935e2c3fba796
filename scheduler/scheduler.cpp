#include <botmesh/scheduler/scheduler.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/internal/worker_pool.hpp>
#include <botmesh/scheduler/cron.hpp>
#include <botmesh/scheduler/internal/task.hpp>
#include <botmesh/stores/memory_schedule_store.hpp>
#include <botmesh/stores/store.hpp>

namespace botmesh {

std::string_view to_string(missed_policy p) noexcept {
  switch (p) {
    case missed_policy::skip:
      return "skip";
    case missed_policy::run_once:
      return "run-once";
    case missed_policy::catch_up:
      return "catch-up";
  }
  return "skip";
}

namespace {

void append_escaped(std::string& out, std::string_view part) {
  for (char c : part) {
    if (c == '%')
      out += "%25";
    else if (c == ':')
      out += "%3A";
    else
      out += c;
  }
}

} // namespace

std::string task_namespace(std::string_view bot_id,
                           std::string_view provider_id,
                           std::string_view connection_id) {
  std::string out;
  append_escaped(out, bot_id);
  out += ':';
  append_escaped(out, provider_id);
  out += ':';
  append_escaped(out, connection_id);
  return out;
}

struct scheduled_task::state {
  std::weak_ptr<scheduler::impl> owner;
  std::uint64_t handle = 0;
  std::string id;
  std::string zone;
  std::atomic<bool> active{true};
};

namespace {

using ms = std::chrono::milliseconds;
using internal::run_plan;
using internal::task;
using internal::task_kind;

struct active_claim {
  std::string stored_id;
  std::uint64_t token = 0;
  ms lease{0};
  time_point next_renew{};
  std::shared_ptr<std::stop_source> stop;
};

} // namespace

struct scheduler::impl : std::enable_shared_from_this<impl> {
  explicit impl(scheduler_options o) : opts(std::move(o)) {
    clk = opts.clock ? opts.clock : &clock::system();
    if (opts.tick.count() <= 0)
      throw invalid_argument_error("tick", "scheduler tick must be positive");
    validate_time_zone(opts.time_zone);
    owner = opts.owner.empty() ? detail::random_token() : opts.owner;
    ensure_pool();
  }

  // The handler pool: created with the scheduler, and again by start() or
  // poll() after a stop() shut it down. Caller holds mtx (or is the
  // constructor).
  void ensure_pool() {
    if (!pool)
      pool = std::make_unique<internal::worker_pool>(
        std::min<std::size_t>(2, std::max<std::size_t>(1, opts.threads)),
        std::max<std::size_t>(1, opts.threads));
  }

  void log(std::string_view text) {
    if (opts.log)
      opts.log(text);
    else
      std::fprintf(stderr, "botmesh scheduler: %.*s\n",
                   static_cast<int>(text.size()), text.data());
  }

  ms grace() const {
    return opts.tick.ms() + (opts.lease ? 2 * opts.leader_ttl.ms() : ms{0});
  }

  schedule_store& sched_store() {
    // Caller holds mtx.
    if (!store) {
      if (opts.store) {
        store = opts.store;
      } else {
        store = std::make_shared<memory_schedule_store>();
        log("no schedule store configured: durable tasks run, but their "
            "calendars do not survive a restart");
      }
      store->start();
    }
    return *store;
  }

  // -- registration ----------------------------------------------------------

  scheduled_task add(task t) {
    auto now = clk->now();
    auto st = std::make_shared<scheduled_task::state>();
    st->owner = weak_from_this();
    st->id = t.opts.id;
    st->zone = t.cron ? t.cron->zone() : std::string{};
    t.st = st;
    if (t.kind == task_kind::cron) {
      auto n = t.cron->next_after(now);
      if (!n)
        throw invalid_argument_error("cron", "cron expression never runs");
      t.next = *n;
    } else {
      t.next = now + t.interval;
    }
    std::unique_lock guard{mtx};
    if (t.durable) {
      if (t.opts.max_catch_up == 0)
        throw invalid_argument_error("max_catch_up",
                                     "max_catch_up must be at least 1");
      if (t.opts.lease.count() <= 0)
        throw invalid_argument_error("lease", "lease must be positive");
      t.stored_id = opts.ns.empty() ? t.opts.id : opts.ns + ":" + t.opts.id;
      if (by_id.count(t.stored_id))
        throw invalid_argument_error(
          "id", fmt::format("task id \"{}\" is already registered", t.opts.id));
      auto& s = sched_store();
      auto rec = s.register_task(t.stored_id, spec_of(t), t.next, now);
      t.next = rec.next_run_at;
      if (rec.done)
        st->active = false; // a one-shot that already ran: its tombstone
    }
    st->handle = next_handle++;
    if (t.durable)
      by_id[t.stored_id] = st->handle;
    tasks.emplace(st->handle, std::move(t));
    cv.notify_all();
    scheduled_task handle;
    handle.state_ = st;
    return handle;
  }

  static std::string spec_of(const task& t) {
    switch (t.kind) {
      case task_kind::every:
        return fmt::format("every {}", t.interval.count());
      case task_kind::cron:
        return "cron " + t.cron->spec();
      case task_kind::delay:
        return fmt::format("delay {}", t.interval.count());
    }
    return {};
  }

  void cancel(std::uint64_t handle) {
    std::string stored;
    {
      std::lock_guard guard{mtx};
      auto i = tasks.find(handle);
      if (i == tasks.end())
        return;
      i->second.st->active = false;
      if (i->second.durable) {
        stored = i->second.stored_id;
        by_id.erase(stored);
      }
      tasks.erase(i);
    }
    if (!stored.empty())
      guarded([&] { sched_store_locked().remove(stored, clk->now()); },
              "removing " + stored);
  }

  schedule_store& sched_store_locked() {
    std::lock_guard guard{mtx};
    return sched_store();
  }

  bool forget(std::string_view id) {
    auto stored = opts.ns.empty() ? std::string{id}
                                  : opts.ns + ":" + std::string{id};
    std::optional<std::uint64_t> handle;
    {
      std::lock_guard guard{mtx};
      if (auto i = by_id.find(stored); i != by_id.end())
        handle = i->second;
    }
    if (handle) {
      std::lock_guard guard{mtx};
      auto i = tasks.find(*handle);
      if (i != tasks.end()) {
        i->second.st->active = false;
        tasks.erase(i);
      }
      by_id.erase(stored);
    }
    return sched_store_locked().remove(stored, clk->now());
  }

  template <class F>
  void guarded(F&& f, const std::string& what) {
    try {
      f();
    } catch (const std::exception& e) {
      log(fmt::format("{} failed: {}", what, e.what()));
    }
  }

  // -- the tick --------------------------------------------------------------

  void tick(time_point now) {
    refresh_leadership(now);
    renew_claims(now);
    check_orphans();
    std::vector<std::uint64_t> due_memory;
    std::vector<std::uint64_t> due_durable;
    {
      std::lock_guard guard{mtx};
      if (stopping)
        return;
      for (auto& [h, t] : tasks) {
        if (t.running || !t.st->active)
          continue;
        if (!t.durable) {
          if (t.next <= now)
            due_memory.push_back(h);
        } else if (due_at(t) <= now) {
          due_durable.push_back(h);
        }
      }
      for (auto h : due_memory)
        start_memory_run(tasks.at(h));
    }
    for (auto h : due_durable)
      try_claim(h, now);
  }

  time_point due_at(const task& t) const {
    // Followers leave on-time claims to the leader.
    return is_leader ? t.next : t.next + opts.leader_ttl.ms();
  }

  void refresh_leadership(time_point now) {
    if (!opts.lease)
      return;
    try {
      is_leader = opts.lease
                    ->try_acquire(leader_name(), owner, now,
                                  opts.leader_ttl.ms())
                    .has_value();
    } catch (const std::exception& e) {
      is_leader = false;
      log(fmt::format("leader lease failed: {}", e.what()));
    }
  }

  std::string leader_name() const {
    return opts.ns.empty() ? "scheduler:leader" : opts.ns + ":scheduler:leader";
  }

  void renew_claims(time_point now) {
    std::vector<active_claim> due;
    {
      std::lock_guard guard{mtx};
      for (auto& [id, c] : claims)
        if (c.next_renew <= now)
          due.push_back(c);
    }
    for (auto& c : due) {
      bool ok = false;
      try {
        ok = store->renew(c.stored_id, owner, c.token, now, c.lease);
      } catch (const std::exception& e) {
        log(fmt::format("renewing the lease of {} failed: {}", c.stored_id,
                        e.what()));
        continue; // try again next tick; the lease may still hold
      }
      std::lock_guard guard{mtx};
      auto i = claims.find(c.stored_id);
      if (i == claims.end() || i->second.token != c.token)
        continue;
      if (ok) {
        i->second.next_renew = now + c.lease / 3;
      } else {
        log(fmt::format("lease of {} (token {}) lost: its run is asked to "
                        "stop",
                        c.stored_id, c.token));
        i->second.stop->request_stop();
        i->second.next_renew = time_point::max();
      }
    }
  }

  void check_orphans() {
    {
      std::lock_guard guard{mtx};
      if (orphans_checked || !started || !store)
        return;
      orphans_checked = true;
    }
    std::vector<schedule_record> all;
    try {
      all = store->list();
    } catch (const std::exception& e) {
      log(fmt::format("listing schedules failed: {}", e.what()));
      return;
    }
    auto prefix = opts.ns.empty() ? std::string{} : opts.ns + ":";
    std::lock_guard guard{mtx};
    for (auto& rec : all) {
      if (rec.deleted || !rec.id.starts_with(prefix) || by_id.count(rec.id))
        continue;
      if (logged_orphans.insert(rec.id).second)
        log(fmt::format("orphan schedule {}: stored, but no task with this id "
                        "is registered; kept and never run (forget_task "
                        "removes it)",
                        rec.id));
    }
  }

  // -- in-memory runs --------------------------------------------------------

  void start_memory_run(task& t) {
    // Caller holds mtx.
    t.running = true;
    ++in_flight;
    auto stop = std::make_shared<std::stop_source>();
    run_stops.insert(stop);
    scheduled_run run;
    run.scheduled_at = t.next;
    run.stop = stop->get_token();
    auto fn = t.fn;
    auto handle = t.st->handle;
    pool->post([self = shared_from_this(), fn, run, handle, stop] {
      self->call(fn, run, "task");
      std::lock_guard guard{self->mtx};
      self->run_stops.erase(stop);
      if (auto i = self->tasks.find(handle); i != self->tasks.end()) {
        auto& t = i->second;
        t.running = false;
        auto next = t.first_slot_after(run.scheduled_at, self->clk->now());
        if (next) {
          t.next = *next;
        } else {
          t.st->active = false;
          self->tasks.erase(i);
        }
      }
      self->finish_run();
    });
  }

  void call(const run_handler& fn, const scheduled_run& run,
            std::string_view what) {
    try {
      fn(run);
    } catch (const std::exception& e) {
      log(fmt::format("{} {} failed: {}", what,
                      run.occurrence_key.empty() ? "run" : run.occurrence_key,
                      e.what()));
    } catch (...) {
      log(fmt::format("{} {} failed", what, run.occurrence_key));
    }
  }

  void finish_run() {
    // Caller holds mtx.
    --in_flight;
    idle_cv.notify_all();
    cv.notify_all();
  }

  // -- durable runs ----------------------------------------------------------

  void try_claim(std::uint64_t handle, time_point now) {
    std::string stored;
    ms lease;
    {
      std::lock_guard guard{mtx};
      auto i = tasks.find(handle);
      if (i == tasks.end() || i->second.running || stopping)
        return;
      stored = i->second.stored_id;
      lease = i->second.opts.lease.ms();
      i->second.running = true; // no second claim attempt from this scheduler
    }
    std::optional<schedule_claim> claim;
    std::optional<schedule_record> current;
    try {
      claim = store->claim(stored, owner, now, lease);
      if (!claim)
        current = store->get(stored);
    } catch (const std::exception& e) {
      log(fmt::format("claiming {} failed: {}", stored, e.what()));
    }
    std::lock_guard guard{mtx};
    auto i = tasks.find(handle);
    if (i == tasks.end()) {
      if (claim) // cancelled meanwhile: give the slot back untouched
        release_claim_locked(stored, *claim);
      return;
    }
    auto& t = i->second;
    if (!claim) {
      t.running = false;
      if (!current)
        return; // store error: retry next tick
      if (current->deleted) {
        log(fmt::format("schedule {} was removed elsewhere: the task stops",
                        stored));
        t.st->active = false;
        return;
      }
      if (current->done) {
        t.st->active = false;
        return;
      }
      t.next = current->next_run_at;
      // Someone runs it: look again when their lease ends.
      if (!current->lease_owner.empty() && current->lease_until > now)
        t.next = std::max(t.next, current->lease_until);
      return;
    }
    auto plan = make_plan(t, *claim, now);
    auto stop = std::make_shared<std::stop_source>();
    claims[stored] = active_claim{stored, claim->token, lease,
                                  now + lease / 3, stop};
    ++in_flight;
    pool->post([self = shared_from_this(), handle, stored,
                c = std::move(*claim), plan = std::move(plan), stop] {
      self->run_durable(handle, stored, c, plan, stop);
    });
  }

  void release_claim_locked(const std::string& stored,
                            const schedule_claim& c) {
    auto rec = c.record;
    store->commit(stored, owner, c.token, rec.next_run_at, false, clk->now());
  }

  run_plan make_plan(const task& t, const schedule_claim& c, time_point now) {
    std::size_t skipped = 0;
    auto p = internal::plan_claim(t, c, now, grace(), skipped);
    if (skipped > 0)
      log(fmt::format("{}: catch-up runs the {} oldest missed slots and "
                      "skips {} more (max_catch_up)",
                      t.stored_id, p.slots.size(), skipped));
    return p;
  }

  void run_durable(std::uint64_t handle, const std::string& stored,
                   const schedule_claim& c, const run_plan& plan,
                   const std::shared_ptr<std::stop_source>& stop) {
    run_handler fn;
    task_options topts;
    {
      std::lock_guard guard{mtx};
      auto i = tasks.find(handle);
      if (i != tasks.end()) {
        fn = i->second.fn;
        topts = i->second.opts;
      }
    }
    std::optional<time_point> first_unrun;
    for (auto slot : plan.slots) {
      if (stop->stop_requested() || !fn) {
        first_unrun = slot;
        break;
      }
      scheduled_run run;
      run.task_id = topts.id;
      run.scheduled_at = slot;
      run.occurrence_key = topts.id + "@" + to_iso_utc(slot);
      run.fencing_token = c.token;
      run.missed = plan.missed;
      run.stop = stop->get_token();
      call(fn, run, "durable task");
    }
    auto end = clk->now();
    std::optional<time_point> next;
    bool done = false;
    {
      std::lock_guard guard{mtx};
      auto i = tasks.find(handle);
      if (first_unrun) {
        next = first_unrun; // a stop: resume from the first slot not run
      } else if (plan.one_shot) {
        next = c.record.next_run_at;
        done = true;
      } else if (plan.next_if_completed) {
        next = plan.next_if_completed;
      } else if (i != tasks.end()) {
        auto& t = i->second;
        auto slot = c.record.next_run_at;
        next = t.opts.missed == missed_policy::skip ? t.first_slot_after(slot, end)
                                                    : t.slot_after(slot);
      }
    }
    bool committed = false;
    if (next) {
      try {
        committed = store->commit(stored, owner, c.token, *next, done, end);
        if (!committed)
          log(fmt::format("commit of {} with token {} rejected: a newer claim "
                          "exists (this executor was stale)",
                          stored, c.token));
      } catch (const std::exception& e) {
        log(fmt::format("committing {} failed: {}", stored, e.what()));
      }
    }
    std::lock_guard guard{mtx};
    if (auto ci = claims.find(stored); ci != claims.end() && ci->second.token == c.token)
      claims.erase(ci);
    if (auto i = tasks.find(handle); i != tasks.end()) {
      auto& t = i->second;
      t.running = false;
      if (committed && next)
        t.next = *next;
      if (committed && done)
        t.st->active = false;
    }
    finish_run();
  }

  // -- lifecycle -------------------------------------------------------------

  void start() {
    std::lock_guard guard{mtx};
    if (started)
      return;
    started = true;
    stopping = false;
    orphans_checked = false;
    ensure_pool();
    timer = std::thread{[self = shared_from_this()] { self->timer_loop(); }};
  }

  void timer_loop() {
    for (;;) {
      tick(clk->now());
      std::unique_lock guard{mtx};
      if (stopping)
        return;
      auto now = clk->now();
      auto wake = now + opts.tick.ms();
      for (auto& [h, t] : tasks)
        if (!t.running && t.st->active)
          wake = std::min(wake, t.durable ? due_at(t) : t.next);
      for (auto& [id, c] : claims)
        wake = std::min(wake, c.next_renew);
      if (wake > now)
        cv.wait_for(guard, wake - now);
      if (stopping)
        return;
    }
  }

  void stop() {
    std::thread t;
    {
      std::lock_guard guard{mtx};
      stopping = true;
      for (auto& [id, c] : claims)
        c.stop->request_stop();
      for (auto& s : run_stops)
        s->request_stop();
      t = std::move(timer);
      cv.notify_all();
    }
    if (t.joinable())
      t.join();
    if (pool) {
      pool->shutdown();
      pool.reset();
    }
    std::lock_guard guard{mtx};
    started = false;
    if (opts.lease && is_leader) {
      try {
        opts.lease->release(leader_name(), owner);
      } catch (...) {
        // nop: the lease expires on its own
      }
    }
  }

  void poll() {
    {
      std::lock_guard guard{mtx};
      ensure_pool();
      stopping = false;
    }
    tick(clk->now());
    std::unique_lock guard{mtx};
    idle_cv.wait(guard, [this] { return in_flight == 0; });
  }

  scheduler_options opts;
  const clock* clk = nullptr;
  std::shared_ptr<schedule_store> store;
  std::string owner;
  std::unique_ptr<internal::worker_pool> pool;

  std::mutex mtx;
  std::condition_variable cv;
  std::condition_variable idle_cv;
  std::map<std::uint64_t, task> tasks;
  std::map<std::string, std::uint64_t> by_id;
  std::map<std::string, active_claim> claims;
  std::set<std::shared_ptr<std::stop_source>> run_stops;
  std::set<std::string> logged_orphans;
  std::uint64_t next_handle = 1;
  std::size_t in_flight = 0;
  bool started = false;
  bool stopping = false;
  bool orphans_checked = false;
  std::atomic<bool> is_leader{true};
  std::thread timer;
};

// -- scheduled_task -------------------------------------------------------------

void scheduled_task::cancel() {
  if (!state_)
    return;
  state_->active = false;
  if (auto owner = state_->owner.lock())
    owner->cancel(state_->handle);
}

const std::string& scheduled_task::id() const noexcept {
  static const std::string empty;
  return state_ ? state_->id : empty;
}

const std::string& scheduled_task::time_zone() const noexcept {
  static const std::string empty;
  return state_ ? state_->zone : empty;
}

bool scheduled_task::active() const noexcept {
  return state_ && state_->active.load();
}

// -- scheduler ------------------------------------------------------------------

namespace {

scheduler::run_handler wrap(scheduler::job fn) {
  return [fn = std::move(fn)](const scheduled_run&) { fn(); };
}

void reject_zone(const task_options& o) {
  if (!o.time_zone.empty())
    throw invalid_argument_error(
      "time_zone", "time_zone applies to cron tasks only, not to every/delay");
}

} // namespace

scheduler::scheduler(scheduler_options opts)
  : impl_(std::make_shared<impl>(std::move(opts))) {
  if (impl_->opts.lease)
    impl_->is_leader = false; // until the lease says otherwise
}

scheduler::~scheduler() {
  impl_->stop();
}

scheduled_task scheduler::every(duration interval, job fn) {
  return every(interval, {}, wrap(std::move(fn)));
}

scheduled_task scheduler::every(duration interval, task_options opts,
                                run_handler fn) {
  if (interval.count() <= 0)
    throw invalid_argument_error("interval",
                                 "every() needs a positive interval, got "
                                   + format_duration(interval.ms()));
  reject_zone(opts);
  task t;
  t.kind = task_kind::every;
  t.interval = interval.ms();
  t.durable = !opts.id.empty();
  t.opts = std::move(opts);
  t.fn = std::move(fn);
  return impl_->add(std::move(t));
}

scheduled_task scheduler::schedule(std::string_view cron, job fn) {
  return schedule(cron, {}, wrap(std::move(fn)));
}

scheduled_task scheduler::schedule(std::string_view cron, task_options opts,
                                   run_handler fn) {
  task t;
  t.kind = task_kind::cron;
  auto zone = opts.time_zone.empty() ? impl_->opts.time_zone : opts.time_zone;
  t.cron.emplace(cron, zone, impl_->clk->now());
  t.durable = !opts.id.empty();
  t.opts = std::move(opts);
  t.fn = std::move(fn);
  return impl_->add(std::move(t));
}

scheduled_task scheduler::delay(duration d, job fn) {
  return delay(d, {}, wrap(std::move(fn)));
}

scheduled_task scheduler::delay(duration d, task_options opts, run_handler fn) {
  reject_zone(opts);
  task t;
  t.kind = task_kind::delay;
  t.interval = d.ms();
  t.durable = !opts.id.empty();
  t.opts = std::move(opts);
  t.fn = std::move(fn);
  return impl_->add(std::move(t));
}

bool scheduler::forget_task(std::string_view id) {
  return impl_->forget(id);
}

void scheduler::start() {
  impl_->start();
}

void scheduler::stop() {
  impl_->stop();
}

void scheduler::poll() {
  impl_->poll();
}

std::chrono::milliseconds scheduler::grace() const noexcept {
  return impl_->grace();
}

} // namespace botmesh
