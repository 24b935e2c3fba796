#pragma once

#include <map>
#include <memory>
#include <mutex>

#include <botmesh/stores/schedule_store.hpp>

namespace botmesh {

/// The in-process schedule store: the reference implementation. Schedulers
/// sharing one instance coordinate like replicas sharing a backend. Nothing
/// survives the process. Cost: O(log n) per call under one of 16 mutexes,
/// chosen by the id's hash, so task actors on several threads calling for
/// different ids seldom wait for each other (on one mutex they did, and a
/// wait there put a CAF worker to sleep). `list()` sorts by id; it is
/// consistent per record, not one instant for all.
class memory_schedule_store final : public schedule_store {
 public:
  memory_schedule_store();
  ~memory_schedule_store() override;

  /// A map under a mutex: no I/O.
  bool blocks() const noexcept override {
    return false;
  }

  std::optional<schedule_record> get(std::string_view id) override;
  schedule_record register_task(std::string_view id, std::string_view spec,
                                time_point first_run, time_point now) override;
  std::optional<schedule_claim> claim(std::string_view id,
                                      std::string_view owner, time_point now,
                                      std::chrono::milliseconds lease) override;
  bool renew(std::string_view id, std::string_view owner, std::uint64_t token,
             time_point now, std::chrono::milliseconds lease) override;
  bool commit(std::string_view id, std::string_view owner, std::uint64_t token,
              time_point next_run_at, bool done, time_point now) override;
  bool remove(std::string_view id, time_point now) override;
  std::vector<schedule_record> list() override;

 private:
  struct shard;
  shard& shard_of(std::string_view id);
  std::unique_ptr<shard[]> shards_;
};

/// The in-process leader lease.
class memory_lease_provider final : public lease_provider {
 public:
  std::optional<std::uint64_t> try_acquire(std::string_view name,
                                           std::string_view owner,
                                           time_point now,
                                           std::chrono::milliseconds ttl) override;
  void release(std::string_view name, std::string_view owner) override;

 private:
  struct slot {
    std::string owner;
    time_point until{};
    std::uint64_t token = 0;
  };
  std::mutex mtx_;
  std::map<std::string, slot, std::less<>> leases_;
};

} // namespace botmesh
