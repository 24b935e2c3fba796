#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <botmesh/runtime/core/checkpoint.hpp>
#include <botmesh/runtime/core/clock.hpp>
#include <botmesh/runtime/core/message.hpp>

namespace botmesh {

/// A chat the bot has seen. `data` is a JSON document for application use.
struct chat_record {
  std::string key{}; ///< the chat key (see `chat_key`)
  std::string provider{};
  std::string chat{};
  std::string participant{};
  time_point created_at{};
  time_point last_message_at{};
  std::string data = "{}";

  friend bool operator==(const chat_record&, const chat_record&) = default;
};

/// A person the bot talks to. `data` is a JSON document for application use.
struct contact_record {
  std::string id{}; ///< provider-scoped id, e.g. "telegram:12345"
  std::string name{};
  std::string phone{};
  time_point updated_at{};
  std::string data = "{}";

  friend bool operator==(const contact_record&,
                         const contact_record&) = default;
};

enum class direction : std::uint8_t { in, out };

/// One entry of a chat's message log.
struct logged_message {
  std::uint64_t seq = 0; ///< assigned by the store, increasing per chat
  direction dir = direction::in;
  std::string id{};
  std::string sender{};
  std::string text{};
  message_type type = message_type::text;
  time_point at{};

  friend bool operator==(const logged_message&,
                         const logged_message&) = default;
};

/// A held lock: `token` proves ownership, `fence` grows on every acquisition
/// of the key (never reused, also after release or expiry), so a resource can
/// refuse writes from an owner that was frozen past its lock.
struct fenced_lock {
  std::string token{};
  std::uint64_t fence = 0;
};

/// The persistent state of a bot: chats, contacts, message logs, flow
/// checkpoints, user data (`ctx.user`) and fenced locks.
///
/// Contract for every implementation:
/// - Thread-safe: any method may be called from any thread concurrently.
/// - Calls may block on I/O. The runtime calls them only from its handler
///   threads, never from a CAF worker.
/// - Expected outcomes (not found, compare-and-set refused, lock taken) are
///   return values; failures (I/O, server errors) throw `botmesh::error`
///   with `errc::store_error`; a stored record that cannot be decoded throws
///   `botmesh::error` with `errc::corrupted_record` naming the key. Bad
///   arguments throw `invalid_argument_error` naming the field, before any
///   write. A failed call never leaves a partial write behind.
/// - Expiry (user data TTL, locks, ephemeral checkpoints) follows the store's
///   clock; an expired item reads as absent.
class store {
 public:
  virtual ~store();

  /// Opens connections and creates schemas. Called by the bot before use;
  /// calling it again is harmless.
  virtual void start();

  /// Releases connections. The store may be started again.
  virtual void stop();

  // -- chats -----------------------------------------------------------------

  /// Inserts or replaces the chat with `rec.key`; keeps the first
  /// `created_at` of an existing record.
  virtual void save_chat(const chat_record& rec) = 0;
  virtual std::optional<chat_record> get_chat(std::string_view key) = 0;
  /// Removes the chat record and its message log. True when a record existed.
  virtual bool delete_chat(std::string_view key) = 0;
  /// All chat records, ordered by key.
  virtual std::vector<chat_record> list_chats() = 0;

  // -- contacts --------------------------------------------------------------

  virtual void save_contact(const contact_record& rec) = 0;
  virtual std::optional<contact_record> get_contact(std::string_view id) = 0;
  virtual bool delete_contact(std::string_view id) = 0;
  /// All contacts, ordered by id.
  virtual std::vector<contact_record> list_contacts() = 0;

  // -- message log -----------------------------------------------------------

  /// Appends to the chat's log and returns the assigned `seq` (1, 2, ...).
  /// Stores may cap a log's length (documented per store), dropping oldest.
  virtual std::uint64_t append_message(std::string_view chat_key,
                                       const logged_message& msg) = 0;
  /// The newest `limit` entries of the chat's log, oldest first.
  virtual std::vector<logged_message> messages(std::string_view chat_key,
                                               std::size_t limit) = 0;

  // -- flow checkpoints ------------------------------------------------------

  /// The live checkpoint of `key`, if any (an expired ephemeral one is absent).
  virtual std::optional<flow_checkpoint> get_checkpoint(std::string_view key)
    = 0;

