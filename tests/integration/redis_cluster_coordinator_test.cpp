// The coordinator conformance suite on the Redis Cluster: the turn and
// leadership keys of a chat share one hash tag, and the heartbeat of a
// previous holder (another slot) is read with a command of its own.

#include <doctest/doctest.h>

#include <future>
#include <memory>
#include <thread>

#include <conformance/coordinator_conformance.hpp>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/redis_coordinator.hpp>
#include <botmesh/stores/redis/redis_store.hpp>

#include "redis_cluster.hpp"
#include "redis_coordinator_factory.hpp"
#include "redis_pause.hpp"
#include "redis_server.hpp"

namespace {

std::shared_ptr<botmesh::redis_client> shared_cluster_client() {
  static auto c = std::make_shared<botmesh::redis_client>(test::cluster_options());
  return c;
}

struct through_the_cluster {
  static void into(botmesh::redis_coordinator_options& o) {
    o.client = shared_cluster_client();
  }
};

using redis_cluster_coordinator_factory =
  test::basic_redis_coordinator_factory<through_the_cluster>;

} // namespace

TYPE_TO_STRING(redis_cluster_coordinator_factory);
BOTMESH_COORDINATOR_CONFORMANCE(redis_cluster_coordinator_factory);

TEST_CASE("cluster: a coordinator with the cluster option makes its own "
          "cluster client, and refuses it together with url or client") {
  botmesh::redis_coordinator own{{.cluster = test::cluster_options(),
                                  .prefix = test::unique_prefix("bmcc"),
                                  .replica_id = "a"}};
  botmesh::blocking_coordinator sync{own};
  auto g = sync.enter("tienda:ana", 1);
  REQUIRE(g.granted());
  for (int which = 0; which < 2; ++which) {
    CAPTURE(which);
    botmesh::redis_coordinator_options o{.cluster = test::cluster_options(),
                                         .prefix = "x"};
    if (which == 0)
      o.url = "redis://127.0.0.1:1";
    else
      o.client = shared_cluster_client();
    try {
      botmesh::redis_coordinator c{o};
      FAIL("accepted cluster with url or client");
    } catch (const botmesh::invalid_argument_error& e) {
      CHECK(e.field() == "cluster");
      CHECK(std::string{e.what()}.find(which == 0 ? "url" : "client")
            != std::string::npos);
    }
  }
}

TEST_CASE("cluster: a store in the legacy layout refuses a cluster client, "
          "naming the layout") {
  try {
    botmesh::redis_store s{{.client = shared_cluster_client(), .prefix = "x",
                            .layout = botmesh::redis_layout_kind::legacy}};
    FAIL("accepted a cluster client");
  } catch (const botmesh::invalid_argument_error& e) {
    CHECK(e.field() == "layout");
    CHECK(std::string{e.what()}.find("legacy") != std::string::npos);
  }
}

TEST_CASE("cluster: a renewal fails only the turns of a master that does not "
          "answer, the turns on the other masters are renewed") {
  // Replies lost after 300 ms; a master asleep for 1.5 s stays under the
  // cluster's node timeout (2 s), so no failover moves its slots meanwhile.
  botmesh::redis_cluster_options opts = test::cluster_options();
  opts.node.command_timeout = "300ms";
  // One connection per node, so the renewal before each sleep leaves the
  // one the next renewal uses connected: a command that meets a connection
  // being made to the sleeping node is not sent, and is retried until the
  // node wakes, which is right but not what this test looks at.
  opts.node.connections = 1;
  auto client = std::make_shared<botmesh::redis_client>(opts);
  auto prefix = test::unique_prefix("bmcr");
  botmesh::redis_coordinator coord{{.client = client, .prefix = prefix,
                                    .replica_id = "a", .lease = "10s"}};
  botmesh::blocking_coordinator sync{coord};
  // Two chats whose turn keys live on different masters.
  auto master_of_chat = [&](const std::string& chat) {
    return test::master_of(botmesh::redis_client::key_slot(
      prefix + ":co:{t:" + botmesh::encode_key_segment(chat) + "}:h"));
  };
  std::string asleep_chat = "tienda:0";
  auto asleep = master_of_chat(asleep_chat);
  std::string awake_chat;
  for (int i = 1; awake_chat.empty(); ++i) {
    auto c = "tienda:" + std::to_string(i);
    if (master_of_chat(c).id != asleep.id)
      awake_chat = c;
  }
  auto g1 = sync.enter(asleep_chat, 1);
  auto g2 = sync.enter(awake_chat, 2);
  REQUIRE(g1.granted());
  REQUIRE(g2.granted());
  botmesh::renewal r{.turns = {{asleep_chat, g1.fence}, {awake_chat, g2.fence}}};
  REQUIRE(sync.renew(r).turns.at(1) > 0);
  auto renews_both = [&] {
    try {
      auto res = sync.renew(r);
      return res.turns.at(0) > 0 && res.turns.at(1) > 0;
    } catch (const std::exception&) {
      return false;
    }
  };
  // Each renewal sends TIME to some master, which may be the sleeping one
  // (then a script's clock stands in): a few rounds make that likely.
  auto sleeper = test::node_client(asleep.address, "10s");
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    auto woke_p = std::make_shared<std::promise<void>>();
    auto woke = woke_p->get_future();
    sleeper->async({"DEBUG", "SLEEP", "1.5"},
                   [woke_p](botmesh::redis_reply, std::exception_ptr) {
                     woke_p->set_value();
                   });
    REQUIRE(test::await_unresponsive("redis://" + asleep.address));
    botmesh::renewal_result res;
    try {
      res = sync.renew(r);
    } catch (const std::exception& e) {
      FAIL("the renewal failed as a whole: " << std::string{e.what()});
    }
    CHECK(res.turns.at(0) == botmesh::renewal_result::failed);
    CHECK(res.turns.at(1) > 0);
    CHECK(res.now_ms > 0);
    bool named = false;
    for (auto& e : res.errors)
      named = named
              || (e.find(asleep_chat) != std::string::npos
                  && e.find("BOTMESH-FAILED") != std::string::npos);
    CHECK(named);
    for (auto& e : res.errors)
      if (e.find("TIME failed") != std::string::npos)
        MESSAGE("TIME met the sleeping master: a script's clock stood in");
    REQUIRE(woke.wait_for(std::chrono::seconds(10))
            == std::future_status::ready);
    // Awake again, the first chat's turn renews as before.
    REQUIRE(test::eventually(renews_both, std::chrono::seconds(20)));
  }
  sync.release({asleep_chat, g1.fence});
  sync.release({awake_chat, g2.fence});
}
