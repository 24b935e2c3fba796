#pragma once

// Internal: platform timestamps (input) as time points.

#include <cstdint>
#include <limits>

#include <botmesh/runtime/core/clock.hpp>

namespace botmesh::internal {

/// A time point from seconds since the Unix epoch, as platforms send them;
/// the epoch (no time) for a value not positive or whose milliseconds do not
/// fit in 64 bits: a platform's field is input, and multiplying it
/// unchecked would overflow.
inline time_point from_unix_seconds(std::int64_t s) noexcept {
  constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max() / 1000;
  return s > 0 && s <= max ? from_unix_ms(s * 1000) : time_point{};
}

} // namespace botmesh::internal
