// The coordinator conformance suite on the Redis Cluster: the turn and
// leadership keys of a chat share one hash tag, and the heartbeat of a
// previous holder (another slot) is read with a command of its own.

#include <doctest/doctest.h>

#include <thread>

#include <conformance/coordinator_conformance.hpp>

#include <botmesh/stores/redis/redis_coordinator.hpp>

#include "redis_cluster.hpp"
#include "redis_server.hpp"

namespace {

std::shared_ptr<botmesh::redis_client> shared_cluster_client() {
  static auto c = std::make_shared<botmesh::redis_client>(test::cluster_options());
  return c;
}

// Leases are short: Redis time is real time, so advance() sleeps.
struct redis_cluster_coordinator_factory {
  static constexpr std::chrono::milliseconds lease{400};
  std::string prefix = test::unique_prefix("bmcc");

  std::unique_ptr<botmesh::coordinator> make(std::string replica_id) {
    return std::make_unique<botmesh::redis_coordinator>(
      botmesh::redis_coordinator_options{.client = shared_cluster_client(),
                                         .prefix = prefix,
                                         .replica_id = std::move(replica_id),
                                         .lease = lease});
  }

  void crash(botmesh::coordinator& c) {
    static_cast<botmesh::redis_coordinator&>(c).crash();
  }

  void advance(std::chrono::milliseconds d) {
    std::this_thread::sleep_for(d);
  }
};

} // namespace

TYPE_TO_STRING(redis_cluster_coordinator_factory);
BOTMESH_COORDINATOR_CONFORMANCE(redis_cluster_coordinator_factory);
