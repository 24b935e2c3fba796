#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include <botmesh/runtime/core/duration.hpp>
#include <botmesh/stores/coordinator.hpp>

namespace botmesh {

struct memory_hub_options {
  /// Idle chats (no ticket, no holder) kept beyond this are evicted, least
  /// recently used first.
  std::size_t max_idle_keys = 10'000;
  /// Time source for leases and heartbeats; the system clock when null.
  /// Must outlive the hub.
  const botmesh::clock* clock = nullptr;
};

/// The in-process reference coordination backend: bots whose coordinators
/// share one hub coordinate like replicas sharing Redis. Thread-safe.
class memory_coordination_hub {
 public:
  explicit memory_coordination_hub(memory_hub_options opts = {});
  ~memory_coordination_hub();

  /// Chats whose state the hub holds now (for tests of eviction).
  std::size_t keys() const;


 private:
  friend class memory_coordinator;
  struct impl;
  std::shared_ptr<impl> impl_;
};

struct memory_coordinator_options {
  /// Must be unique among running replicas; a random UUID when empty.
  std::string replica_id{};
  duration lease = "15s";
};

/// A replica's coordinator on a memory hub. Every call it makes refreshes
/// its heartbeat (as the lease actor's renewals do with Redis). Completions
/// and pushed grants run on the calling thread, after the hub's lock is
/// released; pushes never get lost (`push_epoch` stays 1).
class memory_coordinator final : public coordinator {
 public:
  memory_coordinator(memory_coordination_hub& hub,
                     memory_coordinator_options opts = {});
  ~memory_coordinator() override;

  /// Simulates this replica dying: it stops renewing, gets no more pushes,
  /// and every later call fails with `coordination_unavailable_error`; its
  /// tickets and turns are passed on once its lease has run out.
  void crash();

  const std::string& replica_id() const noexcept override;
  const std::string& incarnation() const noexcept override;
  std::chrono::milliseconds lease() const noexcept override;
  void enter(std::string_view key, std::uint64_t req, bool retry,
             completion<turn_state> done) override;
  void poll(std::string_view key, std::uint64_t req,
            completion<turn_state> done) override;
  void release(turn_ref t, std::string_view handoff,
               completion<release_result> done) override;
  void leave(std::string_view key, std::uint64_t req,
             completion<bool> done) override;
  void skip_if_dead(std::string_view key, std::string_view incarnation,
                    completion<bool> done) override;
  void renew(renewal r, completion<renewal_result> done) override;
  void unlead(std::string_view name, std::uint64_t fence,
              completion<bool> done) override;
  void on_grant(grant_listener fn) override;
  std::uint64_t push_epoch() const noexcept override;

 private:
  bool crashed(std::exception_ptr& err) const;

  std::shared_ptr<memory_coordination_hub::impl> hub_;
  std::string replica_id_;
  std::string incarnation_;
  std::chrono::milliseconds lease_;
  std::atomic<bool> crashed_{false}; // set by crash() from any thread
};

} // namespace botmesh
