#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>

#include <caf/fwd.hpp>

#include <botmesh/runtime/core/clock.hpp>
#include <botmesh/runtime/core/duration.hpp>
#include <botmesh/stores/schedule_store.hpp>

namespace botmesh {

/// What a durable task does with slots that passed while no scheduler ran.
enum class missed_policy : std::uint8_t {
  /// Run none; wait for the next slot after now.
  skip,
  /// Run one (`missed`, at the first missed slot), then the next slot.
  run_once,
  /// Run every missed slot in order, oldest first, up to `max_catch_up`;
  /// the rest are skipped and logged. One claim, one token for all.
  catch_up,
};

std::string_view to_string(missed_policy p) noexcept;

/// One run of a task, as its handler sees it.
struct scheduled_run {
  /// The task id as registered (empty for in-memory tasks).
  std::string task_id{};
  /// The slot this run covers (not the time it started).
  time_point scheduled_at{};
  /// `<task_id>@<scheduled_at as ISO-8601 UTC with ms>`: stable per run, an
  /// idempotency key. Empty for in-memory tasks.
  std::string occurrence_key{};
  /// The claim's fencing token: strictly increasing per task id, also after
  /// cancel and re-registration; shared by the runs of one catch-up.
  std::uint64_t fencing_token = 0;
  /// True when the run comes from the missed-run policy.
  bool missed = false;
  /// Fires when the scheduler stops or the run's lease is lost.
  std::stop_token stop{};
};

/// Options of a task; give the task an `id` to make it durable.
struct task_options {
  /// Stable and unique per scheduler; makes the task durable. Registering
  /// an id twice throws `invalid_argument_error` (field "id").
  std::string id{};
  missed_policy missed = missed_policy::skip;
  std::size_t max_catch_up = 10;
  /// How long a claimed run holds its lease; renewed every third. At least
  /// 100ms (`invalid_argument_error`, field "lease"). (The
  /// default is written as a chrono value, not "60s": task options are
  /// built for every task armed, and text is parsed each time.)
  duration lease = std::chrono::seconds{60};
  /// Cron tasks only: the IANA zone of the fields (default: the scheduler's).
  /// `every` and `delay` reject it (field "time_zone").
  std::string time_zone{};
};

/// A task's handler.
using run_handler = std::function<void(const scheduled_run&)>;

class task_owner;

/// A handle to a registered task. Copyable; all copies control one task.
class scheduled_task {
 public:
  scheduled_task() = default;

  /// No further runs; a running handler finishes. For a durable task the
  /// stored row is removed too (a marker keeps its fencing token); when the
  /// store fails, throws its error (`errc::store_error`) after the task
  /// stopped here: the row stays until `forget_task` removes it.
  void cancel();

  /// The id ("" for in-memory tasks).
  const std::string& id() const noexcept;

  /// The zone of a cron task ("" for every/delay).
  const std::string& time_zone() const noexcept;

  /// False after cancel, after a one-shot ran, or for a tombstone.
  bool active() const noexcept;

  /// Shared by the handles and the scheduler's task (defined by the
  /// scheduler: scheduler/internal/task.hpp).
  struct state;

  explicit scheduled_task(std::shared_ptr<state> st) : state_(std::move(st)) {
    // nop
  }

 private:
  std::shared_ptr<state> state_;
};

/// What a task handle cancels through (the scheduler implements it).
class task_owner {
 public:
  virtual ~task_owner();
  /// Ends the task whose handles share `task` (see `scheduled_task::cancel`).
  /// The state itself, not only its handle: the scheduler keeps no table
  /// of in-memory tasks by handle.
  virtual void cancel(const std::shared_ptr<scheduled_task::state>& task) = 0;
  /// Forgets a durable task whose stored row was removed elsewhere (another
  /// replica's cancel or forget_task): it runs no more, and its id can be
  /// registered again. The store is not called.
  virtual void removed(const std::shared_ptr<scheduled_task::state>& task) = 0;
};

struct scheduler_options {
  /// Where durable calendars live; an in-memory store when null (durable
  /// tasks then work but do not survive a restart; a warning is logged once).
  std::shared_ptr<schedule_store> store{};
  /// Optional leader lease: the holder of `scheduler:leader` claims on time,
  /// the others only runs overdue by `leader_ttl`.
  std::shared_ptr<lease_provider> lease{};
  /// Lease owner id of this scheduler; random when empty.
  std::string owner{};
  /// Polling period: picks up runs whose executor died, retries after store
  /// errors. Also the grace period (plus 2 x leader_ttl with a leader lease).
  duration tick = "1s";
  duration leader_ttl = "30s";
  /// Default zone of cron tasks ("local" = the process zone).
  std::string time_zone = "local";
  /// Time source; the system clock when null. Must outlive the scheduler.
  const botmesh::clock* clock = nullptr;
  /// Threads that run handlers (handlers may block).
  std::size_t threads = 8;
  /// Where handlers run; the scheduler's own pool of `threads` when empty.
  /// Tests on virtual time pass an executor they drain themselves.
  std::function<void(std::function<void()>)> executor{};
  /// The actor system of the task actors (a bot passes its own); when null
  /// the scheduler runs a small one of its own. Must outlive the scheduler.
  caf::actor_system* system = nullptr;
  /// Namespace applied to stored ids ("<ns>:<id>") and to the leader lease
  /// ("<ns>:scheduler:leader"), so bots sharing a backend do not collide.
  /// A bot sets `task_namespace(...)`. Changing it orphans the old rows.
  std::string ns{};
  /// Where warnings go (orphans, skipped catch-up slots, rejected commits,
  /// store errors); stderr when empty. Called from scheduler threads; an
  /// exception it throws is caught (the line goes to stderr with it).
  std::function<void(std::string_view)> log{};
};

/// The namespace of a bot's durable tasks: bot id, provider id and
/// connection id, each with '%' and ':' percent-encoded and joined by ':'
/// ("shop:telegram:123456"), so no two different triples give the same
/// namespace. Changing any of the three leaves the rows stored under the
/// old one as orphans (kept, never run).
std::string task_namespace(std::string_view bot_id,
                           std::string_view provider_id,
                           std::string_view connection_id);

} // namespace botmesh
