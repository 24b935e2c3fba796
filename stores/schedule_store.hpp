#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <botmesh/runtime/core/clock.hpp>

namespace botmesh {

/// The stored calendar of one durable task. Only the calendar is stored,
/// never the handler.
struct schedule_record {
  std::string id{};
  /// The task's specification ("every 60000", "cron TZ=Europe/Madrid 0 9 * * *",
  /// "delay 7200000"); a different spec at registration reschedules.
  std::string spec{};
  /// The next slot to run.
  time_point next_run_at{};
  /// The last fencing token handed out; never goes back, also across
  /// removal and re-registration.
  std::uint64_t fencing_token = 0;
  /// The owner of the current claim (empty: not claimed) and until when.
  std::string lease_owner{};
  time_point lease_until{};
  /// When the current (or an interrupted) claim was taken.
  time_point claimed_at{};
  /// A one-shot task that ran: a tombstone, so re-registering does not run it.
  bool done = false;
  /// Removed (cancel / forget): a marker that keeps `fencing_token`.
  bool deleted = false;
  time_point updated_at{};

  friend bool operator==(const schedule_record&,
                         const schedule_record&) = default;
};

/// A claim on the due slot of a task.
struct schedule_claim {
  /// The record as it was claimed (lease fields set to this claim).
  schedule_record record{};
  /// The fencing token of this claim (== record.fencing_token).
  std::uint64_t token = 0;
  /// True when an earlier claim on the same slot expired without a commit
  /// (its executor died): the slot runs again as such.
  bool interrupted = false;
};

/// Where durable task calendars live, shared by every replica of a bot.
///
/// Contract (the schedule-store conformance suite checks it):
/// - Every method is atomic and thread-safe; any number of processes may
///   share one backend. Methods may block on I/O.
/// - `claim` hands out a slot to one owner at a time while its lease runs;
///   tokens strictly increase per id, also after `remove` and a new
///   `register_task`.
/// - `commit`/`renew`/`release` with a token that is no longer current (a
///   stale executor) change nothing and return false.
/// - Failures throw `botmesh::error` (`errc::store_error`); a record that
///   cannot be decoded throws `errc::corrupted_record` naming the id.
class schedule_store {
 public:
  virtual ~schedule_store();

  /// Opens connections and creates schemas; idempotent.
  virtual void start();

  /// False when every call returns at once without I/O (the memory store):
  /// the scheduler's task actors then call it directly instead of through
  /// the store-I/O actor. True by default.
  virtual bool blocks() const noexcept {
    return true;
  }

  /// The record of `id`, deleted markers included.
  virtual std::optional<schedule_record> get(std::string_view id) = 0;

  /// Registers a task: creates the record with `first_run` when absent or
  /// deleted (keeping a deleted marker's token); keeps an existing record
  /// with the same `spec` untouched (its original time, its tombstone);
  /// replaces the spec and sets `next_run_at = first_run` (keeping the token,
  /// clearing `done`) when the spec differs. A claim still live then keeps
  /// its lease (no claim overlaps a run under way) and the token moves on
  /// by one (that run's renewals and commit are refused). Returns the record
  /// as stored.
  virtual schedule_record register_task(std::string_view id,
                                        std::string_view spec,
                                        time_point first_run, time_point now)
    = 0;

  /// Claims the due slot: succeeds when the record exists, is neither
  /// deleted nor done, `next_run_at <= now`, and no unexpired lease is held.
  /// The token becomes `fencing_token + 1`.
  virtual std::optional<schedule_claim>
  claim(std::string_view id, std::string_view owner, time_point now,
        std::chrono::milliseconds lease) = 0;

  /// Extends the claim `token` of `owner` to `now + lease`; false when the
  /// claim is no longer current or its lease ran out.
  virtual bool renew(std::string_view id, std::string_view owner,
                     std::uint64_t token, time_point now,
                     std::chrono::milliseconds lease) = 0;

  /// Ends the claim `token`: stores `next_run_at` (and `done` for a one-shot
  /// that ran) and clears the lease. False for a stale token, a deleted
  /// record, or a claim of another owner.
  virtual bool commit(std::string_view id, std::string_view owner,
                      std::uint64_t token, time_point next_run_at, bool done,
                      time_point now) = 0;

  /// Removes the task, keeping a deleted marker with its last token.
  /// True when a live record was removed.
  virtual bool remove(std::string_view id, time_point now) = 0;

  /// Every record, deleted markers included, ordered by id.
  virtual std::vector<schedule_record> list() = 0;
};

/// An optional leader lease (the scheduler's `scheduler:leader`): the
/// holder claims slots on time, the others only overdue ones.
class lease_provider {
 public:
  virtual ~lease_provider();

  /// Takes or renews `name` for `owner` until `now + ttl`. Returns the
  /// lease's fencing token (growing with each new holder), or nothing while
  /// another owner holds an unexpired lease.
  virtual std::optional<std::uint64_t>
  try_acquire(std::string_view name, std::string_view owner, time_point now,
              std::chrono::milliseconds ttl) = 0;

  /// Gives the lease up if `owner` holds it.
  virtual void release(std::string_view name, std::string_view owner) = 0;
};

} // namespace botmesh
