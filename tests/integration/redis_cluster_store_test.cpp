// The store, schedule-store and durable-backend conformance suites in the
// cluster:v1 layout, on the Redis Cluster and on one node; the exact keys
// each kind of record lands in; start()'s layout checks.

#include <doctest/doctest.h>

#include <atomic>
#include <set>
#include <thread>

#include <conformance/durable_conformance.hpp>
#include <conformance/schedule_store_conformance.hpp>
#include <conformance/store_conformance.hpp>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/internal/keyspace.hpp>
#include <botmesh/stores/redis/redis_cluster_layout.hpp>
#include <botmesh/stores/redis/redis_durable_backend.hpp>
#include <botmesh/stores/redis/redis_store.hpp>

#include "redis_cluster.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;
using kind = botmesh::redis_cluster_layout::record_kind;

namespace {

std::shared_ptr<botmesh::redis_client> cluster_client() {
  static auto c =
    std::make_shared<botmesh::redis_client>(test::cluster_options());
  return c;
}

std::shared_ptr<botmesh::redis_client> node_client() {
  static auto c = std::make_shared<botmesh::redis_client>(
    botmesh::redis_options{.url = test::redis_url()});
  return c;
}

// TTLs run on the server's clock: advance() lets real time pass.
struct cluster_store_factory {
  std::shared_ptr<botmesh::store> make() {
    auto s = std::make_shared<botmesh::redis_store>(botmesh::redis_store_options{
      .client = cluster_client(), .prefix = test::unique_prefix("bmcl")});
    s->start();
    return s;
  }
  void advance(std::chrono::milliseconds d) {
    std::this_thread::sleep_for(d);
  }
};

struct cluster_layout_one_node_factory {
  std::shared_ptr<botmesh::store> make() {
    auto s = std::make_shared<botmesh::redis_store>(botmesh::redis_store_options{
      .client = node_client(), .prefix = test::unique_prefix("bmcl1"),
      .layout = botmesh::redis_layout_kind::cluster});
    s->start();
    return s;
  }
  void advance(std::chrono::milliseconds d) {
    std::this_thread::sleep_for(d);
  }
};

struct cluster_schedule_factory {
  std::shared_ptr<botmesh::schedule_store> make() {
    botmesh::redis_store s{{.client = cluster_client(),
                            .prefix = test::unique_prefix("bmcl")}};
    return s.schedules();
  }
};

struct cluster_layout_one_node_schedule_factory {
  std::shared_ptr<botmesh::schedule_store> make() {
    botmesh::redis_store s{{.client = node_client(),
                            .prefix = test::unique_prefix("bmcl1"),
                            .layout = botmesh::redis_layout_kind::cluster}};
    return s.schedules();
  }
};

struct cluster_durable_factory {
  static constexpr std::chrono::milliseconds lease{300};
  std::string prefix = test::unique_prefix("bmcldur");

  std::shared_ptr<botmesh::durable_backend> make() {
    auto b = std::make_shared<botmesh::redis_durable_backend>(
      botmesh::redis_durable_options{.client = cluster_client(),
                                     .prefix = prefix});
    b->start();
    return b;
  }
  void advance(std::chrono::milliseconds d) {
    std::this_thread::sleep_for(d);
  }
};

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

template <class F>
std::string field_of(F&& f) {
  try {
    f();
  } catch (const botmesh::invalid_argument_error& e) {
    return e.field();
  }
  return {};
}

bool exists(botmesh::redis_client& c, const std::string& key) {
  return c.call({"EXISTS", key}).integer == 1;
}

} // namespace

TYPE_TO_STRING(cluster_store_factory);
TYPE_TO_STRING(cluster_layout_one_node_factory);
TYPE_TO_STRING(cluster_schedule_factory);
TYPE_TO_STRING(cluster_layout_one_node_schedule_factory);
TYPE_TO_STRING(cluster_durable_factory);
BOTMESH_STORE_CONFORMANCE(cluster_store_factory);
BOTMESH_STORE_CONFORMANCE(cluster_layout_one_node_factory);
BOTMESH_SCHEDULE_STORE_CONFORMANCE(cluster_schedule_factory);
BOTMESH_ASYNC_SCHEDULE_STORE_CONFORMANCE(cluster_schedule_factory);
BOTMESH_SCHEDULE_STORE_CONFORMANCE(cluster_layout_one_node_schedule_factory);
BOTMESH_ASYNC_SCHEDULE_STORE_CONFORMANCE(cluster_layout_one_node_schedule_factory);
BOTMESH_DURABLE_CONFORMANCE(cluster_durable_factory);

