// Durable tasks on Redis: the schedule store's asynchronous face (what the
// scheduler's task actors call) failing as the synchronous calls do, and
// the scheduler itself when Redis is frozen, down, or restarted between a
// claim and its commit.

#include <doctest/doctest.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <botmesh/runtime/core/clock.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/scheduler/cron.hpp>
#include <botmesh/actors/scheduler.hpp>
#include <botmesh/stores/internal/async_schedule_store.hpp>
#include <botmesh/stores/redis/redis_store.hpp>

#include "redis_server.hpp"

using namespace std::chrono_literals;

namespace {

using botmesh::internal::async_schedule_store;

botmesh::time_point t0() {
  return botmesh::parse_iso8601("2026-03-01T10:00:00Z");
}

async_schedule_store& face(const std::shared_ptr<botmesh::schedule_store>& s) {
  auto* a = dynamic_cast<async_schedule_store*>(s.get());
  REQUIRE(a != nullptr);
  return *a;
}

// An asynchronous claim's failure: the error code and text it carried.
struct failure {
  botmesh::errc code = botmesh::errc::none;
  std::string what;
  std::chrono::steady_clock::duration took{};
};

failure failed_claim(async_schedule_store& a, std::string_view id) {
  std::promise<std::exception_ptr> p;
  auto start = std::chrono::steady_clock::now();
  a.claim_async(id, "me", t0(), 10s,
                [&p](async_schedule_store::claim_result, std::exception_ptr e) {
                  p.set_value(e);
                });
  auto f = p.get_future();
  REQUIRE(f.wait_for(20s) == std::future_status::ready);
  failure out;
  out.took = std::chrono::steady_clock::now() - start;
  auto e = f.get();
  REQUIRE(e);
  try {
    std::rethrow_exception(e);
  } catch (const botmesh::error& x) {
    out.code = x.code();
    out.what = x.what();
  }
  return out;
}

// A client of `server` that gives up on a reply after 300 ms.
std::shared_ptr<botmesh::redis_client>
impatient_client(const test::redis_process& server) {
  return std::make_shared<botmesh::redis_client>(
    botmesh::redis_options{.url = server.url(), .command_timeout = "300ms",
                           .connect_timeout = "300ms", .connections = 1});
}

// A directory of its own in /tmp, removed at the end.
struct temp_dir {
  std::string path;
  temp_dir() {
    char tmpl[] = "/tmp/botmesh-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Log lines and runs of a scheduler, read from the test's thread.
struct journal {
  std::mutex mtx;
  std::vector<std::string> lines;
  std::vector<botmesh::scheduled_run> runs;

  std::function<void(std::string_view)> log() {
    return [this](std::string_view l) {
      std::lock_guard guard{mtx};
      lines.emplace_back(l);
    };
  }
  void ran(const botmesh::scheduled_run& r) {
    std::lock_guard guard{mtx};
    runs.push_back(r);
  }
  std::size_t run_count() {
    std::lock_guard guard{mtx};
    return runs.size();
  }
  bool logged(std::string_view a, std::string_view b) {
    std::lock_guard guard{mtx};
    for (auto& l : lines)
      if (l.find(a) != std::string::npos && l.find(b) != std::string::npos)
        return true;
    return false;
  }
};

} // namespace

TEST_CASE("the asynchronous face reports damaged records, error replies, a "
          "server that is down and one that does not answer") {
  test::redis_process server;
  auto client = impatient_client(server);
  botmesh::redis_store db{{.client = client, .prefix = "as"}};
  auto sched = db.schedules();
  auto& a = face(sched);
  sched->register_task("job", "every 1000", t0(), t0());
  SUBCASE("a damaged record names its key and field") {
    // A time out of range (years 1-9999): the script hands the record
    // back, its decoding refuses it.
    client->call({"HSET", "as:sched:job", "next", "-9223372036854775807"});
    auto f = failed_claim(a, "job");
    CHECK(f.code == botmesh::errc::corrupted_record);
    CHECK(f.what.find("as:sched:job") != std::string::npos);
    CHECK(f.what.find("\"next_run_at\"") != std::string::npos);
  }
  SUBCASE("an error reply names the script") {
    client->call({"DEL", "as:sched:job"});
    client->call({"SET", "as:sched:job", "a string"});
    auto f = failed_claim(a, "job");
    CHECK(f.code == botmesh::errc::store_error);
    CHECK(f.what.find("schedule_claim") != std::string::npos);
    CHECK(f.what.find("WRONGTYPE") != std::string::npos);
  }
  SUBCASE("a server that is down fails the call at once") {
    server.kill();
    auto f = failed_claim(a, "job");
    CHECK(f.code == botmesh::errc::store_error);
    CHECK(f.took < 5s);
  }
  SUBCASE("a frozen server: the call times out, and the next one works once "
          "it is back") {
    server.signal(SIGSTOP);
    auto f = failed_claim(a, "job");
    server.signal(SIGCONT);
    CHECK(f.code == botmesh::errc::timeout);
    CHECK(f.took >= 250ms);
    CHECK(f.took < 5s);
    // The claim sent before the freeze may have run once the server went
    // on; either way the store is consistent and answers again.
    std::optional<botmesh::schedule_record> rec;
    for (int i = 0; i < 50 && !rec; ++i) {
      try {
        rec = sched->get("job");
      } catch (const botmesh::error&) {
        std::this_thread::sleep_for(100ms);
      }
    }
    REQUIRE(rec);
    CHECK(rec->fencing_token <= 1);
  }
  // The record left where it was is untouched by the failures above.
  if (server.ping())
    client->call({"DEL", "as:sched:job", "as:schedidx"});
}

TEST_CASE("registering a task over a damaged Redis record names the field and "
          "writes nothing over it") {
  test::redis_process server;
  auto client = impatient_client(server);
  botmesh::redis_store db{{.client = client, .prefix = "dr"}};
  auto sched = db.schedules();
  // A one-shot that ran: a tombstone with its token.
  sched->register_task("once", "at 1000", t0(), t0());
  auto c = sched->claim("once", "me", t0(), 10s);
  REQUIRE(c);
  REQUIRE(sched->commit("once", "me", c->token, t0(), true, t0()));
  auto expect_corrupted = [&](const std::string& field) {
    try {
      sched->register_task("once", "at 1000", t0(), t0() + 1s);
      FAIL("registered over a damaged record");
    } catch (const botmesh::error& e) {
      CHECK(e.code() == botmesh::errc::corrupted_record);
      CHECK(std::string{e.what()}.find("\"" + field + "\"")
            != std::string::npos);
    }
  };
  SUBCASE("a field missing") {
    client->call({"HDEL", "dr:sched:once", "deleted"});
    expect_corrupted("deleted");
  }
  SUBCASE("a token that is not a number") {
    client->call({"HSET", "dr:sched:once", "token", "garbled"});
    expect_corrupted("token");
  }
  SUBCASE("a token too large for 64 bits") {
    client->call({"HSET", "dr:sched:once", "token", "99999999999999999999"});
    expect_corrupted("token");
  }
  SUBCASE("deleted written \"00\" is live, as the reader reads it") {
    client->call({"HSET", "dr:sched:once", "deleted", "00", "done", "0"});
    auto rec = sched->register_task("once", "at 1000", t0() + 1h, t0() + 1s);
    CHECK_FALSE(rec.deleted);
    CHECK(rec.next_run_at == t0()); // kept, not reset to the new first run
    client->call({"HSET", "dr:sched:once", "deleted", "1", "done", "1"});
  }
  // Nothing was written over: the tombstone's fields are as they were.
  auto done = client->call({"HGET", "dr:sched:once", "done"});
  CHECK(done.str == "1");
  auto next = client->call({"HGET", "dr:sched:once", "updated"});
  CHECK(next.str == std::to_string(botmesh::to_unix_ms(t0())));
}

TEST_CASE("durable tasks on Redis run and commit through the task actors") {
  auto client = std::make_shared<botmesh::redis_client>(
    botmesh::redis_options{.url = test::redis_url()});
  auto prefix = test::unique_prefix();
  botmesh::redis_store db{{.client = client, .prefix = prefix}};
  auto store = db.schedules();
  botmesh::manual_clock mc{t0()};
  journal j;
  {
    botmesh::scheduler s{{.store = store, .clock = &mc, .log = j.log()}};
    constexpr int tasks = 40;
    for (int i = 0; i < tasks; ++i)
      s.every("1s", {.id = "t" + std::to_string(i)},
              [&j](const botmesh::scheduled_run& r) { j.ran(r); });
    for (int step = 1; step <= 3; ++step) {
      mc.advance(1s);
      s.poll();
      CHECK(j.run_count() == static_cast<std::size_t>(tasks * step));
    }
    // Every calendar moved on and no lease is left behind.
    for (int i = 0; i < tasks; ++i) {
      auto rec = store->get("t" + std::to_string(i));
      REQUIRE(rec);
      CHECK(rec->next_run_at == t0() + 4s);
      CHECK(rec->lease_owner.empty());
      CHECK(rec->fencing_token == 3);
    }
  }
  std::lock_guard guard{j.mtx};
  for (auto& r : j.runs)
    CHECK(r.occurrence_key == r.task_id + "@" + botmesh::to_iso_utc(r.scheduled_at));
  CHECK(j.lines.empty());
}

TEST_CASE("Redis frozen during a claim: the claim is logged as failed, and "
          "the slot runs exactly once after Redis is back") {
  test::redis_process server;
  auto client = impatient_client(server);
  botmesh::redis_store db{{.client = client, .prefix = "fz"}};
  auto store = db.schedules();
  botmesh::manual_clock mc{t0()};
  journal j;
  botmesh::scheduler s{{.store = store, .clock = &mc, .log = j.log()}};
  s.every("1min", {.id = "job", .missed = botmesh::missed_policy::run_once,
                   .lease = std::chrono::seconds{2}},
          [&j](const botmesh::scheduled_run& r) { j.ran(r); });
  mc.advance(1min);
  server.signal(SIGSTOP);
  s.poll(); // the claim times out
  server.signal(SIGCONT);
  CHECK(j.run_count() == 0);
  CHECK(j.logged("claiming", "failed"));
  // The claim sent into the freeze may have been taken once the server
  // went on (a grant nobody waits for any more): then the slot waits for
  // that lease to run out and is claimed as interrupted. Polls until then
  // run nothing twice.
  for (int i = 0; i < 6; ++i) {
    mc.advance(1s);
    s.poll();
  }
  REQUIRE(j.run_count() == 1);
  std::lock_guard guard{j.mtx};
  CHECK(j.runs[0].scheduled_at == t0() + 1min);
  auto rec = store->get("job");
  REQUIRE(rec);
  CHECK(rec->next_run_at == t0() + 2min);
  CHECK(rec->lease_owner.empty());
  CHECK(rec->fencing_token == j.runs[0].fencing_token);
}

TEST_CASE("Redis down between a claim and its commit: the commit is logged "
          "as failed and the slot runs again once Redis is back") {
  temp_dir dir;
  auto server = test::redis_process::persistent(dir.path);
  auto client = impatient_client(server);
  botmesh::redis_store db{{.client = client, .prefix = "cm"}};
  auto store = db.schedules();
  botmesh::manual_clock mc{t0()};
  journal j;
  std::promise<void> release;
  auto released = release.get_future().share();
  botmesh::scheduler s{{.store = store, .clock = &mc, .log = j.log()}};
  s.every("1min", {.id = "job", .lease = std::chrono::seconds{2}},
          [&j, released](const botmesh::scheduled_run& r) {
            j.ran(r);
            if (r.fencing_token == 1)
              released.wait(); // the first run ends while Redis is down
          });
  mc.advance(1min);
  std::thread poller{[&] { s.poll(); }};
  while (j.run_count() == 0)
    std::this_thread::sleep_for(5ms);
  server.kill();
  release.set_value();
  poller.join(); // the commit failed
  CHECK(j.logged("committing job failed", ""));
  server.start();
  while (!server.ping())
    std::this_thread::sleep_for(20ms);
  // The stored claim outlives the failed commit; once its lease ran out
  // the slot is claimed again, as interrupted, under a newer token.
  auto rec = store->get("job");
  REQUIRE(rec);
  CHECK(rec->lease_owner.empty() == false);
  CHECK(rec->next_run_at == t0() + 1min);
  mc.advance(3s);
  s.poll();
  REQUIRE(j.run_count() == 2);
  std::lock_guard guard{j.mtx};
  CHECK(j.runs[1].scheduled_at == t0() + 1min);
  CHECK(j.runs[1].fencing_token == 2);
  rec = store->get("job");
  REQUIRE(rec);
  CHECK(rec->next_run_at == t0() + 2min);
  CHECK(rec->lease_owner.empty());
}

TEST_CASE("Redis frozen: the claims of many tasks time out together, none "
          "waiting on a thread behind another's timeout") {
  test::redis_process server;
  auto client = impatient_client(server);
  botmesh::redis_store db{{.client = client, .prefix = "many"}};
  botmesh::manual_clock mc{t0()};
  journal j;
  botmesh::scheduler s{{.store = db.schedules(), .clock = &mc, .log = j.log()}};
  constexpr int tasks = 20;
  for (int i = 0; i < tasks; ++i)
    s.every("1min", {.id = "t" + std::to_string(i)},
            [&j](const botmesh::scheduled_run& r) { j.ran(r); });
  mc.advance(1min);
  server.signal(SIGSTOP);
  auto start = std::chrono::steady_clock::now();
  s.poll();
  auto took = std::chrono::steady_clock::now() - start;
  server.signal(SIGCONT);
  CHECK(j.run_count() == 0);
  CHECK(j.logged("claiming", "failed"));
  // One after the other (a thread blocked per call) would take at least
  // tasks x 300 ms = 6 s.
  CHECK(took < 4s);
}
