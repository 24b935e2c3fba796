#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <caf/actor.hpp>

namespace botmesh {

/// What the session actor drives (the bot implements it).
class session_hooks {
 public:
  virtual ~session_hooks();

  /// Asks for the transport to be open (started) or not (stopped); returns
  /// at once. The implementation applies the last wish off the CAF workers
  /// (starting and stopping block), one step at a time and in order: a stop
  /// never runs beside or before the start it follows. `applied`, when
  /// given, is called (on any thread) once the transport is in the state
  /// asked for, right away when it is already.
  virtual void set_transport(bool open, std::function<void()> applied) = 0;

  /// How long the transport has not been open (closed, or connecting: a
  /// poller retrying a platform it lost); nothing while it is open. Must
  /// not block.
  virtual std::optional<std::chrono::steady_clock::duration> closed_for() = 0;

  /// Events; must not block.
  virtual void leader(const std::string& name, std::uint64_t fence) = 0;
  virtual void follower(const std::string& name, const std::string& reason) = 0;
};

struct session_config {
  /// This replica's lease actor, which presents it for `name`.
  caf::actor lease{};
  std::string name{};
  /// A leader whose transport stays closed this long yields.
  std::chrono::milliseconds provider_down{60'000};
  /// How often the transport's state is looked at (lease/3).
  std::chrono::milliseconds period{5'000};
  /// How long a yielding leader waits before presenting itself again.
  std::chrono::milliseconds rest{3'000};
  /// Must outlive the actor.
  session_hooks* hooks = nullptr;
  /// Set while this replica leads (read by `bot::send` on any thread).
  std::shared_ptr<std::atomic<bool>> leading{};
  /// Until when the leadership is valid, in steady_clock ticks, as the lease
  /// actor last confirmed it (optional). The transport's threads check it
  /// before they hand an update on: after a freeze `leading` still says yes
  /// until the lease actor runs again, and another replica may lead by then.
  std::shared_ptr<std::atomic<std::int64_t>> leading_until{};
};

/// Spawns the session actor of an exclusive transport: it asks the lease
/// actor to present this replica for `name` (the lease actor renews the
/// leadership in its batch), starts the transport when elected and stops
/// it when the leadership is lost, and yields when the transport stays
/// closed for `provider_down` or when told `(yield_atom, reason)` (another
/// connection is live), presenting itself again after `rest`. It presents
/// itself once it gets `(start_atom)`. `(shutdown_atom)` stops the
/// transport, then gives the leadership up, replies `true` and exits.
/// Yielding and shutting down give the leadership up only once the
/// transport stopped (bounded by 3 x `period`, a lease), so two replicas
/// never run it at once.
caf::actor spawn_session_actor(caf::actor_system& sys, session_config cfg);

} // namespace botmesh
