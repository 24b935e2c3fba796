#pragma once

// Test helpers for Redis Cluster: the seed scripts/test exported, the
// topology as CLUSTER NODES reports it, a client per node, and slot moves
// step by step (MIGRATING/IMPORTING, key by key, then the new owner).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <botmesh/stores/redis/redis_client.hpp>

namespace test {

/// Runs `pred` until it holds or `limit` passes (a generous bound, not a
/// timing assertion); false when it never held.
inline bool eventually(const std::function<bool()>& pred,
                       std::chrono::milliseconds limit = std::chrono::seconds(60)) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

/// The load threads of a test, which run until `stop` is set. Leaving the
/// scope (also through a failed REQUIRE) sets it and joins them.
class load_threads {
 public:
  explicit load_threads(std::atomic<bool>& stop) : stop_(stop) {
    // nop
  }

  load_threads(const load_threads&) = delete;
  load_threads& operator=(const load_threads&) = delete;

  ~load_threads() {
    stop_all();
  }

  template <class F, class... Args>
  void run(F&& f, Args&&... args) {
    threads_.emplace_back(std::forward<F>(f), std::forward<Args>(args)...);
  }

  /// Sets `stop` and joins every thread. Idempotent.
  void stop_all() {
    stop_ = true;
    for (auto& t : threads_)
      if (t.joinable())
        t.join();
  }

 private:
  std::atomic<bool>& stop_;
  std::vector<std::thread> threads_;
};

/// REDIS_CLUSTER_URL from the environment. Cluster tests run, never skip:
/// a missing URL is an error telling how to run them.
inline std::string redis_cluster_url() {
  auto url = std::getenv("REDIS_CLUSTER_URL");
  if (!url || !*url)
    throw std::runtime_error(
      "REDIS_CLUSTER_URL is not set: run the tests with scripts/test, which "
      "starts a 6-node Redis Cluster on loopback and exports it");
  return url;
}

/// One line of CLUSTER NODES.
struct cluster_node {
  std::string id;
  std::string address; // host:port
  bool master = false;
  bool failed = false;
  std::string master_id; // for a replica
  std::vector<std::pair<int, int>> slots;

  bool serves(int slot) const {
    for (auto [a, b] : slots)
      if (a <= slot && slot <= b)
        return true;
    return false;
  }
};

/// A single-node client for `address` (host:port), one connection.
inline std::unique_ptr<botmesh::redis_client>
node_client(const std::string& address,
            botmesh::duration command_timeout = "5s") {
  return std::make_unique<botmesh::redis_client>(
    botmesh::redis_options{.url = "redis://" + address,
                           .command_timeout = command_timeout,
                           .connections = 1});
}

/// CLUSTER NODES as seen by the node at `address`.
inline std::vector<cluster_node> cluster_nodes(const std::string& address) {
  auto c = node_client(address);
  auto text = c->call({"CLUSTER", "NODES"}).str;
  std::vector<cluster_node> out;
  std::istringstream lines{text};
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream f{line};
    cluster_node n;
    std::string addr, flags, master, ping, pong, epoch, state, slot;
    f >> n.id >> addr >> flags >> master >> ping >> pong >> epoch >> state;
    if (n.id.empty())
      continue;
    n.address = addr.substr(0, addr.find('@'));
    n.master = flags.find("master") != std::string::npos;
    n.failed = flags.find("fail") != std::string::npos
               && flags.find("fail?") == std::string::npos;
    if (master != "-")
      n.master_id = master;
    while (f >> slot) {
      if (slot.starts_with("["))
        continue; // a migration in progress
      auto dash = slot.find('-');
      if (dash == std::string::npos)
        n.slots.emplace_back(std::stoi(slot), std::stoi(slot));
      else
        n.slots.emplace_back(std::stoi(slot.substr(0, dash)),
                             std::stoi(slot.substr(dash + 1)));
    }
    out.push_back(std::move(n));
  }
  return out;
}

/// host:port of the seed node.
inline std::string seed_address() {
  auto url = redis_cluster_url();
  return url.substr(url.find("://") + 3);
}

