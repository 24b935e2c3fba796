#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <botmesh/stores/redis/redis_client.hpp>

namespace botmesh {

/// Kinds of data, as the migration and inspection count them:
/// "chats", "contacts", "messages", "checkpoints", "user_data", "locks",
/// "schedules", and "unchanged" (conversations, cursors, leases,
/// leaderships and the durable journal: the same names in both layouts).
/// Also the values `redis_migration_options::include` accepts.
const std::vector<std::string>& redis_data_kinds();

/// What a keyspace holds under a prefix (`inspect_keyspace`).
struct redis_keyspace_report {
  std::string prefix;
  /// Keys per kind in each layout (indexes and counters included).
  std::map<std::string, std::size_t> legacy{};
  std::map<std::string, std::size_t> cluster{};
  std::map<std::string, std::size_t> unchanged{};
  /// The value of p:{meta}:layout, if set.
  std::optional<std::string> marker{};
  /// Coordinator heartbeats (p:co:rep:*) and chats with a queued ticket or
  /// a turn held (p:co:{t:*}): a live bot.
  std::size_t heartbeats = 0;
  std::size_t pending_turns = 0;

  /// Lines "layout kind count", then the marker and the live counts.
  std::string to_text() const;
  std::string to_json() const;
};

/// Counts the keys under `prefix` per layout and kind. Scans every master
/// of a cluster client (through the client's own node clients: its
/// credentials and `node_address_map` apply). Throws `errc::store_error`
/// on a Redis failure, and when a master is flagged failing while it still
/// serves slots or a slot has no master (its keys could not be counted).
redis_keyspace_report inspect_keyspace(redis_client& client,
                                       const std::string& prefix);

enum class redis_migration_direction : std::uint8_t {
  legacy_to_cluster,
  cluster_to_legacy,
};

struct redis_migration_options {
  /// Where the data is. Required. legacy_to_cluster: one node.
  /// cluster_to_legacy: one node or a cluster client (every master is read;
  /// a master flagged failing that still serves slots, or a slot without a
  /// master, stops the migration with `errc::store_error` before anything
  /// is written or pruned).
  std::shared_ptr<redis_client> source{};
  /// Where it goes; empty: in place, in `source`. cluster_to_legacy needs a
  /// single-node target (a cluster source needs an explicit target).
  std::shared_ptr<redis_client> target{};
  std::string prefix = "botmesh";
  redis_migration_direction direction =
    redis_migration_direction::legacy_to_cluster;
  /// Counts what would be done; writes and deletes nothing.
  bool dry_run = false;
  /// Only these kinds (redis_data_kinds()); empty = all. A limited pass
  /// never writes (or deletes) the layout marker.
  std::vector<std::string> include{};
  /// An existing target record is replaced (default: it wins).
  bool overwrite = false;
  /// After copying, deletes the source keys of the copied kinds (only keys
  /// whose data the target now holds; never shared-name keys in place).
  bool delete_source = false;
  /// Runs although a coordinator heartbeat or a pending turn exists at the
  /// source or a distinct target.
  bool allow_live = false;
  /// cluster_to_legacy only: the legacy target ends up equal to the
  /// source (records overwritten, legacy records the source no longer has
  /// pruned, schedules only in the target turned into tombstones that keep
  /// their token). false: copy only, existing legacy records win.
  bool mirror = true;
};

/// What a migration did (or, with dry_run, would do), per kind.
struct redis_migration_report {
  struct counts {
    /// Records written to the target.
    std::size_t copied = 0;
    /// Records the target already had and kept (overwrite off, or a
    /// schedule whose token was not lower).
    std::size_t kept = 0;
    /// Target records removed or tombstoned to mirror the source (none
    /// when the pass found problems: see `problems`).
    std::size_t pruned = 0;
    /// Source keys deleted (delete_source).
    std::size_t deleted = 0;
  };
  bool dry_run = false;
  std::string direction;
  std::map<std::string, counts> kinds{};
  /// Message items no log references (cluster layout), by key.
  std::vector<std::string> orphans{};
  /// Message items that do not belong to their chat's log, by key (skipped).
  std::vector<std::string> foreign{};
  /// Records that could not be read (damaged), by key and why; not copied,
  /// and never deleted from the source.
  std::vector<std::string> problems{};
  /// Total of the kinds' `pruned`.
  std::size_t pruned = 0;
  /// What happened to p:{meta}:layout: "written", "deleted", "not written:
  /// ..." or "not deleted: ..." with the reason.
  std::string layout_marker;

  std::string to_text() const;
  std::string to_json() const;
};

/// Copies a keyspace between the legacy and the cluster:v1 layouts (see
/// README "Redis Cluster": migrate cold, all bots of the prefix stopped).
///
/// Refuses (`errc::store_error`, naming the keys) while a heartbeat or a
/// pending turn exists at the source or a distinct target, unless
/// `allow_live`. Idempotent and resumable: an existing target record wins
/// unless `overwrite` (rollback with `mirror` overwrites). Messages are read
/// from each chat's log; TTLs of checkpoints and user data are kept; lock
/// fences, leadership terms and checkpoint revisions only go up; turn
/// counters and held locks are not copied; schedules keep their fencing
/// token (a greater source token wins even without overwrite). Shared-name
/// keys (redis_data_kinds' "unchanged") are copied only to another server.
/// The layout marker is written last (forward) or deleted (rollback), and
/// only on a complete pass (no `include`, no dry run).
///
/// Throws `invalid_argument_error` for bad options (field "source",
/// "target", "include", "prefix"), `errc::store_error` for a Redis failure
/// (what was done before it stays done: run it again to resume).
redis_migration_report migrate_redis_layout(const redis_migration_options& o);

} // namespace botmesh
