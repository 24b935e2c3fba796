#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <random>
#include <thread>

#include <botmesh/runtime/botmesh.hpp>

#include "test_util.hpp"

using namespace std::chrono_literals;

namespace {

// Records, per chat, the order of handler calls and whether two calls of the
// same chat ever overlapped; globally, how many calls ran at once.
struct recorder {
  explicit recorder(int chats) : order(chats), in_flight(chats), locks(chats) {
    // nop
  }

  void call(int chat, int seq) {
    if (in_flight[chat].fetch_add(1) != 0)
      ++same_chat_overlaps;
    auto now = ++global_in_flight;
    int seen = max_global.load();
    while (now > seen && !max_global.compare_exchange_weak(seen, now)) {
    }
    // Random short blocking work, so turns of different chats interleave.
    thread_local std::mt19937 rng{std::random_device{}()};
    std::this_thread::sleep_for(
      std::chrono::microseconds(std::uniform_int_distribution<>(0, 400)(rng)));
    {
      std::lock_guard guard{locks[chat]};
      order[chat].push_back(seq);
    }
    --global_in_flight;
    in_flight[chat].fetch_sub(1);
    ++calls;
  }

  std::vector<std::vector<int>> order;
  std::vector<std::atomic<int>> in_flight;
  std::vector<std::mutex> locks;
  std::atomic<int> same_chat_overlaps{0};
  std::atomic<int> global_in_flight{0};
  std::atomic<int> max_global{0};
  std::atomic<int> calls{0};
};

// Parses "<chat> <seq>".
std::pair<int, int> parse(const std::string& text) {
  auto sp = text.find(' ');
  return {std::stoi(text.substr(0, sp)), std::stoi(text.substr(sp + 1))};
}

// Injects `per_chat` messages into each chat from `threads` threads at once;
// each chat's messages come from one thread, in sequence, so arrival order
// per chat is defined while different chats interleave freely.
void inject_all(botmesh::testing_provider& p, int chats, int per_chat,
                int first_seq, int threads) {
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int s = first_seq; s < first_seq + per_chat; ++s)
        for (int c = t; c < chats; c += threads)
          p.inject("c" + std::to_string(c),
                   std::to_string(c) + " " + std::to_string(s));
    });
  }
  for (auto& th : pool)
    th.join();
}

} // namespace

TEST_CASE("100 chats x 100 messages from several threads: each chat in order, "
          "never overlapping, chats in parallel") {
  constexpr int chats = 100;
  constexpr int per_chat = 100;
  auto p = std::make_shared<botmesh::testing_provider>();
  recorder rec{chats};
  botmesh::bot b{{.provider = p, .handler_threads = 16}};
  b.on_message([&](botmesh::context& c) {
    auto [chat, seq] = parse(c.text());
    rec.call(chat, seq);
  });
  b.start();
  inject_all(*p, chats, per_chat, 0, 4);
  REQUIRE(test::eventually([&] { return rec.calls.load() == chats * per_chat; },
                           60s));
  CHECK(rec.same_chat_overlaps.load() == 0);
  for (int c = 0; c < chats; ++c) {
    CAPTURE(c);
    std::vector<int> expected(per_chat);
    std::iota(expected.begin(), expected.end(), 0);
    CHECK(rec.order[c] == expected);
  }
  // Parallelism: calls of different chats were running at the same time.
  CHECK(rec.max_global.load() > 1);
  MESSAGE("max handler calls at once: " << rec.max_global.load());
  REQUIRE(test::eventually(
    [&] { return b.stats().handled == chats * per_chat; }));
  auto st = b.stats();
  CHECK(st.handled == chats * per_chat);
  CHECK(st.refused_overload == 0);
  CHECK(st.activations == chats);
}

TEST_CASE("chat order and exclusion hold across passivation and re-spawn") {
  constexpr int chats = 100;
  constexpr int per_round = 30;
  constexpr int rounds = 3;
  auto p = std::make_shared<botmesh::testing_provider>();
  recorder rec{chats};
  botmesh::bot b{
    {.provider = p, .passivate_after = 20ms, .handler_threads = 16}};
  b.on_message([&](botmesh::context& c) {
    auto [chat, seq] = parse(c.text());
    rec.call(chat, seq);
  });
  b.start();
  for (int r = 0; r < rounds; ++r) {
    inject_all(*p, chats, per_round, r * per_round, 4);
    REQUIRE(test::eventually(
      [&] { return rec.calls.load() == chats * per_round * (r + 1); }, 60s));
    // Every chat actor goes idle and is passivated before the next round.
    REQUIRE(test::eventually([&] { return b.stats().live_chats == 0; }, 20s));
  }
  CHECK(rec.same_chat_overlaps.load() == 0);
  for (int c = 0; c < chats; ++c) {
    CAPTURE(c);
    std::vector<int> expected(per_round * rounds);
    std::iota(expected.begin(), expected.end(), 0);
    CHECK(rec.order[c] == expected);
  }
  auto st = b.stats();
  CHECK(st.activations >= chats * rounds);
  CHECK(st.passivations == st.activations);
  CHECK(rec.max_global.load() > 1);
}
