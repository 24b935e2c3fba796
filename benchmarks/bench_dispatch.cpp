// bench_dispatch: messages per second through a bot (testing provider,
// memory store, 10k chats) next to a router baseline in the same actor
// system: an external thread -> one router actor -> one actor per key, the
// CAF configuration the bot uses. Rounds alternate; the ratio is the median
// of the per-round ratios. Then heap bytes per live chat (router entry and
// chat actor) next to a bare stateful CAF actor, and per passivated chat.
//
//   bench dispatch_msgs_per_s, router_msgs_per_s     msg/s
//   ratio dispatch_vs_router
//   bench heap_per_live_chat, heap_per_bare_actor     bytes
//   ratio heap_chat_vs_bare_actor
//   bench heap_per_passivated_chat                    bytes
//
//   bench_dispatch [--chats N] [--messages N] [--rounds N]

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <malloc.h>
#include <string>
#include <thread>
#include <unordered_map>
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
  auto deadline = clk::now() + 300s;
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

void configure(caf::actor_system_config& cfg) {
  // What a bot sets for its own system.
  botmesh::configure_scheduler(cfg);
  botmesh::configure_actor_system(cfg);
}

// Round-robin over chats, so every chat has messages in flight at once.
double bot_rate(caf::actor_system& sys, const std::vector<std::string>& ids,
                int per_chat) {
  auto p = std::make_shared<botmesh::testing_provider>();
  std::atomic<long> handled{0};
  botmesh::bot b{sys,
                 {.provider = p,
                  .passivate_after = "10m",
                  .max_pending_per_chat = static_cast<std::size_t>(per_chat) + 1,
                  .log_messages = false}};
  b.on_message([&](botmesh::context&) { handled.fetch_add(1); });
  b.start();
  long total = static_cast<long>(ids.size()) * per_chat;
  auto t0 = clk::now();
  for (int m = 0; m < per_chat; ++m)
    for (auto& id : ids)
      p->inject(id, "hola");
  wait_for([&] { return handled.load() == total; });
  auto secs = std::chrono::duration<double>(clk::now() - t0).count();
  b.stop();
  return static_cast<double>(total) / secs;
}

struct baseline_router_state {
  std::unordered_map<std::string, caf::actor> actors;
  std::atomic<long>* handled = nullptr;
};

caf::behavior baseline_chat(caf::event_based_actor*, std::atomic<long>* handled) {
  return {[=](const std::string&) { handled->fetch_add(1); }};
}

caf::behavior baseline_router(caf::stateful_actor<baseline_router_state>* self,
                              std::atomic<long>* handled) {
  self->state.handled = handled;
  return {
    [=](const std::string& key, std::string& text) {
      auto& a = self->state.actors[key];
      if (!a)
        a = self->spawn(baseline_chat, self->state.handled);
      self->send(a, std::move(text));
    },
  };
}

double router_rate(caf::actor_system& sys, const std::vector<std::string>& ids,
                   int per_chat) {
  std::atomic<long> handled{0};
  auto router = sys.spawn(baseline_router, &handled);
  long total = static_cast<long>(ids.size()) * per_chat;
  auto t0 = clk::now();
  for (int m = 0; m < per_chat; ++m)
    for (auto& id : ids)
      caf::anon_send(router, id, std::string{"hola"});
  wait_for([&] { return handled.load() == total; });
  auto secs = std::chrono::duration<double>(clk::now() - t0).count();
  caf::anon_send_exit(router, caf::exit_reason::user_shutdown);
  return static_cast<double>(total) / secs;
}

struct bare_state {
  std::string key;
  std::uint64_t count = 0;
};

caf::behavior bare_actor(caf::stateful_actor<bare_state>* self, std::string key,
                         std::atomic<long>* handled) {
  self->state.key = std::move(key);
  return {[=](const std::string&) {
    ++self->state.count;
    handled->fetch_add(1);
  }};
}

