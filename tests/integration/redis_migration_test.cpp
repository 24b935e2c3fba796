// Migration between the legacy and the cluster:v1 layouts, on the real
// standalone Redis (REDIS_URL) and the 6-node cluster (REDIS_CLUSTER_URL):
// in place and to the cluster, dry run, include, overwrite, delete-source,
// rollback with and without mirror, on seeded data with expiring
// checkpoints and user data, lock fences, schedules with tombstones,
// orphan and foreign message items and damaged records.

#include <doctest/doctest.h>

#include <atomic>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/redis_cluster_layout.hpp>
#include <botmesh/stores/redis/redis_migration.hpp>
#include <botmesh/stores/redis/redis_store.hpp>

#include "redis_cluster.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;
using botmesh::redis_layout_kind;
using botmesh::redis_migration_direction;
using kind = botmesh::redis_cluster_layout::record_kind;

namespace {

std::shared_ptr<botmesh::redis_client> node() {
  static auto c = std::make_shared<botmesh::redis_client>(
    botmesh::redis_options{.url = test::redis_url()});
  return c;
}

std::shared_ptr<botmesh::redis_client> cluster() {
  static auto c =
    std::make_shared<botmesh::redis_client>(test::cluster_options());
  return c;
}

botmesh::time_point now_ms() {
  return std::chrono::time_point_cast<std::chrono::milliseconds>(
    std::chrono::system_clock::now());
}

botmesh::chat_record chat(std::string key) {
  return {key, "tg", key.substr(3), "", botmesh::from_unix_ms(1000),
          botmesh::from_unix_ms(2000), R"({"vip":true})"};
}

botmesh::logged_message msg(std::string text) {
  return {0, botmesh::direction::in, "id-" + text, "u", text};
}

// What a legacy bot leaves behind: every kind of record.
struct seeded {
  std::uint64_t lock_fence = 0;
  std::uint64_t once_token = 0;
  std::uint64_t cp_revision = 0;
};

seeded seed(botmesh::redis_store& s) {
  seeded out;
  s.save_chat(chat("tg:1"));
  s.save_chat(chat("tg:2"));
  s.save_contact({"tg:1", "Ana", "+34", botmesh::from_unix_ms(5), "{}"});
  for (auto t : {"uno", "dos", "tres"})
    s.append_message("tg:1", msg(t));
  s.append_message("tg:2", msg("solo"));
  auto cp = botmesh::flow_checkpoint{};
  cp.key = "tg:1";
  cp.flow = "pedido";
  s.set_checkpoint(cp);
  out.cp_revision = s.set_checkpoint(cp); // revision 2
  auto eph = cp;
  eph.key = "tg:2";
  eph.ephemeral = true;
  eph.expires_at = now_ms() + 60s;
  s.set_checkpoint(eph);
  s.set_user_data("tg:1", "prefs", "lang", R"("es")");
  s.set_user_data("tg:1", "prefs", "tmp", R"(1)", 60s);
  for (int i = 0; i < 3; ++i) {
    auto l = s.acquire_lock_fenced("job", 10s);
    out.lock_fence = l->fence;
    s.release_lock("job", l->token);
  }
  auto sc = s.schedules();
  auto t0 = botmesh::from_unix_ms(1'780'000'000'000);
  sc->register_task("daily", "every 86400000", t0, t0);
  sc->register_task("once", "delay 1000", t0 + 1s, t0);
  auto c = sc->claim("once", "r1", t0 + 1s, 10s);
  out.once_token = c->token;
  sc->commit("once", "r1", c->token, t0 + 1s, true, t0 + 2s);
  sc->remove("once", t0 + 3s); // a tombstone
  s.leases()->try_acquire("sched", "r1", t0, 10min);
  return out;
}

botmesh::redis_store legacy_store(std::shared_ptr<botmesh::redis_client> c,
                                  const std::string& prefix) {
  return botmesh::redis_store{{.client = std::move(c), .prefix = prefix,
                               .layout = redis_layout_kind::legacy}};
}

botmesh::redis_store cluster_store(std::shared_ptr<botmesh::redis_client> c,
                                   const std::string& prefix) {
  return botmesh::redis_store{{.client = std::move(c), .prefix = prefix,
                               .layout = redis_layout_kind::cluster}};
}

// The data a store gives back, for comparing two stores.
void check_same_data(botmesh::store& a, botmesh::store& b) {
  CHECK(a.list_chats() == b.list_chats());
  CHECK(a.list_contacts() == b.list_contacts());
  for (auto k : {"tg:1", "tg:2"}) {
    auto ma = a.messages(k, 100);
    auto mb = b.messages(k, 100);
    REQUIRE(ma.size() == mb.size());
    for (size_t i = 0; i < ma.size(); ++i) {
      CHECK(ma[i].seq == mb[i].seq);
      CHECK(ma[i].text == mb[i].text);
    }
    auto ca = a.get_checkpoint(k);
    auto cb = b.get_checkpoint(k);
    REQUIRE(ca.has_value() == cb.has_value());
    if (ca)
      CHECK(ca->revision == cb->revision);
  }
  CHECK(a.list_user_data("tg:1", "prefs") == b.list_user_data("tg:1", "prefs"));
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

} // namespace

TEST_CASE("migration: a dry run counts every kind and writes nothing") {
  auto prefix = test::unique_prefix("bmmig");
  auto legacy = legacy_store(node(), prefix);
  seed(legacy);
  auto before = botmesh::inspect_keyspace(*node(), prefix);
  CHECK(before.legacy.at("chats") == 3); // 2 records + the index
  CHECK(before.cluster.empty());
  auto rep = botmesh::migrate_redis_layout(
    {.source = node(), .prefix = prefix, .dry_run = true});
  CHECK(rep.dry_run);
  CHECK(rep.kinds.at("chats").copied == 2);
  CHECK(rep.kinds.at("contacts").copied == 1);
  CHECK(rep.kinds.at("messages").copied == 4);
  CHECK(rep.kinds.at("checkpoints").copied == 2);
  CHECK(rep.kinds.at("user_data").copied == 2);
  CHECK(rep.kinds.at("locks").copied == 1);
  CHECK(rep.kinds.at("schedules").copied == 2);
  CHECK(rep.layout_marker == "not written: dry run");
  auto after = botmesh::inspect_keyspace(*node(), prefix);
  CHECK(after.cluster.empty());
  CHECK_FALSE(after.marker.has_value());
  CHECK(after.legacy == before.legacy);
}

TEST_CASE("migration: legacy to cluster in place keeps every record, TTL, "
          "fence and token, is idempotent, and lets a cluster-layout store "
          "start") {
  auto prefix = test::unique_prefix("bmmig");
  auto legacy = legacy_store(node(), prefix);
  auto seeded = seed(legacy);
  auto cl = cluster_store(node(), prefix);
  CHECK(what_of([&] { cl.start(); }).find("run the migration first")
        != std::string::npos);
  auto rep = botmesh::migrate_redis_layout({.source = node(), .prefix = prefix});
  CHECK(rep.layout_marker == "written");
  CHECK(rep.problems.empty());
  CHECK(rep.kinds.at("messages").copied == 4);
  CHECK(rep.kinds.at("unchanged").copied == 0); // same server: not copied
  cl.start();
  check_same_data(legacy, cl);
  botmesh::redis_cluster_layout L{prefix};
  // TTLs kept: the ephemeral checkpoint and the expiring user data.
  auto pttl = node()->call({"PTTL", L.record(kind::checkpoint, "tg:2")}).integer;
  CHECK(pttl > 0);
  CHECK(pttl <= 60'000);
  CHECK(node()->call({"PTTL", L.user_data("tg:1", "prefs", "tmp")}).integer
        > 0);
  CHECK(node()->call({"PTTL", L.user_data("tg:1", "prefs", "lang")}).integer
        == -1);
  // Fences and revisions continue; the tombstone keeps its token.
  auto l = cl.acquire_lock_fenced("job", 10s);
  REQUIRE(l);
  CHECK(l->fence == seeded.lock_fence + 1);
  auto cp = *cl.get_checkpoint("tg:1");
  CHECK(cp.revision == seeded.cp_revision);
  CHECK(*cl.set_checkpoint_if(cp, cp.revision) == seeded.cp_revision + 1);
  auto once = cl.schedules()->get("once");
  REQUIRE(once);
  CHECK(once->deleted);
  CHECK(once->fencing_token == seeded.once_token);
  CHECK(cl.schedules()->list().size() == 2);
  // New messages continue the sequence.
  CHECK(cl.append_message("tg:1", msg("cuatro")) == 4);
  // Again: everything is already there and wins.
  auto again = botmesh::migrate_redis_layout({.source = node(), .prefix = prefix});
  CHECK(again.kinds.at("chats").copied == 0);
  CHECK(again.kinds.at("chats").kept == 2);
  CHECK(again.kinds.at("messages").kept == 4);
  CHECK(cl.messages("tg:1", 10).size() == 4);
}

TEST_CASE("migration: legacy to the cluster copies the shared-name keys too") {
  auto prefix = test::unique_prefix("bmmig");
  auto legacy = legacy_store(node(), prefix);
  seed(legacy);
  auto rep = botmesh::migrate_redis_layout(
    {.source = node(), .target = cluster(), .prefix = prefix});
  CHECK(rep.layout_marker == "written");
  CHECK(rep.kinds.at("unchanged").copied == 1); // the lease
  botmesh::redis_store cl{{.client = cluster(), .prefix = prefix}};
  cl.start();
  check_same_data(legacy, cl);
  CHECK(cluster()->call({"HGET", prefix + ":lease:sched", "owner"}).str
        == "r1");
  // Nothing was written to the source's cluster names.
  CHECK(botmesh::inspect_keyspace(*node(), prefix).cluster.empty());
}

TEST_CASE("migration: a cluster target with a password and an address map is "
          "read on every master with both") {
  // One node serving every slot, asking for a password: what the spec's
  // deployments look like, in small.
  auto secured = test::redis_process::cluster_node("s3cret");
  auto addr = "127.0.0.1:" + std::to_string(secured.port());
  {
    botmesh::redis_client admin{
      botmesh::redis_options{.url = "redis://:s3cret@" + addr}};
    admin.call({"CLUSTER", "ADDSLOTSRANGE", "0", "16383"});
    REQUIRE(test::eventually([&] {
      return admin.call({"CLUSTER", "INFO"}).str.find("cluster_state:ok")
             != std::string::npos;
    }));
  }
  std::atomic<int> mapped{0};
  botmesh::redis_cluster_options o{.root_nodes = {addr}, .password = "s3cret"};
  o.node_address_map = [&](std::string_view a) {
    ++mapped;
    return std::string{a};
  };
  auto target = std::make_shared<botmesh::redis_client>(o);
  auto prefix = test::unique_prefix("bmmig");
  auto legacy = legacy_store(node(), prefix);
  seed(legacy);
  auto before = mapped.load();
  // Without allow_live, the target's keyspace is scanned first.
  auto rep = botmesh::migrate_redis_layout(
    {.source = node(), .target = target, .prefix = prefix});
  CHECK(rep.problems.empty());
  CHECK(rep.kinds.at("chats").copied == 2);
  auto seen = botmesh::inspect_keyspace(*target, prefix);
  CHECK(seen.cluster.at("chats") == 4); // 2 records + their buckets' indexes
  CHECK(mapped.load() > before);
}

TEST_CASE("migration: a pass limited by include copies those kinds only and "
          "leaves the marker unwritten") {
  auto prefix = test::unique_prefix("bmmig");
  auto legacy = legacy_store(node(), prefix);
  seed(legacy);
  auto rep = botmesh::migrate_redis_layout(
    {.source = node(), .prefix = prefix, .include = {"chats", "messages"}});
  CHECK(rep.kinds.count("contacts") == 0);
  CHECK(rep.kinds.at("chats").copied == 2);
  CHECK(rep.layout_marker == "not written: a pass limited by include");
  auto ks = botmesh::inspect_keyspace(*node(), prefix);
  CHECK(ks.cluster.count("contacts") == 0);
  CHECK(ks.cluster.at("chats") >= 3); // 2 records + their buckets' indexes
  auto cl = cluster_store(node(), prefix);
  CHECK(what_of([&] { cl.start(); }).find("run the migration first")
        != std::string::npos);
  CHECK(what_of([] {
          botmesh::migrate_redis_layout(
            {.source = node(), .prefix = "x", .include = {"chat"}});
        }).find("unknown kind \"chat\"")
        != std::string::npos);
}

TEST_CASE("migration: an existing target record wins unless overwrite, a "
          "greater source schedule token always wins and is never lowered") {
  auto prefix = test::unique_prefix("bmmig");
  auto legacy = legacy_store(node(), prefix);
  seed(legacy);
  botmesh::migrate_redis_layout({.source = node(), .prefix = prefix});
  auto cl = cluster_store(node(), prefix);
  cl.start();
  auto renamed = chat("tg:1");
  renamed.data = R"({"moved":true})";
  cl.save_chat(renamed);
  // The legacy side moves a schedule on (a greater token).
  auto t0 = botmesh::from_unix_ms(1'780'000'000'000);
  auto c = legacy.schedules()->claim("daily", "r2", t0, 10s);
  REQUIRE(c);
  auto rep = botmesh::migrate_redis_layout({.source = node(), .prefix = prefix});
  CHECK(cl.get_chat("tg:1")->data == R"({"moved":true})");
  CHECK(rep.kinds.at("schedules").copied == 1); // "daily": greater token
  CHECK(cl.schedules()->get("daily")->fencing_token == c->token);
  // The cluster side's token goes higher; an overwrite keeps it.
  auto c2 = cl.schedules()->claim("daily", "r3", t0 + 1h, 10s);
  REQUIRE(c2);
  auto over = botmesh::migrate_redis_layout(
    {.source = node(), .prefix = prefix, .overwrite = true});
  CHECK(over.kinds.at("chats").copied == 2);
  CHECK(cl.get_chat("tg:1")->data == R"({"vip":true})");
  CHECK(cl.schedules()->get("daily")->fencing_token == c2->token);
  CHECK(cl.schedules()->get("daily")->lease_owner == "r2");
}

TEST_CASE("migration: delete-source removes the copied legacy keys and keeps "
          "the shared ones in place") {
  auto prefix = test::unique_prefix("bmmig");
  auto legacy = legacy_store(node(), prefix);
  seed(legacy);
  auto rep = botmesh::migrate_redis_layout(
    {.source = node(), .prefix = prefix, .delete_source = true});
  CHECK(rep.kinds.at("chats").deleted >= 2);
  auto ks = botmesh::inspect_keyspace(*node(), prefix);
  CHECK(ks.legacy.empty());
  CHECK(ks.unchanged.at("lease") == 1);
  auto cl = cluster_store(node(), prefix);
  cl.start();
  CHECK(cl.list_chats().size() == 2);
  CHECK(cl.messages("tg:1", 10).size() == 3);
}

TEST_CASE("migration: refused while a bot is live, unless allowed") {
  auto prefix = test::unique_prefix("bmmig");
  auto legacy = legacy_store(node(), prefix);
  seed(legacy);
  node()->call({"SET", prefix + ":co:rep:inc-1", "r1", "PX", "60000"});
  auto what = what_of([&] {
    botmesh::migrate_redis_layout({.source = node(), .prefix = prefix});
  });
  CHECK(what.find("1 live coordinator heartbeat") != std::string::npos);
  CHECK(botmesh::inspect_keyspace(*node(), prefix).cluster.empty());
  auto rep = botmesh::migrate_redis_layout(
    {.source = node(), .prefix = prefix, .allow_live = true});
  CHECK(rep.layout_marker == "written");
  // A live target blocks too.
  auto other = test::unique_prefix("bmmig");
  auto seed_other = legacy_store(node(), other);
  seed_other.save_chat(chat("tg:1"));
  cluster()->call({"SET", other + ":co:rep:inc-2", "r2", "PX", "60000"});
  what = what_of([&] {
    botmesh::migrate_redis_layout(
      {.source = node(), .target = cluster(), .prefix = other});
  });
  CHECK(what.find("target") != std::string::npos);
  CHECK(what.find("1 live coordinator heartbeat") != std::string::npos);
}

TEST_CASE("migration: a damaged record is reported by key, not copied, not "
          "deleted, and the marker stays unwritten") {
  auto prefix = test::unique_prefix("bmmig");
  auto legacy = legacy_store(node(), prefix);
  seed(legacy);
  node()->call({"HDEL", prefix + ":chat:tg:2", "provider"});
  node()->call({"RPUSH", prefix + ":log:tg:2", "{broken"});
  auto rep = botmesh::migrate_redis_layout(
    {.source = node(), .prefix = prefix, .delete_source = true});
  REQUIRE(rep.problems.size() == 2);
  CHECK(rep.problems[0].find(prefix + ":chat:tg:2") != std::string::npos);
  CHECK(rep.problems[0].find("\"provider\" is missing") != std::string::npos);
  CHECK(rep.problems[1].find(prefix + ":log:tg:2") != std::string::npos);
  CHECK(rep.layout_marker.starts_with("not written: 2 record(s)"));
  CHECK(node()->call({"EXISTS", prefix + ":chat:tg:2"}).integer == 1);
  CHECK(node()->call({"EXISTS", prefix + ":log:tg:2"}).integer == 1);
  CHECK(node()->call({"EXISTS", prefix + ":chats"}).integer == 1);
  // The good records moved.
  CHECK(node()->call({"EXISTS", prefix + ":chat:tg:1"}).integer == 0);
  // The store still refuses: the pass was not complete.
  auto cl = cluster_store(node(), prefix);
  CHECK(what_of([&] { cl.start(); }).find("run the migration first")
        != std::string::npos);
}

TEST_CASE("migration: a rollback from the cluster mirrors it into the legacy "
          "layout, prunes what the cluster no longer has and deletes the "
          "marker") {
  auto prefix = test::unique_prefix("bmmig");
  auto legacy = legacy_store(node(), prefix);
  auto seeded = seed(legacy);
  botmesh::migrate_redis_layout(
    {.source = node(), .target = cluster(), .prefix = prefix});
  botmesh::redis_store cl{{.client = cluster(), .prefix = prefix}};
  cl.start();
  // Life goes on in the cluster.
  CHECK(cl.delete_chat("tg:2"));
  cl.save_chat(chat("tg:3"));
  cl.append_message("tg:3", msg("nuevo"));
  cl.append_message("tg:1", msg("cuatro"));
  cl.clear_checkpoint("tg:1");
  CHECK(cl.delete_user_data("tg:1", "prefs", "lang"));
  CHECK(cl.delete_contact("tg:1"));
  auto t0 = botmesh::from_unix_ms(1'780'000'000'000);
  CHECK(cl.schedules()->remove("daily", t0 + 5s));
  // A schedule only the legacy side has (registered after the migration).
  legacy.schedules()->register_task("legacy-only", "every 1000", t0, t0);
  auto lo = legacy.schedules()->claim("legacy-only", "r1", t0, 10s);
  REQUIRE(lo);
  botmesh::redis_cluster_layout L{prefix};
  // An item no log references, and one in the wrong log position.
  cluster()->call({"SET", L.message_item("tg:1", "99"), "{}"});
  cluster()->call({"SET", L.message_item("tg:3", "1"),
                   R"({"seq":7,"dir":0,"id":"x","sender":"u","text":"t",)"
                   R"("type":"text","at":1})"});
  auto dry = botmesh::migrate_redis_layout(
    {.source = cluster(), .target = node(), .prefix = prefix,
     .direction = redis_migration_direction::cluster_to_legacy,
     .dry_run = true});
  CHECK(dry.pruned > 0);
  CHECK(legacy.get_chat("tg:2")); // nothing written yet
  auto rep = botmesh::migrate_redis_layout(
    {.source = cluster(), .target = node(), .prefix = prefix,
     .direction = redis_migration_direction::cluster_to_legacy});
  CHECK(rep.layout_marker == "deleted");
  CHECK(rep.pruned == dry.pruned);
  REQUIRE(rep.orphans.size() == 1);
  CHECK(rep.orphans[0] == L.message_item("tg:1", "99"));
  REQUIRE(rep.foreign.size() == 1);
  CHECK(rep.foreign[0] == L.message_item("tg:3", "1"));
  CHECK(cluster()->call({"EXISTS", L.marker()}).integer == 0);
  // The legacy side now equals the cluster (the foreign item aside).
  CHECK_FALSE(legacy.get_chat("tg:2"));
  CHECK(legacy.messages("tg:2", 10).empty());
  CHECK(legacy.get_chat("tg:3"));
  CHECK(legacy.messages("tg:1", 10).size() == 4);
  CHECK_FALSE(legacy.get_checkpoint("tg:1"));
  CHECK(legacy.get_checkpoint("tg:2"));
  CHECK_FALSE(legacy.get_user_data("tg:1", "prefs", "lang"));
  CHECK(legacy.get_user_data("tg:1", "prefs", "tmp"));
  CHECK_FALSE(legacy.get_contact("tg:1"));
  CHECK(legacy.schedules()->get("daily")->deleted);
  auto gone = legacy.schedules()->get("legacy-only");
  REQUIRE(gone);
  CHECK(gone->deleted); // a tombstone that keeps its token
  CHECK(gone->fencing_token == lo->token);
  auto l = legacy.acquire_lock_fenced("job", 10s);
  CHECK(l->fence == seeded.lock_fence + 1);
  // A cluster-layout store started by mistake refuses the restored data.
  auto wrong = cluster_store(node(), prefix);
  CHECK(what_of([&] { wrong.start(); }).find("run the migration first")
        != std::string::npos);
}

TEST_CASE("migration: a rollback that meets an error reading a record "
          "reports it, copies no error text and prunes nothing") {
  auto prefix = test::unique_prefix("bmmig");
  auto legacy = legacy_store(node(), prefix);
  seed(legacy);
  botmesh::migrate_redis_layout(
    {.source = node(), .target = cluster(), .prefix = prefix});
  botmesh::redis_store cl{{.client = cluster(), .prefix = prefix}};
  cl.start();
  CHECK(cl.delete_chat("tg:2")); // a mirror would prune it from legacy
  // A value key of another type: GET answers WRONGTYPE.
  botmesh::redis_cluster_layout L{prefix};
  auto vk = L.user_data("tg:1", "prefs", "lang");
  cluster()->call({"DEL", vk});
  cluster()->call({"HSET", vk, "f", "v"});
  auto rep = botmesh::migrate_redis_layout(
    {.source = cluster(), .target = node(), .prefix = prefix,
     .direction = redis_migration_direction::cluster_to_legacy});
  REQUIRE(rep.problems.size() == 1);
  CHECK(rep.problems[0].find(vk) != std::string::npos);
  CHECK(rep.problems[0].find("WRONGTYPE") != std::string::npos);
  CHECK(rep.pruned == 0);
  CHECK(rep.layout_marker.starts_with("not deleted: 1 record(s)"));
  // The legacy side keeps what it had: the value, and the chat the cluster
  // deleted (the pass was not complete).
  CHECK(legacy.get_user_data("tg:1", "prefs", "lang") == std::string{R"("es")"});
  CHECK(legacy.get_chat("tg:2"));
}

TEST_CASE("migration: a rollback without mirror only copies: existing legacy "
          "records win and nothing is pruned") {
  auto prefix = test::unique_prefix("bmmig");
  auto legacy = legacy_store(node(), prefix);
  seed(legacy);
  botmesh::migrate_redis_layout({.source = node(), .prefix = prefix});
  auto cl = cluster_store(node(), prefix);
  cl.start();
  CHECK(cl.delete_chat("tg:2"));
  auto changed = chat("tg:1");
  changed.data = R"({"changed":1})";
  cl.save_chat(changed);
  cl.save_chat(chat("tg:9"));
  auto rep = botmesh::migrate_redis_layout(
    {.source = node(), .prefix = prefix,
     .direction = redis_migration_direction::cluster_to_legacy,
     .mirror = false});
  CHECK(rep.pruned == 0);
  CHECK(rep.kinds.at("chats").copied == 1); // tg:9
  CHECK(rep.kinds.at("chats").kept == 1);   // tg:1: the legacy one wins
  CHECK(legacy.get_chat("tg:1")->data == R"({"vip":true})");
  CHECK(legacy.get_chat("tg:2")); // not pruned
  CHECK(legacy.get_chat("tg:9"));
  // With delete-source the cluster keys go; the marker went with the
  // complete pass.
  auto del = botmesh::migrate_redis_layout(
    {.source = node(), .prefix = prefix,
     .direction = redis_migration_direction::cluster_to_legacy,
     .delete_source = true, .mirror = false});
  CHECK(del.layout_marker == "deleted");
  auto ks = botmesh::inspect_keyspace(*node(), prefix);
  CHECK(ks.cluster.empty());
  CHECK_FALSE(ks.marker.has_value());
}
