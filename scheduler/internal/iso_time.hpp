#pragma once

// Internal: the occurrence-key time without a string of its own (no cctz
// here, so the actors can include it).

#include <cstddef>

#include <botmesh/runtime/core/clock.hpp>

namespace botmesh::internal {

/// The length of `to_iso_utc`'s text ("2026-03-29T01:00:00.000Z").
inline constexpr std::size_t iso_utc_size = 24;

/// Writes `to_iso_utc(t)` to `out[0..iso_utc_size)` (occurrence keys append
/// it in place); false, nothing written, for a year outside 0-9999.
bool write_iso_utc(time_point t, char* out);

} // namespace botmesh::internal
