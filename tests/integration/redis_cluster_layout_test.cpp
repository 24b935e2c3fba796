// The cluster:v1 key names: exact, and one slot per group of keys a script
// touches (checked against the cluster's own CLUSTER KEYSLOT).

#include <doctest/doctest.h>

#include <set>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/redis_client.hpp>
#include <botmesh/stores/redis/redis_cluster_layout.hpp>

#include "redis_cluster.hpp"

using botmesh::redis_client;
using botmesh::redis_cluster_layout;
using kind = redis_cluster_layout::record_kind;

TEST_CASE("cluster: every kind of key of the cluster:v1 layout has its exact "
          "name") {
  redis_cluster_layout L{"mybot"};
  CHECK(L.marker() == "mybot:{meta}:layout");
  CHECK(redis_cluster_layout::marker_value == "cluster:v1");
  CHECK(L.message_log("tg:42") == "mybot:{m:tg%3A42}:z");
  CHECK(L.message_item("tg:42", "17") == "mybot:{m:tg%3A42}:i:17");
  // Buckets: FNV-1a 32 of the id, modulo 32 ("tg:42" -> 0x1b0de610 -> 16).
  CHECK(redis_cluster_layout::bucket("") == 5);
  CHECK(redis_cluster_layout::bucket("a") == 12); // 0xe40c292c
  CHECK(redis_cluster_layout::bucket("tg:42") == 16);
  CHECK(L.record(kind::chat, "tg:42") == "mybot:{ch:16}:r:tg%3A42");
  CHECK(L.record_index_of(kind::chat, "tg:42") == "mybot:{ch:16}:idx");
  CHECK(L.record(kind::contact, "contact-7") == "mybot:{ct:7}:r:contact-7");
  CHECK(L.record_index(kind::contact, 7) == "mybot:{ct:7}:idx");
  CHECK(L.record(kind::checkpoint, "order flow")
        == "mybot:{cp:5}:r:order%20flow");
  CHECK(L.record(kind::schedule, "sched-1") == "mybot:{sc:26}:r:sched-1");
  CHECK(L.record_index(kind::schedule, 26) == "mybot:{sc:26}:idx");
  CHECK(L.user_data("u{1}", "prefs", "lang")
        == "mybot:{ud:u%7B1%7D}:e:prefs:lang");
  CHECK(L.user_data_index("u{1}") == "mybot:{ud:u%7B1%7D}:idx");
  CHECK(L.lock("job*") == "mybot:{lk:job%2A}:l");
  CHECK(L.fence("job*") == "mybot:{lk:job%2A}:f");
  for (auto part : {"h", "q"})
    CHECK(L.turn("tg:42", part) == std::string{"mybot:co:{t:tg%3A42}:"} + part);
  CHECK(L.lead("telegram") == "mybot:co:{ld:telegram}");
  CHECK(L.lead_term("telegram") == "mybot:co:{ld:telegram}:term");
  CHECK(L.lease("sched") == "mybot:lease:sched");
  CHECK(L.heartbeat("r1-9") == "mybot:co:rep:r1-9");
}

TEST_CASE("cluster: the cluster layout refuses a prefix that would break its "
          "hash tags") {
  for (auto bad : {"", "my{bot", "bot}", "{x}"}) {
    CAPTURE(bad);
    try {
      redis_cluster_layout L{bad};
      FAIL("accepted a bad prefix");
    } catch (const botmesh::invalid_argument_error& e) {
      CHECK(e.field() == "prefix");
    }
  }
}

TEST_CASE("cluster: the keys of each cluster:v1 group share one slot and "
          "bucket tags do not depend on the prefix") {
  auto seed = test::node_client(test::seed_address());
  auto slot = [&](const std::string& k) {
    auto s = seed->call({"CLUSTER", "KEYSLOT", k}).integer;
    CHECK(s == redis_client::key_slot(k));
    return s;
  };
  redis_cluster_layout a{"bot-a"}, b{"bot-b"};
  for (std::string id : {"tg:1", "wa:5491100000000", "x{y}z", "a b*c?[d]"}) {
    CAPTURE(id);
    CHECK(slot(a.message_log(id)) == slot(a.message_item(id, "1")));
    CHECK(slot(a.message_log(id)) == slot(a.message_item(id, "999")));
    for (auto k : {kind::chat, kind::contact, kind::checkpoint, kind::schedule}) {
      CHECK(slot(a.record(k, id)) == slot(a.record_index_of(k, id)));
      // Another bot's records of this bucket are in the same slot.
      CHECK(slot(a.record(k, id)) == slot(b.record(k, id)));
    }
    CHECK(slot(a.user_data(id, "ns", "k1")) == slot(a.user_data_index(id)));
    CHECK(slot(a.user_data(id, "other", "k2")) == slot(a.user_data_index(id)));
    CHECK(slot(a.lock(id)) == slot(a.fence(id)));
    std::set<long long> turn_slots;
    for (auto part : {"h", "q"})
      turn_slots.insert(slot(a.turn(id, part)));
    CHECK(turn_slots.size() == 1);
    CHECK(slot(a.lead(id)) == slot(a.lead_term(id)));
  }
  // The 32 buckets of a kind spread over more than one slot.
  std::set<long long> slots;
  for (std::uint32_t i = 0; i < redis_cluster_layout::buckets; ++i)
    slots.insert(slot(a.record_index(kind::chat, i)));
  CHECK(slots.size() > 16);
}
