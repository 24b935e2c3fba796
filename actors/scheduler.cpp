// The scheduler facade: checks arguments, keeps the registry of tasks, and
// drives the actors (timer actor, one task actor per durable id, the
// store-I/O actor). The mutex guards the registry only: no store call and
// no wait happens under it.

#include <botmesh/actors/scheduler.hpp>
#include <botmesh/actors/internal/caf_logger.hpp>
#include <botmesh/actors/internal/end_actors.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <fmt/format.h>

#include <botmesh/actors/internal/scheduler_engine.hpp>
#include <botmesh/actors/messages.hpp>
#include <botmesh/actors/system_setup.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/internal/deferred_stop.hpp>
#include <botmesh/runtime/core/internal/text.hpp>
#include <botmesh/runtime/core/internal/worker_pool.hpp>
#include <botmesh/scheduler/cron.hpp>
#include <botmesh/stores/memory_schedule_store.hpp>
#include <botmesh/stores/store.hpp>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::internal::poll_ticket>)

namespace botmesh {

// -- the engine's shared parts --------------------------------------------------

namespace internal {

void scheduler_engine::log(std::string_view text) const {
  if (!opts.log) {
    log::warn("scheduler", text, {.replica = owner});
    return;
  }
  // User code, called from task actors (mid-claim) and handler jobs: a
  // throw costs its line, never the actor holding a claim (stop() would
  // wait for its run forever) nor a pool thread.
  try {
    opts.log(text);
  } catch (...) {
    log::warn("scheduler",
              fmt::format("the log callback threw ({}); its line: {}",
                          what_of(std::current_exception()), text),
              {.replica = owner});
  }
}

void scheduler_engine::log_failure(std::string_view text) {
  store_errors.fetch_add(1, std::memory_order_relaxed);
  // No task: nobody waits for this backend (a bot without tasks still
  // renews the leader lease every tick).
  if (tasks.load() == 0)
    return;
  std::uint64_t held = 0;
  if (!failures_.allow(held))
    return;
  if (held == 0)
    this->log(text);
  else
    this->log(fmt::format("{} ({} similar failures not logged in the last "
                          "30s)",
                          text, held));
}

void scheduler_engine::failure_ended() {
  if (failures_.reset() && tasks.load() != 0)
    this->log("store and lease calls succeed again");
}

void scheduler_engine::run_started(std::size_t n) {
  // Sequentially consistent, as are `paused` and wait_idle's read: an actor
  // counts a run and then reads `paused`, stop() sets `paused` and then
  // reads the count, so at least one of them sees the other.
  in_flight_.fetch_add(n);
}

void scheduler_engine::run_finished(std::size_t n) {
  // The lock only for the last one: a waiter checks under it, so it either
  // sees zero or is waiting when this notifies.
  if (in_flight_.fetch_sub(n, std::memory_order_acq_rel) == n) {
    std::lock_guard guard{mtx_};
    idle_cv_.notify_all();
  }
}

void scheduler_engine::wait_idle() {
  std::unique_lock guard{mtx_};
  idle_cv_.wait(guard, [this] { return in_flight_.load() == 0; });
}

} // namespace internal

using internal::task;
using internal::task_kind;

struct scheduler::impl final : task_owner,
                               std::enable_shared_from_this<scheduler::impl> {
  explicit impl(scheduler_options o)
    : eng(std::make_shared<internal::scheduler_engine>()) {
    if (o.tick.count() <= 0)
      throw invalid_argument_error("tick", "scheduler tick must be positive");
    validate_time_zone(o.time_zone);
    eng->clk = o.clock ? o.clock : &clock::system();
    eng->owner = o.owner.empty() ? detail::random_token() : o.owner;
    eng->leader = !o.lease; // until the lease says otherwise
    if (o.executor) {
      eng->execute = o.executor;
    } else {
      auto threads = std::max<std::size_t>(1, o.threads);
      pool = std::make_shared<internal::worker_pool>(std::min<std::size_t>(2, threads),
                                                     threads);
      eng->execute = [p = pool](std::function<void()> job) {
        p->post(std::move(job));
      };
      eng->execute_batch = [p = pool](std::vector<std::function<void()>>& jobs) {
        p->post_batch(jobs);
      };
    }
    if (o.system) {
      sys = o.system;
    } else {
      // Two workers where there are two cores: the task actors' messages
      // (two activations per run) are what bounds durable runs per second,
      // and with one worker they all wait for one core while short handlers
      // leave the other idle (bench_scheduler durable: 5-20% more runs per
      // second with two). More than two only contend with the handler pool
      // for the cores.
      cfg = std::make_unique<caf::actor_system_config>();
      configure_scheduler(
        *cfg, std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 2),
        64);
      cfg->set("logger.file-verbosity", caf::atom("quiet"));
      cfg->set("logger.console-verbosity", caf::atom("quiet"));
      own_sys = std::make_unique<caf::actor_system>(*cfg);
      internal::release_caf_logger();
      sys = own_sys.get();
    }
    eng->opts = std::move(o);
    eng->io = internal::spawn_store_io(*sys);
    timers = internal::spawn_timer_actor(*sys, eng);
    eng->timers.actor = timers;
  }

