// The Redis Cluster client on the 6-node cluster scripts/test starts.
// Tests that change the topology (slot moves, failover) run serially (see
// tests/CMakeLists.txt) and leave the cluster healthy.

#include <doctest/doctest.h>

#include <atomic>
#include <future>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/redis_client.hpp>

#include "redis_cluster.hpp"
#include "redis_pause.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;
using botmesh::redis_client;
using botmesh::redis_reply;

namespace {

std::shared_ptr<redis_client> cluster_client() {
  static auto c = std::make_shared<redis_client>(test::cluster_options());
  return c;
}

// Keys of every shape the hash-tag rule cares about.
std::vector<std::string> tricky_keys() {
  std::vector<std::string> keys{"",        "a",         "{",      "}",
                                "{}",      "{}a",       "a{}",    "{a}",
                                "x{a}y",   "{a}{b}",    "{{a}}",  "}{a}",
                                "a{b",     "a}b{c}",    "{ }",    "user:{42}:x",
                                "m:{m:c%3A1}:z", "p:co:{t:tg:9}:seq"};
  std::mt19937 rng{42};
  std::uniform_int_distribution<int> len{1, 24};
  std::uniform_int_distribution<int> ch{0, 255};
  for (int i = 0; i < 400; ++i) {
    std::string k;
    for (int j = len(rng); j > 0; --j)
      k.push_back(static_cast<char>(ch(rng)));
    if (i % 3 == 0)
      k = "t:{" + k.substr(0, k.size() / 2) + "}:" + k;
    keys.push_back(std::move(k));
  }
  return keys;
}

template <class F>
std::exception_ptr failure_of(F&& f) {
  try {
    f();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

std::string what_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

} // namespace

TEST_CASE("cluster: key_slot agrees with the server's CLUSTER KEYSLOT for every kind "
          "of key") {
  auto seed = test::node_client(test::seed_address());
  for (auto& k : tricky_keys()) {
    CAPTURE(k);
    auto r = seed->call({"CLUSTER", "KEYSLOT", k});
    CHECK(redis_client::key_slot(k) == r.integer);
  }
}

TEST_CASE("cluster: each command goes straight to the master of its key's slot") {
  // No redirection allowed and a single attempt: a command sent to the
  // wrong node would fail instead of being followed.
  auto opts = test::cluster_options();
  opts.max_redirections = 0;
  opts.retry_attempts = 1;
  redis_client c{opts};
  auto prefix = test::unique_prefix("route");
  std::map<std::string, std::unique_ptr<redis_client>> nodes;
  std::set<std::string> masters_used;
  for (int i = 0; i < 60; ++i) {
    auto key = prefix + ":" + std::to_string(i);
    CAPTURE(key);
    auto r = c.call_raw({"SET", key, std::to_string(i)});
    REQUIRE(r.type == redis_reply::kind::status);
    // The value is on the master CLUSTER NODES names for the slot.
    auto m = test::master_of(redis_client::key_slot(key));
    masters_used.insert(m.id);
    auto& n = nodes[m.address];
    if (!n)
      n = test::node_client(m.address);
    CHECK(n->call({"GET", key}).str == std::to_string(i));
    c.call({"DEL", key});
  }
  CHECK(masters_used.size() == 3);
}

TEST_CASE("cluster: a script whose keys hash to different slots is refused before it "
          "is sent, naming the keys") {
  auto c = cluster_client();
  botmesh::redis_script s{"pair", "#!lua\nreturn #KEYS"};
  std::string a = "bm-a", b = "bm-b";
  REQUIRE(redis_client::key_slot(a) != redis_client::key_slot(b));
  auto e = failure_of([&] { c->eval(s, {a, b}, {}); });
  REQUIRE(e);
  try {
    std::rethrow_exception(e);
  } catch (const botmesh::invalid_argument_error& x) {
    CHECK(x.field() == "keys");
    std::string what = x.what();
    CHECK(what.find("\"bm-a\"") != std::string::npos);
    CHECK(what.find("\"bm-b\"") != std::string::npos);
    CHECK(what.find("pair") != std::string::npos);
  }
  // The asynchronous face reports it through the callback.
  std::promise<std::exception_ptr> p;
  c->eval_async("x", s, {a, b}, {},
                [&](redis_reply, std::exception_ptr x) { p.set_value(x); });
  auto async_error = p.get_future().get();
  REQUIRE(async_error);
  CHECK(what_of(async_error).find("\"bm-b\"") != std::string::npos);
  // One hash tag: one slot, and the script runs.
  CHECK(c->eval(s, {"{bm}a", "{bm}b"}, {}).integer == 2);
}

TEST_CASE("cluster: commands without a key and pipelines over many slots get their "
          "replies in order") {
  auto c = cluster_client();
  CHECK(c->call({"PING"}).str == "PONG");
  auto prefix = test::unique_prefix("pipe");
  std::vector<redis_client::command> cmds;
  for (int i = 0; i < 50; ++i)
    cmds.push_back({"SET", prefix + ":" + std::to_string(i), std::to_string(i)});
  for (int i = 0; i < 50; ++i)
    cmds.push_back({"GET", prefix + ":" + std::to_string(i)});
  auto replies = c->pipeline(cmds);
  REQUIRE(replies.size() == 100);
  for (int i = 0; i < 50; ++i)
    CHECK(replies[50 + i].str == std::to_string(i));
  // async_batch: one callback with every reply in order.
  std::promise<std::vector<redis_reply>> p;
  std::vector<redis_client::command> gets(cmds.begin() + 50, cmds.end());
  c->async_batch(gets, [&](std::vector<redis_reply> rs, std::exception_ptr e) {
    if (e)
      p.set_exception(e);
    else
      p.set_value(std::move(rs));
  });
  auto rs = p.get_future().get();
  REQUIRE(rs.size() == 50);
  for (int i = 0; i < 50; ++i)
    CHECK(rs[i].str == std::to_string(i));
  for (int i = 0; i < 50; ++i)
    c->call({"DEL", prefix + ":" + std::to_string(i)});
}

TEST_CASE("cluster: a script meeting NOSCRIPT is sent again with its body") {
  auto c = cluster_client();
  botmesh::redis_script s{"noscript_probe",
                          "#!lua\nreturn redis.call('INCR', KEYS[1])"};
  auto key = test::unique_prefix("ns");
  auto m = test::master_of(redis_client::key_slot(key));
  test::node_client(m.address)->call({"SCRIPT", "FLUSH"});
  auto before = test::error_count(m.address, "NOSCRIPT");
  CHECK(c->eval(s, {key}, {}).integer == 1);
  CHECK(test::error_count(m.address, "NOSCRIPT") == before + 1);
  // Asynchronously too, after another flush.
  test::node_client(m.address)->call({"SCRIPT", "FLUSH"});
  std::promise<redis_reply> p;
  c->eval_async(key, s, {key}, {}, [&](redis_reply r, std::exception_ptr) {
    p.set_value(std::move(r));
  });
  CHECK(p.get_future().get().integer == 2);
  c->call({"DEL", key});
}

TEST_CASE("cluster: unsubscribe ends a subscription on the node it lives on") {
  auto channel = test::unique_prefix("unsub");
  auto master = test::master_of(redis_client::key_slot(channel));
  std::atomic<int> subscribed{0};
  auto c = cluster_client();
  auto id = c->subscribe(channel, [](std::string_view) {}, [&] { ++subscribed; });
  auto numsub = [&] {
    return test::node_client(master.address)
      ->call({"PUBSUB", "NUMSUB", channel})
      .elements.at(1)
      .integer;
  };
  REQUIRE(test::eventually([&] { return subscribed.load() == 1; },
                           std::chrono::seconds(10)));
  REQUIRE(numsub() == 1); // on its slot's master
  c->unsubscribe(id);
  CHECK(test::eventually([&] { return numsub() == 0; }, std::chrono::seconds(5)));
  // The client goes on serving.
  CHECK(c->call({"PING"}).str == "PONG");
}

TEST_CASE("cluster: the first discovery skips root nodes it cannot reach and names "
          "each one when none answers") {
  auto dead = "127.0.0.1:" + std::to_string(test::free_port());
  auto opts = test::cluster_options();
  opts.root_nodes.insert(opts.root_nodes.begin(), dead);
  redis_client c{opts};
  CHECK(c.call({"PING"}).str == "PONG");

  auto dead2 = "127.0.0.1:" + std::to_string(test::free_port());
  botmesh::redis_cluster_options none{.root_nodes = {dead, "redis://" + dead2},
                                      .retry_attempts = 2,
                                      .retry_base = "10ms"};
  auto e = failure_of([&] { redis_client x{none}; });
  REQUIRE(e);
  auto what = what_of(e);
  CHECK(what.find(dead) != std::string::npos);
  CHECK(what.find(dead2) != std::string::npos);
  CHECK(what.find("2 attempts") != std::string::npos);

  auto bad = failure_of(
    [&] { redis_client x{botmesh::redis_cluster_options{.root_nodes = {}}}; });
  REQUIRE(bad);
  CHECK(what_of(bad).find("root node") != std::string::npos);
}

TEST_CASE("cluster: announced addresses go through node_address_map") {
  std::atomic<int> mapped{0};
  auto opts = test::cluster_options();
  opts.node_address_map = [&](std::string_view a) {
    ++mapped;
    return std::string{a};
  };
  redis_client c{opts};
  auto key = test::unique_prefix("map");
  c.call({"SET", key, "v"});
  CHECK(c.call({"GET", key}).str == "v");
  CHECK(mapped.load() >= 3); // at least the three masters
  c.call({"DEL", key});
}

TEST_CASE("cluster: a redirection to an address node_address_map refuses "
          "fails the command naming it, the process lives on") {
  std::atomic<bool> refuse{false};
  std::string refused; // written before `refuse` is set
  auto opts = test::cluster_options();
  opts.retry_attempts = 1;
  opts.node_address_map = [&](std::string_view a) {
    if (refuse.load() && a == refused)
      throw std::out_of_range("no such node in the table");
    return std::string{a};
  };
  redis_client c{opts};
  auto key = test::unique_prefix("refusedmap") + ":{r}";
  auto slot = redis_client::key_slot(key);
  auto from = test::master_of(slot);
  auto to = test::other_master(from.id);
  refused = to.address;
  refuse = true;
  test::begin_slot_move(slot, from, to); // a new key: ASK to `to`
  // The map threw on the reply's thread: before, the process ended.
  auto e = failure_of([&] { c.call_raw({"SET", key, "1"}); });
  auto s = std::to_string(slot);
  test::node_client(to.address)->call({"CLUSTER", "SETSLOT", s, "STABLE"});
  test::node_client(from.address)->call({"CLUSTER", "SETSLOT", s, "STABLE"});
  REQUIRE(e);
  auto what = what_of(e);
  CHECK(what.find("node_address_map refused") != std::string::npos);
  CHECK(what.find(to.address) != std::string::npos);
  CHECK(what.find("no such node in the table") != std::string::npos);
  refuse = false;
  CHECK(c.call({"SET", key, "2"}).str == "OK");
  c.call({"DEL", key});
}

TEST_CASE("cluster: a reply lost to the timeout is not resent and fails with timeout") {
  auto opts = test::cluster_options();
  opts.node.command_timeout = "300ms";
  redis_client c{opts};
  auto key = test::unique_prefix("lost");
  auto m = test::master_of(redis_client::key_slot(key));
  // The node holds every client's commands for 1 s.
  auto admin = test::node_client(m.address);
  admin->call({"CLIENT", "PAUSE", "1000"});
  auto e = failure_of([&] { c.call({"INCR", key}); });
  REQUIRE(e);
  try {
    std::rethrow_exception(e);
  } catch (const botmesh::error& x) {
    CHECK(x.code() == botmesh::errc::timeout);
  }
  // This PING is answered once the pause is over, after every command
  // queued during it. The timed-out connection was closed, so the server
  // dropped its INCR; a resend, on a live connection, would have run.
  admin->call({"PING"});
  CHECK(admin->call({"GET", key}).is_nil());
  c.call({"DEL", key});
}

TEST_CASE("cluster: commands of one affinity redirected with ASK keep their "
          "order on the importing node") {
  auto c = cluster_client();
  auto key = test::unique_prefix("askorder") + ":{l}";
  auto slot = redis_client::key_slot(key);
  auto from = test::master_of(slot);
  auto to = test::other_master(from.id);
  // The key is new, so the migrating node answers ASK for every push and
  // each is sent again, with ASKING, to the importing node.
  test::begin_slot_move(slot, from, to);
  constexpr int n = 2000;
  std::atomic<int> left{n};
  std::atomic<int> failed{0};
  std::promise<void> all_p;
  auto all = all_p.get_future();
  for (int i = 1; i <= n; ++i)
    c->async(key, {"RPUSH", key, std::to_string(i)},
             [&](redis_reply r, std::exception_ptr e) {
               if (e || r.type != redis_reply::kind::integer)
                 ++failed;
               if (--left == 0)
                 all_p.set_value();
             });
  bool done = all.wait_for(30s) == std::future_status::ready;
  auto target = test::node_client(to.address);
  auto listed = target->pipeline({{"ASKING"}, {"LRANGE", key, "0", "-1"}});
  target->pipeline({{"ASKING"}, {"DEL", key}});
  // Back as it was: the slot never moved.
  auto s = std::to_string(slot);
  target->call({"CLUSTER", "SETSLOT", s, "STABLE"});
  test::node_client(from.address)->call({"CLUSTER", "SETSLOT", s, "STABLE"});
  REQUIRE(done);
  CHECK(failed.load() == 0);
  REQUIRE(listed.at(1).elements.size() == static_cast<std::size_t>(n));
  int out_of_order = 0;
  for (int i = 0; i < n; ++i)
    if (listed[1].elements[i].str != std::to_string(i + 1))
      ++out_of_order;
  CHECK(out_of_order == 0);
}

TEST_CASE("cluster: a client made while its first root node hangs takes the "
          "slot map from another node without waiting for it") {
  auto seed = test::seed_address();
  auto asleep = test::master_of(0);
  std::string other;
  for (auto& n : test::cluster_nodes())
    if (n.id != asleep.id && !n.failed)
      other = n.address;
  REQUIRE(!other.empty());
  // 1.5 s stays under the cluster's node timeout (2 s): no failover.
  auto sleeper = test::node_client(asleep.address, "10s");
  auto woke_p = std::make_shared<std::promise<void>>();
  auto woke = woke_p->get_future();
  sleeper->async({"DEBUG", "SLEEP", "1.5"},
                 [woke_p](redis_reply, std::exception_ptr) {
                   woke_p->set_value();
                 });
  REQUIRE(test::await_unresponsive("redis://" + asleep.address));
  auto opts = test::cluster_options();
  opts.root_nodes = {asleep.address, other};
  std::unique_ptr<redis_client> c;
  try {
    c = std::make_unique<redis_client>(opts);
  } catch (const std::exception& e) {
    FAIL("no slot map: " << std::string{e.what()});
  }
  // Made before the sleeping node could answer: asked one after the other,
  // the roots would have held the client until it woke.
  CHECK(woke.wait_for(0s) == std::future_status::timeout);
  REQUIRE(woke.wait_for(10s) == std::future_status::ready);
  auto key = test::unique_prefix("hang") + ":k";
  c->call({"SET", key, "1"});
  CHECK(c->call({"GET", key}).str == "1");
  c->call({"DEL", key});
}

TEST_CASE("cluster: a MOVED for a command whose key is not its first "
          "argument is followed to the slot the server named") {
  // OBJECT ENCODING <key>: the slot is guessed from "ENCODING"; the key is
  // picked on another master, so only the MOVED's slot leads to it.
  auto c = cluster_client();
  auto guessed = test::master_of(redis_client::key_slot("ENCODING"));
  std::string key;
  for (int i = 0; key.empty(); ++i) {
    auto k = test::unique_prefix("moved") + ":" + std::to_string(i);
    if (test::master_of(redis_client::key_slot(k)).id != guessed.id)
      key = k;
  }
  CAPTURE(key);
  c->call({"SET", key, "12345"});
  auto r = c->call_raw({"OBJECT", "ENCODING", key});
  CAPTURE(r.str);
  CHECK(r.type == redis_reply::kind::string);
  CHECK(r.str == "int");
  c->call({"DEL", key});
}

TEST_CASE("cluster: a redirection not followed fails with its text and why it "
          "was not followed") {
  auto opts = test::cluster_options();
  opts.max_redirections = 0;
  opts.retry_attempts = 1;
  redis_client c{opts};
  auto key = test::unique_prefix("giveup") + ":{g}";
  auto slot = redis_client::key_slot(key);
  auto from = test::master_of(slot);
  auto to = test::other_master(from.id);
  test::begin_slot_move(slot, from, to); // a new key: ASK to `to`
  auto r = c.call_raw({"SET", key, "1"});
  auto s = std::to_string(slot);
  test::node_client(to.address)->call({"CLUSTER", "SETSLOT", s, "STABLE"});
  test::node_client(from.address)->call({"CLUSTER", "SETSLOT", s, "STABLE"});
  REQUIRE(r.type == redis_reply::kind::error);
  CAPTURE(r.str);
  CHECK(r.str.starts_with("ASK "));
  CHECK(r.str.find("more than 0 redirections") != std::string::npos);
  CHECK(r.str.find("given up after 1 attempts") != std::string::npos);
}
