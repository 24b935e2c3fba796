#include <doctest/doctest.h>

#include <functional>
#include <thread>

#include <conformance/coordinator_conformance.hpp>

#include <botmesh/stores/redis/redis_coordinator.hpp>

#include "redis_coordinator_factory.hpp"
#include "redis_server.hpp"

namespace {

struct single_node {
  static void into(botmesh::redis_coordinator_options& o) {
    o.url = test::redis_url();
  }
};

using redis_coordinator_factory =
  test::basic_redis_coordinator_factory<single_node>;

} // namespace

TYPE_TO_STRING(redis_coordinator_factory);
BOTMESH_COORDINATOR_CONFORMANCE(redis_coordinator_factory);

TEST_CASE("a chat's turn state is two keys under its hash tag that expire "
          "when the chat is idle") {
  redis_coordinator_factory f;
  auto a = f.make("a");
  botmesh::blocking_coordinator sync{*a};
  auto g = sync.enter("tienda:ana", 1);
  REQUIRE(g.granted());
  REQUIRE(sync.enter("tienda:ana", 2).state == botmesh::turn_state::status::waiting);
  botmesh::redis_client raw{{.url = test::redis_url()}};
  auto h = f.prefix + ":co:{t:tienda%3Aana}:h";
  auto q = f.prefix + ":co:{t:tienda%3Aana}:q";
  CHECK(raw.call({"EXISTS", h, q}).integer == 2);
  // Far above the lease (10 min minimum), never forever.
  for (auto& k : {h, q}) {
    auto ttl = raw.call({"PTTL", k}).integer;
    CHECK(ttl > 500'000);
    CHECK(ttl <= 600'000);
  }
  // The fence is floored by the server clock: a chat forgotten after its
  // keys expired starts above every fence it had.
  auto time = raw.call({"TIME"});
  auto now_ms = std::stoll(time.elements[0].str) * 1000;
  CHECK(g.fence >= static_cast<std::uint64_t>(now_ms - 5000) * 1024);
  // Keys expire only after ten idle minutes, so a forgotten chat's next
  // grant is always in a later server millisecond than its last one: the
  // test waits for that before it deletes them "as if they expired" (in
  // the same millisecond the floor would give the same fence).
  auto server_ms = [&] {
    auto t = raw.call({"TIME"});
    return std::stoll(t.elements[0].str) * 1000
           + std::stoll(t.elements[1].str) / 1000;
  };
  while (static_cast<std::uint64_t>(server_ms()) <= g.fence / 1024)
    std::this_thread::sleep_for(std::chrono::milliseconds{1});
  raw.call({"DEL", h, q}); // as if it expired
  auto again = sync.enter("tienda:ana", 3);
  REQUIRE(again.granted());
  CHECK(again.fence > g.fence);
  CHECK_FALSE(again.previous_holder.has_value());
}

namespace {

// The keys of one chat of `prefix`, and what the test reads of them.
struct chat_keys {
  botmesh::redis_client raw{{.url = test::redis_url()}};
  std::string h, q;

  chat_keys(const std::string& prefix, const std::string& escaped)
    : h(prefix + ":co:{t:" + escaped + "}:h"),
      q(prefix + ":co:{t:" + escaped + "}:q") {}

  long long now_ms() {
    auto t = raw.call({"TIME"});
    return std::stoll(t.elements[0].str) * 1000
           + std::stoll(t.elements[1].str) / 1000;
  }
  long long pttl(const std::string& k) {
    return raw.call({"PTTL", k}).integer;
  }
  long long x() {
    return std::stoll(raw.call({"HGET", h, "x"}).str);
  }
  // As if the keys had last been kept `left` ms before they expire.
  void set_left(long long left) {
    auto until = now_ms() + left;
    raw.call({"HSET", h, "x", std::to_string(until)});
    raw.call({"PEXPIREAT", h, std::to_string(until)});
  }
  // x never promises more than the keys have: both live at least until it
  // (their absolute expiry, so no clock reading races the check).
  void check_x_is_a_lower_bound() {
    auto x = this->x();
    CHECK(x <= raw.call({"PEXPIRETIME", h}).integer);
    if (raw.call({"EXISTS", q}).integer == 1)
      CHECK(x <= raw.call({"PEXPIRETIME", q}).integer);
  }
};

} // namespace

TEST_CASE("a leadership term never goes back when Redis lost its counter") {
  redis_coordinator_factory f;
  auto a = f.make("a");
  botmesh::blocking_coordinator sync{*a};
  auto first = sync.lead("provider:test");
  REQUIRE(first);
  REQUIRE(sync.unlead("provider:test", first->fence));
  // As after a restart without persistence: the counter is gone.
  botmesh::redis_client raw{{.url = test::redis_url()}};
  REQUIRE(raw.call({"DEL", f.prefix + ":co:{ld:provider%3Atest}:term"}).integer
          == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds{5}); // a later ms
  auto again = sync.lead("provider:test");
  REQUIRE(again);
  CHECK(again->fence > first->fence);
}

TEST_CASE("a chat's keys are kept alive lazily: refreshed only when less "
          "than three quarters of the ttl is left, never shortened, and never "
          "below what the hash says") {
  redis_coordinator_factory f;
  // Leases long enough that no turn expires while the test looks (the
  // ttl is then still its 10 minute floor).
  auto make = [&](const char* id, int lease_ms) {
    return std::make_unique<botmesh::redis_coordinator>(
      botmesh::redis_coordinator_options{
        .url = test::redis_url(), .prefix = f.prefix, .replica_id = id,
        .lease = std::chrono::milliseconds{lease_ms}});
  };
  auto a = make("a", 5'000);
  auto b = make("b", 5'000);
  botmesh::blocking_coordinator sa{*a}, sb{*b};
  chat_keys k{f.prefix, "lazy"};
  auto ttl = 600'000;

  // A new chat: both the expiry and x are set with the first grant.
  auto g1 = sa.enter("lazy", 1);
  REQUIRE(g1.granted());
  CHECK(k.pttl(k.h) > ttl - 5'000);
  CHECK(k.x() > k.now_ms() + ttl - 5'000);
  k.check_x_is_a_lower_bound();
  REQUIRE(sa.release({"lazy", g1.fence}).released);

  // More than three quarters left: a turn writes nothing for expiry.
  k.set_left(500'000);
  auto x0 = k.x();
  auto g2 = sa.enter("lazy", 2);
  REQUIRE(g2.granted());
  CHECK(k.x() == x0);
  CHECK(k.pttl(k.h) <= 500'000);
  // A queue created now expires with the hash, not never.
  REQUIRE(sb.enter("lazy", 3).state == botmesh::turn_state::status::waiting);
  CHECK(k.pttl(k.q) > 0);
  CHECK(k.pttl(k.q) <= 500'000);
  k.check_x_is_a_lower_bound();
  auto r = sa.release({"lazy", g2.fence});
  REQUIRE(r.released);

  // Less than three quarters left: the next script that touches the chat
  // refreshes both keys (here b's poll of its granted turn).
  k.set_left(400'000);
  auto g3 = sb.poll("lazy", 3);
  REQUIRE(g3.granted());
  CHECK(k.pttl(k.h) > ttl - 5'000);
  CHECK(k.x() > k.now_ms() + ttl - 5'000);
  k.check_x_is_a_lower_bound();

  // A replica with a longer lease keeps the keys for its longer ttl, and
  // no script of a replica with a shorter one cuts that back (its holder
  // counts on the longer margin between two renewals).
  auto longer = make("long", 20'000);
  botmesh::blocking_coordinator sl{*longer};
  REQUIRE(sl.enter("lazy", 4).state == botmesh::turn_state::status::waiting);
  k.set_left(400'000);
  REQUIRE(sb.renew({.turns = {{"lazy", g3.fence}}}).turns.at(0) > 0);
  k.check_x_is_a_lower_bound();
  k.set_left(100'000);
  REQUIRE(sl.poll("lazy", 4).state == botmesh::turn_state::status::waiting);
  CHECK(k.pttl(k.h) > 800'000 - 5'000); // 40 leases
  CHECK(k.pttl(k.q) > 800'000 - 5'000);
  k.check_x_is_a_lower_bound();
  REQUIRE_FALSE(sb.leave("lazy", 5));
  CHECK_FALSE(sb.skip_if_dead("lazy", "an-incarnation-long-gone"));
  REQUIRE(sb.renew({.turns = {{"lazy", g3.fence}}}).turns.at(0) > 0);
  auto r2 = sb.release({"lazy", g3.fence});
  REQUIRE(r2.released);
  CHECK(k.pttl(k.h) > 800'000 - 10'000);
  k.check_x_is_a_lower_bound();
  // The longer replica holds now (granted by that release).
  REQUIRE(sl.poll("lazy", 4).granted());
  CHECK(k.pttl(k.h) > 800'000 - 10'000);
}

TEST_CASE("a grant is published only on the channel of the replica that "
          "owns the ticket") {
  redis_coordinator_factory f;
  auto a = f.make("a");
  auto b = f.make("b");
  // Before the client: its subscriptions' threads write them until the
  // client is gone.
  std::mutex mtx;
  std::vector<std::string> seen;
  botmesh::redis_client sub_client{{.url = test::redis_url()}};
  sub_client.subscribe(f.prefix + ":co:wake:" + a->incarnation(),
                       [&](std::string_view p) {
                         std::lock_guard guard{mtx};
                         seen.push_back("a " + std::string{p});
                       });
  sub_client.subscribe(f.prefix + ":co:wake:" + b->incarnation(),
                       [&](std::string_view p) {
                         std::lock_guard guard{mtx};
                         seen.push_back("b " + std::string{p});
                       });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto g = botmesh::blocking_coordinator{*a}.enter("chat", 1);
  REQUIRE(g.granted());
  REQUIRE(botmesh::blocking_coordinator{*b}.enter("chat", 2).state
          == botmesh::turn_state::status::waiting);
  REQUIRE(botmesh::blocking_coordinator{*a}.release({"chat", g.fence}).released);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    std::lock_guard guard{mtx};
    if (!seen.empty())
      break;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::lock_guard guard{mtx};
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].starts_with("b 2 "));
  CHECK(seen[0].ends_with("chat"));
}

TEST_CASE("renewals go on after the server lost its scripts (a restart "
          "that was still loading its data when the client reconnected)") {
  // A client that reconnects while the server is LOADING cannot preload
  // its scripts; SCRIPT FLUSH leaves the server in the same state, on a
  // server of the test's own.
  test::redis_process server;
  botmesh::redis_coordinator c{{.url = server.url(),
                                .prefix = "bmco",
                                .replica_id = "a",
                                .lease = std::chrono::milliseconds{5000}}};
  botmesh::blocking_coordinator b{c};
  auto held = b.enter("chat", 1);
  REQUIRE(held.granted());
  auto lead = b.lead("scheduler");
  REQUIRE(lead);
  botmesh::redis_client admin{{.url = server.url()}};
  admin.call({"SCRIPT", "FLUSH"});
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    auto r = b.renew({.turns = {{"chat", held.fence}}, .leads = {"scheduler"}});
    REQUIRE(r.turns.size() == 1);
    CHECK(r.turns[0] > r.now_ms);
    REQUIRE(r.leads.size() == 1);
    REQUIRE(r.leads[0]);
    CHECK(r.leads[0]->fence == lead->fence);
  }
}

TEST_CASE("a renewal whose writes ran well after its TIME reading reports "
          "no more than the lease from that reading") {
  // CLIENT PAUSE WRITE lets the batch's TIME run and holds its heartbeat
  // and co_renew back, as a failover's pause or another cluster node would.
  test::redis_process server;
  constexpr std::int64_t lease = 2000;
  botmesh::redis_coordinator c{{.url = server.url(),
                                .prefix = "bmpause",
                                .replica_id = "a",
                                .lease = std::chrono::milliseconds{lease}}};
  botmesh::blocking_coordinator b{c};
  auto held = b.enter("chat", 1);
  REQUIRE(held.granted());
  botmesh::redis_client admin{{.url = server.url()}};
  admin.call({"CLIENT", "PAUSE", "700", "WRITE"});
  auto r = b.renew({.turns = {{"chat", held.fence}}});
  REQUIRE(r.turns.size() == 1);
  REQUIRE(r.turns[0] > 0);
  CHECK(r.turns[0] - r.now_ms <= lease);
  CHECK(r.turns[0] - r.now_ms > lease - 200);
}

TEST_CASE("a renewal whose turn key is damaged fails for that turn alone, "
          "the other turn and the leadership are renewed") {
  test::redis_process server;
  botmesh::redis_coordinator c{{.url = server.url(),
                                .prefix = "bmpart",
                                .replica_id = "a",
                                .lease = std::chrono::milliseconds{5000}}};
  botmesh::blocking_coordinator b{c};
  auto one = b.enter("one", 1);
  auto two = b.enter("two", 2);
  REQUIRE(one.granted());
  REQUIRE(two.granted());
  REQUIRE(b.lead("scheduler"));
  botmesh::redis_client admin{{.url = server.url()}};
  auto keys = admin.call({"KEYS", "bmpart:*one*:h"});
  REQUIRE(keys.elements.size() == 1);
  admin.call({"DEL", keys.elements[0].str});
  admin.call({"SET", keys.elements[0].str, "not a hash"});
  auto r = b.renew({.turns = {{"one", one.fence}, {"two", two.fence}},
                    .leads = {"scheduler"}});
  REQUIRE(r.turns.size() == 2);
  CHECK(r.turns[0] == botmesh::renewal_result::failed);
  CHECK(r.turns[1] > r.now_ms);
  REQUIRE(r.leads.size() == 1);
  CHECK(r.leads[0].has_value());
  CHECK_FALSE(r.lead_failed(0));
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].find("renewing one") != std::string::npos);
  CHECK(r.errors[0].find("WRONGTYPE") != std::string::npos);
}

TEST_CASE("a leadership whose term key is gone or damaged gets a new, higher "
          "term, and the turns renewed with it are not lost") {
  for (std::string damage : {"", "garbage", "1e999", "-5"}) {
    CAPTURE(damage);
    test::redis_process server;
    botmesh::redis_coordinator c{{.url = server.url(),
                                  .prefix = "bmterm",
                                  .replica_id = "a",
                                  .lease = std::chrono::milliseconds{5000}}};
    botmesh::blocking_coordinator b{c};
    auto one = b.enter("one", 1);
    REQUIRE(one.granted());
    auto first = b.lead("scheduler");
    REQUIRE(first);
    botmesh::redis_client admin{{.url = server.url()}};
    auto keys = admin.call({"KEYS", "bmterm:*scheduler*:term"});
    REQUIRE(keys.elements.size() == 1);
    // A term made anew is floored by the server's clock (ms * 1024): in the
    // millisecond of the first one it would equal it. A key evicted or
    // damaged by an operator is so at least a millisecond later.
    auto server_ms = [&] {
      auto t = admin.call({"TIME"});
      return std::stoll(t.elements[0].str) * 1000
             + std::stoll(t.elements[1].str) / 1000;
    };
    while (static_cast<std::uint64_t>(server_ms()) <= first->fence / 1024)
      std::this_thread::sleep_for(std::chrono::milliseconds{1});
    if (damage.empty())
      admin.call({"DEL", keys.elements[0].str}); // evicted: it has no TTL
    else
      admin.call({"SET", keys.elements[0].str, damage});
    // Before, the reply had no term and the whole batch threw: every turn
    // of the replica lapsed with it, each lease.
    auto r = b.renew({.turns = {{"one", one.fence}}, .leads = {"scheduler"}});
    REQUIRE(r.turns.size() == 1);
    CHECK(r.turns[0] > r.now_ms);
    REQUIRE(r.leads.size() == 1);
    REQUIRE(r.leads[0].has_value());
    CHECK_FALSE(r.lead_failed(0));
    // A term above every one handed out: a fence check still refuses the
    // writes of the term before.
    CHECK(r.leads[0]->fence > first->fence);
    CHECK(r.errors.empty());
  }
}

TEST_CASE("a leadership whose term key is lost or damaged in the millisecond "
          "its term was made gets a term above the one its holder knew") {
  auto prefix = test::unique_prefix("bmterm2");
  botmesh::redis_coordinator c{{.url = test::redis_url(),
                                .prefix = prefix,
                                .replica_id = "a",
                                .lease = std::chrono::milliseconds{5000}}};
  botmesh::blocking_coordinator b{c};
  botmesh::redis_client admin{{.url = test::redis_url()}};
  // At once after the term was made: most rounds fall in its millisecond,
  // where the clock floor alone gives the same term again.
  for (int round = 0; round < 40; ++round) {
    CAPTURE(round);
    auto name = "job" + std::to_string(round);
    auto first = b.lead(name);
    REQUIRE(first);
    auto keys = admin.call({"KEYS", prefix + ":*" + name + "*:term"});
    REQUIRE(keys.elements.size() == 1);
    if (round % 2 == 0)
      admin.call({"DEL", keys.elements[0].str});
    else
      admin.call({"SET", keys.elements[0].str, "garbage"});
    auto r = b.renew({.leads = {name}, .known_terms = {first->fence}});
    REQUIRE(r.leads.size() == 1);
    REQUIRE(r.leads[0].has_value());
    CHECK(r.leads[0]->fence > first->fence);
  }
}

namespace {

// Chat keys for a client of one connection: a submit of them is one
// co_batch call.
std::vector<std::string> chats(std::size_t n) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < n; ++i)
    out.push_back("lane" + std::to_string(i));
  return out;
}

// Every one of `n` operations failed once, each error naming `needle`.
void all_failed(const cc::submitted& r, std::size_t n, const char* needle) {
  REQUIRE(r.calls.size() == n);
  REQUIRE(r.failed.size() == n);
  for (auto& [op, calls] : r.calls)
    CHECK(calls == 1);
  for (auto& failure : r.failed) {
    // Not a structured binding: clang cannot capture one in CAPTURE.
    const auto& what = failure.second;
    CAPTURE(what);
    CHECK(what.find(needle) != std::string::npos);
  }
}

} // namespace

TEST_CASE("an operation of a batch that meets an error reply fails alone, "
          "naming the error, the others run as they would alone") {
  auto prefix = test::unique_prefix("bmco");
  auto client = std::make_shared<botmesh::redis_client>(
    botmesh::redis_options{.url = test::redis_url(), .connections = 1});
  botmesh::redis_coordinator c{{.client = client, .prefix = prefix,
                                .replica_id = "a"}};
  auto k = chats(3);
  botmesh::blocking_coordinator sync{c};
  auto held = sync.enter(k[2], 1);
  REQUIRE(held.granted());
  // The middle chat's turn hash is a string: its HMGET fails WRONGTYPE.
  client->call({"SET", prefix + ":co:{t:" + k[1] + "}:h", "not a hash"});
  cc::batch b;
  b.enter(k[0], 2);
  b.enter(k[1], 3);
  b.release(k[2], held.fence);
  auto r = b.run(c);
  REQUIRE(r->calls.size() == 3);
  for (auto& [op, calls] : r->calls)
    CHECK(calls == 1);
  REQUIRE(r->failed.size() == 1);
  CHECK(r->failed[1].find("co_batch") != std::string::npos);
  CHECK(r->failed[1].find("WRONGTYPE") != std::string::npos);
  REQUIRE(r->entered[0].granted());
  CHECK(r->released[2].released);
  // What ran is there; the broken chat keeps failing with the same clear
  // error, and what it holds is not touched.
  CHECK(sync.poll(k[0], 2).granted());
  CHECK(sync.enter(k[2], 4).granted());
  CHECK_THROWS_WITH_AS(sync.enter(k[1], 3, true), doctest::Contains("WRONGTYPE"),
                       botmesh::coordination_unavailable_error);
  CHECK(client->call({"GET", prefix + ":co:{t:" + k[1] + "}:h"}).str
        == "not a hash");
}

TEST_CASE("a batch whose reply never comes fails each of its operations "
          "with a timeout, repeated, they leave no ticket or turn behind") {
  auto prefix = test::unique_prefix("bmco");
  auto client = std::make_shared<botmesh::redis_client>(
    botmesh::redis_options{.url = test::redis_url(),
                           .command_timeout = "150ms", .connections = 1});
  botmesh::redis_coordinator a{{.client = client, .prefix = prefix,
                                .replica_id = "a",
                                .lease = std::chrono::milliseconds{5000}}};
  botmesh::redis_coordinator b{{.url = test::redis_url(), .prefix = prefix,
                                .replica_id = "b",
                                .lease = std::chrono::milliseconds{5000}}};
  auto k = chats(4);
  botmesh::blocking_coordinator sa{a};
  auto held = sa.enter(k[3], 1);
  REQUIRE(held.granted());
  // Writes stall past the client's timeout: the batch's reply is lost.
  botmesh::redis_client admin{{.url = test::redis_url()}};
  admin.call({"CLIENT", "PAUSE", "600", "WRITE"});
  cc::batch batch;
  batch.enter(k[0], 2);
  batch.enter(k[1], 3);
  batch.release(k[3], held.fence);
  batch.enter(k[2], 4);
  all_failed(*batch.run(a), 4, "no reply within");
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  // Repeated one by one (enters as retries): each is granted once, the
  // release ends the turn whether or not the lost call had.
  std::vector<botmesh::turn_state> got;
  for (auto [key, req] : {std::pair{k[0], 2}, {k[1], 3}, {k[2], 4}}) {
    auto g = sa.enter(key, req, true);
    REQUIRE(g.granted());
    CHECK(g.ticket == 1);
    got.push_back(g);
  }
  sa.release({k[3], held.fence});
  for (std::size_t n = 0; n < got.size(); ++n)
    REQUIRE(sa.release({k[n], got[n].fence}).released);
  // Nothing is left: another replica is granted every chat at once.
  botmesh::blocking_coordinator sb{b};
  for (auto& key : k) {
    CAPTURE(key);
    CHECK(sb.enter(key, 9).granted());
  }
}

#include <botmesh/stores/redis/redis_store.hpp>

TEST_CASE("store.coordinator() shares the store's client and prefix") {
  botmesh::redis_store store{{.url = test::redis_url(),
                              .prefix = test::unique_prefix("bmstore")}};
  auto a = store.coordinator("a");
  auto b = store.coordinator("b");
  auto held = botmesh::blocking_coordinator{*a}.enter("chat", 1);
  REQUIRE(held.granted());
  CHECK(botmesh::blocking_coordinator{*b}.enter("chat", 1).state
        == botmesh::turn_state::status::waiting);
  auto rel = botmesh::blocking_coordinator{*a}.release({"chat", held.fence});
  REQUIRE(rel.released);
  auto next = botmesh::blocking_coordinator{*b}.poll("chat", 1);
  REQUIRE(next.granted());
  CHECK(next.previous_holder == "a");
  // The keys live under the store's prefix.
  auto keys = store.client().call(
    {"KEYS", store.prefix() + ":co:*"});
  CHECK_FALSE(keys.elements.empty());
}

TEST_CASE("a coordinator made on a shared client ends its grant "
          "subscription when it goes") {
  botmesh::redis_store store{{.url = test::redis_url(),
                              .prefix = test::unique_prefix("bmstore")}};
  // The coordinator's grant channel ends with its incarnation.
  auto numsub = [&](const std::string& incarnation) {
    return store.client()
      .call({"PUBSUB", "CHANNELS", "*" + incarnation})
      .elements.size();
  };
  auto eventually = [](const std::function<bool()>& pred) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!pred()) {
      if (std::chrono::steady_clock::now() > deadline)
        return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  };
  for (int round = 0; round < 3; ++round) {
    auto c = store.coordinator("a");
    auto incarnation = c->incarnation();
    // Its subscription connects on a thread of its own.
    REQUIRE(eventually([&] { return numsub(incarnation) == 1; }));
    c.reset();
    // Before, each one left its subscriber (a thread and a connection)
    // with the store's client until the client went.
    CHECK(eventually([&] { return numsub(incarnation) == 0; }));
  }
  // The store's client goes on serving.
  CHECK(store.client().call({"PING"}).str == "PONG");
}

#include <botmesh/runtime/botmesh.hpp>

TEST_CASE("two bots on a real Redis never run a chat's handlers at once") {
  auto prefix = test::unique_prefix("bmbots");
  auto make = [&](std::string id,
                  std::shared_ptr<botmesh::testing_provider> p) {
    auto store = std::make_shared<botmesh::redis_store>(
      botmesh::redis_store_options{.url = test::redis_url(), .prefix = prefix});
    botmesh::coordination_options co;
    co.coordinator = store->coordinator(std::move(id));
    return std::make_unique<botmesh::bot>(
      botmesh::bot_options{.provider = p, .store = store, .coordination = co});
  };
  auto pa = std::make_shared<botmesh::testing_provider>();
  auto pb = std::make_shared<botmesh::testing_provider>();
  std::atomic<int> in_flight{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> done{0};
  auto a = make("a", pa);
  auto b = make("b", pb);
  auto handler = [&](botmesh::context&) {
    if (in_flight.fetch_add(1) != 0)
      ++overlaps;
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    in_flight.fetch_sub(1);
    ++done;
  };
  a->on_message(handler);
  b->on_message(handler);
  a->start();
  b->start();
  std::thread ta{[&] {
    for (int i = 0; i < 30; ++i)
      pa->inject("x", std::to_string(i));
  }};
  std::thread tb{[&] {
    for (int i = 0; i < 30; ++i)
      pb->inject("x", std::to_string(i));
  }};
  ta.join();
  tb.join();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (done.load() < 60 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  CHECK(done.load() == 60);
  CHECK(overlaps.load() == 0);
}

TEST_CASE("an exclusive transport is elected on Redis, the standby takes over "
          "when the leader stops") {
  auto prefix = test::unique_prefix("bmlead");
  auto make = [&](std::string id,
                  std::shared_ptr<botmesh::testing_provider> p) {
    auto store = std::make_shared<botmesh::redis_store>(
      botmesh::redis_store_options{.url = test::redis_url(), .prefix = prefix});
    botmesh::coordination_options co;
    co.coordinator = store->coordinator(std::move(id),
                                        std::chrono::milliseconds(600));
    return std::make_unique<botmesh::bot>(
      botmesh::bot_options{.provider = p, .store = store, .coordination = co});
  };
  auto exclusive = [] {
    return std::make_shared<botmesh::testing_provider>(
      botmesh::testing_provider::options{
        .id = "wa", .capabilities = {.exclusive_session = true}});
  };
  auto pa = exclusive();
  auto pb = exclusive();
  auto a = make("a", pa);
  auto b = make("b", pb);
  a->start();
  REQUIRE(a->ready(std::chrono::seconds(5)));
  b->start();
  CHECK_FALSE(b->ready(std::chrono::milliseconds(700)));
  CHECK(pb->starts() == 0);
  CHECK_THROWS_AS(b->send("x", "hola"), botmesh::provider_not_leader_error);
  a->stop();
  REQUIRE(b->ready(std::chrono::seconds(5)));
  CHECK(pb->starts() == 1);
  CHECK_NOTHROW(b->send("x", "hola"));
}

