#include <doctest/doctest.h>

#include <atomic>
#include <barrier>
#include <functional>
#include <limits>
#include <thread>

#include <sqlite3.h>

#include <conformance/schedule_store_conformance.hpp>
#include <conformance/store_conformance.hpp>

#include <botmesh/stores/sqlite/sqlite_store.hpp>

#include "temp_file.hpp"

namespace {

struct sqlite_store_factory {
  test::temp_file file;
  botmesh::manual_clock clock{
    std::chrono::time_point_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now())};

  std::shared_ptr<botmesh::store> make() {
    auto s = std::make_shared<botmesh::sqlite_store>(
      botmesh::sqlite_store_options{.path = file.path(), .clock = &clock});
    s->start();
    return s;
  }

  void advance(std::chrono::milliseconds d) {
    clock.advance(d);
  }
};

struct sqlite_schedule_store_factory {
  test::temp_file file;
  std::shared_ptr<botmesh::sqlite_store> owner;

  std::shared_ptr<botmesh::schedule_store> make() {
    owner = std::make_shared<botmesh::sqlite_store>(
      botmesh::sqlite_store_options{.path = file.path()});
    owner->start();
    return owner->schedules();
  }
};

// Runs one SQL statement on the file with a separate connection, as another
// program (or a disk fault) would.
void raw_sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
  char* err = nullptr;
  auto rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  INFO((err ? err : ""));
  sqlite3_free(err);
  sqlite3_close(db);
  REQUIRE(rc == SQLITE_OK);
}

// Reads one integer with a separate connection.
std::int64_t raw_int(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  REQUIRE(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK);
  REQUIRE(sqlite3_step(st) == SQLITE_ROW);
  auto v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

// Each of `calls` reads a damaged record: it throws corrupted_record, and
// its text holds every one of `needles`.
void check_corrupted(const std::vector<std::function<void()>>& calls,
                     const std::vector<std::string>& needles) {
  for (auto& f : calls) {
    try {
      f();
      FAIL("read a damaged record");
    } catch (const botmesh::error& e) {
      std::string what = e.what();
      CHECK(e.code() == botmesh::errc::corrupted_record);
      for (auto& n : needles)
        CHECK_MESSAGE(what.find(n) != std::string::npos, n);
    }
  }
}

// One such call, whose text holds `a` and `b` (what was damaged, its key).
void expect_corrupted(const std::function<void()>& f, const std::string& a,
                      const std::string& b) {
  check_corrupted({f}, {a, b});
}

} // namespace

TYPE_TO_STRING(sqlite_store_factory);
TYPE_TO_STRING(sqlite_schedule_store_factory);
BOTMESH_STORE_CONFORMANCE(sqlite_store_factory);
BOTMESH_SCHEDULE_STORE_CONFORMANCE(sqlite_schedule_store_factory);

TEST_CASE("the SQLite store keeps everything across a reopen, in WAL mode") {
  test::temp_file file;
  std::uint64_t rev = 0;
  {
    botmesh::sqlite_store s{{.path = file.path()}};
    s.start();
    s.save_chat({"test:a", "test", "a", "", botmesh::from_unix_ms(1),
                 botmesh::from_unix_ms(2), "{}"});
    s.append_message("test:a", {0, botmesh::direction::in, "m1", "a", "hola"});
    botmesh::flow_checkpoint cp;
    cp.key = "test:a";
    cp.flow = "pedido";
    cp.state = R"({"n":1})";
    rev = *s.set_checkpoint_if(cp, 0);
    s.set_user_data("a", "perfil", "nombre", R"("Ana")");
    s.schedules()->register_task("job", "every 1000",
                                 botmesh::from_unix_ms(5000),
                                 botmesh::from_unix_ms(4000));
  }
  botmesh::sqlite_store s{{.path = file.path()}};
  s.start();
  CHECK(s.get_chat("test:a").has_value());
  CHECK(s.messages("test:a", 5).at(0).text == "hola");
  CHECK(s.get_checkpoint("test:a")->revision == rev);
  CHECK(s.get_user_data("a", "perfil", "nombre") == R"("Ana")");
  CHECK(s.schedules()->get("job")->next_run_at == botmesh::from_unix_ms(5000));
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(file.path().c_str(), &db) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, nullptr);
  REQUIRE(sqlite3_step(st) == SQLITE_ROW);
  CHECK(std::string{reinterpret_cast<const char*>(sqlite3_column_text(st, 0))}
        == "wal");
  sqlite3_finalize(st);
  sqlite3_close(db);
}

