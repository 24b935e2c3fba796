#pragma once

// Internal: the Redis schedule store and leader leases behind
// redis_store::schedules() and ::leases(), in either key layout.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <botmesh/stores/redis/redis_client.hpp>
#include <botmesh/stores/redis/redis_cluster_layout.hpp>
#include <botmesh/stores/redis/redis_layout.hpp>
#include <botmesh/stores/schedule_store.hpp>

namespace botmesh::internal {

/// Where schedules and leases live: the names differ per layout, the
/// records and scripts do not.
struct schedule_naming {
  /// The hash of a task.
  std::function<std::string(std::string_view)> record;
  /// The index listing that task (same slot as its hash).
  std::function<std::string(std::string_view)> index_of;
  /// Every index, read by list().
  std::vector<std::string> indexes;
  /// A leader lease.
  std::function<std::string(std::string_view)> lease;
};

/// p:sched:<id>, p:schedidx, p:lease:<name>.
schedule_naming legacy_schedule_naming(std::shared_ptr<const redis_layout> l);
/// p:{sc:<b>}:r:<id>, p:{sc:<b>}:idx, p:lease:<name>.
schedule_naming cluster_schedule_naming(const redis_cluster_layout& l);

std::shared_ptr<schedule_store>
make_redis_schedule_store(std::shared_ptr<redis_client> client,
                          schedule_naming naming);

std::shared_ptr<lease_provider>
make_redis_lease_provider(std::shared_ptr<redis_client> client,
                          schedule_naming naming);

} // namespace botmesh::internal
