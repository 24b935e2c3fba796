#pragma once

// Internal: what the scheduler's actors share, and how they are spawned.
//
//   facade (scheduler)        timer actor (1)            task actor (1 per durable id)
//    | every/schedule/delay ---> in-memory grid           |
//    | durable id ---------------------------------------> register (spawn)
//    | start / poll / stop ---> (resume|poll|pause) ----> (resume|poll|pause)
//    |                          leader lease every tick   claim -> run -> renew -> commit
//    |                               \                      /
//    |                                 store I/O actor (detached): blocking store calls,
//    |                                 each reply a message to the caller
//    | handlers run on the executor (the handler pool) and report back by message.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <botmesh/runtime/core/log.hpp>
#include <botmesh/runtime/core/internal/log_limiter.hpp>
#include <botmesh/scheduler/internal/task.hpp>
#include <botmesh/scheduler/scheduler.hpp>
#include <botmesh/stores/internal/async_schedule_store.hpp>
#include <botmesh/stores/schedule_store.hpp>

namespace botmesh::internal {

/// One in-memory task: the state its handles share and what the timer
/// actor keeps of it, in one allocation made when the task is added. The
/// actor's heap of slots and a run's job point to it, so the actor needs no
/// table by handle (a cancel brings the entry itself) and firing allocates
/// nothing per run.
//
// The fields a fire touches (its run, its end, the release of a one-shot)
// come first, so that they share as few cache lines as possible with the
// allocation's header: 100k timers do not fit in a cache, and each line
// an entry spreads over is a miss on the timer actor's thread.
struct timer_entry final : scheduled_task::state {
  /// Registered and not cancelled: cleared once, by the first cancel (a
  /// handle's, from any thread), so the task count drops once.
  std::atomic<bool> registered{true};
  bool running = false;
  bool cancelled = false;
  /// The list of ended runs (see timer_inbox::end).
  timer_entry* next_ended = nullptr;
  time_point next{}; // the next slot; while running, the run's slot
  /// The timer actor's hold on the entry, from the moment it takes the
  /// task until the task is done or cancelled and nothing points to it any
  /// longer (its slot popped or swept, its run ended).
  std::shared_ptr<timer_entry> self;
  std::function<void()> job; // instead of `fn` (see task::job)
  run_handler fn;
  // The stop token of the run in progress of a task with a run handler
  // (a plain job has none to give it): written by the actor before the
  // job is posted, read by the job; the next run is prepared only after
  // this one ended.
  std::stop_token run_stop;
  // What the actor needs of the task (not the durable task's fields, which
  // would make every entry half again as large).
  task_grid grid;
};

/// Batches for the timer actor: tasks added and cancelled (the mutex
/// guards those vectors and the two fields below) and runs ended arrive
/// here. A message wakes the actor only when it would not look soon enough
/// by itself: an added task due no earlier than the wake-up the actor has
/// armed is taken by that wake-up, so 100k timers armed cost a few messages
/// instead of one each (a busy actor taking every add was a message, a
/// mailbox push and often a worker's wake-up per timer).
struct timer_inbox {
  std::mutex mtx;
  std::vector<std::shared_ptr<timer_entry>> added;
  std::vector<std::shared_ptr<timer_entry>> cancelled;
  /// A timer_add_atom is on its way (cleared when the actor takes the inbox).
  bool notified = false;
  /// The actor's armed wake-up, which takes the inbox before it fires
  /// anything; max while no such wake-up is pending (the actor resets it
  /// whenever it takes the inbox, and sets it only once it armed again);
  /// min while the scheduler is not started or paused, when start() and
  /// poll() take the inbox before anything fires.
  time_point wake_at = time_point::max();