/// The cluster's nodes, as the seed sees them.
inline std::vector<cluster_node> cluster_nodes() {
  return cluster_nodes(seed_address());
}

/// The master serving `slot`, as the seed sees it.
inline cluster_node master_of(int slot) {
  for (auto& n : cluster_nodes())
    if (n.master && !n.failed && n.serves(slot))
      return n;
  throw std::runtime_error("no master serves slot " + std::to_string(slot));
}

/// A master other than `not_this` (by id).
inline cluster_node other_master(const std::string& not_this) {
  for (auto& n : cluster_nodes())
    if (n.master && !n.failed && n.id != not_this && !n.slots.empty())
      return n;
  throw std::runtime_error("no other master");
}

/// Root nodes for a cluster client: the seed.
inline botmesh::redis_cluster_options cluster_options() {
  return botmesh::redis_cluster_options{.root_nodes = {redis_cluster_url()}};
}

/// First half of a slot move: `to` IMPORTING from `from`, `from` MIGRATING
/// to `to`.
inline void begin_slot_move(int slot, const cluster_node& from,
                            const cluster_node& to) {
  auto s = std::to_string(slot);
  node_client(to.address)->call({"CLUSTER", "SETSLOT", s, "IMPORTING", from.id});
  node_client(from.address)->call({"CLUSTER", "SETSLOT", s, "MIGRATING", to.id});
}

/// Moves `keys` (all in the slot being moved) from `from` to `to`.
inline void migrate_keys(const cluster_node& from, const cluster_node& to,
                         const std::vector<std::string>& keys) {
  auto colon = to.address.rfind(':');
  botmesh::redis_client::command cmd{"MIGRATE",
                                     to.address.substr(0, colon),
                                     to.address.substr(colon + 1),
                                     "",
                                     "0",
                                     "5000",
                                     "KEYS"};
  cmd.insert(cmd.end(), keys.begin(), keys.end());
  node_client(from.address)->call(cmd);
}

/// A node's CLUSTER INFO field (cluster_current_epoch, cluster_my_epoch).
inline long long cluster_info_field(const std::string& address,
                                    const std::string& field) {
  auto text = node_client(address)->call({"CLUSTER", "INFO"}).str;
  auto at = text.find(field + ":");
  if (at == std::string::npos)
    throw std::runtime_error("CLUSTER INFO of " + address + " has no " + field);
  return std::stoll(text.substr(at + field.size() + 1));
}

/// The count of error replies with this prefix ("TRYAGAIN", "NOSCRIPT")
/// the node at `address` has sent (INFO errorstats).
inline long long error_count(const std::string& address, const std::string& prefix) {
  auto text = node_client(address)->call({"INFO", "errorstats"}).str;
  auto at = text.find("errorstat_" + prefix + ":count=");
  if (at == std::string::npos)
    return 0;
  return std::stoll(text.substr(at + prefix.size() + 17));
}

