#pragma once

// Internal: the duplicate check of a webhook provider (ids of updates it
// received lately).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace botmesh::internal {

/// The ids seen lately: at most `window` of them, the oldest going first.
/// `forget` takes one back (a delivery refused for a retry); an id
/// remembered again after that keeps its whole window (its older place in
/// the order is ignored, not evicted in its stead). Thread-safe.
///
/// Cost: O(1) amortized per call under one mutex; the order holds at most
/// twice the window, however many ids are forgotten.
template <class Id>
class recent_ids {
 public:
  explicit recent_ids(std::size_t window) : window_(std::max<std::size_t>(1, window)) {
    // nop
  }

  /// True when `id` was not seen within the window (it is remembered now).
  bool remember(const Id& id) {
    std::lock_guard guard{mtx_};
    auto seq = ++seq_;
    if (!seen_.emplace(id, seq).second)
      return false;
    order_.emplace_back(seq, id);
    while (!order_.empty()
           && (seen_.size() > window_ || order_.size() > 2 * window_
               || stale(order_.front()))) {
      if (!stale(order_.front()))
        seen_.erase(order_.front().second);
      order_.pop_front();
    }
    return true;
  }

  void forget(const Id& id) {
    std::lock_guard guard{mtx_};
    seen_.erase(id);
  }

 private:
  // An order entry whose id was forgotten, or remembered again, since.
  bool stale(const std::pair<std::uint64_t, Id>& e) const {
    auto i = seen_.find(e.second);
    return i == seen_.end() || i->second != e.first;
  }

  std::size_t window_;
  std::mutex mtx_;
  std::uint64_t seq_ = 0;
  std::unordered_map<Id, std::uint64_t> seen_; // id -> its place in order_
  std::deque<std::pair<std::uint64_t, Id>> order_;
};

} // namespace botmesh::internal
