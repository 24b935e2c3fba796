#pragma once

// Internal: the per-process set of inbound message ids seen lately, used to
// drop platform redeliveries when the bot has no durable journal.

#include <chrono>
#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include <botmesh/runtime/core/clock.hpp>

namespace botmesh::internal {

/// A bounded, time-limited set: an id is remembered for `window` after it
/// was inserted, and at most `max_entries` ids are kept (the oldest go
/// first, so under a flood a redelivery older than the bound is not
/// recognized). Thread-safe; its mutex guards only the set.
///
/// Cost: O(1) amortized per insert, one allocation when the id is new;
/// about 80 bytes per id.
class dedupe_set {
 public:
  dedupe_set(std::size_t max_entries, std::chrono::milliseconds window,
             const botmesh::clock& clock);

  /// True when `id` was not seen within the window (it is remembered
  /// now); false for a duplicate.
  bool insert(std::string id);

  std::size_t size() const;

 private:
  void expire(std::int64_t now);

  std::size_t max_;
  std::int64_t window_ms_;
  const botmesh::clock& clock_;
  mutable std::mutex mtx_;
  std::unordered_map<std::string, std::int64_t> seen_; // id -> inserted at
  /// Insertion order, pointing at the keys in `seen_` (stable: a node's
  /// key moves only when it is erased, and a node is erased only through
  /// its newest entry here, which is the last to leave).
  std::deque<std::pair<std::int64_t, const std::string*>> order_;
};

} // namespace botmesh::internal
