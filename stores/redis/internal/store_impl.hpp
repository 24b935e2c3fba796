#pragma once

// Internal: the two implementations behind redis_store, one per key layout.

#include <cstddef>
#include <memory>

#include <botmesh/stores/redis/redis_client.hpp>
#include <botmesh/stores/redis/redis_cluster_layout.hpp>
#include <botmesh/stores/redis/redis_layout.hpp>
#include <botmesh/stores/store.hpp>

namespace botmesh::internal {

/// The legacy single-node layout (redis_layout.hpp).
std::unique_ptr<store>
make_legacy_redis_store(std::shared_ptr<redis_client> client,
                        std::shared_ptr<const redis_layout> layout,
                        std::size_t max_log);

/// The cluster:v1 layout (redis_cluster_layout.hpp), on a cluster or one
/// node.
std::unique_ptr<store>
make_cluster_redis_store(std::shared_ptr<redis_client> client,
                         redis_cluster_layout layout, std::size_t max_log);

/// Chat deletion works through the log in atomic batches of this many
/// entries (cluster:v1).
inline constexpr std::size_t cluster_delete_batch = 1000;

/// Reverses encode_key_segment (a malformed escape is kept as is).
std::string decode_key_segment(std::string_view s);

} // namespace botmesh::internal
