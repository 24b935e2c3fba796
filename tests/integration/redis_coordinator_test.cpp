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
