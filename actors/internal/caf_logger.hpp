#pragma once

// CAF 0.17 keeps a reference to an actor system's logger in a thread-local
// of every thread that spawns one of its actors (or makes a scoped_actor),
// and the system's destructor waits until that logger is gone. A system
// destroyed on another thread while such a thread lives on (an
// application's main thread that made and started a bot) hung for good.

namespace botmesh::internal {

/// Drops the calling thread's reference to any actor system's logger.
/// Called after a spawn (or a scoped_actor's use) on a thread that is not
/// one of the system's own; the CAF log is quiet in this project, so
/// nothing is lost on that thread.
void release_caf_logger() noexcept;

} // namespace botmesh::internal