TEST_CASE("cluster: a cluster-layout store writes every kind of record under "
          "its exact cluster:v1 key") {
  auto c = cluster_client();
  auto prefix = test::unique_prefix("bmclk");
  botmesh::redis_store s{{.client = c, .prefix = prefix}};
  CHECK(s.layout() == botmesh::redis_layout_kind::cluster);
  s.start();
  botmesh::redis_cluster_layout L{prefix};
  CHECK(c->call({"GET", L.marker()}).str == "cluster:v1");
  s.save_chat({"tg:42", "tg", "42", "", botmesh::from_unix_ms(1),
               botmesh::from_unix_ms(2), "{}"});
  CHECK(exists(*c, L.record(kind::chat, "tg:42")));
  CHECK(c->call({"ZSCORE", L.record_index_of(kind::chat, "tg:42"), "tg:42"})
          .str == "0");
  s.save_contact({"tg:7", "Ana", "", botmesh::from_unix_ms(3), "{}"});
  CHECK(exists(*c, L.record(kind::contact, "tg:7")));
  CHECK(s.append_message("tg:42", {0, botmesh::direction::in, "m1", "u",
                                   "hola"})
        == 1);
  CHECK(exists(*c, L.message_item("tg:42", "1")));
  CHECK(c->call({"ZSCORE", L.message_log("tg:42"), "1"}).str == "1");
  auto cp = conformance::sample_checkpoint("tg:42");
  REQUIRE(s.set_checkpoint_if(cp, 0));
  CHECK(exists(*c, L.record(kind::checkpoint, "tg:42")));
  CHECK(c->call({"GET", L.checkpoint_revision("tg:42")}).str == "1");
  CHECK(c->call({"ZSCORE", L.record_index_of(kind::checkpoint, "tg:42"),
                 "tg:42"})
          .str == "inf");
  s.set_user_data("u:1", "prefs", "lang", R"("es")");
  CHECK(exists(*c, L.user_data("u:1", "prefs", "lang")));
  CHECK(c->call({"ZSCORE", L.user_data_index("u:1"), "prefs:lang"}).str
        == "inf");
  auto lock = s.acquire_lock_fenced("job", 10s);
  REQUIRE(lock);
  CHECK(c->call({"GET", L.lock("job")}).str == lock->token);
  CHECK(c->call({"GET", L.fence("job")}).str == "1");
  s.schedules()->register_task("daily", "every 1000", botmesh::from_unix_ms(5),
                               botmesh::from_unix_ms(0));
  CHECK(exists(*c, L.record(kind::schedule, "daily")));
  CHECK(s.leases()->try_acquire("sched", "me", botmesh::from_unix_ms(0), 10s));
  CHECK(exists(*c, L.lease("sched")));
  // A checkpoint whose revision is damaged is cleared, with its index
  // entry, only while it is.
  c->call({"HSET", L.record(kind::checkpoint, "tg:42"), "rev", "oops"});
  REQUIRE(s.set_checkpoint_if(cp, 0)); // (read as no live checkpoint)
  CHECK_FALSE(s.clear_damaged_checkpoint("tg:42"));
  c->call({"HSET", L.record(kind::checkpoint, "tg:42"), "rev", "-1"});
  CHECK(s.clear_damaged_checkpoint("tg:42"));
  CHECK_FALSE(exists(*c, L.record(kind::checkpoint, "tg:42")));
  CHECK(c->call({"ZSCORE", L.record_index_of(kind::checkpoint, "tg:42"),
                 "tg:42"})
          .is_nil());
  REQUIRE(s.set_checkpoint_if(cp, 0));
  // Clearing a checkpoint leaves its index; its revision key stays.
  s.clear_checkpoint("tg:42");
  CHECK(c->call({"ZSCORE", L.record_index_of(kind::checkpoint, "tg:42"),
                 "tg:42"})
          .is_nil());
  CHECK(exists(*c, L.checkpoint_revision("tg:42")));
}