TEST_CASE("a corrupted checkpoint row gives an error naming the key, and the "
          "key can still be written") {
  test::temp_file file;
  botmesh::sqlite_store s{{.path = file.path()}};
  s.start();
  botmesh::flow_checkpoint cp;
  cp.key = "test:broken";
  cp.flow = "pedido";
  auto rev = *s.set_checkpoint_if(cp, 0);
  raw_sql(file.path(),
          "UPDATE checkpoints SET body='{garbage' WHERE key='test:broken'");
  try {
    s.get_checkpoint("test:broken");
    FAIL("read a corrupted checkpoint");
  } catch (const botmesh::corrupted_checkpoint_error& e) {
    CHECK(e.code() == botmesh::errc::corrupted_record);
    CHECK(std::string{e.what()}.find("test:broken") != std::string::npos);
    CHECK(std::string{e.what()}.find("not valid JSON") != std::string::npos);
    // Its revision, so a clear of it can be conditional.
    CHECK(e.revision() == rev);
  }
  // Other rows are unaffected, and the broken one can be replaced.
  cp.key = "test:fine";
  CHECK(s.set_checkpoint_if(cp, 0).has_value());
  cp.key = "test:broken";
  auto next = s.set_checkpoint_if(cp, rev);
  REQUIRE(next);
  CHECK(*next > rev);
  CHECK(s.get_checkpoint("test:broken")->flow == "pedido");
}

TEST_CASE("a SQLite counter stored negative or at its limit is a corrupted "
          "record named with its key, and the row is left as it was") {
  test::temp_file file;
  botmesh::sqlite_store s{{.path = file.path()}};
  s.start();
  constexpr auto top = std::numeric_limits<std::int64_t>::max();
  // A lock whose fence is at the limit: the next would wrap to a number
  // every earlier holder had.
  auto lock = s.acquire_lock_fenced("test:lock", std::chrono::seconds{5});
  REQUIRE(lock);
  REQUIRE(s.release_lock("test:lock", lock->token));
  raw_sql(file.path(), "UPDATE locks SET fence=" + std::to_string(top)
                         + ", token='' WHERE key='test:lock'");
  expect_corrupted([&] { s.acquire_lock_fenced("test:lock", std::chrono::seconds{5}); },
                   "lock fence", "test:lock");
  CHECK(raw_int(file.path(), "SELECT fence FROM locks WHERE key='test:lock'") == top);
  // A message log whose last seq is at the limit.
  botmesh::logged_message m;
  m.id = "m1";
  m.text = "hola";
  s.append_message("test:chat", m);
  raw_sql(file.path(), "UPDATE messages SET seq=" + std::to_string(top)
                         + " WHERE chat_key='test:chat'");
  expect_corrupted([&] { s.append_message("test:chat", m); }, "message seq",
                   "test:chat");
  CHECK(raw_int(file.path(),
                "SELECT COUNT(*) FROM messages WHERE chat_key='test:chat'")
        == 1);
  // A checkpoint whose revision is negative.
  botmesh::flow_checkpoint cp;
  cp.key = "test:cp";
  cp.flow = "pedido";
  REQUIRE(s.set_checkpoint_if(cp, 0));
  raw_sql(file.path(), "UPDATE checkpoints SET revision=-1 WHERE key='test:cp'");
  expect_corrupted([&] { s.set_checkpoint(cp); }, "checkpoint revision",
                   "test:cp");
  CHECK(raw_int(file.path(), "SELECT revision FROM checkpoints WHERE key='test:cp'")
        == -1);
}

