#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <botmesh/runtime/core/clock.hpp>

namespace botmesh {

/// Where one request for a chat's turn stands.
///
/// Instants ending in `_ms` are milliseconds on the backend's clock (the
/// Redis server's, or the memory hub's): a replica never compares them with
/// its own clock directly. `now_ms` is the backend's clock when the answer
/// was made, so `deadline_ms - now_ms` is how long the turn still holds from
/// then; counted from when the request *left* the replica (which was
/// earlier), it gives a lease the replica may safely assume.
struct turn_state {
  enum class status : std::uint8_t {
    /// The turn is this request's: `fence`, `previous_holder`, `deadline_ms`.
    granted,
    /// Queued behind `blocker` (the incarnation holding the chat, or of the
    /// ticket ahead).
    waiting,
    /// No longer queued: given up, skipped as dead, or its turn expired.
    gone,
  };

  status state = status::gone;
  std::string key{};
  /// The request, unique per incarnation (see `coordinator::enter`).
  std::uint64_t req = 0;
  /// Position in the chat's queue (grows per chat while the chat is active).
  std::uint64_t ticket = 0;
  /// Grows with every grant of the chat and never goes back, also after an
  /// idle chat's state expired: writes fenced by it reject a stale holder.
  std::uint64_t fence = 0;
  /// The replica that held the chat's previous turn; nothing when unknown (a
  /// new chat, one idle long enough to be forgotten, or a previous turn
  /// that expired: whether its holder ran it is unknown). Another replica,
  /// or unknown, means: drop in-memory copies of the conversation, read its
  /// checkpoint.
  std::optional<std::string> previous_holder{};
  std::int64_t deadline_ms = 0;
  std::int64_t now_ms = 0;
  std::string blocker{};
  /// Set by `poll` while waiting (an enter leaves it empty: it would cost
  /// every queued enter a scan): the other incarnations whose tickets are
  /// queued ahead of this one, neither this one nor the holder, in queue
  /// order, at most `max_queued_ahead`. A dead one among them would be
  /// granted the turn and keep it a whole lease (it may be frozen) before
  /// it is skipped; named here, it can be skipped while still queued.
  std::vector<std::string> queued_ahead{};
  static constexpr std::size_t max_queued_ahead = 8;
  /// What the previous holder handed over with its release (see
  /// `coordinator::release`), or empty. Set only on a grant made by that
  /// release itself, in the same atomic step: nobody held the chat between
  /// the two turns. Grants found by `poll`, made by an expiry or a `leave`,
  /// never carry it.
  std::string handed{};

  bool granted() const noexcept {
    return state == status::granted;
  }
};

/// A held turn, identified everywhere by its chat and fence: a late answer
/// about a chat's previous turn never touches the next one.
struct turn_ref {
  std::string key{};
  std::uint64_t fence = 0;
};

/// A leadership (exclusive transport, scheduler leader).
struct leadership {
  std::string name{};
  /// Grows with every new holder of the name.
  std::uint64_t fence = 0;
  /// Backend-clock expiry unless renewed, and the backend clock then.
  std::int64_t deadline_ms = 0;
  std::int64_t now_ms = 0;
};

/// What a replica renews every lease/3, in one batch.
struct renewal {
  std::vector<turn_ref> turns{};
  /// Names to take or keep leading.
  std::vector<std::string> leads{};
  /// Per name of `leads` (missing or 0: none): the term this incarnation
  /// last held it at. A backend that lost the name's term, or finds it
  /// damaged, makes the new one above it too, so a holder never gets its
  /// own term back within the one clock tick the floor cannot tell apart.
  std::vector<std::uint64_t> known_terms{};
};

struct renewal_result {
  /// A turn whose renewal met an error of its own (a cluster slot whose
  /// master is down, a damaged key): neither renewed nor known lost. Its
  /// lease runs out unless a later renewal succeeds; the batch's other
  /// turns and leaderships are unaffected.
  static constexpr std::int64_t failed = -1;
  /// The backend clock when the batch ran.
  std::int64_t now_ms = 0;
  /// Per turn of the request, in order: its new deadline, 0 when lost
  /// (expired, taken over, or released), or `failed`.
  std::vector<std::int64_t> turns{};
  /// Per name: the leadership, or nothing while another replica leads (or
  /// when `leads_failed` says its renewal failed).
  std::vector<std::optional<leadership>> leads{};
  /// Per name, when any failed: true for a leadership whose renewal met an
  /// error of its own (neither renewed nor known lost). Empty when none.
  std::vector<bool> leads_failed{};
  /// The errors met, one line each, for logs.
  std::vector<std::string> errors{};

