#pragma once

// Internal: rate limiting of repeated log lines.

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>

namespace botmesh::internal {

/// Rate limit for a repeating condition (a backend that stays down): the
/// first occurrence passes, then at most one per `interval`; a passing
/// occurrence reports how many were held back since the last one. Thread-safe.
class log_limiter {
 public:
  explicit log_limiter(std::chrono::milliseconds interval = std::chrono::seconds{30})
    : interval_(interval) {
    // nop
  }

  /// True when this occurrence should be logged; `suppressed` then holds
  /// how many were dropped since the previous logged one.
  bool allow(std::uint64_t& suppressed,
             std::chrono::steady_clock::time_point now
             = std::chrono::steady_clock::now());

  /// The condition ended: the next occurrence passes at once. Returns true
  /// when occurrences had been logged (so a "recovered" line is worth it).
  bool reset();

 private:
  std::mutex mtx_;
  std::chrono::milliseconds interval_;
  std::optional<std::chrono::steady_clock::time_point> last_{};
  std::uint64_t dropped_ = 0;
};

} // namespace botmesh::internal
