// bench_cluster: what the Redis Cluster client costs per command over the
// single-node client, both talking to the same master of the cluster at
// REDIS_CLUSTER_URL in the same run (keys in that master's slots, so the
// cluster client routes every command there without a redirection).
//
// 15 rounds, each measuring both clients back to back (which goes first
// alternates): 30000 INCRs with 64 in flight (pipelined, where a client's
// own overhead shows) and 1000 sequential round trips. The ratios are the
// medians of the per-round ratios. The pipelined runs also count the CPU
// time of this process (the client's threads; the servers run elsewhere)
// per command, steadier than wall time on a loaded machine.
//
//   bench single_client_pipelined_ns <ns per command>
//   bench cluster_client_pipelined_ns <ns per command>
//   bench single_client_cpu_ns <client CPU ns per command>
//   bench cluster_client_cpu_ns <client CPU ns per command>
//   bench single_client_round_trip_us <µs>
//   bench cluster_client_round_trip_us <µs>
//   ratio cluster_client_vs_single <pipelined cost ratio>   (goal <= 1.1)
//   ratio cluster_client_vs_single_cpu <CPU cost ratio>
//   ratio cluster_client_vs_single_round_trip <ratio>
//
// Then the store in the cluster:v1 layout, 5 alternating rounds: 16
// threads, each on chats of its own, doing checkpoint compare-and-set +
// message append steps, on the 3-master cluster and on the standalone Redis
// at REDIS_URL (one node, same layout). On two cores the nodes compete for
// the CPU, so the ratio has no goal.
//
//   bench cluster_store_steps_per_s <steps/s>   (one step: CAS + append)
//   bench node_store_steps_per_s <steps/s>
//   ratio cluster_store_vs_node_steps <ratio>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

#include <botmesh/stores/redis/redis_client.hpp>
#include <botmesh/stores/redis/redis_cluster_layout.hpp>
#include <botmesh/stores/redis/redis_store.hpp>

using clk = std::chrono::steady_clock;
using botmesh::redis_client;

