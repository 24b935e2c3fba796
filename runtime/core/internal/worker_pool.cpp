#include <botmesh/runtime/core/internal/worker_pool.hpp>

#include <algorithm>
#include <cstdio>
#include <string_view>

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace botmesh::internal {

namespace {
// The pool whose worker this thread is (null elsewhere): it is joined
// before its pool goes.
thread_local const worker_pool* current_pool = nullptr;

// The owner of a shut-down pool whose job this thread runs inline (null
// elsewhere). The owner's tag, not the pool: the pool may go meanwhile.
thread_local const void* inline_owner = nullptr;

// A job of a shut-down pool run on the caller's thread.
class running_for {
 public:
  explicit running_for(const void* owner) : previous_(inline_owner) {
    inline_owner = owner;
  }
  ~running_for() {
    inline_owner = previous_;
  }
  running_for(const running_for&) = delete;
  running_for& operator=(const running_for&) = delete;

 private:
  const void* previous_;
};
} // namespace

worker_pool::worker_pool(std::size_t core, std::size_t max,
                         std::chrono::microseconds stall,
                         std::chrono::milliseconds retire_after,
                         std::chrono::milliseconds long_job)
  : core_(std::max<std::size_t>(1, std::min(core, max))),
    max_(std::max<std::size_t>(1, max)),
    stall_(stall),
    retire_after_(retire_after),
    long_job_(long_job) {
  std::lock_guard guard{mtx_};
  for (std::size_t i = 0; i < core_; ++i)
    spawn_worker(false);
  if (max_ > core_)
    supervisor_ = std::thread{[this] { supervise(); }};
}

worker_pool::~worker_pool() {
  shutdown();
}

template <class Push>
bool worker_pool::queue(std::size_t n, Push&& push) {
  std::lock_guard guard{mtx_};
  if (closed_)
    return false;
  push();
  queued_.store(jobs_.size(), std::memory_order_relaxed);
  // Waking a worker is a syscall: only sleeping ones, as many as there are
  // jobs; one notify_all when that is all of them.
  if (idle_ > 0) {
    if (n >= idle_)
      cv_.notify_all();
    else
      for (std::size_t i = 0; i < n; ++i)
        cv_.notify_one();
  } else if (looking_ == 0 && !watching_) {
    // Every worker is busy: only now can the jobs stall, so only now is
    // the supervisor woken (a wake-up per post would cost as much as the
    // job's own hand-off).
    sup_cv_.notify_one();
  }
  return true;
}

void worker_pool::post(std::function<void()> job) {
  if (!queue(1, [&] { jobs_.push_back(std::move(job)); })) {
    running_for scope{owner_.load()};
    job();
  }
}

void worker_pool::post_batch(std::vector<std::function<void()>>& jobs) {
  if (jobs.empty())
    return;
  if (!queue(jobs.size(), [&] {
        for (auto& job : jobs)
          jobs_.push_back(std::move(job));
      })) {
    running_for scope{owner_.load()};
    for (auto& job : jobs)
      job();
  }
  jobs.clear();
}

void worker_pool::shutdown() {
  {
    std::lock_guard guard{mtx_};
    if (closed_ && workers_.empty())
      return;
    closed_ = true;
  }
  cv_.notify_all();
  sup_cv_.notify_all();
  if (supervisor_.joinable())
    supervisor_.join();
  // The supervisor stopped once the queue was drained: no worker is added
  // after this.
  for (auto& w : workers_)
    if (w.thread.joinable())
      w.thread.join();
  std::lock_guard guard{mtx_};
  workers_.clear();
}

void worker_pool::spawn_worker(bool extra) {
  // Reap workers that retired, so the list stays as long as the live set.
  for (auto i = workers_.begin(); i != workers_.end();) {
    if (i->finished.load()) {
      i->thread.join();
      i = workers_.erase(i);
    } else {
      ++i;
    }
  }
  auto& w = workers_.emplace_back();
  ++alive_;
  w.thread = std::thread{[this, ptr = &w, extra] {
    current_pool = this;
    loop(ptr, extra);
  }};
}

const void* worker_pool::current_owner() noexcept {
  if (inline_owner)
    return inline_owner;
  return current_pool ? current_pool->owner_.load() : nullptr;
}

std::size_t worker_pool::threads() {
  std::lock_guard guard{mtx_};
  return alive_;
}

namespace {

// Reads a small /proc file of this process into `buf`; its length, or 0.
std::size_t read_proc(const char* path, char* buf, std::size_t size) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  auto n = ::read(fd, buf, size - 1);
  ::close(fd);
  if (n <= 0)
    return 0;
  buf[n] = '\0';
  return static_cast<std::size_t>(n);
}

// Nanoseconds thread `tid` spent running plus waiting for a core (the
// first two fields of its schedstat); false when the kernel has no such
// statistics.
bool sched_time(int tid, std::uint64_t& ns) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", tid);
  char buf[128];
  if (read_proc(path, buf, sizeof buf) == 0)
    return false;
  unsigned long long run = 0, wait = 0;
  if (std::sscanf(buf, "%llu %llu", &run, &wait) != 2)
    return false;
  ns = run + wait;
  return true;
}

// Whether thread `tid` is runnable now: running or waiting for a core.
bool runnable(int tid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
  char buf[256];
  auto n = read_proc(path, buf, sizeof buf);
  // "tid (name) S ...": the name may hold anything, so the state follows
  // the last ')'.
  std::string_view text{buf, n};
  auto close = text.rfind(')');
  if (close == std::string_view::npos || close + 2 >= text.size())
    return false;
  return text[close + 2] == 'R';
}

} // namespace

