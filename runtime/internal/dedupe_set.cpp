#include <botmesh/runtime/internal/dedupe_set.hpp>

#include <algorithm>

namespace botmesh::internal {

dedupe_set::dedupe_set(std::size_t max_entries,
                       std::chrono::milliseconds window,
                       const botmesh::clock& clock)
  // At least 1 ms: a re-inserted id then always gets a later time than
  // its older entry in `order_`, which the pointer scheme relies on.
  : max_(max_entries), window_ms_(std::max<std::int64_t>(1, window.count())),
    clock_(clock) {
  // nop
}

void dedupe_set::expire(std::int64_t now) {
  while (!order_.empty()
         && (order_.front().first + window_ms_ <= now || order_.size() > max_)) {
    auto& [at, id] = order_.front();
    auto i = seen_.find(*id);
    if (i != seen_.end() && i->second == at)
      seen_.erase(i);
    order_.pop_front();
  }
}

bool dedupe_set::insert(std::string id) {
  auto now = to_unix_ms(clock_.now());
  std::lock_guard guard{mtx_};
  expire(now);
  auto [i, added] = seen_.try_emplace(std::move(id), now);
  if (!added) {
    if (i->second + window_ms_ > now)
      return false;
    i->second = now; // expired but not swept yet
  }
  order_.emplace_back(now, &i->first);
  if (order_.size() > max_)
    expire(now);
  return true;
}

std::size_t dedupe_set::size() const {
  std::lock_guard guard{mtx_};
  return seen_.size();
}

} // namespace botmesh::internal
