#include <doctest/doctest.h>

#include <csignal>
#include <sstream>
#include <string>
#include <vector>

#include <botmesh/scheduler/cron.hpp>
#include <botmesh/stores/redis/redis_store.hpp>
#include <botmesh/stores/sqlite/sqlite_store.hpp>

#include "redis_server.hpp"
#include "temp_file.hpp"
#include "tools/process.hpp"

using namespace std::chrono_literals;

namespace {

struct run_line {
  std::string key;
  unsigned long long token = 0;
};

std::vector<run_line> runs_of(const std::string& err) {
  std::vector<run_line> out;
  std::istringstream in{err};
  std::string word;
  for (std::string line; std::getline(in, line);) {
    std::istringstream l{line};
    run_line r;
    if (l >> word && word == "run" && l >> r.key >> r.token)
      out.push_back(r);
  }
  return out;
}

// Six slots missed, then a process that dies in the middle of its catch-up
// (after three runs) and one that takes over once its lease ran out: the
// catch-up starts again from its first slot, under a newer token.
void check_restart_from_first_slot(botmesh::schedule_store& store,
                                   const std::vector<std::string>& args_a,
                                   const std::vector<std::string>& args_b) {
  auto now = botmesh::clock::system().now();
  auto first = std::chrono::floor<std::chrono::seconds>(now) - 5min - 30s;
  store.register_task("sync", "every 60000", first, now);
  std::vector<std::string> keys;
  for (int i = 0; i < 6; ++i)
    keys.push_back("sync@" + botmesh::to_iso_utc(first + i * 1min));
  test::process a{BOTMESH_TEST_CATCHUP, args_a};
  REQUIRE(a.wait_for_stderr("blocked"));
  auto ran_a = runs_of(a.err());
  REQUIRE(ran_a.size() == 3);
  CHECK(ran_a[0].key == keys[0]);
  CHECK(ran_a[2].key == keys[2]);
  a.signal(SIGKILL);
  a.wait();
  // Nothing was committed: the row still points at the first slot.
  CHECK(store.get("sync")->next_run_at == first);
  test::process b{BOTMESH_TEST_CATCHUP, args_b};
  REQUIRE(b.wait_for_stderr(keys[5]));
  auto ran_b = runs_of(b.err());
  REQUIRE(ran_b.size() == 6);
  for (std::size_t i = 0; i < 6; ++i) {
    CHECK(ran_b[i].key == keys[i]);
    CHECK(ran_b[i].token == ran_b[0].token); // one claim for the catch-up
  }
  CHECK(ran_b[0].token > ran_a[0].token);
  b.signal(SIGKILL);
  b.wait();
}

} // namespace

TEST_CASE("a process killed with SIGKILL in the middle of a catch-up: the "
          "next one starts it again from its first slot (SQLite)") {
  test::temp_file file;
  botmesh::sqlite_store db{{.path = file.path()}};
  db.start();
  auto store = db.schedules();
  check_restart_from_first_slot(*store, {"sqlite", file.path(), "3"},
                                {"sqlite", file.path(), "0"});
}

TEST_CASE("a process killed with SIGKILL in the middle of a catch-up: the "
          "next one starts it again from its first slot (Redis)") {
  auto prefix = test::unique_prefix("bmcatch");
  botmesh::redis_store db{{.url = test::redis_url(), .prefix = prefix}};
  db.start();
  auto store = db.schedules();
  store->start();
  check_restart_from_first_slot(*store, {"redis", test::redis_url(), prefix, "3"},
                                {"redis", test::redis_url(), prefix, "0"});
}
