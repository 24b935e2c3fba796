#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include <botmesh/runtime/core/duration.hpp>
#include <botmesh/scheduler/scheduler.hpp>

namespace botmesh {

/// Runs tasks every interval, on a cron expression, or once after a delay.
///
/// Built of actors (see `internal/scheduler_engine.hpp`): one actor per
/// durable task id orders claim -> run -> renew -> commit in its mailbox,
/// in-memory tasks share one timer actor, and every store call runs on a
/// detached store-I/O actor whose replies come back as messages. Wake-ups
/// and renewals are CAF delayed messages; handlers run on the handler pool
/// (or `scheduler_options::executor`) and get their stop token when the
/// claim is lost or the scheduler stops. Registration, `cancel` and
/// `forget_task` call the store on the caller's thread (never a CAF worker
/// unless the caller is one).
///
/// In-memory tasks (no id) never overlap themselves: slots that pass while
/// a run is in progress are skipped, keeping the task's grid (no drift).
///
/// Durable tasks (with an id) store their next slot in `store`; each
/// occurrence is claimed with a fenced lease, so schedulers sharing a store
/// never run one occurrence at once (at least once: a run whose executor
/// dies runs again after its lease, with `missed == false`). Intervals never
/// drift (the next slot is the previous plus the interval). A one-shot delay
/// leaves a tombstone until `cancel()` or `forget_task`. Re-registering an id
/// keeps its stored time; a changed spec reschedules from now. Stored ids
/// that no registered task claims are orphans: logged once, kept, never run.
///
/// Invalid arguments throw `invalid_argument_error` naming the field:
/// "interval" (every: not positive), "delay" (negative), "cron" and the cron
/// fields, "time_zone", "id", "max_catch_up".
class scheduler {
 public:
  using job = std::function<void()>;
  using run_handler = botmesh::run_handler;

  explicit scheduler(scheduler_options opts = {});

  /// Stops (see `stop`).
  ~scheduler();

  scheduler(const scheduler&) = delete;
  scheduler& operator=(const scheduler&) = delete;

  scheduled_task every(duration interval, job fn);
  scheduled_task every(duration interval, task_options opts, run_handler fn);
  scheduled_task schedule(std::string_view cron, job fn);
  scheduled_task schedule(std::string_view cron, task_options opts,
                          run_handler fn);
  scheduled_task delay(duration d, job fn);
  scheduled_task delay(duration d, task_options opts, run_handler fn);

  /// Removes the stored row of `id` (namespace applied), e.g. a tombstone
  /// or an orphan; cancels a registered task of that id. True when a live
  /// row was removed.
  bool forget_task(std::string_view id);

  /// Starts: the actors arm their wake-ups. Idempotent.
  void start();

  /// Pauses: no new runs, stop tokens of running handlers fire, waits for
  /// them. Stored rows are kept (a catch-up commits the slots it did not run).
  /// A claim the store took but whose reply was lost is given back (its
  /// lease cut) before it returns: that waits for the store, up to 10 s,
  /// and for the task actors, so call it on a thread of your own, not on a
  /// CAF worker of the scheduler's system. Called from one of this
  /// scheduler's own task handlers (on its handler threads), it would wait
  /// for that handler: it then pauses at once and returns, the rest runs
  /// on a thread of its own, and start(), the next stop() from another
  /// thread and the destructor wait for it. (With
  /// `scheduler_options::executor` its threads are not known: a handler
  /// that stops its scheduler there waits for itself.)
  void stop();

  /// Runs everything due at the clock's now and waits until those runs
  /// finished (and slots that fell due meanwhile ran as well). For tests
  /// with a manual clock; not needed after `start()`. Blocks the caller:
  /// never call it on a CAF worker or with CAF's test coordinator.
  void poll();

  /// The grace period: a slot claimed later than this after it fell due is
  /// missed.
  std::chrono::milliseconds grace() const noexcept;

  /// Counters since construction (relaxed reads; for metrics).
  struct counters {
    std::uint64_t runs = 0;   ///< task handler calls
    std::uint64_t missed = 0; ///< durable claims that found their slot missed
    std::uint64_t failed = 0; ///< handler calls that threw
    std::uint64_t store_errors = 0; ///< failed schedule store / lease calls
  };
  counters stats() const noexcept;

  struct impl;

 private:
  std::shared_ptr<impl> impl_;
};

} // namespace botmesh