/// What every node of the cluster says about it, for a failure message:
/// for each node scripts/test started (REDIS_CLUSTER_DIR/cluster-<port>),
/// its CLUSTER NODES, the state lines of CLUSTER INFO, its role and
/// replication link, and the end of its log. A node that does not answer
/// says so. Written to stderr, which ctest shows for a failed test.
inline void dump_cluster(const std::string& why) {
  std::ostringstream out;
  out << "---- cluster state: " << why << "\n";
  auto dir = std::getenv("REDIS_CLUSTER_DIR");
  if (!dir || !*dir) {
    out << "(REDIS_CLUSTER_DIR is not set)\n";
    std::fputs(out.str().c_str(), stderr);
    return;
  }
  std::vector<std::string> ports;
  for (auto& e : std::filesystem::directory_iterator{dir}) {
    auto name = e.path().filename().string();
    if (e.is_directory() && name.starts_with("cluster-"))
      ports.push_back(name.substr(8));
  }
  std::sort(ports.begin(), ports.end());
  for (auto& port : ports) {
    auto address = "127.0.0.1:" + port;
    out << "== node " << address << "\n";
    try {
      auto c = node_client(address, "1s");
      out << c->call({"CLUSTER", "NODES"}).str;
      std::istringstream info{c->call({"CLUSTER", "INFO"}).str};
      std::string line;
      while (std::getline(info, line))
        if (line.starts_with("cluster_state") || line.starts_with("cluster_slots")
            || line.starts_with("cluster_known") || line.starts_with("cluster_current_epoch")
            || line.starts_with("cluster_my_epoch"))
          out << line << "\n";
      std::istringstream repl{c->call({"INFO", "replication"}).str};
      while (std::getline(repl, line))
        if (line.starts_with("role") || line.starts_with("master_link_status")
            || line.starts_with("master_host") || line.starts_with("master_port")
            || line.starts_with("connected_slaves"))
          out << line << "\n";
    } catch (const std::exception& e) {
      out << "(does not answer: " << e.what() << ")\n";
    }
    std::ifstream log{std::string{dir} + "/cluster-" + port + "/redis.log"};
    std::vector<std::string> lines;
    for (std::string line; std::getline(log, line);)
      lines.push_back(line);
    auto from = lines.size() > 40 ? lines.size() - 40 : 0;
    out << "-- last " << lines.size() - from << " log lines\n";
    for (auto i = from; i < lines.size(); ++i)
      out << lines[i] << "\n";
  }
  out << "---- end of cluster state\n";
  std::fputs(out.str().c_str(), stderr);
}

/// Throws, after dump_cluster(), when `limit` passed since `start`: every
/// wait on the cluster's gossip is bounded, so a cluster that never settles
/// fails the test with its state instead of hanging it.
inline void check_wait(std::chrono::steady_clock::time_point start,
                       std::chrono::milliseconds limit, const std::string& what) {
  if (std::chrono::steady_clock::now() - start > limit) {
    dump_cluster("timed out waiting for " + what);
    throw std::runtime_error("timed out after "
                             + std::to_string(limit.count() / 1000) + " s waiting for "
                             + what);
  }
}

/// Waits until every node agrees `slot` is served by `id` (gossip) and,
/// with `epoch`, knows a current epoch at least that one.
inline void await_slot_owner(int slot, const std::string& id,
                             std::chrono::milliseconds limit = std::chrono::seconds(60),
                             long long epoch = 0) {
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    check_wait(start, limit, "every node to see slot " + std::to_string(slot)
                               + " served by " + id + " at epoch "
                               + std::to_string(epoch) + " or later");
    bool all = true;
    for (auto& n : cluster_nodes())
      if (!n.failed) {
        bool ok = false;
        for (auto& m : cluster_nodes(n.address))
          if (m.id == id && m.serves(slot))
            ok = true;
        all = all && ok
              && (epoch == 0
                  || cluster_info_field(n.address, "cluster_current_epoch") >= epoch);
      }
    if (all)
      return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// Second half: the rest of the slot's keys moved, then every master told
/// the new owner; returns once every node knows it.
inline void end_slot_move(int slot, const cluster_node& from,
                          const cluster_node& to) {
  auto s = std::to_string(slot);
  auto src = node_client(from.address);
  for (;;) {
    auto keys = src->call({"CLUSTER", "GETKEYSINSLOT", s, "100"});
    if (keys.elements.empty())
      break;
    std::vector<std::string> names;
    for (auto& k : keys.elements)
      names.push_back(k.str);
    migrate_keys(from, to, names);
  }
  node_client(to.address)->call({"CLUSTER", "SETSLOT", s, "NODE", to.id});
  node_client(from.address)->call({"CLUSTER", "SETSLOT", s, "NODE", to.id});
  for (auto& n : cluster_nodes())
    if (n.master && !n.failed && n.id != from.id && n.id != to.id)
      node_client(n.address)->call_raw({"CLUSTER", "SETSLOT", s, "NODE", to.id});
  // Importing a slot bumps the importer's config epoch only when it does
  // not already hold the greatest one it knows. A slot moved back before
  // every node heard of this move's epoch could be claimed with an epoch no
  // greater: the nodes that heard of it would keep this owner for good,
  // and this owner, which gave the slot up, would see it unassigned
  // (cluster_state:fail, CLUSTERDOWN for its own slots too). So the move
  // ends once every node sees `to` serving it and knows its epoch.
  await_slot_owner(slot, to.id, std::chrono::seconds(60),
                   cluster_info_field(to.address, "cluster_my_epoch"));
}

/// A whole slot move.
inline void move_slot(int slot, const cluster_node& from, const cluster_node& to) {
  begin_slot_move(slot, from, to);
  end_slot_move(slot, from, to);
}

} // namespace test