TEST_CASE("a schedule row with a time out of range is a corrupted record "
          "naming its id, and it is left as it was") {
  test::temp_file file;
  botmesh::sqlite_store s{{.path = file.path()}};
  s.start();
  auto sched = s.schedules();
  sched->register_task("job", "every 1000", botmesh::from_unix_ms(1),
                       botmesh::from_unix_ms(0));
  raw_sql(file.path(), "UPDATE schedules SET next_run_at=-9223372036854775807 "
                       "WHERE id='job'");
  check_corrupted({[&] { sched->get("job"); },
                   [&] { sched->claim("job", "me", botmesh::from_unix_ms(5),
                                      std::chrono::seconds(1)); }},
                  {"sqlite schedule job", "next_run_at"});
  // Nothing was rewritten by the failed claim.
  CHECK(raw_int(file.path(), "SELECT next_run_at FROM schedules WHERE id='job'")
        == std::numeric_limits<std::int64_t>::min() + 1);
}

TEST_CASE("a schedule row whose number columns hold text or a real is a "
          "corrupted record naming its id and column, not a zero") {
  test::temp_file file;
  botmesh::sqlite_store s{{.path = file.path()}};
  s.start();
  auto sched = s.schedules();
  sched->register_task("job", "every 1000", botmesh::from_unix_ms(1),
                       botmesh::from_unix_ms(0));
  sched->register_task("other", "every 1000", botmesh::from_unix_ms(1),
                       botmesh::from_unix_ms(0));
  auto expect_corrupt = [&](const std::string& column, const std::string& shown) {
    check_corrupted({[&] { sched->get("job"); }, [&] { sched->list(); },
                     [&] { sched->claim("job", "me", botmesh::from_unix_ms(5),
                                        std::chrono::seconds(1)); }},
                    {"sqlite schedule job", column, shown});
  };
  // INTEGER affinity keeps text that is not a number as text.
  raw_sql(file.path(), "UPDATE schedules SET next_run_at='soon' WHERE id='job'");
  expect_corrupt("next_run_at", "\"soon\"");
  raw_sql(file.path(), "UPDATE schedules SET next_run_at=1, fencing_token=2.5 "
                       "WHERE id='job'");
  expect_corrupt("fencing_token", "2.5");
  // A negative token would wrap to a huge one (and the next claim's to 0):
  // tokens must never go backwards.
  raw_sql(file.path(), "UPDATE schedules SET fencing_token=-1 WHERE id='job'");
  expect_corrupt("fencing_token", "negative: -1");
  // The other row reads as it was written; the damaged one is left alone.
  CHECK(sched->get("other")->next_run_at == botmesh::from_unix_ms(1));
  CHECK(raw_int(file.path(), "SELECT fencing_token FROM schedules WHERE "
                             "id='job'")
        == -1);
}

TEST_CASE("compare-and-set holds across separate connections to one file") {
  test::temp_file file;
  constexpr int writers = 4;
  constexpr int rounds = 25;
  std::vector<std::unique_ptr<botmesh::sqlite_store>> stores;
  for (int i = 0; i < writers; ++i) {
    stores.push_back(std::make_unique<botmesh::sqlite_store>(
      botmesh::sqlite_store_options{.path = file.path()}));
    stores.back()->start();
  }
  std::barrier sync{writers};
  std::atomic<std::uint64_t> expected{0};
  std::vector<std::atomic<int>> winners(rounds);
  std::vector<std::thread> pool;
  for (int w = 0; w < writers; ++w) {
    pool.emplace_back([&, w] {
      for (int r = 0; r < rounds; ++r) {
        sync.arrive_and_wait();
        auto seen = expected.load();
        sync.arrive_and_wait();
        botmesh::flow_checkpoint cp;
        cp.key = "test:shared";
        cp.step = std::to_string(w);
        if (auto rev = stores[w]->set_checkpoint_if(cp, seen)) {
          winners[r]++;
          expected = *rev;
        }
        sync.arrive_and_wait();
      }
    });
  }
  for (auto& t : pool)
    t.join();
  for (int r = 0; r < rounds; ++r)
    CHECK(winners[r].load() == 1);
  // Lock fences too: every connection sees one sequence.
  auto a = stores[0]->acquire_lock_fenced("k", std::chrono::seconds(10));
  REQUIRE(a);
  CHECK_FALSE(stores[1]->acquire_lock_fenced("k", std::chrono::seconds(10)));
  REQUIRE(stores[0]->release_lock("k", a->token));
  auto b = stores[1]->acquire_lock_fenced("k", std::chrono::seconds(10));
  REQUIRE(b);
  CHECK(b->fence > a->fence);
}

