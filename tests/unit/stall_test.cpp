#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <dirent.h>
#include <thread>
#include <mutex>
#include <string>
#include <vector>

#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/stores/memory_coordinator.hpp>

#include "test_util.hpp"

using namespace std::chrono_literals;

namespace {

// Threads of this process now.
std::size_t thread_count() {
  std::size_t n = 0;
  if (auto* d = ::opendir("/proc/self/task")) {
    while (auto* e = ::readdir(d))
      if (e->d_name[0] != '.')
        ++n;
    ::closedir(d);
  }
  return n;
}

} // namespace

TEST_CASE("10,000 chats waiting for their turns hold no thread: an unrelated "
          "chat is answered meanwhile and every chat keeps its order") {
  constexpr int chats = 10'000;
  botmesh::memory_coordination_hub hub{{.max_idle_keys = 2 * chats}};
  auto store = std::make_shared<botmesh::memory_store>();
  std::atomic<bool> release_a{false};
  std::atomic<int> a_blocked{0};
  std::mutex mtx;
  std::vector<std::string> turns(chats); // per chat: which replica ran, in order
  auto pa = std::make_shared<botmesh::testing_provider>();
  auto pb = std::make_shared<botmesh::testing_provider>();
  auto threads_before = thread_count();
  auto make = [&](const char* id, std::shared_ptr<botmesh::testing_provider> p) {
    botmesh::coordination_options co;
    co.coordinator = std::make_shared<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = id});
    return std::make_unique<botmesh::bot>(botmesh::bot_options{
      .provider = std::move(p),
      .store = store,
      .handler_threads = 4,
      .log_messages = false,
      .scheduler_threads = 2,
      .coordination = co});
  };
  auto a = make("a", pa);
  auto b = make("b", pb);
  a->on_message([&](botmesh::context& c) {
    // The first handlers block (at most handler_threads of them run at
    // once); every chat's turn is held by A meanwhile.
    ++a_blocked;
    while (!release_a.load() && !c.stop_token().stop_requested())
      std::this_thread::sleep_for(1ms);
    std::lock_guard guard{mtx};
    turns[std::stoi(c.message().chat)] += "a";
  });
  b->on_message([&](botmesh::context& c) {
    if (c.message().chat == "unrelated") {
      c.reply("pong");
      return;
    }
    std::lock_guard guard{mtx};
    turns[std::stoi(c.message().chat)] += "b";
  });
  a->start();
  b->start();
  for (int i = 0; i < chats; ++i)
    pa->inject(std::to_string(i), "first");
  // A has taken every chat's ticket (and holds the turns) before B asks.
  REQUIRE(test::eventually([&] { return hub.keys() >= chats; }, 60s));
  REQUIRE(test::eventually([&] { return a_blocked.load() >= 1; }));
  for (int i = 0; i < chats; ++i)
    pb->inject(std::to_string(i), "second");
  auto t0 = std::chrono::steady_clock::now();
  pb->inject("unrelated", "ping");
  REQUIRE(pb->wait_for_sent(1, 30s));
  auto waited = std::chrono::steady_clock::now() - t0;
  MESSAGE("unrelated chat answered after "
          << std::chrono::duration<double, std::milli>(waited).count()
          << " ms while 10,000 chats waited");
  CHECK(pb->sent_to("unrelated").at(0).text == "pong");
  // Waiting costs no thread: two bots stay within their fixed threads (CAF
  // workers and clock, handler pools up to 4 plus a supervisor, scheduler
  // timers, the router's helpers), far from one thread per waiting chat.
  auto threads_now = thread_count();
  MESSAGE("threads: " << threads_before << " before, " << threads_now
                      << " with 20,000 turns pending");
  CHECK(threads_now - threads_before <= 40);
  {
    std::lock_guard guard{mtx};
    for (auto& t : turns)
      REQUIRE(t.find('b') == std::string::npos); // B waited for every chat
  }
  release_a = true;
  REQUIRE(test::eventually(
    [&] {
      return a->stats().handled == chats && b->stats().handled == chats + 1;
    },
    120s));
  std::lock_guard guard{mtx};
  for (int i = 0; i < chats; ++i) {
    CAPTURE(i);
    REQUIRE(turns[i] == "ab");
  }
  CHECK(a->stats().turn_failures == 0);
  CHECK(b->stats().turn_failures == 0);
}
