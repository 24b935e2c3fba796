#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

namespace botmesh::internal {

/// Threads that run user handlers, which may block, away from CAF's
/// scheduler. FIFO.
///
/// Elastic: it keeps `core` threads and adds one (up to `max`) when jobs
/// are waiting, no job has started for `stall`, and every worker is stuck:
/// its thread is off the cores now and spent most of the time since the
/// previous look blocked (sleeping, waiting for I/O or a lock; by the
/// kernel's scheduler statistics), or its job has run for `long_job`. A
/// worker that was merely preempted (the cores are busy) is not stuck:
/// another thread would only contend for the same cores. So short jobs run
/// on about one thread per core while blocking handlers get as many
/// threads as they need. Extra threads retire
/// after `retire_after` without work. `shutdown()` runs what is queued,
/// then joins.
///
/// A worker that runs out of jobs looks for the next one for up to 50 µs
/// (yielding its core at each look) before it sleeps: short jobs posted one
/// by one then cost no futex wake-up on either side. The cost is that much
/// CPU after the last job of a burst.
class worker_pool {
 public:
  worker_pool(std::size_t core, std::size_t max,
              std::chrono::microseconds stall = std::chrono::milliseconds{1},
              std::chrono::milliseconds retire_after = std::chrono::seconds{5},
              std::chrono::milliseconds long_job = std::chrono::milliseconds{100});
  ~worker_pool();

  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  /// Queues `job`. After `shutdown()` the job runs on the caller's thread,
  /// so a late turn still completes and reports done. It runs there as
  /// this pool's job: current_owner() names this pool's owner meanwhile
  /// (a listener it runs that stops its owner must not wait for the
  /// caller, which that stop may be waiting for).
  void post(std::function<void()> job);

  /// Queues `jobs` in order, as if each were posted, but under one lock and
  /// with one wake-up per sleeping worker needed (not one per job): a
  /// producer with many jobs at once (the timer actor firing a batch of
  /// due timers) otherwise pays a lock hand-off and a futex wake for every
  /// job while the workers drain faster than it posts. Each job stays a job
  /// of its own, so a blocking one holds no other. Leaves `jobs` empty.
  void post_batch(std::vector<std::function<void()>>& jobs);

  void shutdown();

  /// Threads alive now (any thread; for tests and statistics).
  std::size_t threads();

  /// Names the pool's owner (any address; set once, before jobs that ask):
  /// a job asks current_owner() whether it runs for that owner (a handler
  /// that must not wait for its owner's shutdown).
  void tag(const void* owner) noexcept {
    owner_.store(owner);
  }

  /// The owner tagged on the pool whose worker the caller is (null on any
  /// other thread). Reads no pool but the caller's own: safe while another
  /// thread makes or replaces the owner's pools.
  static const void* current_owner() noexcept;

 private:
  using clock = std::chrono::steady_clock;

  // A thread's time running or waiting for a core (ns), and when it was
  // read; `at` unset: not looked at in this job yet.
  struct sample {
    std::uint64_t ns = 0;
    clock::time_point at{};
  };

  struct worker {
    std::thread thread;
    std::atomic<bool> finished{false};
    // Under mtx_:
    int tid = 0;                   // the kernel's id of `thread`
    clock::time_point job_since{}; // when its job started; zero when none
    sample seen{}; // the supervisor's last look at its job
  };

  // The supervisor's look at one busy worker, made without the lock.
  struct look {
    worker* w;
    int tid;
    clock::time_point job_since;
    sample seen;
  };

  /// True when the job looked at has run for `long_job`, or its thread is
  /// off the cores and was blocked for most of the time since the
  /// supervisor's last look at the same job (the first look only takes a
  /// sample). Updates the look's sample. Takes no lock.
  bool stuck(look& l, clock::time_point now) const;

  /// Supervisor, holding `guard`: whether every worker is stuck (and a
  /// thread may still be added). Releases the lock while it reads /proc.
  bool all_stuck(std::unique_lock<std::mutex>& guard);

  void spawn_worker(bool extra); // caller holds mtx_
  /// Queues the `n` jobs `push` adds to `jobs_` (under the lock) and wakes
  /// as many sleeping workers as needed; false (nothing queued) once the
  /// pool is closed.
  template <class Push>
  bool queue(std::size_t n, Push&& push);
  void loop(worker* self, bool extra);
  /// Returns when a job is queued or `spin_` passed; takes no lock.
  void look_for_work();
  void supervise();

  std::mutex mtx_;
  std::condition_variable cv_;     // workers wait for jobs
  std::condition_variable sup_cv_; // the supervisor waits for a backlog
  std::deque<std::function<void()>> jobs_;
  std::list<worker> workers_; // reaped only by the supervisor
  std::vector<look> looks_;   // the supervisor's
  std::thread supervisor_;
  std::size_t core_;
  std::size_t max_;
  std::chrono::microseconds stall_;
  std::chrono::milliseconds retire_after_;
  std::chrono::milliseconds long_job_;
  std::chrono::microseconds spin_{50};
  std::atomic<const void*> owner_{nullptr}; // see tag()
  // jobs_.size(), written under the lock, read without it by look_for_work.
  std::atomic<std::size_t> queued_{0};
  std::size_t alive_ = 0;
  std::size_t idle_ = 0;    // workers waiting on cv_
  std::size_t looking_ = 0; // workers in look_for_work
  std::uint64_t started_jobs_ = 0;
  // The supervisor checks every `stall` (it sleeps until jobs wait while
  // no worker is idle otherwise).
  bool watching_ = true;
  bool closed_ = false;
};

} // namespace botmesh::internal
