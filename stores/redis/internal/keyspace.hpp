#pragma once

// Internal: reading a whole keyspace under a prefix, for the inspection
// and the migration (redis_migration.hpp).

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <botmesh/stores/redis/redis_client.hpp>

namespace botmesh::internal {

/// Every key under `prefix` (SCAN), on one node or on every master of a
/// cluster client; sorted.
std::vector<std::string> scan_prefix(redis_client& c, const std::string& prefix);

/// A key of the cluster:v1 layout, taken apart.
struct cluster_key {
  std::string kind;   ///< as redis_data_kinds(), or "marker"
  std::string tag;    ///< "m", "ch", "ct", "cp", "sc", "ud", "lk"
  std::string id;     ///< decoded: chat (m), user (ud), lock key (lk), record id
  std::string part;   ///< "z", "i", "r", "v", "idx", "e", "l", "f"
  std::string member; ///< item member (m), "ns:key" encoded (ud)
};

std::optional<cluster_key> parse_cluster_key(std::string_view prefix,
                                             std::string_view key);

/// True for a name both layouts share (co:, conv:, cursor:, lease:,
/// {durable:).
bool is_unchanged(std::string_view prefix, std::string_view key);

/// Coordinator heartbeats and pending turns among `keys`.
std::pair<std::size_t, std::size_t>
live_state(redis_client& c, const std::string& prefix,
           const std::vector<std::string>& keys);

} // namespace botmesh::internal