  ~impl() override {
    stopper.join(true);
    stop();
    std::vector<caf::actor> all;
    {
      std::lock_guard guard{mtx};
      for (auto& [h, d] : durable)
        all.push_back(d.actor);
      durable.clear();
    }
    all.push_back(timers);
    all.push_back(eng->io);
    // On CAF's deterministic scheduler nothing runs while this thread
    // waits (the test that drives it runs what is left).
    bool driven = dynamic_cast<caf::scheduler::test_coordinator*>(
                    &sys->scheduler())
                  != nullptr;
    if (own_sys || driven) {
      for (auto& a : all)
        caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    } else {
      // An application's system outlives the scheduler: its actors end
      // before the scheduler goes, so none is left behind in it. (The I/O
      // actor may first finish a store call in flight; a system of our own
      // waits for it the same way.)
      internal::end_and_wait(*sys, all, [this](std::size_t left, int seconds) {
        eng->log(fmt::format("stopping: {} scheduler actors have not ended "
                             "for {} s",
                             left, seconds));
      });
    }
    all.clear();
    timers = nullptr;
    eng->timers.actor = nullptr; // stop() waited for every run: none sends
    // The timer and task actors hold their own copy of the handle: clearing
    // this one races with nobody, and the detached I/O actor can end (a
    // system of our own waits for that) once they are gone.
    eng->io = nullptr;
    own_sys.reset(); // waits for the actors
    if (pool)
      pool->shutdown();
  }

  // The schedule store, created on first use (the caller's thread).
  schedule_store& store() {
    std::call_once(store_once, [this] {
      if (eng->opts.store) {
        eng->store = eng->opts.store;
      } else {
        eng->store = std::make_shared<memory_schedule_store>();
        eng->log("no schedule store configured: durable tasks run, but their "
                 "calendars do not survive a restart");
      }
      eng->store->start();
      eng->async_store =
        dynamic_cast<internal::async_schedule_store*>(eng->store.get());
      eng->store_ready.store(true, std::memory_order_release);
    });
    return *eng->store;
  }

  std::string stored_id(std::string_view id) const {
    return eng->opts.ns.empty() ? std::string{id}
                                : eng->opts.ns + ":" + std::string{id};
  }

  // -- registration ----------------------------------------------------------

