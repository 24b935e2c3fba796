// bench_turn_latency: uncontended acquire+release latency (p50/p99/p999) of
// the memory and Redis coordinators next to a bare Redis PING round trip
// measured in the same run; hand-off latency between two replicas
// alternating on one chat, woken by the push and by polling only; and turns
// per second over 1k chats. Redis from REDIS_URL.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <botmesh/stores/memory_coordinator.hpp>
#include <botmesh/stores/redis/redis_coordinator.hpp>

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

struct percentiles {
  double p50, p99, p999;
};

percentiles pct(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  auto at = [&](double q) {
    return us[std::min(us.size() - 1, static_cast<size_t>(q * us.size()))];
  };
  return {at(0.5), at(0.99), at(0.999)};
}

double micros(clk::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

percentiles uncontended(botmesh::coordinator& c, int n) {
  std::vector<double> us;
  us.reserve(n);
  for (int i = 0; i < n; ++i) {
    auto key = "u" + std::to_string(i % 64);
    auto t0 = clk::now();
    auto t = c.take_ticket(key);
    auto held = c.try_acquire(key, t);
    c.release(*held);
    us.push_back(micros(clk::now() - t0));
  }
  return pct(us);
}

// A and B alternate on one chat: B queues while A holds the turn; the
// figure is the time from A's release until B holds the turn.
percentiles handoff(botmesh::coordinator& a, botmesh::coordinator& b, int n,
                    bool push) {
  std::vector<double> us;
  std::string key = push ? "handoff-push" : "handoff-poll";
  for (int i = 0; i < n; ++i) {
    auto ta = a.take_ticket(key);
    auto held = a.try_acquire(key, ta);
    auto tb = b.take_ticket(key);
    std::atomic<bool> released{false};
    clk::time_point t0;
    std::thread waiter{[&] {
      for (;;) {
        if (released.load())
          if (auto got = b.try_acquire(key, tb)) {
            us.push_back(micros(clk::now() - t0));
            b.release(*got);
            return;
          }
        if (push)
          b.wait_change(key, 100ms);
        else
          std::this_thread::sleep_for(5ms); // the polling floor
      }
    }};
    std::this_thread::sleep_for(2ms); // let B wait
    t0 = clk::now();
    released = true;
    a.release(*held);
    waiter.join();
  }
  return pct(us);
}

double turns_per_second(std::vector<botmesh::coordinator*> replicas, int chats) {
  std::atomic<bool> stop{false};
  std::atomic<long> turns{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 8; ++t) {
    pool.emplace_back([&, t] {
      auto& c = *replicas[t % replicas.size()];
      std::mt19937 rng(t);
      while (!stop) {
        auto key = "chat" + std::to_string(rng() % chats);
        auto ticket = c.take_ticket(key);
        std::optional<botmesh::turn> held;
        while (!(held = c.try_acquire(key, ticket)))
          c.wait_change(key, 5ms);
        c.release(*held);
        ++turns;
      }
    });
  }
  auto t0 = clk::now();
  std::this_thread::sleep_for(2s);
  stop = true;
  for (auto& th : pool)
    th.join();
  return turns / std::chrono::duration<double>(clk::now() - t0).count();
}

void print(const char* what, percentiles p) {
  std::printf("%-44s p50 %8.1f us  p99 %8.1f us  p999 %8.1f us\n", what, p.p50,
              p.p99, p.p999);
}

} // namespace

int main() {
  std::printf("bench_turn_latency\n");
  {
    botmesh::memory_coordination_hub hub;
    botmesh::memory_coordinator a{hub, {.replica_id = "a"}};
    botmesh::memory_coordinator b{hub, {.replica_id = "b"}};
    print("memory: uncontended acquire+release", uncontended(a, 50'000));
    print("memory: hand-off, push wake-up", handoff(a, b, 300, true));
    print("memory: hand-off, polling only", handoff(a, b, 300, false));
    std::printf("memory: turns/s over 1k chats, 2 replicas x 4 threads: %.0f\n",
                turns_per_second({&a, &b}, 1000));
  }
  auto url = std::getenv("REDIS_URL");
  if (!url) {
    std::printf("redis: REDIS_URL not set, Redis figures not measured\n");
    return 0;
  }
  botmesh::redis_client client{{.url = url}};
  std::vector<double> ping;
  for (int i = 0; i < 5000; ++i) {
    auto t0 = clk::now();
    client.call({"PING"});
    ping.push_back(micros(clk::now() - t0));
  }
  auto base = pct(ping);
  print("redis baseline: PING round trip (our client)", base);
  auto prefix = "bench-turn-" + std::to_string(std::random_device{}());
  botmesh::redis_coordinator a{{.url = url, .prefix = prefix, .replica_id = "a"}};
  botmesh::redis_coordinator b{{.url = url, .prefix = prefix, .replica_id = "b"}};
  auto u = uncontended(a, 5'000);
  print("redis: uncontended acquire+release", u);
  std::printf("ratio redis acquire+release p50 / PING p50: %.2f (3 round trips)\n",
              u.p50 / base.p50);
  print("redis: hand-off, push wake-up", handoff(a, b, 200, true));
  print("redis: hand-off, polling only", handoff(a, b, 200, false));
  std::printf("redis: turns/s over 1k chats, 2 replicas x 4 threads: %.0f\n",
              turns_per_second({&a, &b}, 1000));
  return 0;
}
