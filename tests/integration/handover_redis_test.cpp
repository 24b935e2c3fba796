#include <doctest/doctest.h>

#include <botmesh/stores/redis/redis_coordinator.hpp>
#include <botmesh/stores/redis/redis_store.hpp>

#include "handover/handover_suite.hpp"
#include "redis_server.hpp"

namespace {

// The handover suite on Redis (REDIS_URL): each replica a coordinator of
// its own, all sharing one Redis store under a prefix of the test's own.
struct redis_env {
  std::string prefix = test::unique_prefix("bmho");
  std::shared_ptr<botmesh::redis_client> client =
    std::make_shared<botmesh::redis_client>(
      botmesh::redis_options{.url = test::redis_url()});
  std::shared_ptr<test::recording_store> store =
    std::make_shared<test::recording_store>(
      std::make_shared<botmesh::redis_store>(
        botmesh::redis_store_options{.client = client, .prefix = prefix}));

  std::shared_ptr<botmesh::coordinator> coordinator(std::string id) {
    botmesh::redis_coordinator_options o;
    o.url = test::redis_url();
    o.prefix = prefix;
    o.replica_id = std::move(id);
    o.lease = "3s";
    return std::make_shared<botmesh::redis_coordinator>(std::move(o));
  }

  // What a damaged record looks like to the store: a body that is not JSON.
  void corrupt(const std::string& key) {
    client->call({"HSET", prefix + ":cp:" + key, "body", "{garbage"});
  }
};

} // namespace

BOTMESH_HANDOVER_SUITE(redis_env)

TEST_CASE("handover on Redis: a checkpoint whose revision is damaged is "
          "cleared only while it is: a newer checkpoint written while the "
          "reader stalled stays") {
  using namespace test::handover;
  redis_env env;
  replica a{env, "a", reading_store()};
  replica b{env, "b", reading_store()};
  auto cp = order_started_on_a(env, a, b);
  REQUIRE(cp);
  // While b's read of the damaged record stalls, another replica writes
  // the next revision (its compare-and-set reads an unreadable revision
  // as no live checkpoint).
  std::optional<std::uint64_t> newer;
  bool once = false;
  env.store->after_corrupt_read = [&] {
    if (std::exchange(once, true))
      return;
    auto next = *cp;
    next.step = "cantidad";
    newer = env.store->set_checkpoint_if(next, 0);
  };
  env.client->call({"HSET", env.prefix + ":cp:test:x", "rev", "x1"});
  REQUIRE(b.say("café", 1));
  CHECK(b.last() == "nuevo: café");
  CHECK(b.error_text(botmesh::errc::corrupted_record).find("test:x")
        != std::string::npos);
  REQUIRE(newer);
  // Cleared unconditionally, it was gone.
  auto now = env.store->get_checkpoint("test:x");
  REQUIRE(now);
  CHECK(now->revision == *newer);
  CHECK(now->step == "cantidad");
}