  bool lead_failed(std::size_t i) const noexcept {
    return i < leads_failed.size() && leads_failed[i];
  }
};

struct release_result {
  /// False when the turn was no longer held (expired or released before).
  bool released = false;
  /// When the next ticket belongs to this incarnation, its grant (it is
  /// pushed as well; the two are the same grant).
  std::optional<turn_state> next{};
  std::int64_t now_ms = 0;
};

/// Decides which replica processes each chat, and which one leads a name.
///
/// Per chat: a replica `enter`s the chat's queue once per message (after
/// persisting it). The turn is granted at once when nobody holds or waits
/// for the chat; otherwise the request waits. Releasing a turn grants it
/// to the next ticket, whatever the replica, and pushes that grant to the
/// replica that owns the ticket only (`on_grant`); `poll` is the safety net
/// for a push lost on the way. One holder at a time; a turn not renewed
/// within the lease expires and is passed on. A replica whose heartbeat is
/// gone is skipped (`skip_if_dead`). Every coordinator instance has its own
/// incarnation, so a restarted replica with the same replica id never
/// inherits the dead process's tickets or turns.
///
/// Idempotence is what makes lost replies harmless: an `enter` retried with
/// the same request id gets the same ticket or grant, `release` is keyed by
/// fence, `leave` by request id. So a caller that lost a reply repeats the
/// call until it gets one, and never leaves a ticket or turn behind.
///
/// The asynchronous face: every operation returns at once and calls `done`
/// exactly once, from a backend thread (or the caller's own, for the memory
/// hub), with a result or an exception (`coordination_unavailable_error`,
/// or `botmesh::error` with `errc::timeout` for a reply that never came —
/// the request may or may not have run). `done` must not block. Operations
/// on one chat issued by one caller run in the order they were issued.
///
/// `blocking_coordinator` gives the same operations as blocking calls, for
/// tools, tests and threads that may block.
class coordinator {
 public:
  template <class T>
  using completion = std::function<void(T, std::exception_ptr)>;
  using grant_listener = std::function<void(turn_state)>;

  virtual ~coordinator();

  virtual const std::string& replica_id() const noexcept = 0;

  /// Unique per coordinator instance.
  virtual const std::string& incarnation() const noexcept = 0;

  virtual std::chrono::milliseconds lease() const noexcept = 0;

  /// Takes a ticket for request `req` (unique per incarnation; the caller
  /// counts) of chat `key`; granted at once when nobody holds or waits.
  /// `retry`: an earlier call for the same request may have run (its reply
  /// was lost), so its ticket or grant is looked for first and returned
  /// again instead of taking a second ticket.
  virtual void enter(std::string_view key, std::uint64_t req, bool retry,
                     completion<turn_state> done)
    = 0;

  /// Where request `req` stands now. An expired holder is replaced on the
  /// way, so a grant lost in transit is found here.
  virtual void poll(std::string_view key, std::uint64_t req,
                    completion<turn_state> done)
    = 0;

  /// Ends the turn `t` of this incarnation and grants the next ticket.
  /// `handoff` (opaque, may be empty) travels to that next holder in
  /// `turn_state::handed` of the grant's push, only when this release is
  /// valid (the turn was still held at `t.fence`) and grants in the same
  /// step. A push can be lost: a holder that got no `handed` must find
  /// what it needs elsewhere (the store stays the truth). Cost: the bytes
  /// are sent to the backend and, on a grant, pushed once more.
  virtual void release(turn_ref t, std::string_view handoff,
                       completion<release_result> done)
    = 0;

  /// Gives up request `req`: its queued ticket, or its turn when it was
  /// granted meanwhile (then released as by `release`). True when something
  /// was given up.
  virtual void leave(std::string_view key, std::uint64_t req,
                     completion<bool> done)
    = 0;