  scheduled_task add(task t) {
    auto now = eng->now();
    // An in-memory task's entry in the timer actor is the state its handles
    // share: one allocation per task.
    std::shared_ptr<internal::timer_entry> entry;
    std::shared_ptr<scheduled_task::state> st;
    if (t.durable) {
      st = std::make_shared<scheduled_task::state>();
    } else {
      entry = std::make_shared<internal::timer_entry>();
      st = entry;
    }
    st->owner = weak_from_this();
    if (!t.opts.id.empty() || t.cron)
      st->named.reset(new scheduled_task::state::names{
        t.opts.id, t.cron ? t.cron->zone() : std::string{}});
    if (t.kind == task_kind::cron) {
      auto n = t.cron->next_after(now);
      if (!n)
        throw invalid_argument_error("cron", "cron expression never runs");
      t.next = *n;
    } else {
      t.next = now + t.interval;
    }
    if (!t.durable) {
      // (an in-memory task is found by its entry, never by its handle)
      st->handle = next_handle.fetch_add(1, std::memory_order_relaxed);
      ++eng->tasks;
      entry->grid = std::move(static_cast<internal::task_grid&>(t));
      entry->next = t.next;
      entry->fn = std::move(t.fn);
      entry->job = std::move(t.job);
      if (eng->timers.add(std::move(entry)))
        caf::anon_send(timers, timer_add_atom::value);
      return scheduled_task{st};
    }
    t.st = st;
    if (t.opts.max_catch_up == 0)
      throw invalid_argument_error("max_catch_up",
                                   "max_catch_up must be at least 1");
    // Renewed every third, and longer than a store's round trip: a lease
    // of a few ms renews back to back, or lapses before its claim's reply
    // (the task then never runs).
    if (t.opts.lease.count() < 100)
      throw invalid_argument_error(
        "lease", fmt::format("lease must be at least 100ms, got {}",
                             format_duration(t.opts.lease.ms())));
    t.stored_id = stored_id(t.opts.id);
    {
      std::lock_guard guard{mtx};
      if (by_id.count(t.stored_id))
        throw invalid_argument_error(
          "id", fmt::format("task id \"{}\" is already registered", t.opts.id));
      st->handle = next_handle.fetch_add(1, std::memory_order_relaxed);
      by_id[t.stored_id] = st->handle; // reserved while the store answers
    }
    try {
      auto rec =
        store().register_task(t.stored_id, internal::spec_of(t), t.next, now);
      t.next = rec.next_run_at;
      if (rec.done)
        st->active = false; // a one-shot that already ran: its tombstone
    } catch (...) {
      std::lock_guard guard{mtx};
      by_id.erase(t.stored_id);
      throw;
    }
    auto actor = internal::spawn_task_actor(*sys, eng,
                                            std::make_shared<task>(std::move(t)));
    {
      std::lock_guard guard{mtx};
      durable[st->handle] = {actor, st};
    }
    ++eng->tasks;
    if (eng->started.load())
      caf::anon_send(actor, task_resume_atom::value);
    return scheduled_task{st};
  }

  // Ends a registered task: the timer actor drops an in-memory one (given
  // its state `task`); a durable one's actor exits once idle. Returns the
  // stored id of a durable task ("" otherwise).
  std::string detach(std::uint64_t handle,
                     const std::shared_ptr<scheduled_task::state>* task) {
    // An in-memory task (no id; its state is its timer entry) is not in
    // the registry: its entry says whether it is still registered.
    if (task != nullptr && !(*task)->durable()) {
      auto entry = std::static_pointer_cast<internal::timer_entry>(*task);
      if (entry->registered.exchange(false)) {
        --eng->tasks;
        if (eng->timers.cancel(std::move(entry)))
          caf::anon_send(timers, timer_add_atom::value);
      }
      return {};
    }
    std::optional<caf::actor> actor;
    std::string stored;
    {
      std::lock_guard guard{mtx};
      if (auto i = durable.find(handle); i != durable.end()) {
        actor = i->second.actor;
        // Cleared here, before the caller returns (forget_task has no
        // handle to clear it): a catch-up's next slot must not start
        // while the cancel is on its way to the actor.
        i->second.st->active = false;
        durable.erase(i);
        for (auto j = by_id.begin(); j != by_id.end(); ++j)
          if (j->second == handle) {
            stored = j->first;
            by_id.erase(j);
            break;
          }
        --eng->tasks;
      }
    }
    if (actor)
      caf::anon_send(*actor, task_cancel_atom::value);
    return stored;
  }

  void removed(const std::shared_ptr<scheduled_task::state>& task) override {
    detach(task->handle, &task);
  }

  void cancel(const std::shared_ptr<scheduled_task::state>& task) override {
    auto stored = detach(task->handle, &task);
    if (stored.empty())
      return;
    try {
      store().remove(stored, eng->now());
    } catch (const std::exception& e) {
      // Said to the caller, not only logged: the row stays live, and the
      // replicas that register the id go on running it.
      auto why = fmt::format("cancelling task {}: its stored row was not "
                             "removed ({}); it no longer runs here, and "
                             "forget_task removes the row",
                             stored, e.what());
      eng->log(why);
      throw error(errc::store_error, why);
    }
  }

