#pragma once

// Internal: the bot's side of durable processing (see
// `durability_options` in bot.hpp): journaling on arrival, confirming or
// releasing at the end of a turn, the beat that takes over free and
// orphaned records, and the outbox check before each send.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <botmesh/actors/chat_services.hpp>
#include <botmesh/providers/provider.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/durable_backend.hpp>

namespace botmesh {
struct durability_options;
}

namespace botmesh::internal {

/// The journaled turn running on a handler thread: its sends take outbox
/// ids from it, and an error it raises that loses its effect (a lost
/// lease, a store failure) marks it `lost`, so its record is released.
struct durable_turn {
  const std::string* record = nullptr; // journal id
  const std::string* key = nullptr;
  std::uint64_t fence = 0;
  std::uint32_t attempt = 0; // of the record (1: its first holder)
  /// The intake's heartbeat gap count when the record was written.
  std::uint64_t heartbeat_epoch = 0;
  /// The intake's generation that holds the record (chat_event::journal_gen).
  std::uint32_t gen = 0;
  std::uint32_t sends = 0;
  /// Where the sends being made belong (a flow's step; empty: the turn
  /// itself). A replay restarts at the last checkpoint that landed, which
  /// may be one the first attempt wrote mid-turn, so a step's sends are
  /// numbered within the step: the replay's first send of a step meets the
  /// first attempt's send of that step, not a send of a step before it.
  std::string scope{};
  std::vector<std::pair<std::string, std::uint32_t>> scoped_sends{};
  /// The outbox id of the send outbox_allows let through last (empty:
  /// none), taken back by send_failed.
  std::string taken{};
  /// This turn's name as the writer of its outbox entries (made at its
  /// first send): a take-back removes only what this turn wrote.
  std::string writer{};
  bool lost = false;
};

/// The journaled turn on this thread, or null.
durable_turn* current_durable_turn() noexcept;

/// Makes `t` (may be null) this thread's journaled turn for a scope.
class durable_turn_scope {
 public:
  explicit durable_turn_scope(durable_turn* t) noexcept;
  ~durable_turn_scope();
  durable_turn_scope(const durable_turn_scope&) = delete;
  durable_turn_scope& operator=(const durable_turn_scope&) = delete;

 private:
  durable_turn* prev_;
};

/// Makes the sends of this thread's journaled turn (if any) belong to
/// `scope` for a scope (see durable_turn::scope).
class durable_send_scope {
 public:
  explicit durable_send_scope(std::string scope);
  ~durable_send_scope();
  durable_send_scope(const durable_send_scope&) = delete;
  durable_send_scope& operator=(const durable_send_scope&) = delete;

 private:
  durable_turn* turn_;
  std::string prev_;
};

/// What the intake needs from the bot. Called from any thread (backend
/// completions included): each must return quickly without blocking.
class durable_host {
 public:
  virtual ~durable_host();
  /// A journaled message is accepted: count it, tell the provider, route it.
  virtual void accept(chat_event ev, delivery_callbacks cb) = 0;
  /// A redelivery of a journaled message: count it, tell the provider.
  virtual void duplicate(delivery_callbacks cb) = 0;
  /// A claimed record, to be routed like a new message.
  virtual void reinject(chat_event ev) = 0;
  /// Tells the provider a journaled message was accepted whose turn comes
  /// later (it waits behind an earlier message of its chat): `accept` then
  /// routes it, given callbacks with no `accepted` left. `id`: its
  /// message id (as stamped by the bot).
  virtual void acknowledge(delivery_callbacks& cb, const std::string& id) = 0;
  /// Tells the provider a message's journal write failed, or was not made
  /// (`code`). What the provider hands over from that report (a chain's
  /// next message of the chat) is taken as from any acceptance report: no
  /// error listener runs on the backend's thread, and what it accepts is
  /// routed after. A report that throws is logged.
  virtual void refuse_write(delivery_callbacks& cb, errc code) = 0;
  /// A message parked in the intake when it stops (journaled; its
  /// acceptance reported, unless `taken_over`: a claimed record): refused
  /// as the bot stops, its record given back now.
  virtual void refuse_parked(const std::string& key, chat_event ev,
                             delivery_callbacks cb, bool taken_over) = 0;
  /// An error event (posted to the handler pool), and `then` (if any)
  /// once its listeners ran (on the handler pool, or inline once the pool
  /// shut down).
  virtual void report(errc code, std::string what, std::string key,
                      std::function<void()> then = {})
    = 0;
  /// Whether this replica may take records over now: one that cannot send
  /// (its transport not open yet, or the standby of an exclusive
  /// transport) only beats, or it would spend their attempts on sends that
  /// are refused.
  virtual bool may_claim() {
    return true;
  }
};

/// Counters of the intake (read with `stats`).
struct durable_counters {
  std::uint64_t reprocessed = 0;
  std::uint64_t outbox_skipped = 0;
  std::uint64_t journal_errors = 0;
};

class durable_intake {
 public:
  /// `holder` names this process in the backend; `lease` is its heartbeat
  /// lease; `retry_window` the TTL of records and outbox entries.
  durable_intake(const durability_options& opts, std::string holder,
                 std::chrono::milliseconds lease,
                 std::chrono::milliseconds retry_window, durable_host& host);

