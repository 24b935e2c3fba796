#pragma once

// Internal: the scheduler's task model and the planning of a claimed slot
// (which runs it covers and where the calendar goes), kept apart from the
// engine's threads and locks so the missed-run rules read in one place.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <botmesh/scheduler/cron.hpp>
#include <botmesh/scheduler/scheduler.hpp>
#include <botmesh/stores/schedule_store.hpp>

namespace botmesh {

/// What a task's handles share with the scheduler.
struct scheduled_task::state {
  /// A durable task's id and a cron task's zone. Kept apart, and absent
  /// for in-memory every/delay tasks, so that the state an in-memory
  /// task's timer entry starts with stays small (100k timers armed touch
  /// 100k entries).
  struct names {
    std::string id;
    std::string zone;
  };
  std::weak_ptr<task_owner> owner;
  std::uint64_t handle = 0;
  std::unique_ptr<const names> named; ///< null: both ""
  std::atomic<bool> active{true};

  /// Durable tasks are the ones with an id; the rest live in memory.
  bool durable() const noexcept {
    return named && !named->id.empty();
  }
};

} // namespace botmesh

namespace botmesh::internal {

enum class task_kind { every, cron, delay };

// Where a task's slots fall. Kept apart so that an in-memory task's entry
// in the timer actor carries only this, not the durable task's fields.
struct task_grid {
  task_kind kind = task_kind::every;
  std::chrono::milliseconds interval{0}; // every: the period; delay: the delay
  std::optional<cron_schedule> cron;

  // First slot strictly after `t`, on the grid that contains `slot`.
  std::optional<time_point> first_slot_after(time_point slot,
                                             time_point t) const {
    switch (kind) {
      case task_kind::every: {
        if (slot > t)
          return slot;
        auto k = (t - slot) / interval + 1;
        return slot + k * interval;
      }
      case task_kind::cron:
        return cron->next_after(t);
      case task_kind::delay:
        return std::nullopt;
    }
    return std::nullopt;
  }

  std::optional<time_point> slot_after(time_point slot) const {
    return first_slot_after(slot, slot);
  }
};

struct task : task_grid {
  std::shared_ptr<scheduled_task::state> st;
  task_options opts;
  std::string stored_id;
  run_handler fn;
  // In-memory tasks registered with a plain job keep it here instead of in
  // `fn` (a wrapper around it costs one allocation per task); `fn` is empty
  // then.
  std::function<void()> job;
  bool durable = false;
  time_point next{}; // in-memory: next slot; durable: last known stored slot
  bool running = false;
};

// The runs one claim covers and where the calendar goes afterwards.
struct run_plan {
  std::vector<time_point> slots;
  bool missed = false;
  std::optional<time_point> next_if_completed; // unset: decided at commit
  bool one_shot = false;
};

/// The spec a durable task is stored with ("every <ms>", "cron <expr>",
/// "delay <ms>"): a registration with another one replaces the calendar.
std::string spec_of(const task& t);

/// Plans the runs of a claim made at `now`. A slot claimed more than `grace`
/// after it fell due is missed and follows the task's policy; a claim that
/// took over an interrupted one is judged by the original claim's time.
/// `skipped` receives how many missed slots a catch-up leaves out.
run_plan plan_claim(const task& t, const schedule_claim& c, time_point now,
                    std::chrono::milliseconds grace, std::size_t& skipped);

} // namespace botmesh::internal
