#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <botmesh/runtime/core/clock.hpp>

namespace botmesh {

/// A chat's turn, held by one replica at a time.
struct turn {
  std::string key{};
  /// The ticket this turn was granted for.
  std::uint64_t ticket = 0;
  /// Grows with every grant of the chat (and never goes back, also after the
  /// chat's state was evicted): writes fenced by it reject a stale holder.
  std::uint64_t fence = 0;
  /// The replica that held the chat's previous turn; nothing when unknown
  /// (a new or evicted chat). Another replica means: drop in-memory copies
  /// of the conversation and read its checkpoint.
  std::optional<std::string> previous_holder{};
  /// When the turn expires unless renewed.
  time_point deadline{};
};

/// A leadership (exclusive transport, scheduler leader).
struct leadership {
  std::string name{};
  /// Grows with every new holder of the name.
  std::uint64_t fence = 0;
  time_point deadline{};
};

/// Decides which replica processes each chat, and which one leads a name.
///
/// The per-chat protocol: a replica takes a ticket for every message (after
/// persisting it), then asks for the turn with that ticket. Turns are
/// granted in ticket order, whatever the replica, one holder at a time.
/// Tickets and turns of a replica whose heartbeat is gone are skipped;
/// a turn not renewed within the lease is lost. Every coordinator instance
/// has its own incarnation, so a restarted replica with the same replica id
/// never inherits the dead process's turns.
///
/// Failures throw `coordination_unavailable_error`.
class coordinator {
 public:
  virtual ~coordinator();

  virtual const std::string& replica_id() const noexcept = 0;

  /// Unique per coordinator instance.
  virtual const std::string& incarnation() const noexcept = 0;

  virtual std::chrono::milliseconds lease() const noexcept = 0;

  /// Takes the next ticket in the chat's queue.
  virtual std::uint64_t take_ticket(std::string_view key) = 0;

  /// Grants the turn when `ticket` is the next to serve and nobody holds
  /// the chat (earlier tickets of dead replicas or given up are skipped).
  virtual std::optional<turn> try_acquire(std::string_view key,
                                          std::uint64_t ticket) = 0;

  /// Renews this replica's heartbeat and the turns it holds; returns the
  /// keys of turns that were lost (expired or taken over).
  virtual std::vector<std::string> renew(const std::vector<turn>& held) = 0;

  /// Ends a turn; the next ticket is served. False for a turn no longer held.
  virtual bool release(const turn& t) = 0;

  /// Gives up a ticket that will not be used.
  virtual void cancel_ticket(std::string_view key, std::uint64_t ticket) = 0;

  /// Takes or renews the leadership of `name`; nothing while another live
  /// replica leads it.
  virtual std::optional<leadership> try_lead(std::string_view name) = 0;

  /// Gives a leadership up.
  virtual void release_lead(const leadership& l) = 0;

  /// Blocks until the chat's queue may have moved (a release, a cancel) or
  /// `timeout` passes: the push that wakes a waiting replica. Callers keep
  /// polling as a safety net.
  virtual void wait_change(std::string_view key,
                           std::chrono::milliseconds timeout) = 0;
};

class lease_provider;

/// The coordinator's leaderships as a scheduler leader lease (the default
/// `scheduler.lease` of a bot with coordination). The coordinator renews
/// its own leaderships on each call; `ttl` is the coordinator's lease.
std::shared_ptr<lease_provider>
make_coordinator_lease(std::shared_ptr<coordinator> c);

} // namespace botmesh