  /// True when the caller must send the wake-up (timer_add_atom).
  bool add(std::shared_ptr<timer_entry> e) {
    auto at = e->next;
    std::lock_guard guard{mtx};
    added.push_back(std::move(e));
    return notify(at);
  }
  /// A cancel always wakes the actor (unless a wake-up is on its way): what
  /// the task holds is released promptly.
  bool cancel(std::shared_ptr<timer_entry> e) {
    std::lock_guard guard{mtx};
    cancelled.push_back(std::move(e));
    return wake();
  }
  /// Under `mtx`: whether a task due at `at` needs a message.
  bool notify(time_point at) {
    return wake_at > at && wake();
  }
  /// Under `mtx`: whether the caller sends the message (none is on its way).
  bool wake() {
    if (notified)
      return false;
    notified = true;
    return true;
  }
  /// Sets `wake_at` (max: none pending).
  void armed(time_point at) {
    std::lock_guard guard{mtx};
    wake_at = at;
  }
  /// The actor takes what was added and cancelled (swapped with its own,
  /// emptied vectors). Adds send a message from now on, until the actor
  /// has armed again and said so with `armed`.
  void take(std::vector<std::shared_ptr<timer_entry>>& into_added,
            std::vector<std::shared_ptr<timer_entry>>& into_cancelled) {
    std::lock_guard guard{mtx};
    into_added.swap(added);
    into_cancelled.swap(cancelled);
    notified = false;
    wake_at = time_point::max();
  }

  /// Runs that ended. A task never overlaps itself, so its entry is the
  /// node: ending a run allocates nothing and takes no lock; the handler
  /// pool pushes, the timer actor takes the whole list at once.
  std::atomic<timer_entry*> ended{nullptr};

  /// The timer actor, woken by the run that starts a batch of ended runs.
  /// Set once at spawn; cleared by the scheduler when it goes (no run is
  /// left then), which breaks the engine -> actor -> engine cycle early.
  caf::actor actor;

  /// True when the list was empty: the caller sends the wake-up. Until the
  /// actor handled that message it cannot take the entry (it takes the list
  /// only when woken, and every earlier batch was taken on its own
  /// wake-up), so the run still counts as in flight and the caller may
  /// read `actor` after pushing.
  bool end(timer_entry* e) {
    auto* head = ended.load(std::memory_order_relaxed);
    do {
      e->next_ended = head;
    } while (!ended.compare_exchange_weak(head, e, std::memory_order_release,
                                          std::memory_order_relaxed));
    return head == nullptr;
  }

  /// The runs ended since the last call (newest first).
  timer_entry* take_ended() {
    return ended.exchange(nullptr, std::memory_order_acquire);
  }
};

/// Shared by the facade and the actors. Everything but the atomics and the
/// run counter is written before the first actor is spawned, except `store`
/// and `async_store`: set once, on first use (the first durable task's
/// registration, before its actor is spawned), and then `store_ready`.
struct scheduler_engine {
  scheduler_options opts;
  const clock* clk = nullptr;
  std::string owner;
  std::shared_ptr<schedule_store> store;
  /// The store's asynchronous face (Redis), or null: the task actors' calls
  /// then go to the store-I/O actor, or are made in place for a store that
  /// does no I/O (the memory store).
  async_schedule_store* async_store = nullptr;
  /// `store` and `async_store` are set (the timer actor, which may run
  /// while a first durable task is registered, reads them only then).
  std::atomic<bool> store_ready{false};
  /// The store-I/O actor (detached): blocking store and lease calls go there.
  caf::actor io;
  /// In-memory tasks added and runs ended, for the timer actor.
  timer_inbox timers;
  /// Task actors holding a window of claim calls whose replies were lost
  /// (a claim the store may hold for this replica): stop() asks them to
  /// give such claims back, and waits for them only when there is one.
  std::atomic<std::size_t> lost_claims{0};
  /// Runs a handler job (the handler pool, or a test's executor).
  std::function<void(std::function<void()>)> execute;
  /// Runs many handler jobs, each a job of its own (the handler pool's
  /// `post_batch`); empty with a test's executor, which gets them one by one.
  std::function<void(std::vector<std::function<void()>>&)> execute_batch;

  /// Hands `jobs` to `execute_batch`, or one by one to `execute`; leaves
  /// `jobs` empty.
  void execute_all(std::vector<std::function<void()>>& jobs) {
    if (execute_batch) {
      execute_batch(jobs);
    } else {
      for (auto& job : jobs)
        execute(std::move(job));
    }
    jobs.clear();
  }
  /// This scheduler holds the leader lease (always true without one).
  /// The flags are read at every evaluation; they get a cache line of their
  /// own, away from the counters every run writes (on two CAF workers and
  /// the pool, sharing a line cost every evaluation a miss).
  alignas(64) std::atomic<bool> leader{true};
  /// Started: actors arm their own wake-ups (CAF delayed messages).
  std::atomic<bool> started{false};
  /// stop() was called: no new runs until start() or poll().
  std::atomic<bool> paused{false};

