#pragma once

// Internal: the Redis schedule store and leader leases behind
// redis_store::schedules() and ::leases().

#include <memory>

#include <botmesh/stores/redis/redis_client.hpp>
#include <botmesh/stores/redis/redis_layout.hpp>
#include <botmesh/stores/schedule_store.hpp>

namespace botmesh::internal {

std::shared_ptr<schedule_store>
make_redis_schedule_store(std::shared_ptr<redis_client> client,
                          std::shared_ptr<const redis_layout> layout);

std::shared_ptr<lease_provider>
make_redis_lease_provider(std::shared_ptr<redis_client> client,
                          std::shared_ptr<const redis_layout> layout);

} // namespace botmesh::internal
