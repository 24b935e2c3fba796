#pragma once

// Internal: loading time zones by name and converting between botmesh and
// cctz time points, shared by the cron search and the ISO-8601 helpers.

#include <string_view>

#include <cctz/time_zone.h>

#include <botmesh/runtime/core/clock.hpp>

namespace botmesh::internal {

using sec_tp = cctz::time_point<cctz::seconds>;

/// "local" (the process zone), "UTC" or an IANA name; throws
/// `invalid_argument_error` (field "time_zone") for an unknown zone.
cctz::time_zone zone_or_throw(std::string_view name);

inline sec_tp to_seconds(time_point t) {
  return std::chrono::floor<cctz::seconds>(t);
}

inline time_point from_seconds(sec_tp t) {
  return std::chrono::time_point_cast<std::chrono::milliseconds>(t);
}

} // namespace botmesh::internal
