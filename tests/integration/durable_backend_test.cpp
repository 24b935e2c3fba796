#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <future>
#include <latch>
#include <mutex>
#include <thread>

#include <sqlite3.h>

#include <conformance/durable_conformance.hpp>

#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/stores/redis/redis_durable_backend.hpp>
#include <botmesh/stores/sqlite/sqlite_durable_backend.hpp>

#include "redis_server.hpp"
#include "temp_file.hpp"

using namespace std::chrono_literals;

namespace {

struct sqlite_durable_factory {
  static constexpr std::chrono::milliseconds lease{1000};
  botmesh::manual_clock clock;
  test::temp_file file;

  // Each call opens the file anew: backends share it as processes would.
  std::shared_ptr<botmesh::durable_backend> make() {
    auto b = std::make_shared<botmesh::sqlite_durable_backend>(
      botmesh::sqlite_durable_options{.path = file.path(), .clock = &clock});
    b->start();
    return b;
  }

  void advance(std::chrono::milliseconds d) {
    clock.advance(d);
  }
};

// Redis time is real time: advance() sleeps.
struct redis_durable_factory {
  static constexpr std::chrono::milliseconds lease{300};
  std::string prefix = test::unique_prefix("bmdur");
  std::shared_ptr<botmesh::redis_client> client =
    std::make_shared<botmesh::redis_client>(
      botmesh::redis_options{.url = test::redis_url()});

  std::shared_ptr<botmesh::durable_backend> make() {
    auto b = std::make_shared<botmesh::redis_durable_backend>(
      botmesh::redis_durable_options{.client = client, .prefix = prefix});
    b->start();
    return b;
  }

  void advance(std::chrono::milliseconds d) {
    std::this_thread::sleep_for(d);
  }
};

} // namespace

TYPE_TO_STRING(sqlite_durable_factory);
TYPE_TO_STRING(redis_durable_factory);
BOTMESH_DURABLE_CONFORMANCE(sqlite_durable_factory);
BOTMESH_DURABLE_CONFORMANCE(redis_durable_factory);

namespace {

// "<code> <what>" of a completion's error.
std::string failure_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const botmesh::error& err) {
    return std::string{botmesh::to_string(err.code())} + " " + err.what();
  } catch (const std::exception& err) {
    return std::string{"exception "} + err.what();
  }
}

} // namespace

TEST_CASE("the Redis journal keeps each table in one hash slot") {
  redis_durable_factory f;
  auto b = f.make();
  dc::sync s{*b};
  REQUIRE(s.record("t:1#m1", "a") == dc::journal_put::recorded);
  REQUIRE(s.send("t:1#m1/0", "t:1", 1) == dc::outbox_verdict::send);
  auto keys = f.client->call({"KEYS", f.prefix + ":*"});
  REQUIRE(keys.elements.size() >= 5);
  for (auto& k : keys.elements) {
    auto tagged = k.str.rfind(f.prefix + ":{durable:inbound}:", 0) == 0
                  || k.str.rfind(f.prefix + ":{durable:outbox}:", 0) == 0;
    CHECK_MESSAGE(tagged, k.str);
  }
}