bool worker_pool::stuck(look& l, clock::time_point now) const {
  if (now - l.job_since >= long_job_)
    return true;
  if (l.tid == 0)
    return true;
  // Running or waiting for a core. (Checked first: the kernel updates a
  // running thread's time only at its ticks, so the statistics below lag
  // for it; for a thread that is off the cores they are exact.)
  if (runnable(l.tid))
    return false;
  std::uint64_t ns = 0;
  if (!sched_time(l.tid, ns))
    return true;
  auto last = l.seen;
  l.seen = {ns, now};
  bool first_look = last.at == clock::time_point{};
  auto elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(
                   now - last.at)
                   .count();
  auto progress = ns - last.ns;
  // A lock briefly contended or a short write leaves a thread blocked for
  // an instant; blocked for most of an interval is what stalls the pool.
  return !first_look && progress * 4 < static_cast<std::uint64_t>(elapsed);
}

void worker_pool::loop(worker* self, bool extra) {
  std::unique_lock guard{mtx_};
  self->tid = static_cast<int>(::syscall(SYS_gettid));
  for (;;) {
    if (jobs_.empty() && !closed_) {
      // Look for a while before sleeping: a worker that sleeps costs the
      // next post a futex wake-up and itself a context switch, which for
      // short jobs arriving one by one (a chat's next message, a durable
      // task's run) is most of what the hand-off costs. While it looks it
      // does not count as idle, so posts do not wake anybody.
      ++looking_;
      guard.unlock();
      look_for_work();
      guard.lock();
      --looking_;
    }
    if (jobs_.empty() && !closed_) {
      ++idle_;
      if (extra) {
        bool got = cv_.wait_for(guard, retire_after_, [this] {
          return closed_ || !jobs_.empty();
        });
        if (!got) {
          --idle_;
          break; // retire: no work for a while
        }
      } else {
        cv_.wait(guard, [this] { return closed_ || !jobs_.empty(); });
      }
      --idle_;
    }
    if (jobs_.empty())
      break; // closed and drained
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    queued_.store(jobs_.size(), std::memory_order_relaxed);
    ++started_jobs_;
    // Jobs left behind with no worker idle (a post counted a worker that
    // was woken but had not taken its job yet): they can stall now.
    if (!jobs_.empty() && idle_ == 0 && looking_ == 0 && !watching_)
      sup_cv_.notify_one();
    if (max_ > core_)
      self->job_since = clock::now(); // only the supervisor reads it
    guard.unlock();
    job();
    guard.lock();
    self->job_since = {};
    self->seen = {};
  }
  --alive_;
  self->finished = true;
}

void worker_pool::look_for_work() {
  using clock = std::chrono::steady_clock;
  auto until = clock::now() + spin_;
  for (int i = 1;; ++i) {
    if (queued_.load(std::memory_order_relaxed) > 0)
      return;
    // Give the core away at once: the poster may be waiting for it (two
    // cores shared by CAF's workers, the pool and the I/O threads).
    std::this_thread::yield();
    if (i % 16 == 0 && clock::now() >= until)
      return;
  }
}

bool worker_pool::all_stuck(std::unique_lock<std::mutex>& guard) {
  // What to look at, taken under the lock; /proc is read without it, so
  // posts (CAF workers) and finishing workers never wait for the reads.
  looks_.clear();
  for (auto& w : workers_) {
    if (w.finished.load())
      continue;
    if (w.job_since == clock::time_point{})
      return false; // between jobs: it will take the next one
    looks_.push_back({&w, w.tid, w.job_since, w.seen});
  }
  auto started = started_jobs_;
  guard.unlock();
  auto now = clock::now();
  bool all = true;
  // Every worker is looked at (no early exit): each keeps its sample for
  // the next look, so a pool of blocked workers grows on the second look.
  for (auto& l : looks_)
    if (!stuck(l, now))
      all = false;
  guard.lock();
  // Only workers still in the job that was looked at keep the sample, and
  // only if no job started meanwhile is the answer still true.
  for (auto& l : looks_) {
    if (l.w->job_since == l.job_since)
      l.w->seen = l.seen;
    else
      all = false;
  }
  return all && started == started_jobs_ && !jobs_.empty() && idle_ == 0
         && looking_ == 0 && alive_ < max_;
}

void worker_pool::supervise() {
  std::unique_lock guard{mtx_};
  auto last_started = started_jobs_;
  // After shutdown() too, until the queue is drained: a queued job may be
  // what the blocked workers wait for.
  while (!closed_ || !jobs_.empty()) {
    if (jobs_.empty()) {
      watching_ = false;
      sup_cv_.wait(guard, [this] {
        return closed_ || (!jobs_.empty() && idle_ == 0 && looking_ == 0);
      });
      watching_ = true;
      last_started = started_jobs_;
      continue;
    }
    sup_cv_.wait_for(guard, stall_);
    // Jobs wait, none started during the last interval, and every worker
    // is stuck: one more thread is the only way forward. (A worker that is
    // merely preempted would take the next job once it gets a core back.)
    if (!jobs_.empty() && started_jobs_ == last_started && idle_ == 0
        && looking_ == 0 && alive_ < max_ && all_stuck(guard))
      spawn_worker(true);
    last_started = started_jobs_;
  }
}

} // namespace botmesh::internal
