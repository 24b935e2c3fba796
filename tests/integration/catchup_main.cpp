// A process with one durable catch-up task, for the SIGKILL test:
//   botmesh_test_catchup sqlite <path> <block_at>
//   botmesh_test_catchup redis <url> <prefix> <block_at>
// Every run prints "run <occurrence key> <token>" on stderr; the run number
// <block_at> (from 1; 0 = never) prints "blocked" and never returns, so the
// test can kill the process in the middle of its catch-up.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include <botmesh/actors/scheduler.hpp>
#include <botmesh/stores/redis/redis_store.hpp>
#include <botmesh/stores/sqlite/sqlite_store.hpp>

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s sqlite <path> <block_at> | redis <url> "
                         "<prefix> <block_at>\n",
                 argv[0]);
    return 2;
  }
  std::string backend = argv[1];
  std::shared_ptr<botmesh::store> db;
  int block_at = 0;
  if (backend == "sqlite") {
    db = std::make_shared<botmesh::sqlite_store>(
      botmesh::sqlite_store_options{.path = argv[2]});
    block_at = std::atoi(argv[3]);
  } else if (argc >= 5) {
    db = std::make_shared<botmesh::redis_store>(
      botmesh::redis_store_options{.url = argv[2], .prefix = argv[3]});
    block_at = std::atoi(argv[4]);
  } else {
    return 2;
  }
  db->start();
  auto schedules = backend == "sqlite"
                     ? std::static_pointer_cast<botmesh::sqlite_store>(db)->schedules()
                     : std::static_pointer_cast<botmesh::redis_store>(db)->schedules();
  botmesh::scheduler s{{.store = schedules, .tick = "200ms"}};
  int runs = 0;
  s.every("1m",
          {.id = "sync", .missed = botmesh::missed_policy::catch_up,
           .lease = "1s"},
          [&](const botmesh::scheduled_run& r) {
            ++runs;
            std::fprintf(stderr, "run %s %llu\n", r.occurrence_key.c_str(),
                         static_cast<unsigned long long>(r.fencing_token));
            if (runs == block_at) {
              std::fprintf(stderr, "blocked\n");
              for (;;)
                std::this_thread::sleep_for(std::chrono::hours{1});
            }
          });
  s.start();
  std::this_thread::sleep_for(std::chrono::seconds{60});
  s.stop();
  return 0;
}
