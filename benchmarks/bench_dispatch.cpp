// bench_dispatch: messages per second through a bot (testing provider,
// memory store, 10k chats) against a bare CAF baseline measured in the same
// run (one actor per key, plain anon_send), and heap bytes per live chat
// actor and per passivated chat.
//
//   bench_dispatch [chats=10000] [messages_per_chat=50]

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <malloc.h>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>

#include <botmesh/actors/router.hpp>
#include <botmesh/runtime/botmesh.hpp>

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

std::size_t heap_in_use() {
  return mallinfo2().uordblks;
}

void wait_for(const std::function<bool()>& pred) {
  auto deadline = clk::now() + 120s;
  while (!pred()) {
    if (clk::now() > deadline) {
      std::fprintf(stderr, "bench_dispatch: timed out\n");
      std::exit(1);
    }
    std::this_thread::sleep_for(200us);
  }
}

std::vector<std::string> chat_ids(int chats) {
  std::vector<std::string> ids;
  ids.reserve(chats);
  for (int c = 0; c < chats; ++c)
    ids.push_back("chat-" + std::to_string(c));
  return ids;
}

// Round-robin over chats, so every chat has messages in flight at once.
double bot_rate(int chats, int per_chat, bool log_messages) {
  auto ids = chat_ids(chats);
  auto p = std::make_shared<botmesh::testing_provider>();
  std::atomic<long> handled{0};
  botmesh::bot b{{.provider = p,
                  .passivate_after = "10m",
                  .max_pending_per_chat = static_cast<std::size_t>(per_chat) + 1,
                  .log_messages = log_messages}};
  b.on_message([&](botmesh::context&) { handled.fetch_add(1); });
  b.start();
  long total = static_cast<long>(chats) * per_chat;
  auto t0 = clk::now();
  for (int m = 0; m < per_chat; ++m)
    for (auto& id : ids)
      p->inject(id, "hola");
  wait_for([&] { return handled.load() == total; });
  auto secs = std::chrono::duration<double>(clk::now() - t0).count();
  b.stop();
  return static_cast<double>(total) / secs;
}

double baseline_rate(int chats, int per_chat) {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", std::max(2u, std::thread::hardware_concurrency()));
  cfg.set("scheduler.max-throughput", 32);
  caf::actor_system sys{cfg};
  std::atomic<long> handled{0};
  std::vector<caf::actor> actors;
  actors.reserve(chats);
  for (int c = 0; c < chats; ++c)
    actors.push_back(sys.spawn([&handled]() -> caf::behavior {
      return {[&handled](const std::string&) { handled.fetch_add(1); }};
    }));
  long total = static_cast<long>(chats) * per_chat;
  std::string text = "hola";
  auto t0 = clk::now();
  for (int m = 0; m < per_chat; ++m)
    for (auto& a : actors)
      caf::anon_send(a, text);
  wait_for([&] { return handled.load() == total; });
  auto secs = std::chrono::duration<double>(clk::now() - t0).count();
  for (auto& a : actors)
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  return static_cast<double>(total) / secs;
}

struct memory_figures {
  double per_live = 0;
  double per_passivated = 0;
};

memory_figures memory_per_chat(int chats, bool log_messages) {
  auto ids = chat_ids(chats);
  auto p = std::make_shared<botmesh::testing_provider>();
  std::atomic<long> handled{0};
  botmesh::bot b{{.provider = p,
                  .passivate_after = "1500ms",
                  .log_messages = log_messages}};
  b.on_message([&](botmesh::context&) { handled.fetch_add(1); });
  b.start();
  // Warm up allocator pools and the router's table with one chat.
  p->inject("warmup", "x");
  wait_for([&] { return handled.load() == 1; });
  wait_for([&] { return b.stats().live_chats == 0; });
  auto before = heap_in_use();
  for (auto& id : ids)
    p->inject(id, "hola");
  wait_for([&] { return handled.load() == chats + 1; });
  auto live = heap_in_use();
  wait_for([&] { return b.stats().live_chats == 0; });
  std::this_thread::sleep_for(50ms); // let exited actors be reclaimed
  auto passivated = heap_in_use();
  b.stop();
  return {static_cast<double>(live - before) / chats,
          (static_cast<double>(passivated) - static_cast<double>(before)) / chats};
}

} // namespace

int main(int argc, char** argv) {
  int chats = argc > 1 ? std::atoi(argv[1]) : 10'000;
  int per_chat = argc > 2 ? std::atoi(argv[2]) : 50;
  std::printf("bench_dispatch: %d chats x %d messages, %u hardware threads\n",
              chats, per_chat, std::thread::hardware_concurrency());
  // Warm up, then alternate three rounds so neither side always gets the
  // warmer machine; report the best of each (the least disturbed run).
  baseline_rate(chats, 2);
  bot_rate(chats, 2, true);
  double base = 0, bot = 0, bot_nolog = 0;
  for (int round = 0; round < 3; ++round) {
    auto b = baseline_rate(chats, per_chat);
    auto l = bot_rate(chats, per_chat, true);
    auto n = bot_rate(chats, per_chat, false);
    std::printf("  round %d: baseline %9.0f  bot %9.0f  bot without log %9.0f "
                "msg/s\n",
                round + 1, b, l, n);
    base = std::max(base, b);
    bot = std::max(bot, l);
    bot_nolog = std::max(bot_nolog, n);
  }
  std::printf("best of 3 rounds:\n");
  std::printf("baseline (bare CAF, 1 actor/key, anon_send): %12.0f msg/s\n", base);
  std::printf("bot (router + chat actors + handler pool,\n"
              "     memory store logging every message):  %12.0f msg/s\n", bot);
  std::printf("bot without message logging:               %12.0f msg/s\n",
              bot_nolog);
  std::printf("ratio bot / baseline:                       %12.3f\n", bot / base);
  std::printf("ratio bot without logging / baseline:       %12.3f\n",
              bot_nolog / base);
  auto mem = memory_per_chat(chats, false);
  std::printf("heap per live chat actor (router entry + actor): %8.0f bytes\n",
              mem.per_live);
  std::printf("heap per passivated chat (no message log):       %8.0f bytes\n",
              mem.per_passivated);
  auto mem_log = memory_per_chat(chats, true);
  std::printf("heap per passivated chat (memory store: chat record + 1 logged"
              " message): %8.0f bytes\n",
              mem_log.per_passivated);
  return 0;
}