// The beat's sweep drops at most 1000 expired records per call; at a
// sustained arrival rate above that per beat the journal would outgrow the
// retry window. Writes sweep too, so it does not.
TEST_CASE("expired Redis journal records and outbox entries are dropped by "
          "later writes, with no beat") {
  redis_durable_factory f;
  auto b = f.make();
  dc::sync s{*b};
  auto in = f.prefix + ":{durable:inbound}:";
  auto out = f.prefix + ":{durable:outbox}:";
  auto count = [&](const std::string& cmd, const std::string& key) {
    return f.client->call({cmd, key}).integer;
  };
  for (int i = 0; i < 10; ++i) {
    REQUIRE(s.record("t:1#old" + std::to_string(i), "a", 100ms)
            == dc::journal_put::recorded);
    REQUIRE(s.send("t:1#old" + std::to_string(i) + "/0", "t:1", 7, 100ms)
            == dc::outbox_verdict::send);
  }
  REQUIRE(count("HLEN", in + "rec") == 10);
  REQUIRE(count("ZCARD", out + "sent") >= 1);
  f.advance(200ms);
  // Any 8 records in a row include one that sweeps up to 16.
  for (int i = 0; i < 8; ++i)
    REQUIRE(s.record("t:1#new" + std::to_string(i), "a")
            == dc::journal_put::recorded);
  CHECK(count("HLEN", in + "rec") == 8);
  CHECK(count("ZCARD", in + "open") == 8);
  CHECK(count("ZCARD", in + "exp") == 8);
  // The outbox sweeps on about one millisecond in 8: writes spread over
  // 400 ms meet one with near certainty (a miss is (7/8)^400).
  int sends = 0;
  for (; sends < 400 && count("ZCARD", out + "sent") != sends; ++sends) {
    REQUIRE(s.send("t:2#new" + std::to_string(sends) + "/0", "t:2", 0)
            == dc::outbox_verdict::send);
    std::this_thread::sleep_for(1ms);
  }
  CHECK(count("ZCARD", out + "sent") == sends);
  CHECK(count("HLEN", out + "by") == sends); // writers go with their entries
  CHECK(count("HLEN", out + "fence") == 0);
  CHECK(count("ZCARD", out + "fexp") == 0);
}

TEST_CASE("Redis journal records from seq 1e14 keep seqs of their own") {
  redis_durable_factory f;
  auto b = f.make();
  dc::sync s{*b};
  // cjson writes numbers with 14 digits: 1e14 and 1e14+1 were one seq.
  f.client->call({"SET", f.prefix + ":{durable:inbound}:seq", "99999999999999"});
  REQUIRE(s.record("t:1#x", "a") == dc::journal_put::recorded);
  REQUIRE(s.record("t:1#y", "a") == dc::journal_put::recorded);
  f.advance(redis_durable_factory::lease * 2); // a is dead: both claimable
  auto c = s.claim("b", redis_durable_factory::lease);
  REQUIRE(c.records.size() == 2);
  CHECK(c.corrupted.empty());
  CHECK(c.records[0].seq == 100000000000000);
  CHECK(c.records[1].seq == 100000000000001);
  // A counter a Lua number cannot hold: that record fails, named.
  f.client->call({"SET", f.prefix + ":{durable:inbound}:seq", "9007199254740991"});
  auto what = [&] {
    try {
      s.record("t:1#z", "a");
    } catch (const botmesh::error& e) {
      return std::string{e.what()};
    }
    return std::string{};
  }();
  CHECK(what.find(":{durable:inbound}:seq") != std::string::npos);
}

TEST_CASE("a Redis claim takes no record past its TTL, however many expired "
          "ones wait to be swept") {
  redis_durable_factory f;
  auto b = f.make();
  dc::sync s{*b};
  REQUIRE(s.record("t:1#old", "a", 500ms) == dc::journal_put::recorded);
  // More expired entries than one sweep drops (1000), all older: the
  // record's own expiry is left for a later sweep.
  auto exp = f.prefix + ":{durable:inbound}:exp";
  std::vector<std::string> add{"ZADD", exp};
  for (int i = 0; i < 1000; ++i) {
    add.push_back(std::to_string(i + 1));
    add.push_back("t:0#gone" + std::to_string(i));
  }
  f.client->call(add);
  f.advance(800ms); // past its TTL; "a" never beat: its records are free
  // Before, it was claimed and run again, days late in a long outage.
  auto c = s.claim("b", redis_durable_factory::lease);
  CHECK(c.records.empty());
  CHECK(f.client->call({"HGET", f.prefix + ":{durable:inbound}:rec", "t:1#old"})
          .is_nil());
  // A redelivery now is a new message, as on the other backends.
  CHECK(s.record("t:1#old", "a") == dc::journal_put::recorded);
}

