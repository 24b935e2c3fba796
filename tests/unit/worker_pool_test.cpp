// The handler pool: order, jobs stuck behind blocking ones, batches and
// shutdown. Its waits are real threads, so each bound below is generous;
// none measures speed.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <botmesh/runtime/core/internal/worker_pool.hpp>

using namespace std::chrono_literals;
using botmesh::internal::worker_pool;

namespace {

// A gate the blocking jobs wait on; opened by the test (or at its end).
struct gate {
  std::promise<void> p;
  std::shared_future<void> f = p.get_future().share();
  bool opened = false;
  void open() {
    if (!opened) {
      opened = true;
      p.set_value();
    }
  }
  ~gate() {
    open();
  }
};

bool ready_within(std::future<void>& f, std::chrono::milliseconds d) {
  return f.wait_for(d) == std::future_status::ready;
}

// Once the first job set `started`, posts a second one; whether it ran
// within 5 s.
bool next_job_runs(worker_pool& pool, const std::atomic<bool>& started) {
  while (!started.load())
    std::this_thread::sleep_for(1ms);
  // Shared: on a timeout the job may still run after this returns.
  auto ran = std::make_shared<std::promise<void>>();
  auto f = ran->get_future();
  pool.post([ran] { ran->set_value(); });
  return ready_within(f, 5s);
}

} // namespace

TEST_CASE("the pool runs one poster's jobs in order on a single worker") {
  worker_pool pool{1, 1};
  std::mutex mtx;
  std::vector<int> seen;
  std::promise<void> done;
  constexpr int n = 2000;
  for (int i = 0; i < n; ++i)
    pool.post([&, i] {
      std::lock_guard guard{mtx};
      seen.push_back(i);
      if (i == n - 1)
        done.set_value();
    });
  auto f = done.get_future();
  REQUIRE(ready_within(f, 10s));
  std::lock_guard guard{mtx};
  REQUIRE(seen.size() == n);
  for (int i = 0; i < n; ++i)
    CHECK(seen[i] == i);
}

TEST_CASE("a job queued behind workers that all block gets a thread of its "
          "own") {
  gate g;
  worker_pool pool{1, 3};
  std::atomic<int> blocked{0};
  pool.post([&] {
    ++blocked;
    g.f.wait();
  });
  SUBCASE("posted after the worker blocked") {
    while (blocked.load() == 0)
      std::this_thread::sleep_for(1ms);
  }
  SUBCASE("posted at once, before the worker took its own job") {
    // The post may find the worker counted idle though it was already
    // woken for the first job: the job left behind must still be seen.
  }
  std::promise<void> ran;
  pool.post([&] { ran.set_value(); });
  auto f = ran.get_future();
  CHECK(ready_within(f, 5s));
  g.open();
}

TEST_CASE("a job queued behind a worker that computes (runnable, not "
          "blocked) waits for it instead of getting a thread") {
  // Under load a worker is often preempted for longer than the stall
  // interval; a thread added then only contends for the same cores. A job
  // that computes for less than long_job (100 ms) is not stuck.
  std::atomic<bool> started{false}; // declared first: outlives the pool
  worker_pool pool{1, 4};
  pool.post([&] {
    started = true;
    auto until = std::chrono::steady_clock::now() + 40ms;
    while (std::chrono::steady_clock::now() < until) {
      // busy
    }
  });
  REQUIRE(next_job_runs(pool, started));
  CHECK(pool.threads() == 1);
}

TEST_CASE("a job queued behind a worker that computes for longer than "
          "long_job gets a thread") {
  // Declared before the pool: its jobs read them until the pool is gone.
  std::atomic<bool> stop{false};
  std::atomic<bool> started{false};
  worker_pool pool{1, 4, 1ms, 5s, 20ms};
  pool.post([&] {
    started = true;
    while (!stop.load()) {
      // busy until the second job ran
    }
  });
  CHECK(next_job_runs(pool, started));
  CHECK(pool.threads() == 2);
  stop = true;
}

TEST_CASE("jobs posted after a quiet spell are taken by a worker that went "
          "to sleep") {
  worker_pool pool{2, 2};
  for (int round = 0; round < 5; ++round) {
    // Longer than a worker looks for work before it sleeps.
    std::this_thread::sleep_for(20ms);
    std::promise<void> ran;
    pool.post([&] { ran.set_value(); });
    auto f = ran.get_future();
    CHECK(ready_within(f, 5s));
  }
}

TEST_CASE("a batch runs every job, each on its own: a blocking one holds no "
          "other") {
  gate g;
  worker_pool pool{1, 4};
  std::atomic<int> ran{0};
  std::promise<void> all_quick;
  std::vector<std::function<void()>> jobs;
  jobs.push_back([&] { g.f.wait(); });
  constexpr int quick = 50;
  for (int i = 0; i < quick; ++i)
    jobs.push_back([&] {
      if (++ran == quick)
        all_quick.set_value();
    });
  pool.post_batch(jobs);
  CHECK(jobs.empty());
  auto f = all_quick.get_future();
  CHECK(ready_within(f, 5s));
  g.open();
}

TEST_CASE("shutdown runs what is queued, and a later post runs on the "
          "caller's thread") {
  std::atomic<int> ran{0};
  auto pool = std::make_unique<worker_pool>(1, 1);
  for (int i = 0; i < 100; ++i)
    pool->post([&] {
      std::this_thread::sleep_for(50us);
      ++ran;
    });
  pool->shutdown();
  CHECK(ran.load() == 100);
  auto caller = std::this_thread::get_id();
  std::thread::id where;
  pool->post([&] { where = std::this_thread::get_id(); });
  CHECK(where == caller);
  pool.reset(); // a second shutdown in the destructor is a no-op
}

TEST_CASE("shutdown runs a queued job that the blocked workers wait for") {
  worker_pool pool{1, 2};
  std::promise<void> unblock;
  auto unblocked = unblock.get_future().share();
  std::once_flag once;
  auto open = [&] { std::call_once(once, [&] { unblock.set_value(); }); };
  std::promise<void> a_started;
  std::promise<void> a_done;
  pool.post([&, unblocked] {
    a_started.set_value();
    unblocked.wait();
    a_done.set_value();
  });
  a_started.get_future().wait();
  pool.post(open); // queued: the only worker is blocked
  std::thread closer{[&] { pool.shutdown(); }};
  auto done = a_done.get_future();
  bool ran = ready_within(done, 5s);
  open(); // (so that a failing run ends instead of hanging)
  closer.join();
  CHECK(ran);
}
