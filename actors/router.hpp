#pragma once

#include <cstddef>

#include <caf/fwd.hpp>

#include <botmesh/actors/chat_services.hpp>
#include <botmesh/actors/system_setup.hpp>

namespace botmesh {

/// Spawns the router of one bot.
///
/// The router receives `event_ptr`s (messages already validated, boxed
/// with their chat key) and forwards each to the chat actor of that key,
/// spawning that actor on first use. As the single sender to every chat
/// actor, it fixes each chat's order: the order in which messages reached
/// the router's mailbox.
/// When the router gets an exit message, its chat actors exit with it.
///
/// Internal: the bot is its only sender of messages (`bot::actor()` is the
/// way in for applications). It takes events the bot already
/// validated, stamped and counted; a bare `inbound_message` is not part of
/// its protocol (it would skip all three) and is dropped as unexpected.
///
/// Protocol (atoms in messages.hpp):
/// - `event_ptr`                       -> forwarded (or refused when draining)
/// - `(drain_atom, milliseconds)`      -> bool: stops intake, waits until every
///   chat finished its queue; chats still busy after the bound are abandoned
///   (their queued messages refused with `errc::stopped`) and the reply is false.
/// - `(timer_atom, key, id, retries)` -> forwarded to the chat as a timer event
///                                     (`attempt` = how often its turn failed)
caf::actor spawn_router(caf::actor_system& sys, router_config cfg);

/// Registers botmesh's error category and message types in a CAF config.
/// Declared (and documented) in `<botmesh/runtime/bot_actor.hpp>`, defined
/// in the runtime library; declared here too so code that included this
/// header for it keeps compiling.
void configure_actor_system(caf::actor_system_config& cfg);

} // namespace botmesh
