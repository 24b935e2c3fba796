#pragma once

#include <memory>
#include <string>

#include <botmesh/runtime/core/duration.hpp>
#include <botmesh/stores/coordinator.hpp>
#include <botmesh/stores/redis/redis_client.hpp>
#include <botmesh/stores/redis/redis_layout.hpp>

namespace botmesh {

struct redis_coordinator_options {
  /// Connects a client of its own to this URL...
  std::string url = "redis://127.0.0.1:6379";
  /// ...unless an existing client is given.
  std::shared_ptr<redis_client> client{};
  /// Key prefix; the same on every replica.
  std::string prefix = "botmesh";
  /// Unique among running replicas; a random UUID when empty.
  std::string replica_id{};
  duration lease = "15s";
};

/// A replica's coordinator on Redis (see redis_layout.hpp for the keys and
/// stores/redis/lua/co_*.lua for the scripts, one per transition).
///
/// Turn deadlines and heartbeats run on the Redis server's clock. A waiting
/// replica is woken by a PUBLISH from the release script, read by a
/// subscriber on its own connection; callers keep polling as a safety net,
/// since pub/sub is at most once. Redis errors throw
/// `coordination_unavailable_error` naming what failed.
class redis_coordinator final : public coordinator {
 public:
  explicit redis_coordinator(redis_coordinator_options opts = {});
  ~redis_coordinator() override;

  /// Simulates a dead replica: every later call throws and nothing is
  /// renewed, so its heartbeat and turns expire after the lease.
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
  struct impl;
  std::shared_ptr<impl> impl_;
};

} // namespace botmesh
