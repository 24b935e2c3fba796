#pragma once

#include <memory>
#include <string>

#include <botmesh/runtime/core/clock.hpp>
#include <botmesh/stores/durable_backend.hpp>

namespace botmesh {

struct sqlite_durable_options {
  /// The database file (created when missing); may be the store's file.
  /// Processes sharing the file share the journal. ":memory:" is private.
  std::string path = "botmesh.db";
  /// Time source for TTLs and heartbeats; the system clock when null. Must
  /// outlive the backend.
  const botmesh::clock* clock = nullptr;
};

/// The durable backend in a SQLite file (WAL), tables `durable_inbound`,
/// `durable_holders`, `durable_outbox` and `durable_fences`.
///
/// SQLite blocks on disk I/O, so the backend owns one I/O thread with its
/// connection: every operation is queued to it and its completion runs
/// there, in the order the operations were queued. Nothing blocks the
/// caller (a CAF worker, a transport thread) and no caller's lock is held
/// during I/O. Every operation is one `BEGIN IMMEDIATE` transaction, so
/// several processes may share the file.
///
/// Errors (passed to the completion): `errc::store_error` naming the
/// operation and SQLite's message; `errc::corrupted_record` naming the
/// record id when a stored row is unreadable. `start()` throws them.
class sqlite_durable_backend final : public durable_backend {
 public:
  explicit sqlite_durable_backend(sqlite_durable_options opts = {});
  /// Finishes what is queued, then closes the connection.
  ~sqlite_durable_backend() override;

  /// Opens the file and creates the tables (blocking). Idempotent.
  void start() override;

  void record(journal_record rec, std::string_view holder,
              std::chrono::milliseconds ttl,
              completion<journal_put> done) override;
  void confirm(std::string_view id, std::string_view holder,
               completion<bool> done) override;
  void release(std::string_view id, std::string_view holder,
               completion<bool> done) override;
  void release_unhandled(std::string_view id, std::string_view holder,
                         completion<bool> done) override;
  void beat_and_claim(std::string_view holder, std::chrono::milliseconds lease,
                      std::size_t limit, std::uint32_t max_attempts,
                      completion<claim_result> done) override;
  void retire(std::string_view holder, completion<bool> done) override;
  void outbox_claim(std::string_view send_id, std::string_view key,
                    std::uint64_t fence, std::string_view writer,
                    std::chrono::milliseconds ttl,
                    completion<outbox_verdict> done) override;
  void outbox_record(std::string_view send_id, std::string_view key,
                     std::uint64_t fence, std::string_view writer,
                     std::chrono::milliseconds ttl,
                     completion<outbox_verdict> done) override;
  void outbox_forget(std::string_view send_id, std::string_view writer,
                     completion<bool> done) override;

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

} // namespace botmesh
