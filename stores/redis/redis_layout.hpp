#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace botmesh {

/// The key layout of a Redis component (store, coordinator, schedule store,
/// lease provider). `automatic` is `cluster` on a Redis Cluster client and
/// `legacy` otherwise. `cluster` is the cluster:v1 layout
/// (redis_cluster_layout.hpp), which also works on one node; `legacy` is
/// the layout below and cannot run on a cluster (its scripts span slots).
/// Every replica of a bot must use the same layout and prefix: replicas
/// with different layouts see different keyspaces, and their turns and
/// locks stop excluding each other.
enum class redis_layout_kind : std::uint8_t { automatic, legacy, cluster };

/// Every Redis key name of the stores, built in one place. A layout maps
/// each kind of data to keys; `legacy` is the default single-node layout
/// (the cluster layout, with hash tags per script, plugs in here).
///
/// Legacy layout, p = prefix:
///
///   p:chat:<key>            hash   chat record
///   p:chats                 zset   chat index (score 0, ordered by key)
///   p:contact:<id>          hash   contact record
///   p:contacts              zset   contact index
///   p:log:<chat>            list   message log, {"seq":N,...} JSON items
///   p:logseq:<chat>         string last seq of the log
///   p:cp:<key>              hash   checkpoint: rev, body (JSON), created
///   p:cprev:<key>           string last revision ever written (survives clears)
///   p:ud:<user>:<ns>:<key>  string user-data JSON value (PX TTL)
///   p:udidx:<user>:<ns>     zset   user-data index, score = expiry or +inf
///   p:lock:<key>            string lock token (PX TTL)
///   p:fence:<key>           string lock fence counter (INCR)
///   p:sched:<id>            hash   durable task calendar
///   p:schedidx              zset   schedule index
///   p:lease:<name>          hash   leader lease: owner, until, token
///
/// Coordinator keys (the same in every layout: one hash tag per chat):
///
///   p:co:{t:<chat>}:h       hash   a chat's turn: holder, fence, last
///                                  holder, ticket counter
///   p:co:{t:<chat>}:q       list   its queued tickets
///                                  (both expire when the chat is idle; see
///                                  lua/lib/co_common.lua)
///   p:co:rep:<incarnation>  string replica heartbeat (PX lease)
///   p:co:{ld:<name>}        string leadership holder (PX lease), :term counter
///   p:co:wake:<incarnation> channel  grants pushed to the replica that owns
///                                  the ticket
///
/// Segments inside a hash tag are percent-encoded (%, :, {, }, glob
/// characters, spaces), so a chat id can never break a tag.
class redis_layout {
 public:
  virtual ~redis_layout();

  const std::string& prefix() const noexcept {
    return prefix_;
  }

  virtual std::string name() const = 0;
  virtual std::string chat(std::string_view key) const = 0;
  virtual std::string chat_index() const = 0;
  virtual std::string contact(std::string_view id) const = 0;
  virtual std::string contact_index() const = 0;
  virtual std::string log(std::string_view chat) const = 0;
  virtual std::string log_seq(std::string_view chat) const = 0;
  virtual std::string checkpoint(std::string_view key) const = 0;
  virtual std::string checkpoint_revision(std::string_view key) const = 0;
  virtual std::string user_data(std::string_view user, std::string_view ns,
                                std::string_view key) const = 0;
  virtual std::string user_data_index(std::string_view user,
                                      std::string_view ns) const = 0;
  virtual std::string lock(std::string_view key) const = 0;
  virtual std::string fence(std::string_view key) const = 0;
  virtual std::string schedule(std::string_view id) const = 0;
  virtual std::string schedule_index() const = 0;
  virtual std::string lease(std::string_view name) const = 0;

  /// `part` is "h" (the turn hash) or "q" (the ticket queue).
  std::string turn(std::string_view chat, std::string_view part) const;
  std::string heartbeat(std::string_view incarnation) const;
  std::string lead(std::string_view name) const;
  std::string lead_term(std::string_view name) const;
  /// Followed by an incarnation: where grants for it are published.
  std::string grant_channel_prefix() const;

 protected:
  explicit redis_layout(std::string prefix) : prefix_(std::move(prefix)) {
    // nop
  }

  std::string prefix_;
};

/// Percent-encodes the characters that must not appear in a key segment.
std::string encode_key_segment(std::string_view s);

/// The legacy layout under `prefix` (throws `invalid_argument_error`, field
/// "prefix", for an empty prefix).
std::shared_ptr<const redis_layout> make_legacy_layout(std::string prefix);

} // namespace botmesh
