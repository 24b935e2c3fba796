#pragma once

// Internal: leader election for an exclusive transport. A thread presents
// this replica for provider:<id> every lease/3; the elected replica starts
// the transport, the others stand by. A leader whose transport stays closed
// for provider_down yields, waits, and presents itself again.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <atomic>
#include <string>
#include <thread>

#include <botmesh/stores/coordinator.hpp>

namespace botmesh::internal {

class provider_session {
 public:
  struct hooks {
    std::function<void()> start_transport;
    std::function<void()> stop_transport;
    /// How long the transport has been closed; nothing while it is open.
    std::function<std::optional<std::chrono::steady_clock::duration>()>
      closed_for;
    std::function<void(const std::string& name, std::uint64_t fence)> on_leader;
    std::function<void(const std::string& name, const std::string& reason)>
      on_follower;
  };

  provider_session(coordinator& c, std::string name,
                   std::chrono::milliseconds provider_down, hooks h);

  /// Stops presenting; a leader releases its leadership (the transport is
  /// stopped by the caller).
  ~provider_session();

  bool leading() const noexcept {
    return leading_.load();
  }

  /// The transport says another connection is live: a leader steps down
  /// (`on_follower(name, reason)`), stops the transport, releases the
  /// leadership, waits max(lease, 3 s) and presents itself again. Ignored
  /// on a standby. Returns at once (the work happens on the session thread).
  void yield(std::string reason);

 private:
  void loop();
  bool wait(std::chrono::milliseconds d); // false when stopping; a yield wakes it
  bool wait_out(std::chrono::milliseconds d); // ignores yields

  coordinator& coord_;
  std::string name_;
  std::chrono::milliseconds provider_down_;
  hooks hooks_;
  std::atomic<bool> leading_{false};
  std::mutex mtx_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::string yield_reason_; // non-empty: a yield was asked for
  std::thread thread_;
};

} // namespace botmesh::internal
