// Durable processing with real replica processes on Redis.

#include <doctest/doctest.h>

#include "redis_server.hpp"
#include "replica_process.hpp"

using namespace std::chrono_literals;

TEST_CASE("durable replicas: kill -9 of the replica that holds messages "
          "waiting for their turn, mid-step after a send: another replica "
          "handles every accepted message once, in order, without sending "
          "twice") {
  auto prefix = test::unique_prefix("bmdurrep");
  test::replica_process a{test::redis_url(), prefix, "a", 600, "durable"};
  test::replica_process b{test::redis_url(), prefix, "b", 600, "durable"};
  REQUIRE(!a.expect("ready").empty());
  REQUIRE(!b.expect("ready").empty());
  // a answers, then keeps x's turn; three more messages wait behind it.
  a.send("inject-id x id1 sendsleep:5000");
  REQUIRE(a.expect("sent x a sendsleep:5000") == "sent x a sendsleep:5000");
  a.send("inject-id x id2 dos");
  a.send("inject-id x id3 tres");
  a.send("inject-id x id4 cuatro");
  for (std::string id : {"id2", "id3", "id4"})
    REQUIRE(a.expect("accepted " + id) == "accepted " + id);
  // Another chat goes on at b meanwhile.
  b.send("inject-id y idy1 otro");
  CHECK(b.expect("sent y b otro") == "sent y b otro");
  a.signal(SIGKILL);
  // b takes a's records over once a's heartbeat lapsed: the cut step runs
  // again (its send was made: the outbox skips it), then the waiting ones.
  REQUIRE(b.expect("sent x b cuatro", 30s) == "sent x b cuatro");
  CHECK(b.seen("start x") == std::vector<std::string>{
                               "start x sendsleep:5000", "start x dos",
                               "start x tres", "start x cuatro"});
  // (expect() took the lines it returned: "sent x b cuatro" on b, a's
  // "sent x a sendsleep:5000".) b did not send the replayed step's answer.
  CHECK(b.seen("sent x") == std::vector<std::string>{"sent x b dos",
                                                     "sent x b tres"});
  CHECK(a.seen("start x") == std::vector<std::string>{"start x sendsleep:5000"});
  CHECK(a.seen("sent x").empty());
  // A redelivery of a handled message is a duplicate on any replica.
  b.send("inject-id x id3 tres");
  CHECK(b.expect("duplicate id3") == "duplicate id3");
  CHECK(b.seen("start x").size() == 4);
}

TEST_CASE("durable replicas: the same platform message delivered to two "
          "replica processes at once is handled by one") {
  auto prefix = test::unique_prefix("bmdurrep");
  test::replica_process a{test::redis_url(), prefix, "a", 2000, "durable"};
  test::replica_process b{test::redis_url(), prefix, "b", 2000, "durable"};
  REQUIRE(!a.expect("ready").empty());
  REQUIRE(!b.expect("ready").empty());
  constexpr int n = 20;
  for (int i = 0; i < n; ++i) {
    auto line = "inject-id c" + std::to_string(i % 4) + " m" + std::to_string(i)
                + " t" + std::to_string(i);
    a.send(line);
    b.send(line);
  }
  // Every message is either handled or a duplicate on each replica.
  std::size_t handled = 0, dups = 0;
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (handled + dups < 2 * n && std::chrono::steady_clock::now() < deadline) {
    handled = a.seen("sent c").size() + b.seen("sent c").size();
    dups = a.seen("duplicate").size() + b.seen("duplicate").size();
  }
  CHECK(handled == n);
  CHECK(dups == n);
}

TEST_CASE("durable replicas: a replica frozen (SIGSTOP) past its lease while "
          "running a step: another replica handles the message, and the "
          "frozen one, resumed, neither answers nor has it handled again") {
  auto prefix = test::unique_prefix("bmdurrep");
  test::replica_process a{test::redis_url(), prefix, "a", 600, "durable"};
  test::replica_process b{test::redis_url(), prefix, "b", 600, "durable"};
  REQUIRE(!a.expect("ready").empty());
  REQUIRE(!b.expect("ready").empty());
  a.send("inject-id x id1 sleep:1000");
  REQUIRE(a.expect("start x sleep:1000") == "start x sleep:1000");
  a.signal(SIGSTOP);
  // a's heartbeat and x's turn lapse: b takes the record and the turn.
  REQUIRE(b.expect("sent x b sleep:1000", 20s) == "sent x b sleep:1000");
  a.signal(SIGCONT);
  // a's step wakes up and tries to answer: fenced by its lost turn.
  CHECK_FALSE(a.expect("error lease_lost").empty());
  // The chat goes on at b, in order, and nobody handles id1 a third time.
  b.send("inject-id x id2 luego");
  REQUIRE(b.expect("sent x b luego") == "sent x b luego");
  CHECK(a.seen("sent x").empty());
  CHECK(b.seen("start x") == std::vector<std::string>{"start x sleep:1000",
                                                      "start x luego"});
}