TEST_CASE("cluster: deleting a chat removes a log longer than one batch, item "
          "by item with its entry") {
  auto c = cluster_client();
  auto prefix = test::unique_prefix("bmcld");
  botmesh::redis_store s{
    {.client = c, .prefix = prefix, .max_log_per_chat = 5000}};
  s.start();
  botmesh::redis_cluster_layout L{prefix};
  s.save_chat({"tg:1", "tg", "1", "", botmesh::from_unix_ms(1),
               botmesh::from_unix_ms(1), "{}"});
  for (int i = 1; i <= 2345; ++i)
    REQUIRE(s.append_message("tg:1", {0, botmesh::direction::in,
                                      "m" + std::to_string(i), "u", "x"})
            == static_cast<std::uint64_t>(i));
  CHECK(s.messages("tg:1", 3).back().seq == 2345);
  CHECK(s.delete_chat("tg:1"));
  CHECK_FALSE(exists(*c, L.message_log("tg:1")));
  CHECK_FALSE(exists(*c, L.message_item("tg:1", "1")));
  CHECK_FALSE(exists(*c, L.message_item("tg:1", "2345")));
  CHECK(s.list_chats().empty());
  // A new log starts again at 1.
  CHECK(s.append_message("tg:1", {0, botmesh::direction::in, "n", "u", "y"})
        == 1);
}

TEST_CASE("cluster: a log over its cap drops its oldest entries with their "
          "items") {
  auto c = cluster_client();
  auto prefix = test::unique_prefix("bmclc");
  botmesh::redis_store s{
    {.client = c, .prefix = prefix, .max_log_per_chat = 3}};
  botmesh::redis_cluster_layout L{prefix};
  for (int i = 1; i <= 5; ++i)
    s.append_message("tg:1", {0, botmesh::direction::in, "m", "u", "x"});
  auto log = s.messages("tg:1", 10);
  REQUIRE(log.size() == 3);
  CHECK(log.front().seq == 3);
  CHECK(log.back().seq == 5);
  CHECK_FALSE(exists(*c, L.message_item("tg:1", "2")));
  CHECK(c->call({"ZCARD", L.message_log("tg:1")}).integer == 3);
}

TEST_CASE("cluster: appends that trim at once keep the newest entries up to "
          "the cap, never fewer") {
  auto c = cluster_client();
  auto prefix = test::unique_prefix("bmclt");
  constexpr std::size_t cap = 10;
  botmesh::redis_store s{
    {.client = c, .prefix = prefix, .max_log_per_chat = cap}};
  botmesh::redis_cluster_layout L{prefix};
  auto z = L.message_log("tg:1");
  for (std::size_t i = 0; i < cap; ++i)
    s.append_message("tg:1", {0, botmesh::direction::in, "m", "u", "x"});
  // Each append's trim ran with the count its own script saw: two trims
  // over one entry each deleted the oldest one, then the next two, and the
  // log fell under its cap until later appends filled it again.
  std::atomic<bool> writing{true};
  std::atomic<long long> fewest{static_cast<long long>(cap)};
  std::thread watcher{[&] {
    while (writing.load()) {
      auto n = c->call({"ZCARD", z}).integer;
      if (n < fewest.load())
        fewest = n;
    }
  }};
  std::vector<std::thread> writers;
  for (int t = 0; t < 6; ++t)
    writers.emplace_back([&] {
      for (int i = 0; i < 150; ++i)
        s.append_message("tg:1", {0, botmesh::direction::in, "m", "u", "x"});
    });
  for (auto& w : writers)
    w.join();
  writing = false;
  watcher.join();
  CHECK(fewest.load() == static_cast<long long>(cap));
  auto last = static_cast<std::uint64_t>(cap + 6 * 150);
  auto log = s.messages("tg:1", 100);
  REQUIRE(log.size() == cap);
  CHECK(log.front().seq == last - cap + 1);
  CHECK(log.back().seq == last);
}