TEST_CASE("a corrupted Redis journal record is named: settling it fails "
          "with corrupted_record and a claim sets it aside") {
  redis_durable_factory f;
  auto b = f.make();
  dc::sync s{*b};
  REQUIRE(s.record("t:1#bad", "a") == dc::journal_put::recorded);
  REQUIRE(s.record("t:1#good", "a") == dc::journal_put::recorded);
  REQUIRE(s.release("t:1#good", "a"));
  REQUIRE(s.record("t:1#nomsg", "a") == dc::journal_put::recorded);
  REQUIRE(s.record("t:1#numkey", "a") == dc::journal_put::recorded);
  auto rec = f.prefix + ":{durable:inbound}:rec";
  f.client->call({"HSET", rec, "t:1#bad", "not json"});
  // JSON with a journal record's state, but no message / a key that is no
  // string: claimed with good records, they made the whole reply unreadable.
  f.client->call({"HSET", rec, "t:1#nomsg", R"({"st":1,"a":1,"h":"","s":3,"k":"t:1"})"});
  f.client->call({"HSET", rec, "t:1#numkey", R"({"st":1,"a":1,"h":"","s":4,"k":5,"m":"x"})"});
  // Counts that are no whole number: read back, they failed the reply.
  REQUIRE(s.record("t:1#negseq", "a") == dc::journal_put::recorded);
  REQUIRE(s.record("t:1#halfa", "a") == dc::journal_put::recorded);
  f.client->call({"HSET", rec, "t:1#negseq", R"({"st":1,"a":1,"h":"","s":-1,"k":"t:1","m":"x"})"});
  f.client->call({"HSET", rec, "t:1#halfa", R"({"st":1,"a":1.5,"h":"","s":6,"k":"t:1","m":"x"})"});
  // A count past 32 bits: cut to 0 by the caller, it was given up "after
  // 0 attempts" and its message erased.
  REQUIRE(s.record("t:1#biga", "a") == dc::journal_put::recorded);
  f.client->call({"HSET", rec, "t:1#biga", R"({"st":1,"a":4294967296,"h":"","s":9,"k":"t:1","m":"x"})"});
  // A field cjson reads as infinity and cannot write back: the claim's
  // write aborted the whole script, every beat, so nothing after it was
  // ever claimed; a state that is neither held nor free sat unreported.
  REQUIRE(s.record("t:1#inf", "a") == dc::journal_put::recorded);
  REQUIRE(s.record("t:1#st5", "a") == dc::journal_put::recorded);
  REQUIRE(s.record("t:1#good2", "a") == dc::journal_put::recorded);
  REQUIRE(s.release("t:1#good2", "a"));
  REQUIRE(s.record("t:1#infheld", "a") == dc::journal_put::recorded);
  f.client->call({"HSET", rec, "t:1#inf", R"({"st":1,"a":1,"h":"","s":7,"k":"t:1","m":"x","z":1e999})"});
  f.client->call({"HSET", rec, "t:1#st5", R"({"st":5,"a":1,"h":"","s":8,"k":"t:1","m":"x"})"});
  f.client->call({"HSET", rec, "t:1#infheld", R"({"st":0,"a":1,"h":"a","s":10,"k":"t:1","m":"x","z":1e999})"});
  try {
    s.confirm("t:1#infheld", "a");
    FAIL("confirm of a record that cannot be written back did not fail");
  } catch (const botmesh::error& e) {
    CHECK(e.code() == botmesh::errc::corrupted_record);
    CHECK(std::string{e.what()}.find("t:1#infheld") != std::string::npos);
  }
  CHECK(f.client->call({"HGET", rec, "t:1#infheld"}).str.find("1e999")
        != std::string::npos); // kept as it was
  try {
    s.confirm("t:1#bad", "a");
    FAIL("confirm of a corrupted record did not fail");
  } catch (const botmesh::error& e) {
    CHECK(e.code() == botmesh::errc::corrupted_record);
    CHECK(std::string{e.what()}.find("t:1#bad") != std::string::npos);
  }
  f.advance(redis_durable_factory::lease * 2); // a is dead: both claimable
  auto c = s.claim("b", redis_durable_factory::lease);
  CHECK(dc::ids(c.records) == std::vector<std::string>{"t:1#good", "t:1#good2"});
  std::string corrupted;
  for (auto& id : c.corrupted)
    corrupted += id + " ";
  CHECK(corrupted
        == "t:1#bad t:1#nomsg t:1#numkey t:1#negseq t:1#halfa t:1#biga "
           "t:1#inf t:1#st5 t:1#infheld ");
  CHECK(c.dropped.empty());
  // Set aside, not deleted: what was stored is kept for a look.
  CHECK(f.client->call({"HGET", rec, "t:1#inf"}).str.find("1e999")
        != std::string::npos);
  CHECK(s.claim("b", redis_durable_factory::lease).corrupted.empty());
}