  /// Writes `cp` under `cp.key` unconditionally; returns the new revision.
  virtual std::uint64_t set_checkpoint(const flow_checkpoint& cp) = 0;

  /// Compare-and-set: writes `cp` only if the live checkpoint's revision is
  /// `expected_revision` (0 = "there is no live checkpoint"). Returns the new
  /// revision, or nothing when refused. Revisions chain per key: a new one is
  /// always greater than any earlier revision of the key, even across a
  /// clear, so a stale writer can never match again.
  virtual std::optional<std::uint64_t>
  set_checkpoint_if(const flow_checkpoint& cp, std::uint64_t expected_revision)
    = 0;

  /// Removes the checkpoint only if its revision is `expected_revision`.
  /// True when it was removed.
  virtual bool clear_checkpoint_if(std::string_view key,
                                   std::uint64_t expected_revision) = 0;

  /// Removes the checkpoint of `key` unconditionally (no-op when absent).
  virtual void clear_checkpoint(std::string_view key) = 0;

  /// Removes the checkpoint of `key` only while its revision cannot be read
  /// (missing, or not a revision): what a turn does with a checkpoint it
  /// found damaged that way, so a readable one another holder wrote
  /// meanwhile stays. True when removed. By default unconditional, for a
  /// store where such a checkpoint refuses every later write of its key
  /// (nothing newer can be there).
  virtual bool clear_damaged_checkpoint(std::string_view key) {
    clear_checkpoint(key);
    return true;
  }

  /// False for a store whose checkpoint writes cannot be conditional; with
  /// coordination on, the bot warns at start and keeps only a local fence.
  virtual bool supports_compare_and_set() const noexcept {
    return true;
  }

  // -- user data (ctx.user) --------------------------------------------------

  /// The JSON value stored under (user, ns, key), if any.
  virtual std::optional<std::string>
  get_user_data(std::string_view user, std::string_view ns,
                std::string_view key) = 0;

  /// Stores a JSON value, optionally expiring after `ttl` (> 0). Throws
  /// `invalid_argument_error` for an empty user/namespace/key ("user", "ns",
  /// "key"), a value that is not JSON ("value") or a TTL that is not positive
  /// or is over 100 years ("ttl").
  virtual void set_user_data(std::string_view user, std::string_view ns,
                             std::string_view key, std::string_view value_json,
                             std::optional<std::chrono::milliseconds> ttl = {})
    = 0;

  /// True when a live value was removed.
  virtual bool delete_user_data(std::string_view user, std::string_view ns,
                                std::string_view key) = 0;

  /// Live (key, JSON value) pairs of one user's namespace, ordered by key.
  virtual std::vector<std::pair<std::string, std::string>>
  list_user_data(std::string_view user, std::string_view ns) = 0;

  // -- fenced locks ----------------------------------------------------------

  /// Takes the lock `key` for `ttl` if nobody holds it (or the holder's TTL
  /// ran out). Returns the token and a fence greater than every fence handed
  /// out for `key` before, or nothing when the lock is held. Throws
  /// `invalid_argument_error` for an empty key ("key") or a ttl <= 0 or over
  /// 100 years ("ttl").
  virtual std::optional<fenced_lock>
  acquire_lock_fenced(std::string_view key, std::chrono::milliseconds ttl) = 0;

  /// Extends a held lock to `ttl` from now. False when `token` no longer
  /// holds it (expired, released, or taken by someone else).
  virtual bool renew_lock(std::string_view key, std::string_view token,
                          std::chrono::milliseconds ttl) = 0;

  /// Releases the lock if `token` holds it; a stale token changes nothing.
  virtual bool release_lock(std::string_view key, std::string_view token) = 0;
};

namespace detail {

/// Shared argument checks of store implementations (throw
/// `invalid_argument_error` naming the field).
void check_user_data_args(std::string_view user, std::string_view ns,
                          std::string_view key);
void check_ttl(std::chrono::milliseconds ttl, std::string_view field = "ttl");
void check_key(std::string_view key, std::string_view field = "key");

/// A random 128-bit token as 32 hex characters (lock tokens).
std::string random_token();

/// A random UUID (version 4): replica ids, coordinator incarnations.
std::string random_uuid();

} // namespace detail

} // namespace botmesh