TEST_CASE("cluster: expired ephemeral checkpoints leave their bucket's index "
          "when the bucket is written again") {
  auto c = cluster_client();
  auto prefix = test::unique_prefix("bmclx");
  botmesh::redis_store s{{.client = c, .prefix = prefix}};
  s.start();
  botmesh::redis_cluster_layout L{prefix};
  auto idx = L.record_index_of(kind::checkpoint, "tg:0");
  std::vector<std::string> keys; // four chats of one bucket
  for (int i = 0; keys.size() < 4; ++i)
    if (auto k = "tg:" + std::to_string(i);
        L.record_index_of(kind::checkpoint, k) == idx)
      keys.push_back(k);
  auto expiry = std::chrono::time_point_cast<std::chrono::milliseconds>(
                  std::chrono::system_clock::now())
                + 500ms;
  for (int i = 0; i < 3; ++i) {
    auto cp = conformance::sample_checkpoint(keys[i]);
    cp.ephemeral = true;
    cp.expires_at = expiry;
    s.set_checkpoint(cp);
  }
  CHECK(c->call({"ZCARD", idx}).integer == 3);
  std::this_thread::sleep_until(expiry + 200ms); // the server's clock too
  s.set_checkpoint(conformance::sample_checkpoint(keys[3]));
  CHECK(c->call({"ZRANGE", idx, "0", "-1"}).elements.size() == 1);
  CHECK(s.get_checkpoint(keys[3]).has_value());
  CHECK_FALSE(s.get_checkpoint(keys[0]).has_value());
}

TEST_CASE("cluster: a log cap of 0 is refused in both layouts") {
  CHECK(field_of([] {
          botmesh::redis_store s{{.client = cluster_client(),
                                  .prefix = test::unique_prefix("bmcl0"),
                                  .max_log_per_chat = 0}};
        })
        == "max_log_per_chat");
  CHECK(field_of([] {
          botmesh::redis_store s{{.client = node_client(),
                                  .prefix = test::unique_prefix("bmcl0"),
                                  .max_log_per_chat = 0}};
        })
        == "max_log_per_chat");
}

TEST_CASE("cluster: a log's seq from 1e14 is written as an integer, not in "
          "Lua's 1e+14") {
  auto c = cluster_client();
  auto prefix = test::unique_prefix("bmclb");
  botmesh::redis_store s{{.client = c, .prefix = prefix}};
  botmesh::redis_cluster_layout L{prefix};
  s.append_message("tg:1", {0, botmesh::direction::in, "m1", "u", "a"});
  // The entry renumbered just below 1e14.
  std::string high = "99999999999999";
  auto item = c->call({"GET", L.message_item("tg:1", "1")}).str;
  REQUIRE(item.starts_with("{\"seq\":1,"));
  item = "{\"seq\":" + high + "," + item.substr(std::string{"{\"seq\":1,"}.size());
  c->call({"SET", L.message_item("tg:1", high), item});
  c->call({"ZADD", L.message_log("tg:1"), high, high});
  c->call({"ZREM", L.message_log("tg:1"), "1"});
  c->call({"DEL", L.message_item("tg:1", "1")});
  CHECK(s.append_message("tg:1", {0, botmesh::direction::in, "m2", "u", "b"})
        == 100000000000000);
  auto log = s.messages("tg:1", 10);
  REQUIRE(log.size() == 2);
  CHECK(log[0].seq == 99999999999999);
  CHECK(log[1].seq == 100000000000000);
  CHECK(log[1].text == "b");
  CHECK(c->call({"ZSCORE", L.message_log("tg:1"), "100000000000000"}).type
        == botmesh::redis_reply::kind::string);
}