namespace {

// Sets `damage` ("column = value") on journal row `id`, as something other
// than the backend would.
void damage_row(sqlite_durable_factory& f, const std::string& id,
                const std::string& damage) {
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open(f.file.path().c_str(), &raw) == SQLITE_OK);
  auto sql = "UPDATE durable_inbound SET " + damage + " WHERE id = '" + id + "'";
  REQUIRE(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(raw);
}

} // namespace

TEST_CASE("a corrupted SQLite journal row is named and set aside by a claim, "
          "the other rows are claimed") {
  // A negative seq, a seq of text, a real or too large an attempt count, a
  // state that is none of the four (never claimed, confirmed or named, it
  // expired unseen with its message).
  for (std::string damage : {"seq = -1", "seq = 'x'", "attempts = 1.5",
                             "attempts = 5000000000", "state = 'x'",
                             "state = 7", "state = -2", "state = 0.5",
                             "state = 1.5", "state = 2.5",
                             "expires_at = 'x'"}) {
    CAPTURE(damage);
    sqlite_durable_factory f;
    auto b = f.make();
    dc::sync s{*b};
    REQUIRE(s.record("t:1#bad", "a") == dc::journal_put::recorded);
    REQUIRE(s.record("t:1#good", "a") == dc::journal_put::recorded);
    REQUIRE(s.record("t:1#good2", "a") == dc::journal_put::recorded);
    damage_row(f, "t:1#bad", damage);
    f.advance(sqlite_durable_factory::lease * 2); // a is dead
    auto c = s.claim("b", sqlite_durable_factory::lease);
    CHECK(dc::ids(c.records) == std::vector<std::string>{"t:1#good", "t:1#good2"});
    CHECK(c.corrupted == std::vector<std::string>{"t:1#bad"});
    // Set aside: not named again, and the heartbeat was written.
    auto again = s.claim("b", sqlite_durable_factory::lease);
    CHECK(again.corrupted.empty());
    CHECK(again.records.empty());
  }
}

