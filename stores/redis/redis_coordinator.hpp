#pragma once

#include <memory>
#include <optional>
#include <string>

#include <botmesh/runtime/core/duration.hpp>
#include <botmesh/stores/coordinator.hpp>
#include <botmesh/stores/redis/redis_client.hpp>
#include <botmesh/stores/redis/redis_layout.hpp>

namespace botmesh {

struct redis_coordinator_options {
  /// Connects a client of its own to this URL...
  std::string url = "redis://127.0.0.1:6379";
  /// ...unless an existing client is given...
  std::shared_ptr<redis_client> client{};
  /// ...or a Redis Cluster client of its own is wanted: not combinable with
  /// `url` or `client` (`invalid_argument_error`, field "cluster"). The
  /// coordinator's keys are the same on one node and on a cluster: a
  /// chat's turn keys share one hash tag, so do a leadership's.
  std::optional<redis_cluster_options> cluster{};
  /// Key prefix; the same on every replica.
  std::string prefix = "botmesh";
  /// Unique among running replicas; a random UUID when empty.
  std::string replica_id{};
  duration lease = "15s";
  /// The store's key layout (redis_layout_kind). The coordinator's keys are
  /// the same in both, but the choice is checked as the store's is:
  /// `legacy` on a cluster throws `invalid_argument_error` (field
  /// "layout"), and the cluster layout refuses a prefix with `{` or `}`.
  redis_layout_kind layout = redis_layout_kind::automatic;
};

/// A replica's coordinator on Redis (see redis_layout.hpp for the keys and
/// stores/redis/lua/co_*.lua for the scripts, one per transition).
///
/// Turn deadlines and heartbeats run on the Redis server's clock. Grants
/// made by another replica's release are published on this incarnation's
/// own channel and read by a subscriber on a connection of its own; pub/sub
/// is at most once, so `push_epoch` changes with every (re)subscription and
/// waiters poll what may have been missed. A chat idle for
/// max(10 min, 40 x lease) is forgotten (its keys expire): its next holder
/// learns no previous holder, and fences keep growing regardless.
///
/// Each chat's operations go on one connection (chosen by its key), so a
/// release and the next enter of the same chat reach Redis in order
/// without waiting for each other. Redis errors complete with
/// `coordination_unavailable_error` naming what failed; a reply that never
/// came with `errc::timeout`.
class redis_coordinator final : public coordinator {
 public:
  explicit redis_coordinator(redis_coordinator_options opts = {});
  ~redis_coordinator() override;

  /// Simulates a dead replica: every later call fails and nothing is
  /// renewed, so its heartbeat and turns expire after the lease.
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
  /// Standalone: one co_batch call per connection lane and up to 8
  /// operations. A cluster client issues them one by one (a script's keys
  /// must share a slot).
  void submit(std::vector<turn_op> ops) override;
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
  struct impl;
  std::shared_ptr<impl> impl_;
};

} // namespace botmesh
