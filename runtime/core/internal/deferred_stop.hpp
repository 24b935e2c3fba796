#pragma once

// A stop that may be asked from one of the threads it waits for (a handler
// that stops its own bot or scheduler): run there, it would wait for
// itself for good.

#include <functional>
#include <mutex>
#include <thread>

namespace botmesh::internal {

/// Runs a stop asked from inside on a thread of its own, and lets the
/// owner wait for it from outside. Thread-safe. Costs nothing until a stop
/// is asked from inside (then one thread, for as long as the stop runs).
class deferred_stop {
 public:
  deferred_stop() = default;
  deferred_stop(const deferred_stop&) = delete;
  deferred_stop& operator=(const deferred_stop&) = delete;

  /// Joins a stop still running; the owner calls join() first, on a thread
  /// other than the stop's.
  ~deferred_stop() {
    join(true);
  }

  /// Asked from a thread the stop waits for: `stop` runs on a thread of its
  /// own, unless one runs already or the owner closed this. Returns at once.
  void begin_inside(std::function<void()> stop) {
    std::lock_guard guard{mtx_};
    if (closed_ || (thread_.joinable() && !finished_))
      return;
    if (thread_.joinable())
      thread_.join(); // its stop returned: it is ending
    finished_ = false;
    thread_ = std::thread{[this, stop = std::move(stop)] {
      stop();
      std::lock_guard guard{mtx_};
      finished_ = true;
    }};
  }

  /// Waits for a stop begun inside, if any. `close`: no stop begins inside
  /// from now on (an owner going away, or one that stops only once).
  void join(bool close = false) {
    std::thread t;
    {
      std::lock_guard guard{mtx_};
      closed_ = closed_ || close;
      t = std::move(thread_);
    }
    if (t.joinable())
      t.join();
  }

 private:
  std::mutex mtx_;
  std::thread thread_;
  bool finished_ = false; // thread_'s stop returned
  bool closed_ = false;
};

} // namespace botmesh::internal