TEST_CASE("a SQLite journal row whose expiry is no number is kept a day "
          "after it was named, then swept") {
  sqlite_durable_factory f;
  auto b = f.make();
  dc::sync s{*b};
  REQUIRE(s.record("t:1#bad", "a") == dc::journal_put::recorded);
  damage_row(f, "t:1#bad", "expires_at = 'x'");
  f.advance(sqlite_durable_factory::lease * 2);
  CHECK(s.claim("b", sqlite_durable_factory::lease).corrupted
        == std::vector<std::string>{"t:1#bad"});
  auto rows = [&] {
    sqlite3* raw = nullptr;
    REQUIRE(sqlite3_open(f.file.path().c_str(), &raw) == SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    REQUIRE(sqlite3_prepare_v2(raw, "SELECT COUNT(*) FROM durable_inbound",
                               -1, &st, nullptr)
            == SQLITE_OK);
    REQUIRE(sqlite3_step(st) == SQLITE_ROW);
    auto n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(raw);
    return n;
  };
  f.advance(std::chrono::hours{23});
  s.claim("b", sqlite_durable_factory::lease);
  CHECK(rows() == 1); // still there for a look
  f.advance(std::chrono::hours{2});
  s.claim("b", sqlite_durable_factory::lease);
  CHECK(rows() == 0); // before, text sorted above every time: kept forever
}

TEST_CASE("a SQLite beat that claims nothing sets no corrupted row aside: "
          "the next claim names it") {
  sqlite_durable_factory f;
  auto b = f.make();
  dc::sync s{*b};
  REQUIRE(s.record("t:1#bad", "a") == dc::journal_put::recorded);
  damage_row(f, "t:1#bad", "state = 7");
  // An old generation kept alive, or a new one's first beat: nobody reads
  // what it found. Before, it set the row aside there, and no beat ever
  // named it.
  CHECK(s.claim("a~1", sqlite_durable_factory::lease, 5, 0).corrupted.empty());
  CHECK(s.claim("b", sqlite_durable_factory::lease).corrupted
        == std::vector<std::string>{"t:1#bad"});
}

TEST_CASE("a SQLite journal row with a damaged expiry: a redelivery of a "
          "handled one is a duplicate, of an open one it takes its place, and "
          "a handled one is swept") {
  for (std::string damage : {"expires_at = 'x'", "expires_at = x'00'"}) {
    CAPTURE(damage);
    sqlite_durable_factory f;
    auto b = f.make();
    dc::sync s{*b};
    REQUIRE(s.record("t:1#done", "a") == dc::journal_put::recorded);
    REQUIRE(s.confirm("t:1#done", "a"));
    REQUIRE(s.record("t:1#open", "a") == dc::journal_put::recorded);
    damage_row(f, "t:1#done", damage);
    damage_row(f, "t:1#open", damage);
    // Before, both threw corrupted_record, at every redelivery.
    CHECK(s.record("t:1#done", "a") == dc::journal_put::duplicate);
    CHECK(s.record("t:1#open", "a") == dc::journal_put::recorded);
    // The handled one's tombstone goes at the next sweep (text sorted
    // above every time: it stayed for good); the open one, recorded anew,
    // is claimed as any other.
    f.advance(sqlite_durable_factory::lease * 2);
    auto c = s.claim("b", sqlite_durable_factory::lease);
    CHECK(dc::ids(c.records) == std::vector<std::string>{"t:1#open"});
    CHECK(c.corrupted.empty());
    CHECK(s.record("t:1#done", "a") == dc::journal_put::recorded);
  }
  // A fractional expiry is a time: before, record() refused it.
  sqlite_durable_factory f;
  auto b = f.make();
  dc::sync s{*b};
  REQUIRE(s.record("t:1#frac", "a") == dc::journal_put::recorded);
  damage_row(f, "t:1#frac", "expires_at = expires_at + 0.5");
  CHECK(s.record("t:1#frac", "a") == dc::journal_put::duplicate);
}

TEST_CASE("a SQLite journal completion that throws leaves the backend's "
          "thread, and later calls, working") {
  sqlite_durable_factory f;
  auto b = f.make();
  std::promise<void> ran;
  b->confirm("t:1#none", "a", [&](bool, std::exception_ptr) {
    ran.set_value();
    throw std::runtime_error("a completion that throws");
  });
  ran.get_future().wait();
  // Out of the I/O thread, the exception ended the process.
  dc::sync s{*b};
  CHECK(s.record("t:1#after", "a") == dc::journal_put::recorded);
  CHECK(s.confirm("t:1#after", "a"));
}

TEST_CASE("a SQLite journal row with a damaged seq neither stops new records "
          "nor takes their order") {
  // Text sorts above every number; the largest integer has no successor.
  for (std::string damage : {"seq = 'x'", "seq = 9223372036854775807"}) {
    CAPTURE(damage);
    sqlite_durable_factory f;
    auto b = f.make();
    dc::sync s{*b};
    REQUIRE(s.record("t:1#bad", "a") == dc::journal_put::recorded);
    REQUIRE(s.record("t:1#one", "a") == dc::journal_put::recorded);
    damage_row(f, "t:1#bad", damage);
    CHECK(s.record("t:1#two", "a") == dc::journal_put::recorded);
    CHECK(s.record("t:1#three", "a") == dc::journal_put::recorded);
    f.advance(sqlite_durable_factory::lease * 2); // a is dead
    auto c = s.claim("b", sqlite_durable_factory::lease);
    CHECK(dc::ids(c.records)
          == std::vector<std::string>{"t:1#one", "t:1#two", "t:1#three"});
    CHECK(c.corrupted == std::vector<std::string>{"t:1#bad"});
  }
}

TEST_CASE("a SQLite journal file from before outbox writers gets the column: "
          "its entries stay sent, new ones name their writer") {
  sqlite_durable_factory f;
  {
    sqlite3* raw = nullptr;
    REQUIRE(sqlite3_open(f.file.path().c_str(), &raw) == SQLITE_OK);
    auto sql = "CREATE TABLE durable_outbox (id TEXT PRIMARY KEY, "
               "expires_at INTEGER NOT NULL); "
               "INSERT INTO durable_outbox VALUES ('t:1#m1/0', "
               + std::to_string(botmesh::to_unix_ms(f.clock.now()) + 60000)
               + ")";
    REQUIRE(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr)
            == SQLITE_OK);
    sqlite3_close(raw);
  }
  auto b = f.make();
  dc::sync s{*b};
  CHECK(s.send("t:1#m1/0", "t:1", 0) == dc::outbox_verdict::duplicate);
  CHECK_FALSE(s.forget("t:1#m1/0"));
  CHECK(s.send("t:1#m1/0", "t:1", 0) == dc::outbox_verdict::duplicate);
  CHECK(s.send("t:1#m2/0", "t:1", 0) == dc::outbox_verdict::send);
  CHECK(s.forget("t:1#m2/0"));
  // Opened again: the column is there once.
  auto again = f.make();
  dc::sync s2{*again};
  CHECK(s2.send("t:1#m2/0", "t:1", 0) == dc::outbox_verdict::send);
}

