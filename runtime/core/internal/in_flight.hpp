#pragma once

// Internal: counts an operation under way for as long as a scope lasts, so
// a shutdown can wait until none is (the Redis cluster's resends, the HTTP
// server's answer posts). The count is seq_cst: callers pair it with a
// flag the other side sets before reading the count.

#include <atomic>

namespace botmesh::internal {

struct in_flight {
  std::atomic<int>& n;
  explicit in_flight(std::atomic<int>& count) noexcept : n(count) {
    n.fetch_add(1);
  }
  ~in_flight() {
    n.fetch_sub(1);
  }
  in_flight(const in_flight&) = delete;
  in_flight& operator=(const in_flight&) = delete;
};

} // namespace botmesh::internal
