// The Redis Cluster client while the topology changes: slots moved between
// masters (MOVED, ASK, TRYAGAIN) and a manual failover. Each test leaves
// the cluster healthy (every slot served) for the next.

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/redis_client.hpp>

#include "redis_cluster.hpp"
#include "redis_server.hpp"

using botmesh::redis_client;
using botmesh::redis_reply;

namespace {

// A tag whose slot is served by `master_id`'s node... or any tag: the
// tests look up the owner of the tag they get.
std::string fresh_tag() {
  return test::unique_prefix("tag");
}

// Increments `key` in a loop on a thread of its own until finished,
// counting replies, lost replies (timeout) and other failures, and what
// succeeded after `mark()`.
class incr_writer {
 public:
  incr_writer(redis_client& c, std::string key)
    : c_(c), key_(std::move(key)), thread_([this] { run(); }) {
    // nop
  }

  ~incr_writer() {
    finish();
  }

  void finish() {
    stop_ = true;
    if (thread_.joinable())
      thread_.join();
  }

  void mark() {
    marked_ = true;
  }

  /// Waits until `n` increments succeeded after the mark, or in all when
  /// there is no mark; false, after the cluster's state was written to
  /// stderr, when they did not within 60 s (a cluster that never served
  /// the key again fails the test instead of hanging it).
  bool await_ok(long long n) const {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while ((marked_ ? ok_after_mark : ok).load() < n) {
      if (std::chrono::steady_clock::now() > until) {
        test::dump_cluster(std::to_string(n) + " increments of " + key_
                           + " did not succeed within 60 s");
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  std::atomic<long long> ok{0}, ok_after_mark{0}, lost{0}, failed{0};
  /// Read after finish().
  std::vector<std::string> errors;

 private:
  void run() {
    while (!stop_) {
      try {
        c_.call({"INCR", key_});
        ++ok;
        if (marked_)
          ++ok_after_mark;
      } catch (const botmesh::error& e) {
        (e.code() == botmesh::errc::timeout ? lost : failed)++;
        errors.emplace_back(e.what());
      }
    }
  }

  redis_client& c_;
  std::string key_;
  std::atomic<bool> stop_{false}, marked_{false};
  std::thread thread_;
};

} // namespace

TEST_CASE("cluster topology: after a slot moved the client follows MOVED, updates "
          "its map and resends") {
  redis_client c{test::cluster_options()};
  auto tag = fresh_tag();
  auto key = "{" + tag + "}:k";
  int slot = redis_client::key_slot(key);
  c.call({"SET", key, "before"});
  auto from = test::master_of(slot);
  auto to = test::other_master(from.id);
  auto moved_before = test::error_count(from.address, "MOVED");
  test::move_slot(slot, from, to);
  // The client still maps the slot to `from`, which answers MOVED.
  CHECK(c.call({"GET", key}).str == "before");
  CHECK(test::error_count(from.address, "MOVED") == moved_before + 1);
  // The map was updated: the next command goes straight to `to`.
  c.call({"SET", key, "after"});
  CHECK(test::error_count(from.address, "MOVED") == moved_before + 1);
  CHECK(test::node_client(to.address)->call({"GET", key}).str == "after");
  c.call({"DEL", key});
  test::move_slot(slot, to, from); // back, so slots stay spread
}

TEST_CASE("cluster topology: with unknown-endpoint the nodes name no host: "
          "the client is made, and follows MOVED and ASK to the host it asked") {
  // Every node writes its host as nil in CLUSTER SLOTS and as "" in MOVED
  // and ASK: "the host you asked". Set back on the way out.
  struct endpoint_type {
    explicit endpoint_type(const char* type) {
      for (auto& n : test::cluster_nodes())
        test::node_client(n.address)
          ->call({"CONFIG", "SET", "cluster-preferred-endpoint-type", type});
    }
    ~endpoint_type() {
      for (auto& n : test::cluster_nodes())
        test::node_client(n.address)
          ->call({"CONFIG", "SET", "cluster-preferred-endpoint-type", "ip"});
    }
  } unknown{"unknown-endpoint"};
  auto seed = test::node_client(test::seed_address())->call({"CLUSTER", "SLOTS"});
  REQUIRE(seed.elements.size() > 0);
  REQUIRE(seed.elements[0].elements[2].elements[0].type == redis_reply::kind::nil);
  redis_client c{test::cluster_options()};
  auto tag = fresh_tag();
  auto a = "{" + tag + "}:a", n = "{" + tag + "}:new";
  int slot = redis_client::key_slot(a);
  c.call({"SET", a, "A"});
  auto from = test::master_of(slot);
  auto to = test::other_master(from.id);
  test::begin_slot_move(slot, from, to);
  test::migrate_keys(from, to, {a});
  auto asks = test::error_count(from.address, "ASK");
  CHECK(c.call({"GET", a}).str == "A");       // ASK :port -> `to`
  CHECK(c.call({"SET", n, "N"}).str == "OK"); // a new key, by ASK too
  CHECK(test::error_count(from.address, "ASK") == asks + 2);
  test::end_slot_move(slot, from, to);
  auto moved = test::error_count(from.address, "MOVED");
  CHECK(c.call({"GET", n}).str == "N");       // MOVED :port -> `to`
  CHECK(test::error_count(from.address, "MOVED") == moved + 1);
  c.call({"DEL", a, n});
  test::move_slot(slot, to, from);
}

TEST_CASE("cluster topology: during a slot migration a moved key is reached with "
          "ASK and a split multi-key script is retried on TRYAGAIN until "
          "the move ends") {
  redis_client c{test::cluster_options()};
  auto tag = fresh_tag();
  auto a = "{" + tag + "}:a", b = "{" + tag + "}:b", n = "{" + tag + "}:new";
  int slot = redis_client::key_slot(a);
  c.call({"SET", a, "A"});
  c.call({"SET", b, "B"});
  auto from = test::master_of(slot);
  auto to = test::other_master(from.id);
  test::begin_slot_move(slot, from, to);
  test::migrate_keys(from, to, {a}); // the slot is split: a moved, b not
  auto asks = test::error_count(from.address, "ASK");
  CHECK(c.call({"GET", a}).str == "A");         // ASK -> ASKING + GET on `to`
  CHECK(c.call({"GET", b}).str == "B");         // still on `from`
  CHECK(c.call({"SET", n, "N"}).str == "OK");   // a new key goes to `to`
  CHECK(test::error_count(from.address, "ASK") == asks + 2);

  botmesh::redis_script both{"both", "#!lua\nreturn {redis.call('GET', KEYS[1]), "
                                     "redis.call('GET', KEYS[2])}"};
  // With one attempt, TRYAGAIN comes back as the reply.
  {
    auto opts = test::cluster_options();
    opts.retry_attempts = 1;
    redis_client once{opts};
    auto r = once.call_raw({"EVAL", both.body(), "2", a, b});
    REQUIRE(r.type == redis_reply::kind::error);
    CHECK(r.str.starts_with("TRYAGAIN"));
    CHECK(r.str.find("given up after 1 attempts") != std::string::npos);
  }
  // With retries, the script waits for the move to end: it is sent, meets
  // TRYAGAIN, and succeeds once the slot is whole again on `to`.
  auto tryagain = test::error_count(from.address, "TRYAGAIN");
  auto opts = test::cluster_options();
  opts.retry_attempts = 1000; // the move below ends it, not the budget
  opts.retry_base = "1ms";
  redis_client patient{opts};
  std::promise<redis_reply> p;
  patient.eval_async(a, both, {a, b}, {}, [&](redis_reply r, std::exception_ptr e) {
    if (e)
      p.set_exception(e);
    else
      p.set_value(std::move(r));
  });
  while (test::error_count(from.address, "TRYAGAIN") == tryagain)
    std::this_thread::sleep_for(std::chrono::milliseconds(2)); // polls a counter
  test::end_slot_move(slot, from, to);
  auto r = p.get_future().get();
  REQUIRE(r.type == redis_reply::kind::array);
  REQUIRE(r.elements.size() == 2);
  CHECK(r.elements[0].str == "A");
  CHECK(r.elements[1].str == "B");
  CHECK(c.call({"GET", n}).str == "N");
  c.call({"DEL", a, b, n});
  test::move_slot(slot, to, from);
}

TEST_CASE("cluster topology: a manual failover is followed and every command "
          "succeeds or fails with a clear error, none is lost") {
  redis_client c{test::cluster_options()};
  auto key = "{" + fresh_tag() + "}:counter";
  int slot = redis_client::key_slot(key);
  c.call({"SET", key, "0"});
  auto old_master = test::master_of(slot);
  auto replica = test::synced_replica_of(old_master);

  // A writer keeps incrementing while the replica takes over.
  incr_writer w{c, key};
  REQUIRE(w.await_ok(50));
  redis_client stale{test::cluster_options()}; // its map: the old master
  test::fail_over_to(replica, slot);
  w.mark();
  REQUIRE(w.await_ok(50));
  w.finish();
  for (auto& e : w.errors) {
    CAPTURE(e);
    CHECK(e.find("INCR") != std::string::npos); // names the command
  }
  // A manual failover waits for the replica to catch up: every
  // acknowledged increment is there; a lost reply may or may not have run.
  auto value = std::stoll(test::node_client(replica.address)->call({"GET", key}).str);
  CHECK(value >= w.ok.load());
  CHECK(value <= w.ok.load() + w.lost.load());
  CHECK(w.failed.load() == 0);
  // The old master is a replica now: a client that still maps the slot to
  // it is redirected.
  auto moved = test::error_count(old_master.address, "MOVED");
  CHECK(stale.call({"GET", key}).str == std::to_string(value));
  CHECK(test::error_count(old_master.address, "MOVED") == moved + 1);
  c.call({"DEL", key});
  // The roles stay swapped: the cluster is healthy either way, once every
  // node's gossip caught up.
  REQUIRE(test::await_whole_cluster());
}

TEST_CASE("cluster topology: when a master hangs its replica takes over and "
          "commands go to it, the ones in between failing with clear errors") {
  auto opts = test::cluster_options();
  opts.node.command_timeout = "500ms";
  redis_client c{opts};
  auto key = "{" + fresh_tag() + "}:hang";
  int slot = redis_client::key_slot(key);
  c.call({"SET", key, "0"});
  auto master = test::master_of(slot);
  // Only a replica in sync takes over.
  auto replica = test::synced_replica_of(master);
  // The master stops answering for 15 s, far past the 2 s node timeout:
  // the cluster fails it over (detection, agreement and the replica's
  // election take several seconds, more on a loaded machine); it comes
  // back as a replica.
  auto sleeper = test::node_client(master.address, "30s");
  std::promise<void> woke_p;
  auto woke = woke_p.get_future();
  sleeper->async({"DEBUG", "SLEEP", "15"},
                 [&](redis_reply, std::exception_ptr) { woke_p.set_value(); });
  incr_writer w{c, key};
  // The replica serves the slot once a majority of masters agreed.
  bool mine = false;
  while (!mine && woke.wait_for(std::chrono::milliseconds(50))
                    != std::future_status::ready)
    for (auto& n : test::cluster_nodes(replica.address))
      if (n.id == replica.id && n.master && n.serves(slot))
        mine = true;
  if (!mine) {
    w.finish();
    test::dump_cluster("the replica did not take over");
    FAIL("the replica did not take over while its master hung for 15 s");
  }
  w.mark();
  bool served = w.await_ok(50);
  w.finish();
  woke.wait();
  REQUIRE(served);
  CHECK(w.lost.load() > 0); // the hung master's commands timed out
  for (auto& e : w.errors) {
    CAPTURE(e);
    CHECK(e.find("INCR") != std::string::npos);
  }
  // What the new master acknowledged is there (earlier writes may be lost
  // with asynchronous replication: the documented failover caveat).
  auto value = std::stoll(test::node_client(replica.address)->call({"GET", key}).str);
  CHECK(value >= w.ok_after_mark.load());
  // The old master rejoins as a replica of the new one.
  test::await_slot_owner(slot, replica.id);
  c.call({"DEL", key});
  // Later cluster tests need every node to see the whole cluster again.
  REQUIRE(test::await_whole_cluster());
}

TEST_CASE("cluster topology: a subscription whose node was killed moves to "
          "another node and hears what is published after") {
  // A channel whose slot's master is not the seed (the helpers ask it).
  std::string channel;
  test::cluster_node master;
  do {
    channel = test::unique_prefix("sub");
    master = test::master_of(redis_client::key_slot(channel));
  } while (master.address == test::seed_address());
  // Before the client: its subscription's thread writes them until the
  // client is gone.
  std::mutex mtx;
  std::vector<std::string> heard;
  std::atomic<int> subscribed{0};
  redis_client c{test::cluster_options()};
  c.subscribe(
    channel,
    [&](std::string_view p) {
      std::lock_guard guard{mtx};
      heard.emplace_back(p);
    },
    [&] { ++subscribed; });
  auto subscribers_at = [&](const std::string& address) {
    auto r = test::node_client(address)->call({"PUBSUB", "NUMSUB", channel});
    return r.elements.at(1).integer;
  };
  REQUIRE(test::eventually([&] { return subscribed.load() == 1; }, std::chrono::seconds(10)));
  REQUIRE(subscribers_at(master.address) == 1); // on its slot's master
  test::kill_node(master.address);
  // No REQUIRE until the node is back: the next tests need it.
  // Before, the subscription retried the dead node until it came back: every
  // push was missed meanwhile (for good if it never did).
  CHECK(test::eventually([&] { return subscribed.load() >= 2; }, std::chrono::seconds(20)));
  // Published on the seed, a live node other than the killed one: the
  // cluster bus brings it to whichever node the subscription is on now.
  auto pub = test::node_client(test::seed_address());
  CHECK(test::eventually(
    [&] {
      try {
        pub->call({"PUBLISH", channel, "after"});
      } catch (const botmesh::error&) {
        return false; // a node in the middle of the failover: again
      }
      std::lock_guard guard{mtx};
      return std::find(heard.begin(), heard.end(), "after") != heard.end();
    },
    std::chrono::seconds(10)));
  test::restart_node(master.address);
  REQUIRE(test::await_whole_cluster(std::chrono::seconds(60)));
}