TEST_CASE("Redis journal operations issued together go out in a few script "
          "calls, each with its own result, completed in the order issued") {
  test::redis_process server;
  auto client = std::make_shared<botmesh::redis_client>(
    botmesh::redis_options{.url = server.url()});
  botmesh::redis_durable_backend b{{.client = client, .prefix = "bmbatch"}};
  b.start();
  dc::sync s{b};
  REQUIRE(s.record("t:1#bad", "a") == dc::journal_put::recorded);
  REQUIRE(s.record("t:1#dup", "a") == dc::journal_put::recorded);
  client->call({"HSET", "bmbatch:{durable:inbound}:rec", "t:1#bad", "not json"});
  client->call({"CONFIG", "RESETSTAT"});
  constexpr int n = 100;
  std::mutex mtx;
  std::vector<std::string> order; // "<op> <result>" in completion order
  std::vector<std::string> issued;
  std::latch all{3 * n + 2};
  auto note = [&](std::string what) {
    std::lock_guard guard{mtx};
    order.push_back(std::move(what));
    all.count_down();
  };
  for (int i = 0; i < n; ++i) {
    auto id = "t:2#m" + std::to_string(i);
    issued.push_back("record " + id + " recorded");
    b.record({.id = id, .key = "t:2", .message = "{}"}, "a",
             std::chrono::minutes(1),
             [&, id](dc::journal_put r, std::exception_ptr e) {
               note("record " + id
                    + (e ? " failed"
                         : r == dc::journal_put::recorded ? " recorded"
                                                          : " duplicate"));
             });
    issued.push_back("send " + id + "/0 send");
    b.outbox_claim(id + "/0", "t:2", 1, "a", std::chrono::minutes(1),
                   [&, id](dc::outbox_verdict v, std::exception_ptr e) {
                     note("send " + id + "/0"
                          + (e ? " failed"
                               : v == dc::outbox_verdict::send ? " send"
                                                               : " other"));
                   });
    issued.push_back("confirm " + id + " true");
    b.confirm(id, "a", [&, id](bool held, std::exception_ptr e) {
      note("confirm " + id + (e ? " failed" : held ? " true" : " false"));
    });
    if (i == n / 2) {
      // Amid the others: a damaged record fails alone, a duplicate is one.
      issued.push_back("confirm t:1#bad corrupted");
      b.confirm("t:1#bad", "a", [&](bool, std::exception_ptr e) {
        auto what = e ? failure_of(e) : std::string{};
        CHECK(what.find("t:1#bad") != std::string::npos);
        note(what.starts_with("corrupted_record") ? "confirm t:1#bad corrupted"
                                                  : "confirm t:1#bad " + what);
      });
      issued.push_back("record t:1#dup duplicate");
      b.record({.id = "t:1#dup", .key = "t:1", .message = "{}"}, "a",
               std::chrono::minutes(1),
               [&](dc::journal_put r, std::exception_ptr e) {
                 note(std::string{"record t:1#dup "}
                      + (e ? "failed"
                           : r == dc::journal_put::duplicate ? "duplicate"
                                                             : "recorded"));
               });
    }
  }
  all.wait();
  CHECK(order == issued);
  // 302 operations; those issued while a call was in flight share the next.
  auto stats = client->call({"INFO", "commandstats"}).str;
  auto at = stats.find("cmdstat_evalsha:calls=");
  REQUIRE(at != std::string::npos);
  auto calls = std::stoi(stats.substr(at + 22));
  MESSAGE("script calls for 302 operations: " << calls);
  CHECK(calls <= 60);
  CHECK(s.record("t:2#m7", "a") == dc::journal_put::duplicate);
}

