#pragma once

#include <cstddef>

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

/// Sets the scheduler the way a bot sets up the actor system it owns:
/// `threads` workers (0: one per core, at least 2), `max_throughput`
/// messages per actor before a worker moves on (so one busy chat cannot
/// starve the others), and an idle worker that spins briefly and then sleeps
/// on a condition variable a sender wakes — CAF's middle phase of 50 µs
/// sleeps is turned off. Why: a turn waits on replies that arrive from the
/// Redis connection's thread; a worker in a 50 µs sleep (about 110 µs with
/// the kernel's timer slack) notices such a message only when it wakes,
/// which more than doubled the latency of a turn. The cost: a worker that
/// would have found work within its middle phase pays a futex wake-up
/// (a few µs) instead. An application embedding a bot in its own system may
/// call this too.
void configure_scheduler(caf::actor_system_config& cfg,
                         std::size_t threads = 0,
                         std::size_t max_throughput = 32);

} // namespace botmesh
