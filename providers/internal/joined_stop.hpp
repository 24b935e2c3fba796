#pragma once

// Internal: one stop token for two (a send given up when its turn ends or
// when its provider stops).

#include <functional>
#include <optional>
#include <stop_token>

namespace botmesh::internal {

/// A stop token that fires when either of two does. Not movable: its
/// callbacks refer to it.
class joined_stop {
 public:
  joined_stop(const std::stop_token& a, const std::stop_token& b) {
    std::function<void()> cut = [this] { src_.request_stop(); };
    a_.emplace(a, cut);
    b_.emplace(b, cut);
  }
  joined_stop(const joined_stop&) = delete;
  joined_stop& operator=(const joined_stop&) = delete;

  std::stop_token token() const noexcept {
    return src_.get_token();
  }

 private:
  std::stop_source src_;
  std::optional<std::stop_callback<std::function<void()>>> a_, b_;
};

} // namespace botmesh::internal
