#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <caf/fwd.hpp>

#include <botmesh/actors/turn_token.hpp>
#include <botmesh/stores/coordinator.hpp>
#include <botmesh/stores/schedule_store.hpp>

namespace botmesh {

/// What the lease actor reports outward (the bot implements it). Called on
/// the lease actor's thread: it must return at once and never block.
class lease_listener {
 public:
  virtual ~lease_listener();

  /// A held turn ended otherwise than by its release: `expired`, `frozen`
  /// or `settle` (the bot raises `events::lease_lost`).
  virtual void turn_lost(const std::string& key, std::uint64_t fence,
                         turn_end why)
    = 0;
};

struct lease_config {
  std::shared_ptr<botmesh::coordinator> coordinator{};
  /// The longest a step may hold its turn once it started.
  std::chrono::milliseconds settle{60'000};
  /// Waiting requests whose grant may have been missed (the push channel
  /// was down when they entered) are polled from 5 ms up to this; the
  /// others every lease/3, as a safety net and to find dead holders.
  std::chrono::milliseconds max_poll{100};
  /// Must outlive the actor; may be null.
  lease_listener* listener = nullptr;
};

/// Spawns the lease actor of one replica (a scheduled actor: a detached one
/// would keep the actor system's destructor waiting for its delayed
/// messages, and every handler it runs is short and never blocks): the
/// single owner of this
/// replica's turn state (the requests waiting for a turn, the turns held,
/// the leaderships), mirroring what the coordinator holds.
///
/// Guarantees:
/// - A turn is granted to a chat actor by message `(granted_atom, req,
///   token)`; the token's validity counts from when the request that
///   granted or renewed it left this process, minus a margin of lease/10.
///   A push (a grant made by another replica's release) is mapped to this
///   process's clock from the backend clock of earlier replies, and never
///   believed for longer than a lease from when it was read.
/// - Every lease/3: one batch renews the heartbeat, every held turn and
///   every leadership. A turn whose lease runs out before a renewal came
///   back ends as `frozen`; one the backend says is gone, as `expired`; a
///   step past `settle` (counted from `start_atom`, which the token's
///   `step_started()` sends when a thread begins the step), as `settle`.
///   Each ends its token (so the step's writes are refused and its stop
///   token fires), tells the chat `(lost_atom, req, fence, reason)`, tells the
///   listener, and is released so the chat moves on.
/// - Nothing is left behind on a lost reply: an enter is retried (as a
///   retry, so it never takes a second ticket) until it is answered, then
///   given back if its chat no longer wants it; a grant for a request
///   nobody waits for is released at once; failed releases and leaves are
///   repeated until the backend answered them.
/// - A request whose ticket vanished (skipped as dead, or its holder
///   expired) is reported as `(lost_atom, req, 0, "gone")`; a holder whose
///   heartbeat is gone is skipped with `skip_if_dead` (its queued tickets;
///   its turn only once that turn's lease ran out).
///
/// Protocol: see the diagram in messages.hpp. `(shutdown_atom)` releases
/// what it holds, gives up what it waits for and its leaderships, replies
/// `true` once the backend answered (or after a lease), and exits.
caf::actor spawn_lease_actor(caf::actor_system& sys, lease_config cfg);

/// A leader lease (for the scheduler) held by the lease actor: renewed in
/// its batch every lease/3 together with the heartbeat and the turns, never
/// by a round trip of its own, and lost when that batch cannot renew it.
///
/// `try_acquire` presents this replica for the name through the lease actor
/// the first time (and waits up to `first_answer` for the election's
/// answer; it is called from the scheduler's store-I/O thread, which may
/// block); later calls only read the last answer. `owner`, `now` and `ttl`
/// are the lease actor's: the coordinator's incarnation and lease.
/// Before `bind` and after `close` it leads nothing.
class lease_actor_leadership final : public lease_provider {
 public:
  explicit lease_actor_leadership(std::chrono::milliseconds first_answer);
  ~lease_actor_leadership() override;

  /// The lease actor to lead through (spawned in `sys`).
  void bind(caf::actor_system& sys, caf::actor lease);

  /// Gives every leadership up and forgets the lease actor.
  void close();

  std::optional<std::uint64_t> try_acquire(std::string_view name,
                                           std::string_view owner,
                                           time_point now,
                                           std::chrono::milliseconds ttl) override;
  void release(std::string_view name, std::string_view owner) override;

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

} // namespace botmesh
