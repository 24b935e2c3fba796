#pragma once

#include <atomic>
#include <chrono>

namespace botmesh {

/// Wall-clock time as used by stores, leases and the scheduler.
using time_point = std::chrono::time_point<std::chrono::system_clock,
                                           std::chrono::milliseconds>;

/// A source of the current time. Everything that reads time for TTLs, leases
/// or schedules takes one, so tests can move time without sleeping.
/// Implementations are thread-safe.
class clock {
 public:
  virtual ~clock();

  virtual time_point now() const = 0;

  /// The process-wide system clock.
  static const clock& system();
};

/// A clock that only moves when told to. Thread-safe.
class manual_clock : public clock {
 public:
  explicit manual_clock(time_point start = time_point{std::chrono::milliseconds{
                          1'700'000'000'000}});

  time_point now() const override;

  void set(time_point t);

  void advance(std::chrono::milliseconds d);

 private:
  std::atomic<std::int64_t> ms_;
};

/// Milliseconds since the Unix epoch of a time point.
inline std::int64_t to_unix_ms(time_point t) noexcept {
  return t.time_since_epoch().count();
}

inline time_point from_unix_ms(std::int64_t ms) noexcept {
  return time_point{std::chrono::milliseconds{ms}};
}

} // namespace botmesh
