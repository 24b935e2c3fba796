#pragma once

// Metrics in the Prometheus text format (version 0.0.4).
//
// Counters, gauges and histograms are plain objects owned by whoever
// updates them (a bot, the Redis client): updating one is a relaxed atomic
// add, with no lock and no lookup. Owners register a *collector* with a
// registry; a scrape calls every collector, which reads its values into an
// `exposition` that groups samples by family and renders the text.
//
//   # HELP botmesh_messages_received_total Inbound messages accepted.
//   # TYPE botmesh_messages_received_total counter
//   botmesh_messages_received_total{bot="shop"} 42

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace botmesh::metrics {

/// A count that only grows. `inc` is one relaxed atomic add.
class counter {
 public:
  void inc(std::uint64_t n = 1) noexcept {
    v_.fetch_add(n, std::memory_order_relaxed);
  }
  std::uint64_t value() const noexcept {
    return v_.load(std::memory_order_relaxed);
  }

 private:
  std::atomic<std::uint64_t> v_{0};
};

/// A value that goes up and down (a queue's depth).
class gauge {
 public:
  void add(std::int64_t n = 1) noexcept {
    v_.fetch_add(n, std::memory_order_relaxed);
  }
  void sub(std::int64_t n = 1) noexcept {
    v_.fetch_sub(n, std::memory_order_relaxed);
  }
  void set(std::int64_t n) noexcept {
    v_.store(n, std::memory_order_relaxed);
  }
  std::int64_t value() const noexcept {
    return v_.load(std::memory_order_relaxed);
  }

 private:
  std::atomic<std::int64_t> v_{0};
};

/// A latency histogram with fixed buckets from 0.5 ms to 60 s.
/// `observe` costs a scan of 16 bounds and three relaxed atomic adds.
class histogram {
 public:
  /// Upper bounds of the buckets, in seconds (+Inf is implicit).
  static constexpr std::array<double, 16> bounds{
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25,   0.5,   1.0,    2.5,   5.0,  10.0,  30.0,  60.0};

  /// Records one duration (a negative one counts as 0).
  void observe(std::chrono::nanoseconds d) noexcept;

  struct snapshot {
    /// Per bucket (not cumulative); the last is +Inf.
    std::array<std::uint64_t, bounds.size() + 1> buckets{};
    std::uint64_t count = 0;
    double sum_seconds = 0;
  };

  /// The current values. Concurrent observations may be half-counted
  /// (count and buckets read at slightly different moments); the
  /// rendered `_count` is the sum of the buckets, so a scrape is consistent.
  snapshot read() const noexcept;

 private:
  std::array<std::atomic<std::uint64_t>, bounds.size() + 1> buckets_{};
  std::atomic<std::uint64_t> sum_ns_{0};
};

/// Label name/value pairs of one sample. Empty values are left out.
using labels = std::vector<std::pair<std::string_view, std::string_view>>;

/// The samples of one scrape, grouped by family. Not thread-safe: one
/// scrape builds one.
class exposition {
 public:
  void counter(std::string_view name, std::string_view help,
               const labels& ls, std::uint64_t value);
  void gauge(std::string_view name, std::string_view help, const labels& ls,
             double value);
  void histogram(std::string_view name, std::string_view help,
                 const labels& ls, const histogram::snapshot& s);

  /// The text format: families in the order first added, each with one
  /// HELP and one TYPE line.
  std::string str() const;

 private:
  struct family {
    std::string help;
    std::string type;
    std::string samples;
  };
  family& get(std::string_view name, std::string_view help,
              std::string_view type);

  std::vector<std::string> order_;
  std::map<std::string, family, std::less<>> families_;
};

/// Collectors to scrape. Thread-safe; the mutex is taken to add or remove a
/// collector and during a scrape, never when a metric is updated.
class registry {
 public:
  using collector = std::function<void(exposition&)>;

  /// Removes its collector when destroyed (waiting for a scrape that
  /// is running it).
  class registration {
   public:
    registration() = default;
    registration(registration&& other) noexcept;
    registration& operator=(registration&& other) noexcept;
    ~registration();

   private:
    friend class registry;
    registration(registry* r, std::uint64_t id) : reg_(r), id_(id) {
      // nop
    }
    void reset() noexcept;
    registry* reg_ = nullptr;
    std::uint64_t id_ = 0;
  };

  /// Adds `c`, called on every scrape until the registration goes away.
  [[nodiscard]] registration add(collector c);

  /// Calls every collector and renders the text format.
  std::string scrape() const;

 private:
  mutable std::mutex mtx_;
  std::uint64_t next_ = 0;
  std::map<std::uint64_t, collector> collectors_;
};

/// The process's registry: bots and the Redis client register there, and
/// `/metrics` serves it.
registry& global_registry();

/// The content type of the text format.
inline constexpr std::string_view content_type =
  "text/plain; version=0.0.4; charset=utf-8";

} // namespace botmesh::metrics