  bool forget(std::string_view id) {
    auto stored = stored_id(id);
    std::optional<std::uint64_t> handle;
    {
      std::lock_guard guard{mtx};
      if (auto i = by_id.find(stored); i != by_id.end())
        handle = i->second;
    }
    if (handle)
      detach(*handle, nullptr); // ids are durable tasks only
    return store().remove(stored, eng->now());
  }

  // -- lifecycle -------------------------------------------------------------

  std::vector<caf::actor> task_actors() {
    std::lock_guard guard{mtx};
    std::vector<caf::actor> out;
    out.reserve(durable.size());
    for (auto& [h, d] : durable)
      out.push_back(d.actor);
    return out;
  }

  std::vector<std::string> registered_ids() {
    std::lock_guard guard{mtx};
    std::vector<std::string> out;
    for (auto& [id, h] : by_id)
      out.push_back(id);
    return out;
  }

  void start() {
    // After a stop asked by a handler: that stop ends first (it would undo
    // this start as it went on).
    if (!on_handler_thread())
      stopper.join();
    if (eng->started.exchange(true))
      return;
    eng->paused = false;
    caf::anon_send(timers, task_resume_atom::value, registered_ids());
    for (auto& a : task_actors())
      caf::anon_send(a, task_resume_atom::value);
  }

  // stop() on one of this scheduler's own handler threads (a task that
  // stops its scheduler, or its bot) would wait for that very handler: the
  // wait goes to a thread of its own, which start(), the next stop() from
  // elsewhere and the destructor join. No new run starts from the call on.
  internal::deferred_stop stopper;

  bool on_handler_thread() const noexcept {
    // (The pool is tagged with the scheduler, which the bot knows too.)
    return pool && internal::worker_pool::current_owner() == tag;
  }
  const void* tag = nullptr; // the scheduler, set once at construction

  void stop() {
    if (on_handler_thread()) {
      eng->paused = true;
      stopper.begin_inside([this] { stop_now(); });
      return;
    }
    stopper.join();
    stop_now();
  }

  void stop_now() {
    eng->paused = true;
    bool was_started = eng->started.exchange(false);
    caf::anon_send(timers, task_pause_atom::value);
    for (auto& a : task_actors())
      caf::anon_send(a, task_pause_atom::value);
    eng->wait_idle();
    // Claims whose replies were lost are given back before stop() returns
    // (bounded: such a claim also lapses on its own after its lease).
    if (eng->lost_claims.load() > 0)
      await_idle(
        [&](const auto& ticket) {
          for (auto& a : task_actors())
            caf::anon_send(a, task_give_back_atom::value, ticket);
        },
        std::chrono::seconds{10});
    // Given back whether or not this replica knows it leads: an acquire
    // whose reply was lost may have won it (release only ends the lease
    // this owner holds), and another replica would wait out leader_ttl.
    // After the acquire in flight, if any, answered: it would take the
    // lease again (bounded: a hung store call; the lease then expires).
    if (was_started && eng->opts.lease) {
      await_idle(
        [&](const auto& ticket) {
          caf::anon_send(timers, leader_atom::value, ticket);
        },
        std::chrono::seconds{10});
      try {
        eng->opts.lease->release(eng->leader_name(), eng->owner);
      } catch (...) {
        // nop: the lease expires on its own
      }
      eng->leader = false;
    }
  }

  void poll() {
    eng->paused = false;
    // The leader lease first: it decides which runs are due.
    await_idle([&](const auto& ticket) {
      caf::anon_send(timers, leader_atom::value, ticket);
    });
    // Every actor at once (they work in parallel).
    await_idle([&](const auto& ticket) {
      for (auto& a : task_actors())
        caf::anon_send(a, task_poll_atom::value, ticket);
      caf::anon_send(timers, task_poll_atom::value, ticket);
    });
  }

  // Hands one ticket to the actors `send` asks; returns once each let it
  // go (idle, or gone).
  template <class Send>
  static void await_idle(Send send, std::optional<std::chrono::milliseconds>
                                      bound = std::nullopt) {
    auto ticket = std::make_shared<internal::poll_ticket>();
    auto idle = ticket->future();
    send(ticket);
    ticket.reset();
    if (bound)
      idle.wait_for(*bound);
    else
      idle.wait();
  }

