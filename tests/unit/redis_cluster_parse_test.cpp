// The pure parts of the Redis Cluster client: CRC16, first keys,
// redirections and CLUSTER SLOTS replies (no server).

#include <doctest/doctest.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/internal/cluster.hpp>

using botmesh::redis_client;
using botmesh::redis_reply;
namespace internal = botmesh::internal;

namespace {

redis_reply integer(long long v) {
  redis_reply r;
  r.type = redis_reply::kind::integer;
  r.integer = v;
  return r;
}

redis_reply string(std::string s) {
  redis_reply r;
  r.type = redis_reply::kind::string;
  r.str = std::move(s);
  return r;
}

redis_reply array(std::vector<redis_reply> xs) {
  redis_reply r;
  r.type = redis_reply::kind::array;
  r.elements = std::move(xs);
  return r;
}

} // namespace

TEST_CASE("CRC16 and key slots follow the Redis Cluster specification") {
  // The specification's check value, and slots it documents.
  CHECK(internal::crc16("123456789") == 0x31C3);
  CHECK(redis_client::key_slot("foo") == 12182);
  CHECK(redis_client::key_slot("{user1000}.following")
        == redis_client::key_slot("{user1000}.followers"));
  CHECK(redis_client::key_slot("foo{}{bar}") == internal::crc16("foo{}{bar}") % 16384);
  CHECK(redis_client::key_slot("foo{{bar}}zap") == internal::crc16("{bar") % 16384);
  CHECK(redis_client::key_slot("foo{bar}{zap}") == redis_client::key_slot("bar"));
}

TEST_CASE("the first key of a command decides its slot and scripts use the key "
          "after numkeys") {
  using cmd = redis_client::command;
  CHECK(internal::first_key(cmd{"GET", "k"}) == "k");
  CHECK(internal::first_key(cmd{"evalsha", "abc", "2", "k1", "k2", "a"}) == "k1");
  CHECK(internal::first_key(cmd{"EVAL", "return 1", "0", "a"}) == std::nullopt);
  CHECK(internal::first_key(cmd{"EVAL", "return 1", "x", "a"}) == std::nullopt);
  CHECK(internal::first_key(cmd{"PING"}) == std::nullopt);
  CHECK(internal::first_key(cmd{"SCRIPT", "LOAD", "x"}) == std::nullopt);
  CHECK(internal::first_key(cmd{}) == std::nullopt);
}

TEST_CASE("MOVED and ASK replies are parsed and a malformed one is not a "
          "redirection") {
  auto m = internal::parse_redirection("MOVED 3999 127.0.0.1:6381");
  REQUIRE(m);
  CHECK(!m->ask);
  CHECK(m->slot == 3999);
  CHECK(m->address == "127.0.0.1:6381");
  auto a = internal::parse_redirection("ASK 0 ::1:7000");
  REQUIRE(a);
  CHECK(a->ask);
  CHECK(a->address == "::1:7000");
  for (auto bad : {"MOVED", "MOVED 16384 h:1", "MOVED -1 h:1", "MOVED 1 h",
                   "MOVED 1 h:0", "MOVED x h:1", "ASK 1 :1", "ERR MOVED 1 h:1",
                   "TRYAGAIN Multiple keys"}) {
    CAPTURE(bad);
    CHECK(!internal::parse_redirection(bad));
  }
}

TEST_CASE("a CLUSTER SLOTS reply becomes ranges with masters and replicas, "
          "and a malformed one is refused by name") {
  auto reply = array({
    array({integer(0), integer(5460), array({string("10.0.0.1"), integer(7000),
                                             string("id1")}),
           array({string("10.0.0.4"), integer(7003), string("id4")})}),
    array({integer(5461), integer(16383),
           array({string(""), integer(7001), string("id2")})}),
  });
  auto ranges = internal::parse_cluster_slots(reply, "seed");
  REQUIRE(ranges.size() == 2);
  CHECK(ranges[0].first == 0);
  CHECK(ranges[0].last == 5460);
  CHECK(ranges[0].master == "10.0.0.1:7000");
  REQUIRE(ranges[0].replicas.size() == 1);
  CHECK(ranges[0].replicas[0] == "10.0.0.4:7003");
  CHECK(ranges[1].master == "seed:7001"); // an empty host: the one asked
  CHECK_THROWS_WITH_AS(
    internal::parse_cluster_slots(string("x"), "h"),
    doctest::Contains("CLUSTER SLOTS: malformed reply"), botmesh::error);
  CHECK_THROWS_WITH_AS(
    internal::parse_cluster_slots(
      array({array({integer(5), integer(16384),
                    array({string("h"), integer(1)})})}),
      "h"),
    doctest::Contains("slot range 5-16384"), botmesh::error);
  CHECK_THROWS_WITH_AS(
    internal::parse_cluster_slots(
      array({array({integer(0), integer(1), array({string("h"), integer(0)})})}),
      "h"),
    doctest::Contains("a node is not [host, port"), botmesh::error);
}
