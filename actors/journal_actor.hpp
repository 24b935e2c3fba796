#pragma once

#include <chrono>
#include <functional>

#include <caf/fwd.hpp>

namespace botmesh {

/// What the journal actor runs. Both jobs are asynchronous: they return at
/// once and call their `done` exactly once, from any thread, when the
/// backend answered (or failed).
struct journal_config {
  /// Time between beats; a beat still running when the next is due makes
  /// the actor skip that one (never two beats at once).
  std::chrono::milliseconds period{5'000};
  /// One beat: renew this replica's heartbeat in the durable backend and
  /// claim (and re-inject) what is free or held by dead holders.
  std::function<void(std::function<void()> done)> beat;
  /// At shutdown: end this replica's heartbeat.
  std::function<void(std::function<void()> done)> retire;
};

/// Spawns the journal actor of one replica: the single owner of the beat
/// timer of durable processing. It beats every `period`, the first time
/// one period after it was spawned (the bot makes the first beat itself,
/// before it takes any message: a record must never exist before its
/// holder's heartbeat, or another replica would take it for a dead one's).
/// No backend call runs on its thread (the jobs only issue them).
///
/// Protocol: `(beat_now_atom)` beats at once (unless a beat runs);
/// `(shutdown_atom)` -> `true` once the running beat finished and `retire`
/// completed; then it exits.
caf::actor spawn_journal_actor(caf::actor_system& sys, journal_config cfg);

} // namespace botmesh