TEST_CASE("a damaged outbox fence fails its own send in a batch, before "
          "taking it, the batch's other sends are taken") {
  test::redis_process server;
  auto client = std::make_shared<botmesh::redis_client>(
    botmesh::redis_options{.url = server.url()});
  botmesh::redis_durable_backend b{{.client = client, .prefix = "bmfence"}};
  b.start();
  client->call({"HSET", "bmfence:{durable:outbox}:fence", "t:9", "garbage"});
  std::latch all{3};
  std::mutex mtx;
  std::vector<std::string> got;
  for (auto chat : {"t:2", "t:9", "t:3"}) {
    b.outbox_claim(std::string{chat} + "#m/0", chat, 5, "a",
                   std::chrono::minutes(1),
                   [&, chat](dc::outbox_verdict v, std::exception_ptr e) {
                     std::string what = chat;
                     if (e) {
                       what += failure_of(e).starts_with("corrupted_record")
                                 ? " corrupted"
                                 : " error";
                     } else {
                       what += v == dc::outbox_verdict::send ? " send" : " other";
                     }
                     std::lock_guard guard{mtx};
                     got.push_back(what);
                     all.count_down();
                   });
  }
  all.wait();
  CHECK(got == std::vector<std::string>{"t:2 send", "t:9 corrupted", "t:3 send"});
  auto sent = "bmfence:{durable:outbox}:sent";
  CHECK(client->call({"ZSCORE", sent, "t:9#m/0"}).is_nil());
  CHECK_FALSE(client->call({"ZSCORE", sent, "t:3#m/0"}).is_nil());
}

