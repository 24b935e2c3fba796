#include <doctest/doctest.h>

#include <thread>

#include <conformance/durable_conformance.hpp>

#include <botmesh/stores/redis/redis_durable_backend.hpp>
#include <botmesh/stores/sqlite/sqlite_durable_backend.hpp>

#include "redis_server.hpp"
#include "temp_file.hpp"

namespace {

struct sqlite_durable_factory {
  static constexpr std::chrono::milliseconds lease{1000};
  botmesh::manual_clock clock;
  test::temp_file file;

  // Each call opens the file anew: backends share it as processes would.
  std::shared_ptr<botmesh::durable_backend> make() {
    auto b = std::make_shared<botmesh::sqlite_durable_backend>(
      botmesh::sqlite_durable_options{.path = file.path(), .clock = &clock});
    b->start();
    return b;
  }

  void advance(std::chrono::milliseconds d) {
    clock.advance(d);
  }
};

// Redis time is real time: advance() sleeps.
struct redis_durable_factory {
  static constexpr std::chrono::milliseconds lease{300};
  std::string prefix = test::unique_prefix("bmdur");
  std::shared_ptr<botmesh::redis_client> client =
    std::make_shared<botmesh::redis_client>(
      botmesh::redis_options{.url = test::redis_url()});

  std::shared_ptr<botmesh::durable_backend> make() {
    auto b = std::make_shared<botmesh::redis_durable_backend>(
      botmesh::redis_durable_options{.client = client, .prefix = prefix});
    b->start();
    return b;
  }

  void advance(std::chrono::milliseconds d) {
    std::this_thread::sleep_for(d);
  }
};

} // namespace

TYPE_TO_STRING(sqlite_durable_factory);
TYPE_TO_STRING(redis_durable_factory);
BOTMESH_DURABLE_CONFORMANCE(sqlite_durable_factory);
BOTMESH_DURABLE_CONFORMANCE(redis_durable_factory);

TEST_CASE("the Redis journal keeps each table in one hash slot") {
  redis_durable_factory f;
  auto b = f.make();
  dc::sync s{*b};
  REQUIRE(s.record("t:1#m1", "a") == dc::journal_put::recorded);
  REQUIRE(s.send("t:1#m1/0", "t:1", 1) == dc::outbox_verdict::send);
  auto keys = f.client->call({"KEYS", f.prefix + ":*"});
  REQUIRE(keys.elements.size() >= 5);
  for (auto& k : keys.elements) {
    auto tagged = k.str.rfind(f.prefix + ":{durable:inbound}:", 0) == 0
                  || k.str.rfind(f.prefix + ":{durable:outbox}:", 0) == 0;
    CHECK_MESSAGE(tagged, k.str);
  }
}

TEST_CASE("a corrupted Redis journal record is named: settling it fails "
          "with corrupted_record and a claim sets it aside") {
  redis_durable_factory f;
  auto b = f.make();
  dc::sync s{*b};
  REQUIRE(s.record("t:1#bad", "a") == dc::journal_put::recorded);
  REQUIRE(s.record("t:1#good", "a") == dc::journal_put::recorded);
  REQUIRE(s.release("t:1#good", "a"));
  f.client->call({"HSET", f.prefix + ":{durable:inbound}:rec", "t:1#bad",
                  "not json"});
  try {
    s.confirm("t:1#bad", "a");
    FAIL("confirm of a corrupted record did not fail");
  } catch (const botmesh::error& e) {
    CHECK(e.code() == botmesh::errc::corrupted_record);
    CHECK(std::string{e.what()}.find("t:1#bad") != std::string::npos);
  }
  f.advance(redis_durable_factory::lease * 2); // a is dead: both claimable
  auto c = s.claim("b", redis_durable_factory::lease);
  CHECK(dc::ids(c.records) == std::vector<std::string>{"t:1#good"});
  CHECK(c.corrupted == std::vector<std::string>{"t:1#bad"});
  CHECK(s.claim("b", redis_durable_factory::lease).corrupted.empty());
}

TEST_CASE("a Redis journal call while the server is down fails with a "
          "store error, and works again once it is back") {
  test::redis_process server;
  auto client = std::make_shared<botmesh::redis_client>(botmesh::redis_options{
    .url = server.url(), .command_timeout = "1s", .connect_timeout = "500ms",
    .max_backoff = "100ms"});
  botmesh::redis_durable_backend b{{.client = client, .prefix = "bmdown"}};
  b.start();
  dc::sync s{b};
  REQUIRE(s.record("t:1#m1", "a") == dc::journal_put::recorded);
  server.kill();
  CHECK_THROWS_AS(s.record("t:1#m2", "a"), botmesh::error);
  server.start();
  // The server lost its data (no persistence): m1 is new again. What matters
  // is that the client recovers without a new backend.
  for (int i = 0; i < 50; ++i) {
    try {
      CHECK(s.record("t:1#m2", "a") == dc::journal_put::recorded);
      return;
    } catch (const botmesh::error&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  FAIL("the journal did not recover after the server restarted");
}
