#pragma once

// Internal: which layout a Redis component uses, and reading a whole
// keyspace under a prefix (the store's start check, the inspection and the
// migration of redis_migration.hpp).

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <botmesh/stores/redis/redis_client.hpp>
#include <botmesh/stores/redis/redis_layout.hpp>

namespace botmesh::internal {

/// The layout a component uses: `asked` with `automatic` resolved for the
/// kind of client. Throws `invalid_argument_error`, field "layout", for
/// `legacy` on a cluster client, and field "prefix" for an empty prefix or,
/// in the cluster layout, one holding `{` or `}`. `component` names the
/// caller in the message.
redis_layout_kind resolve_layout(redis_layout_kind asked, bool cluster_client,
                                 std::string_view prefix,
                                 std::string_view component);

/// The kind of legacy data `key` holds under `prefix` ("chats", "contacts",
/// "messages", "checkpoints", "user_data", "locks", "schedules"), or
/// nothing for a key the layouts share or one not under the prefix (leases,
/// coordinator, conversation, cursor and durable keys are the same in both
/// layouts).
std::optional<std::string_view> legacy_data_kind(std::string_view prefix,
                                                 std::string_view key);

/// `s` with the glob characters of SCAN MATCH escaped.
std::string escape_glob(std::string_view s);

/// SCANs one node for keys matching `match`, handing each to `visit` until
/// it returns false. Throws `store_error` for a malformed reply.
void scan_node(redis_client& c, const std::string& match,
               const std::function<bool(const std::string&)>& visit);

/// Every key under `prefix` (SCAN), on one node or on every master of a
/// cluster client (cluster_masters); sorted.
std::vector<std::string> scan_prefix(redis_client& c, const std::string& prefix);

/// The masters (`host:port`) a CLUSTER NODES text lists, which together
/// serve every slot. Throws `errc::store_error` naming a master flagged
/// `fail` or `fail?` that still serves slots, or the slots no master
/// serves: a scan would miss their keys, a count would be short and a
/// mirror would prune records the source still has. A failed master
/// without slots (replaced by its replica) holds nothing and is left out.
std::vector<std::string> cluster_masters(std::string_view nodes_text);

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
