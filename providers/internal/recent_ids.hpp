#pragma once

// Internal: the duplicate check of a webhook provider (ids of updates it
// received lately, and those whose acceptance is not known yet).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

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

/// The duplicate check of a webhook's deliveries: `recent_ids`, plus the
/// ids handed to the bot whose acceptance is not known yet (a journal write
/// on its way) with what waits for them. A redelivery that comes meanwhile
/// must get the original's answer: a 200 now would lose the update if the
/// write then failed. Thread-safe; one mutex over both.
template <class Id, class Waiter>
class pending_ids {
 public:
  enum class admission {
    fresh,     ///< new: pending until `decided`
    parked,    ///< a duplicate of a pending one: the waiter waits for it
    duplicate, ///< seen, and decided
  };

  explicit pending_ids(std::size_t window) : seen_(window) {
    // nop
  }

  /// Remembers `id` without following its acceptance (a status report).
  bool remember(const Id& id) {
    return seen_.remember(id);
  }

  /// Remembers `id`; for a duplicate of a pending one, moves `w` to wait.
  admission admit(const Id& id, Waiter& w) {
    std::lock_guard guard{mtx_};
    if (seen_.remember(id)) {
      pending_[id];
      return admission::fresh;
    }
    auto p = pending_.find(id);
    if (p == pending_.end())
      return admission::duplicate;
    p->second.push_back(std::move(w));
    return admission::parked;
  }

  /// The acceptance of `id` is known: what waited for it, taken. `again`
  /// (refused for a retry) forgets `id` in the same step: a duplicate in
  /// between would be taken for decided, answered 200, and the retry that
  /// should come never would.
  std::vector<Waiter> decided(const Id& id, bool again) {
    std::lock_guard guard{mtx_};
    if (again)
      seen_.forget(id);
    auto p = pending_.find(id);
    if (p == pending_.end())
      return {};
    auto out = std::move(p->second);
    pending_.erase(p);
    return out;
  }

  /// Everything that waits (the provider stops), taken. The ids stay
  /// pending: their acceptance is still coming (`accepted` is always
  /// called), and a redelivery after a restart must wait for it as before
  /// the stop, not be answered as decided while the write may yet fail.
  std::vector<Waiter> take_all() {
    std::lock_guard guard{mtx_};
    std::vector<Waiter> out;
    for (auto& [id, ws] : pending_) {
      for (auto& w : ws)
        out.push_back(std::move(w));
      ws.clear();
    }
    return out;
  }

 private:
  std::mutex mtx_;
  recent_ids<Id> seen_;
  std::unordered_map<Id, std::vector<Waiter>> pending_;
};

} // namespace botmesh::internal
