// The coordinator conformance suite on the Redis Cluster: the turn and
// leadership keys of a chat share one hash tag, and the heartbeat of a
// previous holder (another slot) is read with a command of its own.

#include <doctest/doctest.h>

#include <thread>

#include <conformance/coordinator_conformance.hpp>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/redis_coordinator.hpp>
#include <botmesh/stores/redis/redis_store.hpp>

#include "redis_cluster.hpp"
#include "redis_coordinator_factory.hpp"
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