  const std::string& holder() const noexcept {
    return holder_;
  }

  /// Starts the backend and makes the first beat, waiting for both
  /// (blocking: from `bot::start()` only). Records claimed by a beat are
  /// re-injected at once.
  void start();

  /// Records `msg` (of chat `key`); the host's `accept` or `duplicate` runs
  /// once the record landed, or the provider hears the error.
  void journal(std::string key, inbound_message msg, delivery_callbacks cb);

  /// The end of a journaled event (`ev.journal`, held by the generation
  /// `ev.journal_gen`): confirmed when `keep`, else released.
  void settle(const std::string& key, const chat_event& ev, bool keep);

  /// The end of a journaled event that was refused before its handler ran
  /// because the bot stops: released with its attempt given back
  /// (durable_backend::release_unhandled).
  void give_back(const std::string& key, const chat_event& ev);

  /// One beat: heartbeat, then claimed records re-injected in order.
  void beat(std::function<void()> done);

  /// Ends the heartbeat of every generation (an orderly stop): from the
  /// call on, sends wait for the outbox's verdict; the generations are
  /// retired (their records claimable by other replicas) once the outbox
  /// entries of sends already made landed or failed a last time. `done`
  /// runs when the backend answered every retire.
  void retire(std::function<void()> done);

  /// Before a send of the journaled turn on this thread (if any): false to
  /// skip it (sent before); throws `lease_lost_error` ("superseded") when a
  /// later holder of the chat sent, or the backend's error.
  bool outbox_allows(const std::string& chat_key);

  /// After the send outbox_allows let through on this thread failed: its
  /// outbox entry is taken back (the record's settle waits for that), so a
  /// replay makes the send instead of skipping it. A failure that may have
  /// reached the platform (a timeout) is then sent again: at least once.
  void send_failed();

  /// Waits up to `bound` until every backend operation issued completed;
  /// false when some still had not.
  bool wait_idle(std::chrono::milliseconds bound);

  std::chrono::milliseconds lease() const noexcept {
    return lease_;
  }

  durable_counters stats() const noexcept;

 private:
  using steady = std::chrono::steady_clock;

  /// The heartbeat was valid without a gap since `epoch` was read, and
  /// still is.
  bool heartbeat_kept(std::uint64_t epoch) const noexcept;

  void op(std::function<void(std::function<void()>)> run);
  std::string holder_of(std::uint32_t gen) const;
  std::uint32_t open_one();
  void open_in(std::uint32_t gen);
  void close_one(std::uint32_t gen);
  void suspect(std::uint32_t gen);
  void settle_as(const std::string& key, const std::string& id, bool keep,
                 std::uint32_t gen, bool counted, bool unhandled = false);
  void renewed(steady::rep sent, bool new_generation);
  struct entry {
    std::string send_id, key;
    std::string writer; // the turn that took it (outbox_forget's writer)
    std::uint64_t fence = 0;
    bool forget = false; // a send to take back (its outbox_forget failed)
    bool last_try = false; // written again by a retire: not a third time
    // A take-back of a claim whose reply was lost: the claim may still land
    // after it (a call on a connection that broke), so it is made once
    // more at the next beat.
    bool again = false;
  };
  // A record's outbox entries as one generation holds it: a record taken
  // over again by a later generation of this process (the earlier one's
  // heartbeat lapsed) while an earlier turn's entries are in flight is
  // settled twice, once under each holder name.
  using held_record = std::pair<std::string, std::uint32_t>;
  void entry_landed(const held_record& record, const entry* failed);
  std::function<void()> take_retire();
  std::vector<std::pair<held_record, entry>> take_failed(bool last_try);
  void resend(const held_record& record, entry e);
  void retire_generations(std::vector<std::uint32_t> gens,
                          std::function<void()> done);
  void take_back(durable_turn& t, std::string send_id, bool again = false);
  void forget_entry(const held_record& record, entry e);
  void write_entry(const held_record& record, entry e);
  void failed(const std::string& key, std::string what, std::exception_ptr e);
  void claimed(durable_backend::claim_result r, std::uint32_t gen);
  void hold(const std::string& key, const std::string& id, std::uint32_t gen);
  bool held_back(const std::string& key, chat_event& ev,
                 delivery_callbacks& cb);
  bool park_claimed(const std::string& key, chat_event& ev);
  bool resolved(const std::string& key, const std::string& id,
                std::uint64_t serial = 0);
  void acked(const std::string& key);
  void release(const std::string& key);
  void expire_holds();

