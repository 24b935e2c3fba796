#pragma once

// Internal: the replica's lease keeper ("lease actor" in DESIGN.md). It
// mirrors the turns this replica holds, renews them and the heartbeat in one
// call every lease/3, fences turns that were lost, and fences everything
// when renewals have failed for almost a whole lease (a freeze or a network
// cut), before the leases expire in the backend. It also enforces `settle`.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <botmesh/stores/coordinator.hpp>

namespace botmesh::internal {

/// One held turn as its chat's handler thread sees it.
struct held_turn {
  botmesh::turn turn;
  std::stop_source stop;        // fires on settle or loss
  std::string lost_reason;      // non-empty once fenced
  std::chrono::steady_clock::time_point started;
  bool released = false;
};

class turn_keeper {
 public:
  using lost_fn = std::function<void(const std::string& key,
                                     const std::string& reason)>;

  turn_keeper(coordinator& c, std::chrono::milliseconds settle, lost_fn on_lost);
  ~turn_keeper();

  /// Takes a ticket for `key` and waits for the turn: woken by the
  /// coordinator's push, polling from 5 ms up to `max_poll` as a safety net.
  /// Returns the held turn; nothing after `turn_wait` or when `stop` fires
  /// (the ticket is given up). Coordinator failures throw.
  std::shared_ptr<held_turn> acquire(const std::string& key,
                                     std::chrono::milliseconds turn_wait,
                                     std::chrono::milliseconds max_poll,
                                     const std::stop_token& stop);

  /// Starts mirroring a granted turn.
  std::shared_ptr<held_turn> hold(botmesh::turn t);

  /// Releases a turn (unless settle already did) and stops mirroring it.
  void release(const std::shared_ptr<held_turn>& h);

  /// Throws `lease_lost_error` (with the reason it was lost) unless the turn
  /// is unfenced and was renewed recently enough to be valid. The check
  /// before every write.
  void check(held_turn& h);

 private:
  void loop();
  void fence_locked(held_turn& h, const std::string& reason);

  coordinator& coord_;
  std::chrono::milliseconds settle_;
  lost_fn on_lost_;
  std::mutex mtx_;
  std::condition_variable cv_;
  std::unordered_map<std::string, std::shared_ptr<held_turn>> held_;
  // Releases that failed on the network, retried every lease/3 so a chat
  // does not stay blocked behind a live replica until the lease runs out.
  std::vector<botmesh::turn> failed_releases_;
  std::chrono::steady_clock::time_point last_renewal_;
  bool stopping_ = false;
  std::thread thread_;
};

} // namespace botmesh::internal