TEST_CASE("a Redis journal call while the server is down fails with a "
          "store error, and works again once it is back") {
  test::redis_process server;
  auto client = std::make_shared<botmesh::redis_client>(botmesh::redis_options{
    .url = server.url(), .command_timeout = "1s", .connect_timeout = "500ms",
    .max_backoff = "100ms"});
  botmesh::redis_durable_backend b{{.client = client, .prefix = "bmdown"}};
  b.start();
  dc::sync s{b};
  REQUIRE(s.record("t:1#m1", "a") == dc::journal_put::recorded);
  server.kill();
  CHECK_THROWS_AS(s.record("t:1#m2", "a"), botmesh::error);
  server.start();
  // The server lost its data (no persistence): m1 is new again. What matters
  // is that the client recovers without a new backend.
  for (int i = 0; i < 50; ++i) {
    try {
      CHECK(s.record("t:1#m2", "a") == dc::journal_put::recorded);
      return;
    } catch (const botmesh::error&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  FAIL("the journal did not recover after the server restarted");
}

// -- bots on a shared backend --------------------------------------------------

namespace {

// Two bots sharing `backend` get every platform id at once from two
// threads; returns (handled, duplicates) summed over both.
std::pair<int, std::uint64_t>
deliver_twice(const std::function<std::shared_ptr<botmesh::durable_backend>()>&
                backend,
              int n) {
  struct replica {
    std::shared_ptr<botmesh::testing_provider> p =
      std::make_shared<botmesh::testing_provider>();
    std::unique_ptr<botmesh::bot> b;
    std::atomic<int> handled{0};
  };
  replica r[2];
  for (int i = 0; i < 2; ++i) {
    r[i].b = std::make_unique<botmesh::bot>(botmesh::bot_options{
      .provider = r[i].p,
      .durability = botmesh::durability_options{
        .backend = backend(), .instance_id = "r" + std::to_string(i)}});
    r[i].b->on_message([&r, i](botmesh::context& c) {
      ++r[i].handled;
      c.reply(c.text());
    });
    r[i].b->on<botmesh::events::error>([](const botmesh::events::error& e) {
      std::fprintf(stderr, "deliver_twice: error %s: %s\n",
                   std::string{botmesh::to_string(e.code)}.c_str(),
                   e.what.c_str());
    });
    r[i].b->start();
  }
  std::latch go{2};
  std::vector<std::thread> ts;
  for (int i = 0; i < 2; ++i)
    ts.emplace_back([&, i] {
      go.arrive_and_wait();
      for (int k = 0; k < n; ++k) {
        botmesh::inbound_message m;
        m.chat = "c" + std::to_string(k % 3);
        m.sender = m.chat;
        m.id = "id" + std::to_string(k);
        m.text = std::to_string(k);
        r[i].p->inject(std::move(m));
      }
    });
  for (auto& t : ts)
    t.join();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (r[0].b->stats().duplicates + r[1].b->stats().duplicates
             + r[0].p->sent().size() + r[1].p->sent().size()
           < static_cast<std::size_t>(2 * n)
         && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  for (auto& x : r)
    x.b->stop();
  for (auto& x : r)
    if (auto st = x.b->stats(); st.reprocessed != 0)
      std::fprintf(stderr, "deliver_twice: %llu reprocessed\n",
                   static_cast<unsigned long long>(st.reprocessed));
  return {r[0].handled + r[1].handled,
          r[0].b->stats().duplicates + r[1].b->stats().duplicates};
}

} // namespace

TEST_CASE("two bots on one SQLite journal handle a platform id delivered to "
          "both at once once") {
  test::temp_file file;
  auto [handled, dups] = deliver_twice(
    [&] {
      return std::make_shared<botmesh::sqlite_durable_backend>(
        botmesh::sqlite_durable_options{.path = file.path()});
    },
    40);
  CHECK(handled == 40);
  CHECK(dups == 40);
}

TEST_CASE("two bots on one Redis journal handle a platform id delivered to "
          "both at once once") {
  auto prefix = test::unique_prefix("bmdurbots");
  auto client = std::make_shared<botmesh::redis_client>(
    botmesh::redis_options{.url = test::redis_url()});
  auto [handled, dups] = deliver_twice(
    [&] {
      return std::make_shared<botmesh::redis_durable_backend>(
        botmesh::redis_durable_options{.client = client, .prefix = prefix});
    },
    40);
  CHECK(handled == 40);
  CHECK(dups == 40);
}

TEST_CASE("a bot's journal on a Redis that restarts: messages are refused "
          "with store_error while it is down and handled once it is back") {
  test::redis_process server;
  auto client = std::make_shared<botmesh::redis_client>(botmesh::redis_options{
    .url = server.url(), .command_timeout = "1s", .connect_timeout = "500ms",
    .max_backoff = "100ms"});
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p,
                  .durability = botmesh::durability_options{
                    .backend = std::make_shared<botmesh::redis_durable_backend>(
                      botmesh::redis_durable_options{.client = client,
                                                     .prefix = "bmrestart"}),
                    .lease = "300ms"}}};
  b.on_message([](botmesh::context& c) { c.reply("ok " + c.text()); });
  b.start();
  auto deliver = [&](std::string id) {
    std::promise<botmesh::errc> accepted;
    botmesh::inbound_message m;
    m.chat = "ana";
    m.sender = "ana";
    m.id = std::move(id);
    m.text = m.id;
    p->inject(std::move(m),
              {.accepted = [&](botmesh::errc e) { accepted.set_value(e); },
               .turn_ended = {}});
    return accepted.get_future().get();
  };
  REQUIRE(deliver("m1") == botmesh::errc::none);
  REQUIRE(p->wait_for_sent(1, std::chrono::seconds(5)));
  server.kill();
  auto down = deliver("m2");
  CHECK((down == botmesh::errc::store_error || down == botmesh::errc::timeout));
  server.start();
  // The platform retries until the bot takes it.
  botmesh::errc back = down;
  for (int i = 0; i < 50 && back != botmesh::errc::none; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    back = deliver("m2");
  }
  REQUIRE(back == botmesh::errc::none);
  REQUIRE(p->wait_for_sent(2, std::chrono::seconds(5)));
  b.stop();
  CHECK(p->sent()[1].text == "ok m2");
  CHECK(p->sent().size() == 2);
}
