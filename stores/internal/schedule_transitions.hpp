#pragma once

// Internal: the state transitions of a stored schedule record, shared by the
// stores that load a record, change it and save it back (memory, SQLite).
// The Redis store runs the same transitions in its Lua scripts.

#include <chrono>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/schedule_store.hpp>

namespace botmesh::internal {

/// Instants a stored schedule may hold: years 1 to 9999. Anything else is a
/// damaged record; accepting it would overflow the planning arithmetic (a
/// slot near INT64_MIN) or make the scheduler count ages of missed slots.
inline constexpr std::int64_t min_record_ms = -62'135'596'800'000;
inline constexpr std::int64_t max_record_ms = 253'402'300'799'999;

/// Throws `errc::corrupted_record` naming `where` (the key or row) and the
/// field when a time of `rec` is out of range.
inline void check_record_times(const schedule_record& rec,
                               std::string_view where) {
  auto check = [&](time_point t, std::string_view field) {
    auto ms = to_unix_ms(t);
    if (ms < min_record_ms || ms > max_record_ms)
      throw error(errc::corrupted_record,
                  fmt::format("{}: field \"{}\" holds {} ms, outside years "
                              "1-9999",
                              where, field, ms));
  };
  check(rec.next_run_at, "next_run_at");
  check(rec.lease_until, "lease_until");
  check(rec.claimed_at, "claimed_at");
  check(rec.updated_at, "updated_at");
}

/// Registers `spec` on `rec` (a fresh record when absent): an existing live
/// record with the same spec stays as it is (returns false: nothing to
/// save); otherwise the spec and first run are set, the tombstone cleared
/// and the fencing token kept (returns true). A live claim of a record
/// that is not deleted (a run under way, on the old spec) keeps its lease,
/// so no new claim overlaps it, and its token moves on, so its renewals and
/// its commit on the old spec's calendar are refused; otherwise the lease
/// is cleared.
inline bool register_record(schedule_record& rec, bool exists,
                            std::string_view id, std::string_view spec,
                            time_point first_run, time_point now) {
  if (exists && !rec.deleted && rec.spec == spec)
    return false;
  bool running = exists && !rec.deleted && !rec.lease_owner.empty()
                 && rec.lease_until > now;
  rec.id = std::string{id};
  rec.spec = std::string{spec};
  rec.next_run_at = first_run;
  if (running) {
    rec.fencing_token += 1;
  } else {
    rec.lease_owner.clear();
    rec.lease_until = {};
    rec.claimed_at = {};
  }
  rec.done = false;
  rec.deleted = false;
  rec.updated_at = now;
  return true;
}

/// Claims the due slot of `rec` for `owner`, or nothing when it is not
/// claimable (deleted, done, not due, or leased by a live claim).
inline std::optional<schedule_claim>
claim_record(schedule_record& rec, std::string_view owner, time_point now,
             std::chrono::milliseconds lease) {
  if (rec.deleted || rec.done || rec.next_run_at > now)
    return std::nullopt;
  if (!rec.lease_owner.empty() && rec.lease_until > now)
    return std::nullopt;
  bool interrupted = !rec.lease_owner.empty();
  rec.fencing_token += 1;
  rec.lease_owner = std::string{owner};
  rec.lease_until = now + lease;
  if (!interrupted)
    rec.claimed_at = now;
  rec.updated_at = now;
  return schedule_claim{rec, rec.fencing_token, interrupted};
}

} // namespace botmesh::internal