namespace {

constexpr int rounds = 15;
constexpr long per_round = 30000;
constexpr int in_flight = 64;
constexpr int round_trips = 1000;

double cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

struct cost {
  double wall_ns;
  double cpu_ns;
};

// Issues `total` INCRs keeping `window` in flight; wall and CPU ns per
// command.
cost pipelined(redis_client& c, const std::vector<std::string>& keys,
               long total, int window) {
  std::atomic<long> issued{0}, done{0};
  std::promise<void> finished;
  std::function<void()> next = [&] {
    auto i = issued.fetch_add(1);
    if (i >= total)
      return;
    c.async({"INCR", keys[static_cast<std::size_t>(i) % keys.size()]},
            [&](botmesh::redis_reply, std::exception_ptr e) {
              if (e) {
                std::fprintf(stderr, "bench_cluster: a command failed\n");
                std::abort();
              }
              if (done.fetch_add(1) + 1 == total)
                finished.set_value();
              else
                next();
            });
  };
  auto t0 = clk::now();
  auto c0 = cpu_ns();
  for (int w = 0; w < window; ++w)
    next();
  finished.get_future().wait();
  auto n = static_cast<double>(total);
  return {std::chrono::duration<double, std::nano>(clk::now() - t0).count() / n,
          (cpu_ns() - c0) / n};
}

double round_trip_us(redis_client& c, const std::vector<std::string>& keys) {
  auto t0 = clk::now();
  for (int i = 0; i < round_trips; ++i)
    c.call({"INCR", keys[static_cast<std::size_t>(i) % keys.size()]});
  return std::chrono::duration<double, std::micro>(clk::now() - t0).count()
         / round_trips;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The master the seed is (or replicates) and the slot ranges it serves.
struct target {
  std::string address;
  std::vector<std::pair<int, int>> slots;
};

target master_near(const std::string& seed) {
  redis_client c{{.url = "redis://" + seed, .connections = 1}};
  auto text = c.call({"CLUSTER", "NODES"}).str;
  std::istringstream lines{text};
  std::string line, mine_master;
  std::vector<std::vector<std::string>> rows;
  while (std::getline(lines, line)) {
    std::istringstream f{line};
    std::vector<std::string> cols;
    for (std::string w; f >> w;)
      cols.push_back(w);
    if (cols.size() >= 8)
      rows.push_back(cols);
  }
  std::string want;
  for (auto& r : rows)
    if (r[2].find("myself") != std::string::npos)
      want = r[2].find("master") != std::string::npos ? r[0] : r[3];
  for (auto& r : rows)
    if (r[0] == want) {
      target t{r[1].substr(0, r[1].find('@')), {}};
      for (std::size_t i = 8; i < r.size(); ++i) {
        if (r[i].starts_with("["))
          continue;
        auto dash = r[i].find('-');
        auto a = std::stoi(r[i].substr(0, dash));
        auto b = dash == std::string::npos ? a : std::stoi(r[i].substr(dash + 1));
        t.slots.emplace_back(a, b);
      }
      return t;
    }
  std::fprintf(stderr, "bench_cluster: no master found from %s\n", seed.c_str());
  std::exit(1);
}

constexpr int store_rounds = 5;
constexpr int store_threads = 16;
constexpr int store_steps = 400; // per thread and round

// Steps (checkpoint CAS + append) per second with `store_threads` threads.
double store_steps_per_s(botmesh::store& s, int round) {
  std::vector<std::thread> pool;
  auto t0 = clk::now();
  for (int t = 0; t < store_threads; ++t)
    pool.emplace_back([&, t] {
      botmesh::flow_checkpoint cp;
      cp.key = "tg:" + std::to_string(round) + "-" + std::to_string(t);
      cp.flow = "bench";
      std::uint64_t rev = 0;
      for (int i = 0; i < store_steps; ++i) {
        cp.state = "{\"n\":" + std::to_string(i) + "}";
        rev = s.set_checkpoint_if(cp, rev).value_or(0);
        s.append_message(cp.key, {0, botmesh::direction::in, "m", "u", "x"});
      }
    });
  for (auto& th : pool)
    th.join();
  auto secs = std::chrono::duration<double>(clk::now() - t0).count();
  return store_threads * store_steps / secs;
}

constexpr int turn_threads = 16;
constexpr int turns_per_thread = 300; // per round

// Uncontended turns (enter, granted at once, release) per second with
// `turn_threads` threads, each on chats of its own.
double turns_per_s(botmesh::coordinator& co, int round) {
  std::vector<std::thread> pool;
  std::atomic<long> granted{0};
  auto t0 = clk::now();
  for (int t = 0; t < turn_threads; ++t)
    pool.emplace_back([&, t] {
      botmesh::blocking_coordinator bc{co};
      for (int i = 0; i < turns_per_thread; ++i) {
        auto key = "tg:turn-" + std::to_string(round) + "-" + std::to_string(t)
                   + "-" + std::to_string(i % 8);
        auto st = bc.enter(key, static_cast<std::uint64_t>(
                                  (t + 1) * 1'000'000 + round * 10'000 + i));
        if (!st.granted())
          continue;
        granted.fetch_add(1);
        bc.release({key, st.fence});
      }
    });
  for (auto& th : pool)
    th.join();
  auto secs = std::chrono::duration<double>(clk::now() - t0).count();
  if (granted.load() != turn_threads * turns_per_thread)
    std::printf("# turns: %ld of %d granted at once\n", granted.load(),
                turn_threads * turns_per_thread);
  return static_cast<double>(granted.load()) / secs;
}

} // namespace

int main() {
  auto url = std::getenv("REDIS_CLUSTER_URL");
  if (!url || !*url) {
    std::fprintf(stderr, "bench_cluster: REDIS_CLUSTER_URL is not set (scripts/test "
                         "starts a cluster and exports it)\n");
    return 1;
  }
  std::string seed = url;
  seed = seed.substr(seed.find("://") + 3);
  auto t = master_near(seed);
  std::vector<std::string> keys;
  for (int i = 0; keys.size() < 64; ++i) {
    auto k = "bench-cluster:" + std::to_string(i);
    int s = redis_client::key_slot(k);
    for (auto [a, b] : t.slots)
      if (a <= s && s <= b)
        keys.push_back(k);
  }
  redis_client single{{.url = "redis://" + t.address}};
  redis_client cluster{botmesh::redis_cluster_options{.root_nodes = {url}}};
  // Warm-up: connections open, caches hot.
  pipelined(single, keys, 5000, in_flight);
  pipelined(cluster, keys, 5000, in_flight);

  std::vector<double> s_pipe, c_pipe, s_cpu, c_cpu, s_rt, c_rt, r_pipe, r_cpu,
    r_rt;
  for (int r = 0; r < rounds; ++r) {
    // Which client goes first alternates, so a drift in the machine's load
    // does not favour one.
    cost s{}, c{};
    double srt = 0, crt = 0;
    if (r % 2 == 0) {
      s = pipelined(single, keys, per_round, in_flight);
      c = pipelined(cluster, keys, per_round, in_flight);
      srt = round_trip_us(single, keys);
      crt = round_trip_us(cluster, keys);
    } else {
      c = pipelined(cluster, keys, per_round, in_flight);
      s = pipelined(single, keys, per_round, in_flight);
      crt = round_trip_us(cluster, keys);
      srt = round_trip_us(single, keys);
    }
    s_pipe.push_back(s.wall_ns);
    c_pipe.push_back(c.wall_ns);
    s_cpu.push_back(s.cpu_ns);
    c_cpu.push_back(c.cpu_ns);
    s_rt.push_back(srt);
    c_rt.push_back(crt);
    r_pipe.push_back(c.wall_ns / s.wall_ns);
    r_cpu.push_back(c.cpu_ns / s.cpu_ns);
    r_rt.push_back(crt / srt);
  }
  for (auto& k : keys)
    single.call({"DEL", k});

  // The store, on the cluster and on its one master.
  auto prefix = "bench-cluster-store-" + std::to_string(
    clk::now().time_since_epoch().count());
  auto on_cluster = std::make_shared<redis_client>(
    botmesh::redis_cluster_options{.root_nodes = {url}});
  auto node_url = std::getenv("REDIS_URL");
  if (!node_url || !*node_url) {
    std::fprintf(stderr, "bench_cluster: REDIS_URL is not set (scripts/test "
                         "starts a standalone Redis and exports it)\n");
    return 1;
  }
  auto on_node = std::make_shared<redis_client>(
    botmesh::redis_options{.url = node_url});
  botmesh::redis_store cs{{.client = on_cluster, .prefix = prefix + "-c"}};
  botmesh::redis_store ns{{.client = on_node, .prefix = prefix + "-n",
                           .layout = botmesh::redis_layout_kind::cluster,
                           .allow_legacy_data = true}};
  cs.start();
  ns.start();
  std::vector<double> c_st, n_st, r_st;
  for (int r = 0; r < store_rounds; ++r) {
    double c = 0, n = 0;
    if (r % 2 == 0) {
      c = store_steps_per_s(cs, r);
      n = store_steps_per_s(ns, r);
    } else {
      n = store_steps_per_s(ns, r);
      c = store_steps_per_s(cs, r);
    }
    c_st.push_back(c);
    n_st.push_back(n);
    r_st.push_back(c / n);
  }
  // Turns: the coordinator of each store.
  auto cc = cs.coordinator("bench-c");
  auto nc = ns.coordinator("bench-n");
  std::vector<double> c_tu, n_tu, r_tu;
  for (int r = 0; r < store_rounds; ++r) {
    double c = 0, n = 0;
    if (r % 2 == 0) {
      c = turns_per_s(*cc, r);
      n = turns_per_s(*nc, r);
    } else {
      n = turns_per_s(*nc, r);
      c = turns_per_s(*cc, r);
    }
    c_tu.push_back(c);
    n_tu.push_back(n);
    r_tu.push_back(c / n);
  }
  // The benchmark's keys go (they live under the two prefixes only).
  for (int r = 0; r < store_rounds; ++r)
    for (int th = 0; th < store_threads; ++th) {
      auto chat = "tg:" + std::to_string(r) + "-" + std::to_string(th);
      cs.delete_chat(chat);
      cs.clear_checkpoint(chat);
      ns.delete_chat(chat);
      ns.clear_checkpoint(chat);
      for (auto* p : {&cs, &ns}) {
        botmesh::redis_cluster_layout L{p->prefix()};
        p->client().call({"DEL", L.checkpoint_revision(chat)});
      }
    }
  for (auto* p : {&cs, &ns})
    p->client().call({"DEL", botmesh::redis_cluster_layout{p->prefix()}.marker()});
  std::printf("bench single_client_pipelined_ns %.0f ns\n", median(s_pipe));
  std::printf("bench cluster_client_pipelined_ns %.0f ns\n", median(c_pipe));
  std::printf("bench single_client_cpu_ns %.0f ns\n", median(s_cpu));
  std::printf("bench cluster_client_cpu_ns %.0f ns\n", median(c_cpu));
  std::printf("bench single_client_round_trip_us %.1f us\n", median(s_rt));
  std::printf("bench cluster_client_round_trip_us %.1f us\n", median(c_rt));
  std::printf("ratio cluster_client_vs_single %.3f\n", median(r_pipe));
  std::printf("ratio cluster_client_vs_single_cpu %.3f\n", median(r_cpu));
  std::printf("ratio cluster_client_vs_single_round_trip %.3f\n", median(r_rt));
  std::printf("bench cluster_store_steps_per_s %.0f steps/s\n", median(c_st));
  std::printf("bench node_store_steps_per_s %.0f steps/s\n", median(n_st));
  std::printf("ratio cluster_store_vs_node_steps %.3f\n", median(r_st));
  std::printf("bench cluster_turns_per_s %.0f turns/s\n", median(c_tu));
  std::printf("bench node_turns_per_s %.0f turns/s\n", median(n_tu));
  std::printf("ratio cluster_turns_vs_node %.3f\n", median(r_tu));
}
