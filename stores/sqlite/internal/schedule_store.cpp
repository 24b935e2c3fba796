#include <botmesh/stores/sqlite/internal/schedule_store.hpp>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/internal/schedule_transitions.hpp>
#include <botmesh/stores/sqlite/internal/db.hpp>
#include <botmesh/stores/store.hpp>

namespace botmesh::internal {

namespace {

void read_fields(const stmt& s, schedule_record& r) {
  r.spec = s.text(1);
  r.next_run_at = from_unix_ms(s.int64(2));
  auto token = s.int64(3);
  if (token < 0) // a fencing token only grows from 0: damage, not a number to wrap
    throw error(errc::corrupted_record,
                fmt::format("column fencing_token is negative: {}", token));
  r.fencing_token = static_cast<std::uint64_t>(token);
  r.lease_owner = s.text(4);
  r.lease_until = from_unix_ms(s.int64(5));
  r.claimed_at = from_unix_ms(s.int64(6));
  r.done = s.int64(7) != 0;
  r.deleted = s.int64(8) != 0;
  r.updated_at = from_unix_ms(s.int64(9));
}

constexpr const char* columns =
  "id, spec, next_run_at, fencing_token, lease_owner, lease_until, "
  "claimed_at, done, deleted, updated_at";

schedule_record read(const stmt& s) {
  schedule_record r;
  r.id = s.text(0);
  try {
    read_fields(s, r);
  } catch (const error& e) {
    if (e.code() != errc::corrupted_record)
      throw;
    throw error(errc::corrupted_record,
                fmt::format("sqlite schedule {}: {}", r.id, e.what()));
  }
  check_record_times(r, "sqlite schedule " + r.id);
  return r;
}

std::optional<schedule_record> load(db& d, std::string_view id) {
  stmt s{d, std::string{"SELECT "} + columns + " FROM schedules WHERE id=?"};
  s.bind(1, id);
  if (!s.step())
    return std::nullopt;
  return read(s);
}

void save(db& d, const schedule_record& r) {
  stmt s{d, "INSERT OR REPLACE INTO schedules VALUES (?,?,?,?,?,?,?,?,?,?)"};
  s.bind(1, r.id).bind(2, r.spec).bind(3, to_unix_ms(r.next_run_at));
  s.bind(4, static_cast<std::int64_t>(r.fencing_token)).bind(5, r.lease_owner);
  s.bind(6, to_unix_ms(r.lease_until)).bind(7, to_unix_ms(r.claimed_at));
  s.bind(8, std::int64_t{r.done}).bind(9, std::int64_t{r.deleted});
  s.bind(10, to_unix_ms(r.updated_at));
  s.run();
}

class sqlite_schedule_store final : public schedule_store {
 public:
  explicit sqlite_schedule_store(std::shared_ptr<db> d) : db_(std::move(d)) {
    // nop
  }

  std::optional<schedule_record> get(std::string_view id) override {
    std::lock_guard guard{db_->mutex()};
    return load(*db_, id);
  }

  // The same transitions as memory_schedule_store, each in one transaction.
  schedule_record register_task(std::string_view id, std::string_view spec,
                                time_point first_run, time_point now) override {
    detail::check_key(id, "id");
    transaction tx{*db_};
    auto rec = load(*db_, id);
    bool exists = rec.has_value();
    schedule_record r = rec.value_or(schedule_record{});
    if (!exists) {
      // Its tombstone may have been purged by hand: the token goes on from
      // the fence its removal left.
      stmt f{*db_, "SELECT fencing_token FROM schedule_fences WHERE id=?"};
      f.bind(1, id);
      if (f.step()) {
        auto fence = f.int64(0);
        if (fence < 0) // a token only grows from 0: damage
          throw error(errc::corrupted_record,
                      fmt::format("sqlite schedule_fences {}: fencing_token "
                                  "is negative: {}",
                                  id, fence));
        r.fencing_token = static_cast<std::uint64_t>(fence);
      }
    }
    if (!register_record(r, exists, id, spec, first_run, now))
      return r;
    save(*db_, r);
    tx.commit();
    return r;
  }

  std::optional<schedule_claim> claim(std::string_view id,
                                      std::string_view owner, time_point now,
                                      std::chrono::milliseconds lease) override {
    detail::check_key(owner, "owner");
    detail::check_ttl(lease, "lease");
    transaction tx{*db_};
    auto rec = load(*db_, id);
    if (!rec)
      return std::nullopt;
    auto c = claim_record(*rec, owner, now, lease);
    if (!c)
      return std::nullopt;
    save(*db_, *rec);
    tx.commit();
    return c;
  }

  bool renew(std::string_view id, std::string_view owner, std::uint64_t token,
             time_point now, std::chrono::milliseconds lease) override {
    detail::check_ttl(lease, "lease");
    std::lock_guard guard{db_->mutex()};
    stmt s{*db_, "UPDATE schedules SET lease_until=?, updated_at=? WHERE id=? "
                 "AND deleted=0 AND fencing_token=? AND lease_owner=? AND "
                 "lease_until>?"};
    s.bind(1, to_unix_ms(now + lease)).bind(2, to_unix_ms(now)).bind(3, id);
    s.bind(4, static_cast<std::int64_t>(token)).bind(5, owner);
    s.bind(6, to_unix_ms(now));
    return s.run() > 0;
  }

  bool commit(std::string_view id, std::string_view owner, std::uint64_t token,
              time_point next_run_at, bool done, time_point now) override {
    std::lock_guard guard{db_->mutex()};
    stmt s{*db_, "UPDATE schedules SET next_run_at=?, done=?, lease_owner='', "
                 "lease_until=0, claimed_at=0, updated_at=? WHERE id=? AND "
                 "deleted=0 AND fencing_token=? AND lease_owner=?"};
    s.bind(1, to_unix_ms(next_run_at)).bind(2, std::int64_t{done});
    s.bind(3, to_unix_ms(now)).bind(4, id);
    s.bind(5, static_cast<std::int64_t>(token)).bind(6, owner);
    return s.run() > 0;
  }

  // The tombstone keeps the fencing token; so does schedule_fences, for
  // when tombstones are purged by hand (DELETE FROM schedules WHERE
  // deleted AND ...): a task registered again never goes back to a token
  // an executor may still hold.
  bool remove(std::string_view id, time_point now) override {
    transaction tx{*db_};
    stmt s{*db_, "UPDATE schedules SET deleted=1, done=0, lease_owner='', "
                 "lease_until=0, claimed_at=0, updated_at=? WHERE id=? AND "
                 "deleted=0"};
    s.bind(1, to_unix_ms(now)).bind(2, id);
    if (s.run() == 0)
      return false;
    stmt f{*db_, "INSERT INTO schedule_fences (id, fencing_token) "
                 "SELECT id, fencing_token FROM schedules WHERE id=? "
                 "ON CONFLICT(id) DO UPDATE SET fencing_token="
                 "max(fencing_token, excluded.fencing_token)"};
    f.bind(1, id);
    f.run();
    tx.commit();
    return true;
  }

  std::vector<schedule_record> list() override {
    std::lock_guard guard{db_->mutex()};
    stmt s{*db_, std::string{"SELECT "} + columns
                   + " FROM schedules ORDER BY id"};
    std::vector<schedule_record> out;
    while (s.step())
      out.push_back(read(s));
    return out;
  }

 private:
  std::shared_ptr<db> db_;
};

} // namespace

std::shared_ptr<schedule_store> make_sqlite_schedule_store(std::shared_ptr<db> d) {
  return std::make_shared<sqlite_schedule_store>(std::move(d));
}

} // namespace botmesh::internal
