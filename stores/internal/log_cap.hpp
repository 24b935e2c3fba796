#pragma once

// Internal: the check of `max_log_per_chat`, shared by every store.

#include <cstddef>
#include <string_view>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>

namespace botmesh::internal {

/// A cap of 0 would keep no message while still counting them: each store
/// did something else with it (the cluster layout even reused sequence
/// numbers), so it is refused when the store is made.
inline void check_log_cap(std::size_t max_log_per_chat, std::string_view store) {
  if (max_log_per_chat == 0)
    throw invalid_argument_error(
      "max_log_per_chat",
      fmt::format("{}: max_log_per_chat must be at least 1 (the newest "
                  "messages a chat's log keeps)",
                  store));
}

} // namespace botmesh::internal