double heap_per_bare_actor(caf::actor_system& sys,
                           const std::vector<std::string>& ids) {
  std::atomic<long> handled{0};
  std::vector<caf::actor> actors;
  actors.reserve(ids.size());
  auto before = heap_in_use();
  for (auto& id : ids) {
    actors.push_back(sys.spawn(bare_actor, id, &handled));
    caf::anon_send(actors.back(), std::string{"hola"});
  }
  wait_for([&] { return handled.load() == static_cast<long>(ids.size()); });
  auto after = heap_in_use();
  for (auto& a : actors)
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  return (static_cast<double>(after) - static_cast<double>(before))
         / static_cast<double>(ids.size());
}

struct chat_memory {
  double per_live = 0;
  double per_passivated = 0;
};

chat_memory heap_per_chat(caf::actor_system& sys,
                          const std::vector<std::string>& ids) {
  auto p = std::make_shared<botmesh::testing_provider>();
  std::atomic<long> handled{0};
  botmesh::bot b{sys,
                 {.provider = p,
                  .passivate_after = "1500ms",
                  .log_messages = false}};
  b.on_message([&](botmesh::context&) { handled.fetch_add(1); });
  b.start();
  // Warm up allocator pools and the router's table with a few chats, with
  // enough messages to fill the process's cache of freed event boxes (a
  // fixed ~640 KB, not a cost per chat; see event_box).
  constexpr int warmup = 2048;
  for (int i = 0; i < warmup; ++i)
    p->inject("warmup-" + std::to_string(i % 64), "x");
  wait_for([&] { return handled.load() == warmup; });
  wait_for([&] { return b.stats().live_chats == 0; });
  auto before = heap_in_use();
  for (auto& id : ids)
    p->inject(id, "hola");
  wait_for([&] {
    return handled.load() == static_cast<long>(ids.size()) + warmup;
  });
  auto live = heap_in_use();
  wait_for([&] { return b.stats().live_chats == 0; });
  std::this_thread::sleep_for(50ms); // let exited actors be reclaimed
  auto passivated = heap_in_use();
  b.stop();
  auto n = static_cast<double>(ids.size());
  return {(static_cast<double>(live) - static_cast<double>(before)) / n,
          (static_cast<double>(passivated) - static_cast<double>(before)) / n};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  int chats = 10'000;
  int per_chat = 50;
  int rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string opt = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (opt == "--chats")
      chats = v;
    else if (opt == "--messages")
      per_chat = v;
    else if (opt == "--rounds")
      rounds = std::max(1, v);
  }
  std::printf("bench_dispatch: %d chats x %d messages, %d rounds, %u hardware "
              "threads\n",
              chats, per_chat, rounds, std::thread::hardware_concurrency());
  caf::actor_system_config cfg;
  configure(cfg);
  caf::actor_system sys{cfg};
  auto ids = chat_ids(chats);
  // Heap first, on a quiet heap, each after a warm-up of its own kind.
  heap_per_bare_actor(sys, chat_ids(100));
  auto bare = heap_per_bare_actor(sys, ids);
  auto mem = heap_per_chat(sys, ids);
  router_rate(sys, ids, 2); // warm up
  bot_rate(sys, ids, 2);
  std::vector<double> bots, routers, ratios;
  for (int r = 0; r < rounds; ++r) {
    // Alternate which side goes first, so neither always gets the warmer
    // machine.
    double b = 0, x = 0;
    if (r % 2 == 0) {
      x = router_rate(sys, ids, per_chat);
      b = bot_rate(sys, ids, per_chat);
    } else {
      b = bot_rate(sys, ids, per_chat);
      x = router_rate(sys, ids, per_chat);
    }
    bots.push_back(b);
    routers.push_back(x);
    ratios.push_back(b / x);
    std::printf("  round %d: bot %9.0f  router %9.0f msg/s  ratio %.3f\n",
                r + 1, b, x, b / x);
  }
  std::printf("bench dispatch_msgs_per_s %.0f msg/s\n", median(bots));
  std::printf("bench router_msgs_per_s %.0f msg/s\n", median(routers));
  std::printf("ratio dispatch_vs_router %.3f\n", median(ratios));
  std::printf("bench heap_per_live_chat %.0f bytes\n", mem.per_live);
  std::printf("bench heap_per_bare_actor %.0f bytes\n", bare);
  std::printf("ratio heap_chat_vs_bare_actor %.3f\n", mem.per_live / bare);
  std::printf("bench heap_per_passivated_chat %.0f bytes\n", mem.per_passivated);
  return 0;
}
