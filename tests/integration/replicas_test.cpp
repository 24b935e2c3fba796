#include <doctest/doctest.h>

#include <botmesh/stores/redis/redis_store.hpp>

#include "redis_server.hpp"
#include "replica_process.hpp"

using namespace std::chrono_literals;

TEST_CASE("a replica process killed with SIGKILL mid-turn: its chat is taken "
          "over after the lease") {
  auto prefix = test::unique_prefix("bmrep");
  test::replica_process a{test::redis_url(), prefix, "a", 600};
  test::replica_process b{test::redis_url(), prefix, "b", 600};
  REQUIRE(!a.expect("ready").empty());
  REQUIRE(!b.expect("ready").empty());
  a.send("inject x sleep:60000");
  REQUIRE(!a.expect("start x sleep").empty()); // a holds x's turn
  a.signal(SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  b.send("inject x hola");
  CHECK(b.expect("sent x b hola") == "sent x b hola");
  // Not before a's lease could run out.
  CHECK(std::chrono::steady_clock::now() - t0 >= 300ms);
}

TEST_CASE("a replica frozen past its lease (SIGSTOP) never answers out of "
          "order afterwards and reports lease_lost") {
  auto prefix = test::unique_prefix("bmrep");
  test::replica_process a{test::redis_url(), prefix, "a", 600};
  test::replica_process b{test::redis_url(), prefix, "b", 600};
  REQUIRE(!a.expect("ready").empty());
  REQUIRE(!b.expect("ready").empty());
  a.send("inject x sleep:300");
  REQUIRE(!a.expect("start x sleep").empty());
  a.signal(SIGSTOP); // frozen while holding x's turn
  b.send("inject x hola");
  REQUIRE(b.expect("sent x b hola") == "sent x b hola");
  a.signal(SIGCONT);
  // a's handler wakes up and tries to answer: fenced.
  auto err = a.expect("error lease_lost");
  CHECK_FALSE(err.empty());
  CHECK(err.find("test:x") != std::string::npos);
  CHECK_FALSE(a.expect("lost test:x").empty());
  CHECK(a.seen("sent x a").empty());
  // And a serves the chat again, in order, once it gets a fresh turn.
  a.send("inject x otra");
  CHECK(a.expect("sent x a otra") == "sent x a otra");
}