  /// When `incarnation`'s heartbeat is gone, skips it in chat `key`: its
  /// queued tickets, and its turn once the turn's deadline passed (a frozen
  /// replica may be granted a turn after its heartbeat ran out and use it
  /// when it resumes, within that turn's lease); true when something was
  /// skipped.
  virtual void skip_if_dead(std::string_view key, std::string_view incarnation,
                            completion<bool> done)
    = 0;

  /// One `enter` of `submit`.
  struct enter_op {
    std::string key;
    std::uint64_t req = 0;
    bool retry = false;
    completion<turn_state> done;
  };

  /// One `release` of `submit`.
  struct release_op {
    turn_ref turn;
    std::string handoff;
    completion<release_result> done;
  };

  using turn_op = std::variant<enter_op, release_op>;

  /// Issues `ops` in order, each exactly as its `enter` or `release` call
  /// would (same results, same errors, each `done` called once), but
  /// together where the backend can: a standalone Redis runs a batch of
  /// them in one script call, one round trip and one script start for the
  /// lot, which under load is most of what a turn costs the server. A
  /// failure of that call (lost reply, error reply) fails every operation
  /// in it, like a lost reply of each: all are safe to repeat. The default
  /// calls `enter` and `release` one by one, so a coordinator that
  /// overrides those (a forwarding one) sees every operation.
  virtual void submit(std::vector<turn_op> ops);

  /// Renews this incarnation's heartbeat, the turns and the leaderships of
  /// `r` in one batch (one round trip). An error that concerns one turn or
  /// one leadership (or the heartbeat alone) fails only that part (see
  /// `renewal_result::failed`); the completion gets an error only when the
  /// batch as a whole failed (no reply, a lost connection).
  virtual void renew(renewal r, completion<renewal_result> done) = 0;

  /// Gives a leadership up if this incarnation holds it at `fence`.
  virtual void unlead(std::string_view name, std::uint64_t fence,
                      completion<bool> done)
    = 0;

  /// Where grants for this incarnation's tickets arrive when another
  /// request (a release, a leave, an expiry) granted them: called from a
  /// backend thread, must not block. Set once, before the first `enter`.
  virtual void on_grant(grant_listener fn) = 0;

  /// Grows each time the push channel is (re)established. A request that
  /// entered while it was some other value may have missed its push: poll
  /// it. 0 while there is no channel.
  virtual std::uint64_t push_epoch() const noexcept = 0;
};

/// The coordinator's operations as blocking calls. Throws
/// `coordination_unavailable_error` (or `botmesh::error` with
/// `errc::timeout`). Never from a CAF worker or a handler waiting for a
/// turn: for tools, tests and the scheduler's own thread.
class blocking_coordinator {
 public:
  explicit blocking_coordinator(coordinator& c) : c_(c) {
    // nop
  }

  turn_state enter(std::string_view key, std::uint64_t req, bool retry = false);
  turn_state poll(std::string_view key, std::uint64_t req);
  release_result release(turn_ref t, std::string_view handoff = {});
  bool leave(std::string_view key, std::uint64_t req);
  bool skip_if_dead(std::string_view key, std::string_view incarnation);
  renewal_result renew(renewal r);
  /// Takes or keeps the leadership of `name` (renewing the heartbeat);
  /// `known_term`: the term this incarnation last held it at, if any (see
  /// renewal::known_terms).
  std::optional<leadership> lead(std::string_view name,
                                 std::uint64_t known_term = 0);
  bool unlead(std::string_view name, std::uint64_t fence);

 private:
  coordinator& c_;
};

class lease_provider;

/// The coordinator's leaderships as a scheduler leader lease, for a
/// scheduler run beside a coordinator without a bot (a bot's scheduler
/// leads through its lease actor); `ttl` is the coordinator's lease. Each
/// call blocks on the coordinator. An acquire whose reply was lost throws,
/// and `release` then asks the coordinator once more, so a leadership the
/// lost call won is still given back at once.
std::shared_ptr<lease_provider>
make_coordinator_lease(std::shared_ptr<coordinator> c);

} // namespace botmesh