TEST_CASE("a SQLite store that cannot open its file says so") {
  botmesh::sqlite_store s{{.path = "/nonexistent-dir/x/bot.db"}};
  try {
    s.start();
    FAIL("opened an impossible path");
  } catch (const botmesh::error& e) {
    CHECK(e.code() == botmesh::errc::store_error);
    CHECK(std::string{e.what()}.find("/nonexistent-dir/x/bot.db")
          != std::string::npos);
  }
  CHECK_THROWS_AS(s.get_chat("x"), botmesh::error);
}

TEST_CASE("the SQLite store refuses a log cap of 0, naming the option") {
  std::string field;
  try {
    botmesh::sqlite_store s{{.path = ":memory:", .max_log_per_chat = 0}};
  } catch (const botmesh::invalid_argument_error& e) {
    field = e.field();
  }
  CHECK(field == "max_log_per_chat");
}

TEST_CASE("a SQLite log cap past what a seq counts keeps every message") {
  // SIZE_MAX, a natural "unlimited": cast to a seq it was -1, and every
  // append deleted the whole log, itself included.
  botmesh::sqlite_store s{
    {.path = ":memory:",
     .max_log_per_chat = std::numeric_limits<std::size_t>::max()}};
  s.start();
  botmesh::logged_message m;
  m.id = "m1";
  m.text = "uno";
  CHECK(s.append_message("test:chat", m) == 1);
  m.id = "m2";
  m.text = "dos";
  CHECK(s.append_message("test:chat", m) == 2);
  auto log = s.messages("test:chat", 10);
  REQUIRE(log.size() == 2);
  CHECK(log[0].text == "uno");
  CHECK(log[1].text == "dos");
}

TEST_CASE("a SQLite row whose columns were damaged is a corrupted record "
          "naming its key, not a plausible value") {
  test::temp_file file;
  botmesh::sqlite_store s{{.path = file.path()}};
  s.start();
  botmesh::chat_record chat;
  chat.key = "test:chat";
  chat.provider = "testing";
  chat.chat = "1";
  s.save_chat(chat);
  raw_sql(file.path(), "UPDATE chats SET created_at='x' WHERE key='test:chat'");
  expect_corrupted([&] { s.get_chat("test:chat"); }, "test:chat", "created_at");
  expect_corrupted([&] { s.list_chats(); }, "test:chat", "created_at");
  botmesh::contact_record contact;
  contact.id = "test:contact";
  s.save_contact(contact);
  raw_sql(file.path(),
          "UPDATE contacts SET updated_at=1.5 WHERE id='test:contact'");
  expect_corrupted([&] { s.get_contact("test:contact"); }, "test:contact",
                   "updated_at");
  // A direction that is neither in (0) nor out (1) was read as out.
  botmesh::logged_message m;
  m.id = "m1";
  m.text = "hola";
  s.append_message("test:log", m);
  raw_sql(file.path(), "UPDATE messages SET dir=7 WHERE chat_key='test:log'");
  expect_corrupted([&] { s.messages("test:log", 10); }, "test:log", "dir");
  raw_sql(file.path(), "UPDATE messages SET seq='x' WHERE chat_key='test:log'");
  expect_corrupted([&] { s.append_message("test:log", m); }, "test:log", "seq");
  // A negative revision was read as 2^64 - 1.
  botmesh::flow_checkpoint cp;
  cp.key = "test:cp";
  cp.flow = "pedido";
  REQUIRE(s.set_checkpoint_if(cp, 0));
  raw_sql(file.path(), "UPDATE checkpoints SET revision=-1 WHERE key='test:cp'");
  expect_corrupted([&] { s.get_checkpoint("test:cp"); }, "test:cp", "revision");
  REQUIRE(s.acquire_lock_fenced("test:lock", std::chrono::seconds{5}));
  raw_sql(file.path(), "UPDATE locks SET expires_at='x' WHERE key='test:lock'");
  expect_corrupted(
    [&] { s.acquire_lock_fenced("test:lock", std::chrono::seconds{5}); },
    "test:lock", "expires_at");
}

