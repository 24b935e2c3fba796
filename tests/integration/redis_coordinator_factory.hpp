#pragma once

// The coordinator factory of the conformance suite for Redis, on one node
// or on the cluster: `Connect::into(options)` says how to reach Redis.

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <botmesh/stores/redis/redis_coordinator.hpp>

#include "redis_server.hpp"

namespace test {

template <class Connect>
struct basic_redis_coordinator_factory {
  // Leases are short: Redis time is real time, so advance() sleeps.
  static constexpr std::chrono::milliseconds lease{400};
  std::string prefix = unique_prefix("bmco");

  std::unique_ptr<botmesh::coordinator> make(std::string replica_id) {
    botmesh::redis_coordinator_options o;
    Connect::into(o);
    o.prefix = prefix;
    o.replica_id = std::move(replica_id);
    o.lease = lease;
    return std::make_unique<botmesh::redis_coordinator>(std::move(o));
  }

  void crash(botmesh::coordinator& c) {
    static_cast<botmesh::redis_coordinator&>(c).crash();
  }

  void advance(std::chrono::milliseconds d) {
    std::this_thread::sleep_for(d);
  }
};

} // namespace test
