#pragma once

// Atoms of the router / chat actor protocol. Include only in .cpp files that
// talk to these actors (pulls in caf/atom.hpp).

#include <caf/atom.hpp>

namespace botmesh {

/// router -> chat, bot -> router: finish what is queued, then reply.
/// To the router it carries the bound (std::chrono::milliseconds) and the
/// reply is `true` when every chat drained in time.
using drain_atom = caf::atom_constant<caf::atom("bm_drain")>;

/// router -> chat: refuse everything still queued with `errc::stopped`.
using abandon_atom = caf::atom_constant<caf::atom("bm_abandn")>;

/// handler thread -> chat: the running turn finished.
using turn_done_atom = caf::atom_constant<caf::atom("bm_done")>;

/// chat -> router: (key, messages received); the reply `true` lets the chat
/// exit because the router forwarded nothing more.
using idle_atom = caf::atom_constant<caf::atom("bm_idle")>;

/// runtime -> router: (key, timer id): a timer armed for a chat fired; the
/// router forwards (timer id) to the chat actor, spawning it if needed.
using timer_atom = caf::atom_constant<caf::atom("bm_timer")>;


} // namespace botmesh
