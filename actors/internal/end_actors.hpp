#pragma once

// Internal: ends actors and waits until they have.

#include <cstddef>
#include <functional>
#include <vector>

#include <caf/fwd.hpp>

namespace botmesh::internal {

/// Sends each of `actors` an exit (user_shutdown) and waits, without a
/// bound, until every one has ended; `still_waiting(left, seconds)` is
/// called every 10 s meanwhile. Blocks the calling thread: not for a CAF
/// worker those actors need.
void end_and_wait(caf::actor_system& sys, const std::vector<caf::actor>& actors,
                  const std::function<void(std::size_t left, int seconds)>&
                    still_waiting);

} // namespace botmesh::internal
