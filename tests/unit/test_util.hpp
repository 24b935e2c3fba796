#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <botmesh/runtime/bot.hpp>

namespace test {

using namespace std::chrono_literals;

/// Waits until `pred` holds, checking every millisecond; false on timeout.
inline bool eventually(const std::function<bool()>& pred,
                       std::chrono::milliseconds timeout = 10s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline)
      return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

/// Runs `fn` on this thread. A call that hangs longer than `limit` (a
/// deadlock) would hold the whole run: the process then says `what` and
/// aborts.
inline void run_or_abort(const std::function<void()>& fn,
                         std::chrono::seconds limit, const char* what) {
  std::atomic<bool> done{false};
  std::thread watchdog{[&] {
    if (!eventually([&] { return done.load(); }, limit)) {
      std::fputs(what, stderr);
      std::fputs("\n", stderr);
      std::abort();
    }
  }};
  fn();
  done = true;
  watchdog.join();
}

/// Resets `p` on this thread, as run_or_abort: a destructor that hangs.
template <class T>
void reset_or_abort(std::unique_ptr<T>& p, std::chrono::seconds limit,
                    const char* what) {
  run_or_abort([&] { p.reset(); }, limit, what);
}

/// Sets `p` when opened or when it goes out of scope, whichever comes
/// first. Declared after the bots whose handlers wait on p's future, it
/// opens before they stop (a bot's stop waits for its handlers), also when
/// a REQUIRE fails.
class opener {
 public:
  explicit opener(std::promise<void>& p) : p_(p) {
    // nop
  }
  opener(const opener&) = delete;
  opener& operator=(const opener&) = delete;
  ~opener() {
    open();
  }

  void open() {
    if (!std::exchange(opened_, true))
      p_.set_value();
  }

 private:
  std::promise<void>& p_;
  bool opened_ = false;
};

/// Collects a bot's error events (thread-safe).
class error_log {
 public:
  void attach(botmesh::bot& b) {
    b.on<botmesh::events::error>([this](const botmesh::events::error& e) {
      std::lock_guard guard{mtx_};
      errors_.push_back(e);
    });
  }

  std::vector<botmesh::events::error> all() const {
    std::lock_guard guard{mtx_};
    return errors_;
  }

  std::size_t count(botmesh::errc code) const {
    std::lock_guard guard{mtx_};
    std::size_t n = 0;
    for (auto& e : errors_)
      n += e.code == code ? 1 : 0;
    return n;
  }

 private:
  mutable std::mutex mtx_;
  std::vector<botmesh::events::error> errors_;
};

} // namespace test
