#pragma once

#include <caf/fwd.hpp>

#include <botmesh/actors/chat_services.hpp>

namespace botmesh {

/// Spawns the router of one bot.
///
/// The router receives `inbound_message` (already validated) and forwards it
/// to the chat actor of its chat key, spawning that actor on first use. As
/// the single sender to every chat actor, it fixes each chat's order: the
/// order in which messages reached the router's mailbox. When the router
/// gets an exit message, its chat actors exit with it.
///
/// Protocol (atoms in messages.hpp):
/// - `inbound_message`                 -> forwarded (or refused when draining)
/// - `(drain_atom, milliseconds)`      -> bool: stops intake, waits until every
///   chat finished its queue; chats still busy after the bound are abandoned
///   (their queued messages refused with `errc::stopped`) and the reply is false.
/// - `(timer_atom, key, id)`           -> forwarded to the chat as `(timer_atom, id)`
caf::actor spawn_router(caf::actor_system& sys, router_config cfg);

/// Registers botmesh's error category and message types in a CAF config.
/// Optional for local use (the bot works without it); call it before
/// creating the `caf::actor_system` to render botmesh errors by name and to
/// send botmesh messages to remote actors.
void configure_actor_system(caf::actor_system_config& cfg);

} // namespace botmesh
