// bench_stores: operations per second of checkpoint compare-and-set and of
// fenced lock acquire+release on the memory, SQLite and Redis stores, with 1
// and 64 concurrent callers. For Redis (REDIS_URL) also a bare PING round
// trip and raw pipelined throughput on one hiredis connection, measured in
// the same run, and the ratio of the store's throughput to them.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <hiredis/hiredis.h>
#include <unistd.h>

#include <botmesh/stores/memory_store.hpp>
#include <botmesh/stores/redis/redis_store.hpp>
#include <botmesh/stores/sqlite/sqlite_store.hpp>

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

constexpr auto window = 1500ms;

// Runs `op(caller, i)` on `callers` threads for `window`; returns ops/s.
double rate(int callers, const std::function<void(int, long)>& op) {
  std::atomic<bool> stop{false};
  std::atomic<long> total{0};
  std::vector<std::thread> pool;
  for (int c = 0; c < callers; ++c)
    pool.emplace_back([&, c] {
      long n = 0;
      while (!stop.load(std::memory_order_relaxed))
        op(c, n++);
      total += n;
    });
  auto t0 = clk::now();
  std::this_thread::sleep_for(window);
  stop = true;
  for (auto& t : pool)
    t.join();
  return total / std::chrono::duration<double>(clk::now() - t0).count();
}

struct figures {
  double cas1, cas64, lock1, lock64;
};

figures measure(botmesh::store& s, const std::string& name) {
  std::vector<std::uint64_t> revs(64, 0);
  auto cas = [&](int c, long) {
    botmesh::flow_checkpoint cp;
    cp.key = "bench:" + std::to_string(c);
    cp.flow = "pedido";
    cp.state = R"({"producto":"café","cantidad":2})";
    auto r = s.set_checkpoint_if(cp, revs[c]);
    if (!r) { // someone else's revision (a rerun): read and go on
      auto cur = s.get_checkpoint(cp.key);
      revs[c] = cur ? cur->revision : 0;
      return;
    }
    revs[c] = *r;
  };
  auto lock = [&](int c, long) {
    auto key = "bench-lock:" + std::to_string(c);
    if (auto l = s.acquire_lock_fenced(key, 10s))
      s.release_lock(key, l->token);
  };
  figures f{rate(1, cas), rate(64, cas), rate(1, lock), rate(64, lock)};
  std::printf("%-8s checkpoint CAS  1 caller: %9.0f/s   64 callers: %9.0f/s\n",
              name.c_str(), f.cas1, f.cas64);
  std::printf("%-8s lock acq+rel    1 caller: %9.0f/s   64 callers: %9.0f/s\n",
              name.c_str(), f.lock1, f.lock64);
  return f;
}

struct endpoint {
  std::string host;
  int port;
};

endpoint parse(const std::string& url) {
  auto rest = url.substr(url.find("//") + 2);
  auto colon = rest.rfind(':');
  return {rest.substr(0, colon), std::atoi(rest.substr(colon + 1).c_str())};
}

void redis_baselines(const std::string& url, const figures& ours) {
  auto ep = parse(url);
  redisContext* c = redisConnect(ep.host.c_str(), ep.port);
  if (!c || c->err) {
    std::printf("redis baseline: cannot connect to %s\n", url.c_str());
    return;
  }
  // Bare round trip: one PING at a time.
  constexpr int pings = 20000;
  auto t0 = clk::now();
  for (int i = 0; i < pings; ++i)
    freeReplyObject(redisCommand(c, "PING"));
  double secs = std::chrono::duration<double>(clk::now() - t0).count();
  double ping_rate = pings / secs;
  // Raw pipelined throughput: batches of 64 commands on one connection.
  constexpr int batches = 2000;
  constexpr int depth = 64;
  t0 = clk::now();
  for (int b = 0; b < batches; ++b) {
    for (int i = 0; i < depth; ++i)
      redisAppendCommand(c, "INCR bench-raw");
    for (int i = 0; i < depth; ++i) {
      void* r = nullptr;
      redisGetReply(c, &r);
      freeReplyObject(r);
    }
  }
  secs = std::chrono::duration<double>(clk::now() - t0).count();
  double raw = batches * depth / secs;
  freeReplyObject(redisCommand(c, "DEL bench-raw"));
  redisFree(c);
  std::printf("redis baseline PING round trip:      %9.0f/s (%.1f us each)\n",
              ping_rate, 1e6 / ping_rate);
  std::printf("redis baseline raw pipelined INCR:   %9.0f/s (depth %d, one "
              "connection)\n",
              raw, depth);
  std::printf("ratio redis CAS 1 caller / PING round trip:     %6.3f\n",
              ours.cas1 / ping_rate);
  std::printf("ratio redis CAS 64 callers / raw pipelined:     %6.3f\n",
              ours.cas64 / raw);
  std::printf("ratio redis lock 64 callers / raw pipelined:    %6.3f "
              "(each op is 2 commands)\n",
              ours.lock64 / raw);
  std::printf("ratio redis CAS 64 callers / 1 caller (pipelining gain): %6.2fx\n",
              ours.cas64 / ours.cas1);
}

} // namespace

int main() {
  std::printf("bench_stores: %lld ms per figure\n",
              static_cast<long long>(window.count()));
  {
    botmesh::memory_store s;
    measure(s, "memory");
  }
  {
    char tmpl[] = "/tmp/botmesh-bench-XXXXXX";
    int fd = mkstemp(tmpl);
    close(fd);
    std::string path = tmpl;
    {
      botmesh::sqlite_store s{{.path = path}};
      s.start();
      measure(s, "sqlite");
    }
    for (auto suffix : {"", "-wal", "-shm"})
      unlink((path + suffix).c_str());
  }
  auto url = std::getenv("REDIS_URL");
  if (!url) {
    std::printf("redis: REDIS_URL not set, Redis figures not measured\n");
    return 0;
  }
  botmesh::redis_store s{{.url = url, .prefix = "bench-stores"}};
  s.start();
  auto f = measure(s, "redis");
  redis_baselines(url, f);
  return 0;
}
