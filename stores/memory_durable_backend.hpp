#pragma once

#include <memory>

#include <botmesh/runtime/core/clock.hpp>
#include <botmesh/stores/durable_backend.hpp>

namespace botmesh {

/// The in-process durable backend: bots sharing one instance deduplicate
/// and reprocess like replicas sharing Redis (for tests and single-process
/// bots: nothing survives the process). Thread-safe; every completion runs
/// on the caller's thread before the call returns. Its mutex guards only
/// its own tables. `clock` (the system clock when null) must outlive it.
class memory_durable_backend final : public durable_backend {
 public:
  explicit memory_durable_backend(const botmesh::clock* clock = nullptr);
  ~memory_durable_backend() override;

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

  /// Records in the journal now, tombstones included (for tests).
  std::size_t size() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace botmesh