  time_point now() const {
    return clk->now();
  }

  /// The grace period: tick, plus 2 x leader_ttl with a leader lease.
  std::chrono::milliseconds grace() const {
    return opts.tick.ms()
           + (opts.lease ? 2 * opts.leader_ttl.ms() : std::chrono::milliseconds{0});
  }

  /// Followers leave on-time claims to the leader.
  time_point due_at(time_point next) const {
    return leader.load() ? next : next + opts.leader_ttl.ms();
  }

  std::string leader_name() const {
    return opts.ns.empty() ? "scheduler:leader" : opts.ns + ":scheduler:leader";
  }

  /// A warning (orphans, skipped catch-up slots, failed runs): to
  /// `opts.log` when set, else to the botmesh logger.
  void log(std::string_view text) const;

  /// A store or lease call failed. It repeats every tick while a backend is
  /// down, so it is written only while the scheduler has work (a task
  /// registered) and at most once per 30 s, with the count held back.
  void log_failure(std::string_view text);

  /// A store or lease call succeeded: after failures, one "recovered" line.
  void failure_ended();

  /// Tasks registered (in-memory and durable): failures matter only then.
  std::atomic<std::size_t> tasks{0};

  /// Counters for metrics (relaxed: read by scrapes only).
  alignas(64) std::atomic<std::uint64_t> runs{0}; ///< task handler calls
  std::atomic<std::uint64_t> missed{0};   ///< claims that found their slot missed
  std::atomic<std::uint64_t> failed{0};   ///< handler calls that threw
  std::atomic<std::uint64_t> store_errors{0}; ///< failed store/lease calls

  /// Runs between a claim (or an in-memory run) and its end; stop() waits
  /// for none to be left. The timer actor counts a whole batch of runs in
  /// one call.
  void run_started(std::size_t n = 1);
  void run_finished(std::size_t n = 1);
  void wait_idle();

 private:
  std::mutex mtx_; // for idle_cv_
  std::condition_variable idle_cv_;
  log_limiter failures_{std::chrono::seconds{30}};
  alignas(64) std::atomic<std::size_t> in_flight_{0};
};

/// What poll() waits on: every actor it asks keeps a copy until it is
/// idle, and the last copy to go (the actor went idle, or the message or
/// the actor died holding it) wakes poll(). One shared object instead of a
/// request and a reply per actor, which cost more than the run they wait
/// for; and nothing hangs on an actor that went away.
class poll_ticket {
 public:
  ~poll_ticket() {
    done_.set_value();
  }
  std::future<void> future() {
    return done_.get_future();
  }

 private:
  std::promise<void> done_;
};

/// A blocking call for the store-I/O actor: `fn` runs on its thread, and
/// the reply (the same pointer) comes back as a message; `failure` holds
/// the text of an exception `fn` threw.
struct store_call {
  std::function<void()> fn;
  std::string failure;
  /// For a call made through the asynchronous face: what the actor does
  /// with it, when the client's callback sends it back as
  /// `(io_atom, shared_ptr<store_call>)`.
  std::function<void(const std::string&)> resume;
};

/// Spawns the detached store-I/O actor: `(io_atom, shared_ptr<store_call>)`
/// runs the call and replies `(io_atom, shared_ptr<store_call>)`.
caf::actor spawn_store_io(caf::actor_system& sys);

/// Spawns the actor of one durable task (its id registered already).
caf::actor spawn_task_actor(caf::actor_system& sys,
                            std::shared_ptr<scheduler_engine> eng,
                            std::shared_ptr<task> t);

/// Spawns the timer actor: in-memory tasks on their grid, the leader lease
/// and the orphan check at start.
caf::actor spawn_timer_actor(caf::actor_system& sys,
                             std::shared_ptr<scheduler_engine> eng);

} // namespace botmesh::internal