  std::shared_ptr<internal::scheduler_engine> eng;
  std::shared_ptr<internal::worker_pool> pool;
  std::unique_ptr<caf::actor_system_config> cfg;
  std::unique_ptr<caf::actor_system> own_sys;
  caf::actor_system* sys = nullptr;
  caf::actor timers;
  std::once_flag store_once;

  std::atomic<std::uint64_t> next_handle{1};
  std::mutex mtx; // the registry below
  // A durable task's actor and the state its handles share.
  struct durable_task {
    caf::actor actor;
    std::shared_ptr<scheduled_task::state> st;
  };
  std::map<std::uint64_t, durable_task> durable;
  std::map<std::string, std::uint64_t> by_id;
};

// -- scheduler ------------------------------------------------------------------

namespace {

void reject_zone(const task_options& o) {
  if (!o.time_zone.empty())
    throw invalid_argument_error(
      "time_zone", "time_zone applies to cron tasks only, not to every/delay");
}

// A plain job (the overloads without options) is kept as it is, not
// wrapped into a run handler: such a task is always in memory, and the
// wrapper would cost an allocation per task.
task make_task(task_kind kind, std::chrono::milliseconds interval,
               task_options opts, run_handler fn, scheduler::job job = {}) {
  if (kind != task_kind::cron)
    reject_zone(opts);
  task t;
  t.kind = kind;
  t.interval = interval;
  t.durable = !opts.id.empty();
  t.opts = std::move(opts);
  t.fn = std::move(fn);
  t.job = std::move(job);
  return t;
}

// (No upper bound here: a `duration` holds at most 100 years, which every
// store keeps and no clock arithmetic overflows; nor a negative one.)
void check_interval(duration interval) {
  if (interval.count() <= 0)
    throw invalid_argument_error("interval",
                                 "every() needs a positive interval, got "
                                   + format_duration(interval.ms()));
}

scheduled_task schedule_cron(scheduler::impl& impl, std::string_view cron,
                             task_options opts, run_handler fn,
                             scheduler::job plain = {}) {
  auto zone = opts.time_zone.empty() ? impl.eng->opts.time_zone
                                     : opts.time_zone;
  cron_schedule parsed{cron, zone, impl.eng->now()};
  auto t = make_task(task_kind::cron, {}, std::move(opts), std::move(fn),
                     std::move(plain));
  t.cron.emplace(std::move(parsed));
  return impl.add(std::move(t));
}

} // namespace

scheduler::scheduler(scheduler_options opts)
  : impl_(std::make_shared<impl>(std::move(opts))) {
  // Its handler threads tell who they run for (see impl::stop; a bot
  // stopped from one of its tasks asks too).
  impl_->tag = this;
  if (impl_->pool)
    impl_->pool->tag(this);
}

scheduler::~scheduler() {
  impl_->stop();
}

scheduled_task scheduler::every(duration interval, job fn) {
  check_interval(interval);
  return impl_->add(
    make_task(task_kind::every, interval.ms(), {}, {}, std::move(fn)));
}

scheduled_task scheduler::every(duration interval, task_options opts,
                                run_handler fn) {
  check_interval(interval);
  return impl_->add(
    make_task(task_kind::every, interval.ms(), std::move(opts), std::move(fn)));
}

scheduled_task scheduler::schedule(std::string_view cron, job fn) {
  return schedule_cron(*impl_, cron, {}, {}, std::move(fn));
}

scheduled_task scheduler::schedule(std::string_view cron, task_options opts,
                                   run_handler fn) {
  return schedule_cron(*impl_, cron, std::move(opts), std::move(fn));
}

scheduled_task scheduler::delay(duration d, job fn) {
  return impl_->add(make_task(task_kind::delay, d.ms(), {}, {}, std::move(fn)));
}

scheduled_task scheduler::delay(duration d, task_options opts, run_handler fn) {
  return impl_->add(
    make_task(task_kind::delay, d.ms(), std::move(opts), std::move(fn)));
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
  return impl_->eng->grace();
}

scheduler::counters scheduler::stats() const noexcept {
  auto& e = *impl_->eng;
  constexpr auto r = std::memory_order_relaxed;
  return {e.runs.load(r), e.missed.load(r), e.failed.load(r),
          e.store_errors.load(r)};
}

} // namespace botmesh
