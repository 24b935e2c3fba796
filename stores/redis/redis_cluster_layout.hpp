#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace botmesh {

/// The key names of the `cluster:v1` layout: every group of keys one script
/// touches shares a hash tag (one slot), and listings read sorted-set
/// indexes that live in the slot of their records. Part of the contract:
/// every replica and the migration compute exactly these names.
///
/// p = prefix (must not hold `{` or `}`); <...> segments percent-encoded
/// (encode_key_segment: no `:`, `{`, `}`, `%`, glob character or space
/// remains, so an id never breaks a tag); <b> = bucket(id), 0-31:
///
///   p:{m:<chat>}:z                  zset    a chat's message log
///   p:{m:<chat>}:i:<member>         string  one message of that log
///   p:{ch:<b>}:r:<chat key>         hash    chat record
///   p:{ch:<b>}:idx                  zset    chats of bucket b
///   p:{ct:<b>}:r:<id>, :idx         contacts
///   p:{cp:<b>}:r:<key>, :idx        checkpoints (index scored by expiry)
///   p:{cp:<b>}:v:<key>              string  a checkpoint's last revision
///                                   (survives clears, as p:cprev: does)
///   p:{sc:<b>}:r:<id>, :idx         schedules
///   p:{ud:<user>}:e:<ns>:<key>      string  user data (ctx.user)
///   p:{ud:<user>}:idx               zset    a user's entries (by expiry),
///                                   member <ns>:<key> (both encoded)
///   p:{lk:<key>}:l                  string  lock token
///   p:{lk:<key>}:f                  string  lock fence counter
///   p:co:{t:<chat>}:h, :q           turns: the chat's hash (ticket counter,
///                                   fence, holder) and its ticket queue
///                                   (the spec's seq/tix/serving/owner/last
///                                   parts, in two keys of one slot: a turn
///                                   script then touches two keys, not five)
///   p:co:{ld:<name>}                leadership holder, and ...:term
///   p:conv:, p:cursor:, p:lease:, p:co:rep:, p:{durable:<table>}:*
///                                   unchanged from the legacy layout
///   p:{meta}:layout                 string  "cluster:v1" (the marker)
///
/// Bucket tags carry no prefix: bots sharing a cluster spread each kind of
/// record over the same 32 slots (about 10 per master with 3 masters), and
/// a listing costs 32 commands.
class redis_cluster_layout {
 public:
  /// Buckets per kind of record.
  static constexpr std::uint32_t buckets = 32;

  /// The marker's value.
  static constexpr std::string_view marker_value = "cluster:v1";

  /// Records kept in buckets, by their tag.
  enum class record_kind { chat, contact, checkpoint, schedule };

  /// Throws `invalid_argument_error` (field "prefix") for an empty prefix or
  /// one holding `{` or `}` (it would break the hash tags).
  explicit redis_cluster_layout(std::string prefix);

  const std::string& prefix() const noexcept {
    return prefix_;
  }

  /// FNV-1a (32 bits) of the id's bytes, modulo 32.
  static std::uint32_t bucket(std::string_view id) noexcept;

  /// The tag of a kind: "ch", "ct", "cp" or "sc".
  static std::string_view tag(record_kind k) noexcept;

  /// The marker's key under any prefix (a legacy one may hold braces).
  static std::string marker_key(std::string_view prefix);
  std::string marker() const;

  std::string message_log(std::string_view chat) const;
  std::string message_item(std::string_view chat, std::string_view member) const;

  std::string record(record_kind k, std::string_view id) const;
  /// The index of bucket `b` (0-31) of a kind.
  std::string record_index(record_kind k, std::uint32_t b) const;
  /// The index of the bucket `id` falls in.
  std::string record_index_of(record_kind k, std::string_view id) const;

  std::string user_data(std::string_view user, std::string_view ns,
                        std::string_view key) const;
  std::string user_data_index(std::string_view user) const;
  /// The member of (ns, key) in a user's index: "<ns>:<key>", encoded.
  static std::string user_data_member(std::string_view ns,
                                      std::string_view key);

  /// The last revision ever written for a checkpoint key (same slot as the
  /// checkpoint): revisions never repeat across clears.
  std::string checkpoint_revision(std::string_view key) const;

  std::string lock(std::string_view key) const;
  std::string fence(std::string_view key) const;

  /// `part`: "h" (the chat's hash) or "q" (its ticket queue); see
  /// lua/lib/co_common.lua for their fields.
  std::string turn(std::string_view chat, std::string_view part) const;
  std::string lead(std::string_view name) const;
  std::string lead_term(std::string_view name) const;

  // Unchanged from the legacy layout (so are p:conv:, p:cursor: and
  // p:{durable:<table>}:*, named by the components that own them).
  std::string lease(std::string_view name) const;
  std::string heartbeat(std::string_view incarnation) const;

 private:
  std::string prefix_;
};

} // namespace botmesh
