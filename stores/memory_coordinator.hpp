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
/// its heartbeat (as the lease actor's renewals do with Redis).
class memory_coordinator final : public coordinator {
 public:
  memory_coordinator(memory_coordination_hub& hub,
                     memory_coordinator_options opts = {});
  ~memory_coordinator() override;

  /// Simulates this replica dying: it stops renewing and every later call
  /// throws `coordination_unavailable_error`; its tickets and turns are
  /// skipped once its lease has passed.
  void crash();

  const std::string& replica_id() const noexcept override;
  const std::string& incarnation() const noexcept override;
  std::chrono::milliseconds lease() const noexcept override;
  std::uint64_t take_ticket(std::string_view key) override;
  std::optional<turn> try_acquire(std::string_view key,
                                  std::uint64_t ticket) override;
  std::vector<std::string> renew(const std::vector<turn>& held) override;
  bool release(const turn& t) override;
  void cancel_ticket(std::string_view key, std::uint64_t ticket) override;
  std::optional<leadership> try_lead(std::string_view name) override;
  void release_lead(const leadership& l) override;
  void wait_change(std::string_view key,
                   std::chrono::milliseconds timeout) override;

 private:
  void check_alive() const;

  std::shared_ptr<memory_coordination_hub::impl> hub_;
  std::string replica_id_;
  std::string incarnation_;
  std::chrono::milliseconds lease_;
  std::atomic<bool> crashed_{false}; // set by crash() from any thread
};

} // namespace botmesh