namespace test {

/// Makes `replica` the master of its shard with CLUSTER FAILOVER (it waits
/// for the replica to catch up) and waits until every node agrees it
/// serves `slot`. A manual failover that timed out (Redis gives it 5 s) is
/// asked again.
inline void fail_over_to(const cluster_node& replica, int slot) {
  auto c = node_client(replica.address);
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    auto what = "a manual failover to " + replica.address;
    while (c->call({"INFO", "replication"}).str.find("master_link_status:up")
           == std::string::npos) {
      check_wait(start, std::chrono::seconds(60), what);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    check_wait(start, std::chrono::seconds(60), what);
    c->call({"CLUSTER", "FAILOVER"});
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(6);
    while (std::chrono::steady_clock::now() < until) {
      for (auto& n : cluster_nodes(replica.address))
        if (n.id == replica.id && n.master && n.serves(slot)) {
          await_slot_owner(slot, replica.id);
          return;
        }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

} // namespace test

namespace test {

/// A replica of `master` in sync with it, once the cluster lists one (after
/// a failover the old master shows up as a replica a moment later).
inline cluster_node synced_replica_of(const cluster_node& master) {
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    check_wait(start, std::chrono::seconds(60),
               "a replica of " + master.address + " in sync with it");
    for (auto& n : cluster_nodes())
      if (!n.master && n.master_id == master.id && !n.failed) {
        auto info = node_client(n.address)->call({"INFO", "replication"}).str;
        if (info.find("master_link_status:up") != std::string::npos)
          return n;
      }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

} // namespace test

#include <csignal>
#include <cstdio>
#include <sys/types.h>
#include <unistd.h>

namespace test {

/// SIGKILLs the node at `address` (its pid from INFO server), as a crash.
/// Returns the pid.
inline long kill_node(const std::string& address) {
  auto info = node_client(address)->call({"INFO", "server"}).str;
  auto at = info.find("process_id:");
  if (at == std::string::npos)
    throw std::runtime_error("INFO server of " + address + " has no process_id");
  auto pid = std::stol(info.substr(at + 11));
  if (::kill(static_cast<pid_t>(pid), SIGKILL) != 0)
    throw std::runtime_error("cannot kill the node at " + address);
  return pid;
}

/// Starts the node at `address` again with the command line scripts/test
/// used (REDIS_CLUSTER_DIR/cluster-<port>/start): it reads its nodes.conf
/// and rejoins the cluster. The server is not this process's child.
inline void restart_node(const std::string& address) {
  auto dir = std::getenv("REDIS_CLUSTER_DIR");
  if (!dir || !*dir)
    throw std::runtime_error(
      "REDIS_CLUSTER_DIR is not set: run the tests with scripts/test, whose "
      "scripts/lib/servers.sh keeps each cluster node's command line there");
  auto start = std::string{dir} + "/cluster-"
               + address.substr(address.rfind(':') + 1) + "/start";
  if (::access(start.c_str(), X_OK) != 0)
    throw std::runtime_error("no start script for " + address + ": " + start);
  // Detached: the shell exits at once, the server is adopted by init.
  auto cmd = "setsid '" + start + "' </dev/null >/dev/null 2>&1 &";
  if (std::system(cmd.c_str()) != 0)
    throw std::runtime_error("could not run " + start);
}

/// True when the node at `address` answers and says the cluster is whole:
/// cluster_state:ok, every slot served, `nodes` nodes known, none failing,
/// and, for a replica, its link to the master up.
inline bool node_sees_whole_cluster(const std::string& address, int nodes = 6) {
  try {
    auto c = node_client(address, "1s");
    auto info = c->call({"CLUSTER", "INFO"}).str;
    if (info.find("cluster_state:ok") == std::string::npos
        || info.find("cluster_slots_ok:16384") == std::string::npos
        || info.find("cluster_slots_pfail:0") == std::string::npos
        || info.find("cluster_slots_fail:0") == std::string::npos
        || info.find("cluster_known_nodes:" + std::to_string(nodes))
             == std::string::npos)
      return false;
    // No node flagged fail or fail? (a replica is in no slot count).
    if (c->call({"CLUSTER", "NODES"}).str.find("fail") != std::string::npos)
      return false;
    auto repl = c->call({"INFO", "replication"}).str;
    return repl.find("role:master") != std::string::npos
           || repl.find("master_link_status:up") != std::string::npos;
  } catch (const std::exception&) {
    return false;
  }
}

/// Which master serves which slots, as the node at `address` sees it: one
/// line per master with slots, sorted, so that two nodes' views compare.
inline std::string slot_owners(const std::string& address) {
  std::vector<std::string> lines;
  for (auto& n : cluster_nodes(address))
    if (n.master && !n.slots.empty()) {
      auto line = n.id;
      for (auto [a, b] : n.slots)
        line += " " + std::to_string(a) + "-" + std::to_string(b);
      lines.push_back(std::move(line));
    }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (auto& l : lines)
    out += l + "\n";
  return out;
}

/// True when the cluster has its six nodes, every one sees the whole
/// cluster (node_sees_whole_cluster), and all agree on which master serves
/// which slots; false while a node does not answer.
inline bool cluster_is_whole() {
  try {
    auto nodes = cluster_nodes();
    if (nodes.size() != 6)
      return false;
    std::string owners;
    for (auto& n : nodes) {
      if (!node_sees_whole_cluster(n.address))
        return false;
      auto seen = slot_owners(n.address);
      if (owners.empty())
        owners = std::move(seen);
      else if (seen != owners)
        return false;
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

/// Waits (up to `bound`) until cluster_is_whole(): after a failover the old
/// master rejoins as a replica, and until the gossip settled a node may
/// still answer CLUSTERDOWN. A test that moved roles calls this before it
/// ends, so the next cluster test starts on a whole cluster.
/// Polls every 50 ms: each look opens a client per node.
inline bool await_whole_cluster(
  std::chrono::milliseconds bound = std::chrono::seconds(30)) {
  auto until = std::chrono::steady_clock::now() + bound;
  while (!cluster_is_whole()) {
    if (std::chrono::steady_clock::now() > until) {
      dump_cluster("the cluster is not whole after "
                   + std::to_string(bound.count() / 1000) + " s");
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

} // namespace test

namespace test {

/// Makes the cluster anew on the same ports (scripts/lib/cluster-reset,
/// which scripts/test names in REDIS_CLUSTER_RESET). Every key is lost.
inline void reset_cluster() {
  auto cmd = std::getenv("REDIS_CLUSTER_RESET");
  if (!cmd || !*cmd)
    throw std::runtime_error(
      "REDIS_CLUSTER_RESET is not set: run the tests with scripts/test");
  if (std::system((std::string{"'"} + cmd + "'").c_str()) != 0)
    throw std::runtime_error(std::string{"the cluster could not be made anew: "}
                             + cmd + " failed");
}

/// Returns once the cluster is whole. A cluster that is not whole within
/// 30 s is written to stderr (dump_cluster) and made anew (reset_cluster):
/// the test that broke it already failed on its own check, and the next one
/// must not fail for it. Throws when the cluster cannot be made whole.
inline void ensure_whole_cluster() {
  if (await_whole_cluster(std::chrono::seconds(30)))
    return;
  std::fputs("the cluster is not whole: making it anew\n", stderr);
  reset_cluster();
  if (!await_whole_cluster(std::chrono::seconds(30)))
    throw std::runtime_error("the cluster is not whole after it was made anew");
}

} // namespace test
