#pragma once

// Internal: a durable run's occurrence key (no cctz here, so the actors can
// include it).

#include <string>
#include <string_view>

#include <botmesh/runtime/core/clock.hpp>

namespace botmesh::internal {

/// `<task_id>@<slot as to_iso_utc>`, built in one allocation (every durable
/// run makes one).
std::string occurrence_key(std::string_view task_id, time_point slot);

} // namespace botmesh::internal
