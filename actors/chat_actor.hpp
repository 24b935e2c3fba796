#pragma once

#include <memory>
#include <string>

#include <caf/fwd.hpp>

#include <botmesh/actors/chat_services.hpp>

namespace botmesh {

namespace internal {

/// Without coordination: the run queue of one chat's events (chat_actor.cpp).
class chat_runner;

} // namespace internal

/// Spawns the actor of one chat for `parent` (the router), which tells it
/// when to exit.
///
/// Its mailbox is the chat's FIFO, so a chat's handlers never overlap and
/// keep arrival order. Without coordination its events go to a run queue
/// that one handler thread at a time drains (`chat_services::run_event`);
/// with coordination each event takes its ticket from the lease actor as it
/// arrives and runs through `chat_services::run_turn` once granted, the
/// next only when that turn reported done.
/// It never blocks a CAF worker. Messages beyond `max_pending_per_chat` are
/// refused with `errc::overloaded`. When the router's sweep finds it got
/// nothing for `passivate_after` it sends `(idle_atom)`; an idle chat then
/// asks the router `(idle_atom, key, received)` and exits when allowed.
///
/// Protocol: `event_ptr` (a message, or a timer as an event); `turn_done_atom`;
/// `drain_atom` -> `bool` (replied once the queue is empty and no turn
/// runs); `abandon_atom`.
///
/// `run`: the run queue of the chat's previous actor, which ended by an
/// exception (see chat_gone_atom) while events still ran or waited in it:
/// the new actor goes on with it, so they keep their order and never run
/// beside the chat's newer events.
caf::actor spawn_chat(caf::event_based_actor* parent, std::string key,
                      std::shared_ptr<const router_config> cfg,
                      std::shared_ptr<internal::chat_runner> run = nullptr);

} // namespace botmesh