  std::shared_ptr<durable_backend> backend_;
  std::uint32_t max_attempts_;
  std::size_t claim_batch_;
  std::string holder_;
  std::chrono::milliseconds lease_;
  std::chrono::milliseconds retry_window_;
  durable_host& host_;
  std::mutex mtx_; // guards inflight_ and the generations below
  std::condition_variable cv_;
  std::size_t inflight_ = 0;
  // Generations. A settle or a beat whose failure may leave records held
  // by this process that nothing here will handle (a release or confirm
  // that did not land, a claim whose reply was lost) marks the current
  // generation suspect. The next beat then starts a new holder name
  // (`holder_~<gen>`) for new records and claims, and the old generation
  // is kept beating until the events it holds in process are settled, then
  // retired: what it still holds becomes claimable, and is handled again.
  std::uint32_t gen_ = 0;
  bool rotate_ = false;
  /// Per live generation: its records being written or in process.
  std::map<std::uint32_t, std::size_t> open_{{0, 0}};
  // A first attempt's send goes out before its outbox entry is known to be
  // written. Until every entry of the record landed, its settle is held
  // back (and its generation stays open): a replay must find the entries,
  // or it would send again. Entries that failed are written again at each
  // beat.
  struct unlanded {
    std::size_t in_flight = 0;
    std::vector<entry> failed{};
    // Send ids taken back (their sends failed): never written again.
    std::vector<std::string> forgotten{};
    bool forgot(const std::string& send_id) const {
      return std::find(forgotten.begin(), forgotten.end(), send_id)
             != forgotten.end();
    }
    bool settle_held = false;
    bool keep = false;
    std::string key{};
  };
  std::map<held_record, unlanded> unlanded_;
  // Chats held back behind a message whose journal write failed: it may
  // have landed (its reply lost), leaving a record held by a suspect
  // generation that a beat takes over once that generation is retired.
  // The platform's retry is then a duplicate; a later message of the
  // chat, run at once, would overtake it. So the chat's later messages
  // are journaled and acknowledged, but parked here, in order, behind
  // each such id until it is settled: written anew (the first write had
  // not landed: it runs in its place), taken over here (it waits in its
  // place too, so it never overtakes what is ahead of it), given up, not found by a whole claim made after every
  // generation it may be held by was retired (it never landed, or
  // another replica took it), or two leases after its first failure (an
  // error event says so). A message written under a generation an
  // earlier id waits in is left to the claim, which takes it after that
  // id in arrival order: parked here, it would keep that generation from
  // being retired. Parking, not refusing: a refusal would stop a Telegram
  // poller's whole batch, and every chat with it.
  struct held_item {
    std::string id{};               // its record
    std::optional<chat_event> ev{}; // parked, else an id waited for
    delivery_callbacks cb{};        // (parked) its `accepted` already called
    bool claimed = false;           // (parked) taken over: re-injected
    // (Waited for) the generations its failed writes were made under: the
    // first that landed holds the record.
    std::vector<std::uint32_t> gens{};
    steady::time_point until{};     // (waited for) its bound
    // (Waited for) changed with each failure or claim left to it, from a
    // counter of the intake's: a claim's "not found" counts only for the
    // item as the beat saw it.
    std::uint64_t serial = 0;
    bool settled = false;           // (waited for) no longer
    bool waits_in(std::uint32_t gen) const {
      return !ev && !settled
             && std::find(gens.begin(), gens.end(), gen) != gens.end();
    }
  };
  struct held_chat {
    std::deque<held_item> items{};
    std::size_t acking = 0; // parked, their acceptance not yet reported
    bool releasing = false; // a thread is routing the parked ones
  };
  std::unordered_map<std::string, held_chat> held_;
  // !held_.empty(), readable without mtx_: a journal write's completion
  // and a claim look at it first, so the common case (no chat held) takes
  // no lock. A hold of a chat happens before that chat's next completion
  // (the backend completes one chat's calls in order), which sees it.
  std::atomic<bool> any_held_{false};
  std::uint64_t held_serial_ = 0;
  // The held chat `key` (under mtx_), or null.
  held_chat* held_of(const std::string& key);
  // The item of `id` in `h` (parked or waited for), or its end.
  static std::deque<held_item>::iterator item_of(held_chat& h,
                                                 const std::string& id);
  void wait_again(held_item& item, std::uint32_t gen);
  // Whether an id waited for before `end` may be held by `gen`: a
  // message written under it must not be parked behind it (kept open, it
  // would keep that generation from being retired).
  static bool waits_before(const held_chat& h,
                           std::deque<held_item>::const_iterator end,
                           std::uint32_t gen);
  bool holding_ = true; // false once retired: nothing is held back after
  // A retire waiting for the outbox entries in flight (see retire()).
  std::function<void()> retiring_;
  bool retired_ = false; // retiring_ ran: no beat comes any more
  // Numbers the turns that write outbox entries (their writer names).
  std::atomic<std::uint64_t> writers_{0};
  std::atomic<std::uint64_t> reprocessed_{0}, outbox_skipped_{0},
    journal_errors_{0};
  // Written by beat completions, read by handler threads before a send.
  std::atomic<steady::rep> hb_valid_until_{0}; // 0: no beat landed yet
  // The beats that may have come after the heartbeat lapsed (each sent or
  // answered later than the last one's validity): while it is unchanged and
  // the heartbeat valid, no other replica can have claimed a record held
  // here.
  std::atomic<std::uint64_t> hb_gaps_{0};
  // Some beat landed (journal() refuses messages until then).
  std::atomic<bool> beat_landed_{false};
};

} // namespace botmesh::internal