TEST_CASE("cluster: damaged cluster-layout records read back as errors naming "
          "the key, and the rest of the keyspace stays readable") {
  auto c = cluster_client();
  auto prefix = test::unique_prefix("bmclx");
  botmesh::redis_store s{{.client = c, .prefix = prefix}};
  botmesh::redis_cluster_layout L{prefix};
  s.append_message("tg:1", {0, botmesh::direction::in, "m1", "u", "a"});
  s.append_message("tg:1", {0, botmesh::direction::in, "m2", "u", "b"});
  c->call({"SET", L.message_item("tg:1", "2"), "{not json"});
  auto what = what_of([&] { s.messages("tg:1", 10); });
  CHECK(what.find(L.message_item("tg:1", "2")) != std::string::npos);
  c->call({"DEL", L.message_item("tg:1", "2")});
  what = what_of([&] { s.messages("tg:1", 10); });
  CHECK(what.find("item is missing") != std::string::npos);
  // Other chats, and new writes, are unaffected.
  s.append_message("tg:2", {0, botmesh::direction::in, "m", "u", "c"});
  CHECK(s.messages("tg:2", 10).size() == 1);
  s.save_chat({"tg:3", "tg", "3", "", botmesh::from_unix_ms(1),
               botmesh::from_unix_ms(1), "{}"});
  c->call({"HSET", L.record(kind::chat, "tg:3"), "created_at", "yesterday"});
  what = what_of([&] { s.get_chat("tg:3"); });
  CHECK(what.find(L.record(kind::chat, "tg:3")) != std::string::npos);
  CHECK(what.find("\"created_at\" is not an integer") != std::string::npos);
  auto sched = s.schedules();
  sched->register_task("job", "every 1000", botmesh::from_unix_ms(1),
                       botmesh::from_unix_ms(0));
  c->call({"HSET", L.record(kind::schedule, "job"), "token", "x"});
  what = what_of([&] { sched->list(); });
  CHECK(what.find(L.record(kind::schedule, "job")) != std::string::npos);
}

TEST_CASE("cluster: layout options are checked when the store is created") {
  CHECK(field_of([] {
          botmesh::redis_store s{{.client = cluster_client(),
                                  .prefix = "x",
                                  .layout = botmesh::redis_layout_kind::legacy}};
        })
        == "layout");
  CHECK(field_of([] {
          botmesh::redis_store s{{.client = node_client(),
                                  .prefix = "my{bot}",
                                  .layout = botmesh::redis_layout_kind::cluster}};
        })
        == "prefix");
  CHECK(field_of([] {
          botmesh::redis_store s{{.client = cluster_client(), .prefix = "a}"}};
        })
        == "prefix");
  CHECK(field_of([] {
          botmesh::redis_store s{{.url = "redis://127.0.0.1:1",
                                  .cluster = test::cluster_options()}};
        })
        == "cluster");
  // The cluster option makes a client of its own, in the cluster layout.
  botmesh::redis_store own{{.prefix = test::unique_prefix("bmclo"),
                            .cluster = test::cluster_options()}};
  CHECK(own.layout() == botmesh::redis_layout_kind::cluster);
  CHECK(own.client().is_cluster());
  own.start();
  // Without a cluster, automatic is legacy.
  botmesh::redis_store one{{.client = node_client(), .prefix = "x"}};
  CHECK(one.layout() == botmesh::redis_layout_kind::legacy);
}

TEST_CASE("cluster: a cluster-layout store on one node refuses a prefix that "
          "holds legacy keys until migrated or allowed") {
  auto c = node_client();
  auto prefix = test::unique_prefix("bmclm");
  botmesh::redis_store legacy{{.client = c, .prefix = prefix}};
  legacy.start();
  legacy.save_chat({"tg:1", "tg", "1", "", botmesh::from_unix_ms(1),
                    botmesh::from_unix_ms(1), "{}"});
  botmesh::redis_store_options o{.client = c, .prefix = prefix,
                                 .layout = botmesh::redis_layout_kind::cluster};
  botmesh::redis_store cl{o};
  auto what = what_of([&] { cl.start(); });
  CHECK(what.find("run the migration first") != std::string::npos);
  CHECK(what.find(prefix + ":chat") != std::string::npos);
  CHECK(field_of([&] { cl.start(); }) == "layout");
  // Nothing was written, nothing lost.
  CHECK(c->call({"EXISTS", prefix + ":{meta}:layout"}).integer == 0);
  CHECK(legacy.get_chat("tg:1"));
  o.allow_legacy_data = true;
  botmesh::redis_store allowed{o};
  allowed.start();
  // A marker of another version is refused by name.
  auto other = test::unique_prefix("bmclm");
  c->call({"SET", other + ":{meta}:layout", "cluster:v9"});
  botmesh::redis_store v9{{.client = c, .prefix = other,
                           .layout = botmesh::redis_layout_kind::cluster}};
  what = what_of([&] { v9.start(); });
  CHECK(what.find("cluster:v9") != std::string::npos);
}