TEST_CASE("a SQLite task registered again after its tombstone was purged by "
          "hand goes on from its last fencing token") {
  test::temp_file file;
  botmesh::sqlite_store s{{.path = file.path()}};
  s.start();
  auto sched = s.schedules();
  auto t0 = botmesh::from_unix_ms(1'000'000);
  sched->register_task("x", "every 1000", t0, t0);
  std::uint64_t token = 0;
  for (int i = 0; i < 3; ++i) {
    auto now = t0 + std::chrono::seconds(i);
    auto c = sched->claim("x", "me", now, std::chrono::seconds(60));
    REQUIRE(c);
    token = c->token;
    REQUIRE(sched->commit("x", "me", token, now + std::chrono::seconds(1),
                          false, now));
  }
  CHECK(token == 3);
  REQUIRE(sched->remove("x", t0 + std::chrono::seconds(5)));
  // The purge the documentation describes, from another connection.
  raw_sql(file.path(), "DELETE FROM schedules WHERE deleted = 1");
  CHECK_FALSE(sched->get("x").has_value());
  auto again = t0 + std::chrono::seconds(10);
  auto rec = sched->register_task("x", "every 1000", again, again);
  CHECK(rec.fencing_token == 3);
  auto c = sched->claim("x", "me", again, std::chrono::seconds(60));
  REQUIRE(c);
  CHECK(c->token == 4);
  // Removed and purged once more: the fence follows the newest token.
  REQUIRE(sched->remove("x", again + std::chrono::seconds(1)));
  raw_sql(file.path(), "DELETE FROM schedules WHERE deleted = 1");
  sched->register_task("x", "every 1000", again, again);
  auto d = sched->claim("x", "me", again + std::chrono::seconds(2),
                        std::chrono::seconds(60));
  REQUIRE(d);
  CHECK(d->token == 5);
}

TEST_CASE("a SQLite file whose tombstones predate schedule_fences gets their "
          "fences when opened, so a purge does not reset their tokens") {
  test::temp_file file;
  auto t0 = botmesh::from_unix_ms(1'000'000);
  {
    botmesh::sqlite_store s{{.path = file.path()}};
    s.start();
    auto sched = s.schedules();
    sched->register_task("old", "every 1000", t0, t0);
    for (int i = 0; i < 2; ++i) {
      auto now = t0 + std::chrono::seconds(i);
      auto c = sched->claim("old", "me", now, std::chrono::seconds(60));
      REQUIRE(c);
      REQUIRE(sched->commit("old", "me", c->token, now + std::chrono::seconds(1),
                            false, now));
    }
    REQUIRE(sched->remove("old", t0 + std::chrono::seconds(5)));
  }
  // As a file written before the table existed: no fence rows, and the
  // version it had then.
  raw_sql(file.path(), "DELETE FROM schedule_fences");
  raw_sql(file.path(), "PRAGMA user_version = 0");
  botmesh::sqlite_store s{{.path = file.path()}};
  s.start();
  raw_sql(file.path(), "DELETE FROM schedules WHERE deleted = 1");
  auto sched = s.schedules();
  auto again = t0 + std::chrono::seconds(10);
  CHECK(sched->register_task("old", "every 1000", again, again).fencing_token == 2);
  // A fence stored negative is damage, named.
  raw_sql(file.path(), "DELETE FROM schedules");
  raw_sql(file.path(), "UPDATE schedule_fences SET fencing_token = -3");
  try {
    sched->register_task("old", "every 1000", again, again);
    FAIL("registered over a damaged fence");
  } catch (const botmesh::error& e) {
    CHECK(e.code() == botmesh::errc::corrupted_record);
    CHECK(std::string{e.what()}.find("fencing_token") != std::string::npos);
  }
}
