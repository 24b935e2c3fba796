// The pure parts of the Redis Cluster client: CRC16, first keys,
// redirections and CLUSTER SLOTS replies (no server).

#include <doctest/doctest.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/internal/cluster.hpp>
#include <botmesh/stores/redis/internal/keyspace.hpp>

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
                   "MOVED 1 h:0", "MOVED x h:1", "ERR MOVED 1 h:1",
                   "TRYAGAIN Multiple keys",
                   // Hosts a URL would read as a database or a user.
                   "MOVED 3999 a/b:6379", "ASK 1 u:p@h:1", "MOVED 1 h?x:1",
                   "MOVED 1 h h:1"}) {
    CAPTURE(bad);
    CHECK(!internal::parse_redirection(bad));
  }
  // An empty or "?" host (unknown-endpoint, or hostname with none set) is
  // the host the command went to; with none known, not a redirection.
  CHECK(!internal::parse_redirection("ASK 1 :1"));
  auto same = internal::parse_redirection("MOVED 3999 :6380", "10.0.0.2");
  REQUIRE(same);
  CHECK(same->address == "10.0.0.2:6380");
  auto unknown = internal::parse_redirection("ASK 7 ?:7001", "::1");
  REQUIRE(unknown);
  CHECK(unknown->ask);
  CHECK(unknown->address == "::1:7001");
  CHECK(internal::parse_redirection("MOVED 1 h:1", "x")->address == "h:1");
  CHECK(!internal::parse_redirection("MOVED 1 :0", "x"));
  CHECK(!internal::parse_redirection("MOVED 1 ?:1", "a/b"));
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
  // unknown-endpoint writes the host as nil; hostname with none set, "?".
  redis_reply nil;
  nil.type = redis_reply::kind::nil;
  auto odd = internal::parse_cluster_slots(
    array({array({integer(0), integer(1), array({nil, integer(7002)})}),
           array({integer(2), integer(16383),
                  array({string("?"), integer(7003)})})}),
    "seed");
  REQUIRE(odd.size() == 2);
  CHECK(odd[0].master == "seed:7002");
  CHECK(odd[1].master == "seed:7003");
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
  // A host a URL would read as a database: named, not made a client.
  CHECK_THROWS_WITH_AS(
    internal::parse_cluster_slots(
      array({array({integer(0), integer(1), array({string("a/b"), integer(7000)})})}),
      "h"),
    doctest::Contains("a node's host \"a/b\" is not a host name or address"),
    botmesh::error);
}

TEST_CASE("the masters a cluster scan reads: every slot served, none failing") {
  auto error_of = [](const std::string& text) {
    try {
      internal::cluster_masters(text);
    } catch (const botmesh::error& e) {
      CHECK(e.code() == botmesh::errc::store_error);
      return std::string{e.what()};
    }
    return std::string{};
  };
  std::string replica =
    "r4 127.0.0.1:30004@31004,host4 slave m1 0 1426238317239 4 connected\n";
  std::string m1 = "m1 127.0.0.1:30001@31001 myself,master - 0 0 1 connected "
                   "0-5460 [5461->-m2]\n";
  std::string m2 = "m2 127.0.0.1:30002@31002 master - 0 1426238316232 2 "
                   "connected 5461 5462-10922\n";
  std::string m3 = "m3 127.0.0.1:30003@31003 master - 0 1426238318243 3 "
                   "connected 10923-16383\n";
  // Healthy: the masters' host:port, replicas and the moving slot's
  // bracket left out.
  auto masters = internal::cluster_masters(replica + m1 + m2 + m3);
  CHECK(masters == std::vector<std::string>{"127.0.0.1:30001", "127.0.0.1:30002",
                                            "127.0.0.1:30003"});
  // A master that stopped answering still owns its slots until its replica
  // takes over: its keys cannot be read, which a scan must not pass over.
  std::string suspect = "m3 127.0.0.1:30003@31003 master,fail? - 0 1 3 "
                        "connected 10923-16383\n";
  auto e = error_of(m1 + m2 + suspect);
  CHECK(e.find("127.0.0.1:30003") != std::string::npos);
  CHECK(e.find("fail?") != std::string::npos);
  CHECK(e.find("5461 slots") != std::string::npos);
  CHECK(error_of(m1 + m2 + "m3 127.0.0.1:30003@31003 master,fail - 0 1 3 "
                           "disconnected 10923-16383\n")
          .find("flagged master,fail ") != std::string::npos);
  // After the failover the old master lists no slots: nothing to read there.
  auto after = internal::cluster_masters(
    m1 + m2 + "m3 127.0.0.1:30003@31003 master,fail - 0 1 3 disconnected\n"
    + "m6 127.0.0.1:30006@31006 master - 0 1 7 connected 10923-16383\n");
  CHECK(after == std::vector<std::string>{"127.0.0.1:30001", "127.0.0.1:30002",
                                          "127.0.0.1:30006"});
  // Slots nobody serves (a shard lost with its replicas) are named.
  CHECK(error_of(m1 + m3).find("no master serves slots 5461-10922")
        != std::string::npos);
  CHECK(error_of(m1 + m2 + "m3 127.0.0.1:30003@31003 master - 0 1 3 connected "
                           "10923-16384\n")
          .find("malformed slot range \"10923-16384\"") != std::string::npos);
}