TEST_CASE("cluster: a marked prefix lets a cluster-layout store start and "
          "makes a legacy store warn") {
  auto c = node_client();
  auto prefix = test::unique_prefix("bmclw");
  botmesh::redis_store legacy_seed{{.client = c, .prefix = prefix}};
  legacy_seed.save_contact({"tg:1", "Ana", "", botmesh::from_unix_ms(1), "{}"});
  c->call({"SET", prefix + ":{meta}:layout", "cluster:v1"});
  botmesh::redis_store cl{{.client = c, .prefix = prefix,
                           .layout = botmesh::redis_layout_kind::cluster}};
  cl.start(); // the marker says the migration completed
  std::vector<std::string> warnings;
  botmesh::redis_store legacy{
    {.client = c, .prefix = prefix,
     .warn = [&](std::string_view w) { warnings.emplace_back(w); }}};
  legacy.start();
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find(prefix + ":{meta}:layout") != std::string::npos);
  CHECK(warnings[0].find("legacy") != std::string::npos);
  // A fresh prefix gets the marker from the first cluster-layout store.
  auto fresh = test::unique_prefix("bmclw");
  botmesh::redis_store first{{.client = c, .prefix = fresh,
                              .layout = botmesh::redis_layout_kind::cluster}};
  first.start();
  CHECK(c->call({"GET", fresh + ":{meta}:layout"}).str == "cluster:v1");
}

TEST_CASE("cluster: a chat deleted while messages are appended leaves every "
          "log entry with its item and no item without its entry") {
  auto c = node_client();
  auto prefix = test::unique_prefix("bmclr");
  botmesh::redis_store s{{.client = c, .prefix = prefix,
                          .max_log_per_chat = 100'000,
                          .layout = botmesh::redis_layout_kind::cluster}};
  botmesh::redis_cluster_layout L{prefix};
  for (int i = 0; i < 2500; ++i)
    s.append_message("tg:1", {0, botmesh::direction::in, "m", "u", "old"});
  std::atomic<bool> deleting{false};
  std::thread writer{[&] {
    while (!deleting)
      std::this_thread::yield();
    for (int i = 0; i < 500; ++i)
      s.append_message("tg:1", {0, botmesh::direction::in, "m", "u", "new"});
  }};
  deleting = true;
  s.delete_chat("tg:1");
  writer.join();
  // Whatever the interleaving: the log and its items agree, in order.
  auto members = c->call({"ZRANGE", L.message_log("tg:1"), "0", "-1"});
  std::set<std::string> listed;
  for (auto& m : members.elements)
    listed.insert(m.str);
  std::set<std::string> items;
  std::string cursor = "0";
  auto match = botmesh::internal::escape_glob(L.message_item("tg:1", "")) + "*";
  do {
    auto r = c->call({"SCAN", cursor, "MATCH", match, "COUNT", "1000"});
    cursor = r.elements[0].str;
    for (auto& k : r.elements[1].elements)
      items.insert(k.str.substr(L.message_item("tg:1", "").size()));
  } while (cursor != "0");
  CHECK(items == listed);
  auto log = s.messages("tg:1", 100'000);
  CHECK(log.size() == listed.size());
  for (size_t i = 1; i < log.size(); ++i)
    CHECK(log[i].seq > log[i - 1].seq);
  // Every message that survived was appended during the deletion.
  for (auto& m : log)
    CHECK(m.text == "new");
}
