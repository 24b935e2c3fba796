#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace botmesh {

/// One inbound message in the journal.
struct journal_record {
  /// The record's id: provider, chat key and the platform's message id
  /// (see `journal_id`). Two deliveries of one platform message have the
  /// same id, whatever replica receives them.
  std::string id{};
  /// The chat key the message belongs to.
  std::string key{};
  /// The message, encoded with `to_json(inbound_message)`.
  std::string message{};
  /// Arrival order in the backend (grows with every record).
  std::uint64_t seq = 0;
  /// How many holders took it so far (1 after `record`; +1 per claim).
  std::uint32_t attempts = 0;
};

/// What `durable_backend::record` did.
enum class journal_put : std::uint8_t {
  /// New: recorded, held by the caller.
  recorded,
  /// A record with this id exists (or existed within its TTL): drop it.
  duplicate,
};

/// What `durable_backend::outbox_claim` decided for one send.
enum class outbox_verdict : std::uint8_t {
  /// First time this send id is seen: send it.
  send,
  /// Already sent (a replayed step): skip it.
  duplicate,
  /// The chat's outbox saw a higher fence: the sender is a stale holder.
  fenced,
};

std::string_view to_string(journal_put p) noexcept;
std::string_view to_string(outbox_verdict v) noexcept;

/// The journal id of a platform message: `<chat key>#<platform id>` (the
/// chat key already names the provider). When either part holds a '#' or
/// a backslash, both parts have each of these preceded by a backslash, so
/// two different pairs never make one id (the built-in providers' ids hold
/// neither: theirs keep the plain form).
std::string journal_id(std::string_view chat_key, std::string_view message_id);

/// The storage of durable processing: the inbound journal (every message
/// recorded on arrival, confirmed once its effect is kept, reprocessed
/// otherwise) and the outbox (every send of a journaled turn, once).
///
/// A record is *held* by one holder (a process incarnation: its instance id
/// and a nonce) from `record` on, until the holder `confirm`s it (done: kept
/// only as a tombstone that makes later deliveries duplicates) or
/// `release`s it (free: any holder may claim it). A holder proves it is
/// alive with `beat_and_claim` at least once per `lease`; records of a
/// holder whose heartbeat lapsed, and free ones, are claimed by the next
/// live holder that beats, in arrival order.
///
/// Every record, tombstone and outbox entry expires `ttl` after it was
/// written: the platform's retry window, past which a redelivery is not
/// expected.
///
/// The asynchronous face: every operation returns at once and calls `done`
/// exactly once, with a result or an exception (`botmesh::error`:
/// `errc::store_error` naming the operation, `errc::timeout`,
/// `errc::corrupted_record` naming the record). `done` may run on the
/// caller's thread (memory) or a backend thread (SQLite's I/O thread, a
/// Redis connection's), must not block, and operations issued by one
/// thread complete in the order they were issued.
class durable_backend {
 public:
  template <class T>
  using completion = std::function<void(T, std::exception_ptr)>;

  virtual ~durable_backend();

  /// Prepares the backend (tables, connections). Blocking; idempotent.
  /// Called once by the bot's `start()` on the caller's thread.
  virtual void start() {
    // nop
  }

  /// Records `rec` (its `seq` and `attempts` are set by the backend) held
  /// by `holder`, unless a record with its id exists: then `duplicate`.
  virtual void record(journal_record rec, std::string_view holder,
                      std::chrono::milliseconds ttl,
                      completion<journal_put> done)
    = 0;

  /// Marks record `id` done if `holder` holds it; false otherwise (it was
  /// claimed by another holder after this one's heartbeat lapsed). A
  /// record past its TTL may already be forgotten (backends drop expired
  /// records at their own pace): then false too.
  virtual void confirm(std::string_view id, std::string_view holder,
                       completion<bool> done)
    = 0;

  /// Frees record `id` if `holder` holds it, so it is claimed again; false
  /// otherwise.
  virtual void release(std::string_view id, std::string_view holder,
                       completion<bool> done)
    = 0;

  /// As `release`, for a record whose message `holder` never handled (the
  /// bot refused it before its turn because it stops): the attempt its
  /// claim (or its recording) counted is given back, so restarts alone
  /// never bring a record to `max_attempts`. The default releases and
  /// keeps the count.
  virtual void release_unhandled(std::string_view id, std::string_view holder,
                                 completion<bool> done) {
    release(id, holder, std::move(done));
  }

  /// Renews `holder`'s heartbeat for `lease`, then claims up to `limit`
  /// records that are free or held by a holder whose heartbeat lapsed, and
  /// returns them in arrival order, now held by `holder`. Records that
  /// already had `max_attempts` holders are given up: returned in
  /// `dropped`, held by `holder` without a new attempt, for the caller to
  /// report and then `confirm`. Until that confirm lands they stay held, so
  /// a caller that lost this reply, or died first, leaves them to the next
  /// holder, which reports them again (at least once).
  struct claim_result {
    std::vector<journal_record> records{};
    /// Records given up because they reached `max_attempts` (held, to be
    /// confirmed once reported).
    std::vector<journal_record> dropped{};
    /// Ids of stored records that could not be decoded: taken out of the
    /// journal's open records so they do not block the others.
    std::vector<std::string> corrupted{};
  };
  virtual void beat_and_claim(std::string_view holder,
                              std::chrono::milliseconds lease,
                              std::size_t limit, std::uint32_t max_attempts,
                              completion<claim_result> done)
    = 0;

  /// Ends `holder`'s heartbeat (an orderly stop): what it still holds is
  /// claimable at once.
  virtual void retire(std::string_view holder, completion<bool> done) = 0;

  /// Takes send `send_id` of chat `key` made under `fence` (0 without
  /// coordination) for `writer`: `send` the first time, `duplicate` when
  /// it was taken before, `fenced` when a send of the chat under a higher
  /// fence was taken (the sender lost the chat). `writer` names the one
  /// attempt of a step that takes the send (unique per process and turn):
  /// the entry remembers it, so `outbox_forget` takes back only what that
  /// attempt wrote.
  virtual void outbox_claim(std::string_view send_id, std::string_view key,
                            std::uint64_t fence, std::string_view writer,
                            std::chrono::milliseconds ttl,
                            completion<outbox_verdict> done)
    = 0;

  /// As outbox_claim, for a send made before the verdict (its entry written
  /// ahead of it): the id is recorded even when the chat's outbox saw a
  /// higher fence (the verdict is then `fenced` and the chat's fence
  /// stays), so a replay of its message skips the send instead of making it
  /// twice. Written over another writer's live entry, that entry then names
  /// no writer: a send was made on it, so no take-back removes it. The
  /// default is outbox_claim, which records nothing when fenced.
  virtual void outbox_record(std::string_view send_id, std::string_view key,
                             std::uint64_t fence, std::string_view writer,
                             std::chrono::milliseconds ttl,
                             completion<outbox_verdict> done) {
    outbox_claim(send_id, key, fence, writer, ttl, std::move(done));
  }

  /// Takes send `send_id` back if `writer` wrote its entry: the send
  /// failed, or was never made (the claim's reply was lost), so a replay
  /// must make it rather than skip it. An entry another writer wrote (an
  /// earlier attempt's send, which may have been made) stays. True when an
  /// entry was removed. The chat's fence stays. Ordered with the
  /// `outbox_claim`s issued before it.
  virtual void outbox_forget(std::string_view send_id, std::string_view writer,
                             completion<bool> done)
    = 0;
};

} // namespace botmesh
