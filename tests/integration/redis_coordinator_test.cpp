#include <doctest/doctest.h>

#include <thread>

#include <conformance/coordinator_conformance.hpp>

#include <botmesh/stores/redis/redis_coordinator.hpp>

#include "redis_server.hpp"

namespace {

// Leases are short: Redis time is real time, so advance() sleeps.
struct redis_coordinator_factory {
  static constexpr std::chrono::milliseconds lease{400};
  std::string prefix = test::unique_prefix("bmco");

  std::unique_ptr<botmesh::coordinator> make(std::string replica_id) {
    return std::make_unique<botmesh::redis_coordinator>(
      botmesh::redis_coordinator_options{.url = test::redis_url(),
                                         .prefix = prefix,
                                         .replica_id = std::move(replica_id),
                                         .lease = lease});
  }

  void crash(botmesh::coordinator& c) {
    static_cast<botmesh::redis_coordinator&>(c).crash();
  }

  void advance(std::chrono::milliseconds d) {
    std::this_thread::sleep_for(d);
  }
};

} // namespace

TYPE_TO_STRING(redis_coordinator_factory);
BOTMESH_COORDINATOR_CONFORMANCE(redis_coordinator_factory);

TEST_CASE("a release wakes a replica waiting on Redis without polling") {
  redis_coordinator_factory f;
  auto a = f.make("a");
  auto b = f.make("b");
  auto ta = a->take_ticket("chat");
  auto held = a->try_acquire("chat", ta);
  REQUIRE(held);
  auto tb = b->take_ticket("chat");
  std::atomic<bool> woken{false};
  std::thread waiter{[&] {
    // One long wait: only the push can end it early.
    b->wait_change("chat", std::chrono::seconds(5));
    woken = true;
  }};
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE(a->release(*held));
  waiter.join();
  CHECK(woken.load());
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4));
  CHECK(b->try_acquire("chat", tb).has_value());
}

#include <botmesh/stores/redis/redis_store.hpp>

TEST_CASE("store.coordinator() shares the store's client and prefix") {
  botmesh::redis_store store{{.url = test::redis_url(),
                              .prefix = test::unique_prefix("bmstore")}};
  auto a = store.coordinator("a");
  auto b = store.coordinator("b");
  auto ta = a->take_ticket("chat");
  auto tb = b->take_ticket("chat");
  auto held = a->try_acquire("chat", ta);
  REQUIRE(held);
  CHECK_FALSE(b->try_acquire("chat", tb).has_value());
  REQUIRE(a->release(*held));
  auto next = b->try_acquire("chat", tb);
  REQUIRE(next);
  CHECK(next->previous_holder == "a");
  // The keys live under the store's prefix.
  auto keys = store.client().call(
    {"KEYS", store.layout().prefix() + ":co:*"});
  CHECK_FALSE(keys.elements.empty());
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

TEST_CASE("an exclusive transport is elected on Redis; the standby takes over "
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

#include <botmesh/runtime/internal/turn_keeper.hpp>

TEST_CASE("a release that failed on the network is repaired by the keeper "
          "well before the lease expires") {
  test::redis_process server;
  auto flaky = std::make_shared<botmesh::redis_client>(botmesh::redis_options{
    .url = server.url(), .command_timeout = "200ms", .max_backoff = "100ms"});
  botmesh::redis_coordinator a{{.client = flaky, .prefix = "watchdog",
                                .replica_id = "a", .lease = "6s"}};
  botmesh::redis_coordinator b{{.url = server.url(), .prefix = "watchdog",
                                .replica_id = "b", .lease = "6s"}};
  botmesh::internal::turn_keeper keeper{a, std::chrono::minutes(1), nullptr};
  auto t = a.take_ticket("chat");
  auto granted = a.try_acquire("chat", t);
  REQUIRE(granted);
  auto held = keeper.hold(*granted);
  auto tb = b.take_ticket("chat");
  server.signal(SIGSTOP); // the network "cuts" while a releases
  keeper.release(held);   // times out: queued for the watchdog
  server.signal(SIGCONT);
  auto t0 = std::chrono::steady_clock::now();
  std::optional<botmesh::turn> got;
  while (!got && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    try {
      got = b.try_acquire("chat", tb);
    } catch (const botmesh::coordination_unavailable_error&) {
      // b's connection may also have been reset by the stop
    }
    if (!got)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(got);
  // Without the retry, b would have waited for the 6 s lease to run out.
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4));
  CHECK(got->previous_holder == "a");
}
