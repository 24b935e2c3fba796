#pragma once

#include <memory>
#include <string>

#include <botmesh/stores/schedule_store.hpp>
#include <botmesh/stores/store.hpp>

namespace botmesh {

namespace internal {
class db;
}

struct sqlite_store_options {
  /// The database file (created when missing). ":memory:" is a private
  /// in-memory database, useful in tests.
  std::string path = "botmesh.db";
  /// Time source for TTLs, lock and checkpoint expiry; the system clock when
  /// null. Must outlive the store.
  const botmesh::clock* clock = nullptr;
  /// A chat's log keeps its newest entries up to this many (at least 1:
  /// 0 is refused with `invalid_argument_error`, field "max_log_per_chat").
  std::size_t max_log_per_chat = 1000;
};

/// The embedded persistent store: one SQLite file in WAL mode, its schema
/// created by `start()`. Every write is one atomic statement or a
/// `BEGIN IMMEDIATE` transaction where it reads before writing, so several
/// processes may share the file. Cleared checkpoints keep their revision and
/// released locks their fence, so neither ever repeats, a power cut included:
/// every commit is synced to disk (`synchronous=FULL`) before it returns.
///
/// Cost: one connection serialized by a mutex; every call is a few
/// statements on it, and every write waits for one sync of the WAL file.
/// Calls block on disk I/O: the runtime makes them from handler threads
/// only. A row that cannot be decoded throws
/// `errc::corrupted_record` naming its key; SQLite failures throw
/// `errc::store_error` naming the operation.
class sqlite_store final : public store {
 public:
  explicit sqlite_store(sqlite_store_options opts = {});
  ~sqlite_store() override;

  /// Opens the file, sets WAL and creates the tables. Idempotent.
  void start() override;

  /// The durable-task calendars in the same file (table `schedules`, and
  /// `schedule_fences`: the last fencing token of each removed task),
  /// sharing this store's connection. Valid after `start()`. Old
  /// tombstones may be purged by hand once no executor can still hold
  /// their token (`DELETE FROM schedules WHERE deleted AND updated_at <
  /// ...`): a task registered again goes on from its fence.
  std::shared_ptr<schedule_store> schedules();

  void save_chat(const chat_record& rec) override;
  std::optional<chat_record> get_chat(std::string_view key) override;
  bool delete_chat(std::string_view key) override;
  std::vector<chat_record> list_chats() override;

  void save_contact(const contact_record& rec) override;
  std::optional<contact_record> get_contact(std::string_view id) override;
  bool delete_contact(std::string_view id) override;
  std::vector<contact_record> list_contacts() override;

  std::uint64_t append_message(std::string_view chat_key,
                               const logged_message& msg) override;
  std::vector<logged_message> messages(std::string_view chat_key,
                                       std::size_t limit) override;

  std::optional<flow_checkpoint> get_checkpoint(std::string_view key) override;
  std::uint64_t set_checkpoint(const flow_checkpoint& cp) override;
  std::optional<std::uint64_t>
  set_checkpoint_if(const flow_checkpoint& cp,
                    std::uint64_t expected_revision) override;
  bool clear_checkpoint_if(std::string_view key,
                           std::uint64_t expected_revision) override;
  void clear_checkpoint(std::string_view key) override;

  std::optional<std::string> get_user_data(std::string_view user,
                                           std::string_view ns,
                                           std::string_view key) override;
  void set_user_data(std::string_view user, std::string_view ns,
                     std::string_view key, std::string_view value_json,
                     std::optional<std::chrono::milliseconds> ttl = {}) override;
  bool delete_user_data(std::string_view user, std::string_view ns,
                        std::string_view key) override;
  std::vector<std::pair<std::string, std::string>>
  list_user_data(std::string_view user, std::string_view ns) override;

  std::optional<fenced_lock>
  acquire_lock_fenced(std::string_view key,
                      std::chrono::milliseconds ttl) override;
  bool renew_lock(std::string_view key, std::string_view token,
                  std::chrono::milliseconds ttl) override;
  bool release_lock(std::string_view key, std::string_view token) override;

 private:
  internal::db& conn();

  sqlite_store_options opts_;
  const botmesh::clock* clock_;
  std::shared_ptr<internal::db> db_;
  std::shared_ptr<schedule_store> schedules_;
};

} // namespace botmesh
