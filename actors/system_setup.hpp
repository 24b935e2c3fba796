#pragma once

#include <cstddef>

#include <caf/fwd.hpp>

namespace botmesh {

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
/// call this too (see `<botmesh/runtime/bot_actor.hpp>`).
void configure_scheduler(caf::actor_system_config& cfg,
                         std::size_t threads = 0,
                         std::size_t max_throughput = 32);

} // namespace botmesh
