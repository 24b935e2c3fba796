// The bounded, time-limited set of recent inbound ids.

#include <doctest/doctest.h>

#include <deque>
#include <map>
#include <random>
#include <set>
#include <string>

#include <botmesh/runtime/core/clock.hpp>
#include <botmesh/runtime/internal/dedupe_set.hpp>

using namespace std::chrono_literals;
using botmesh::internal::dedupe_set;

TEST_CASE("an id is a duplicate within the window and new again after it") {
  botmesh::manual_clock clock;
  dedupe_set set{100, 1000ms, clock};
  CHECK(set.insert("telegram:1#10"));
  CHECK_FALSE(set.insert("telegram:1#10"));
  CHECK(set.insert(std::string{"telegram:1#11"}));
  clock.advance(999ms);
  CHECK_FALSE(set.insert("telegram:1#10"));
  clock.advance(1ms);
  // Expired: new again, and remembered from now.
  CHECK(set.insert("telegram:1#10"));
  CHECK_FALSE(set.insert("telegram:1#10"));
  CHECK(set.size() == 1); // #11 swept with the first #10 entry
}

TEST_CASE("an id re-inserted after expiry, before its old entry was swept, "
          "stays until its new entry expires") {
  botmesh::manual_clock clock;
  dedupe_set set{100, 100ms, clock};
  CHECK(set.insert("a"));
  clock.advance(100ms);
  // "a" expired; no other insert swept it yet. Re-inserting sweeps the
  // old entry first, then remembers "a" again.
  CHECK(set.insert("a"));
  clock.advance(50ms);
  CHECK(set.insert("b")); // sweeps nothing: both are in their window
  CHECK_FALSE(set.insert("a"));
  clock.advance(50ms);
  CHECK(set.insert("a")); // a's window ended, b's not
  CHECK_FALSE(set.insert("b"));
}

TEST_CASE("past max_entries the oldest ids are forgotten first") {
  botmesh::manual_clock clock;
  dedupe_set set{3, 60s, clock};
  for (auto id : {"1", "2", "3", "4"})
    CHECK(set.insert(id));
  CHECK(set.size() == 3);
  CHECK(set.insert("1")); // forgotten: the bound, not the window
  CHECK_FALSE(set.insert("4"));
}

TEST_CASE("the set agrees with a reference model over a random run") {
  // Random ids, re-inserts, expiries and the size bound together; under
  // AddressSanitizer this also checks that no entry outlives its key.
  botmesh::manual_clock clock;
  constexpr std::size_t bound = 50;
  dedupe_set set{bound, 20ms, clock};
  std::mt19937 rng{7};
  std::map<std::string, std::int64_t> model; // id -> inserted at (ms)
  std::deque<std::pair<std::int64_t, std::string>> order;
  std::int64_t now = 0;
  auto expire = [&] {
    while (!order.empty()
           && (order.front().first + 20 <= now || order.size() > bound)) {
      auto [at, id] = order.front();
      if (auto i = model.find(id); i != model.end() && i->second == at)
        model.erase(i);
      order.pop_front();
    }
  };
  for (int step = 0; step < 20000; ++step) {
    if (rng() % 4 == 0) {
      auto d = static_cast<std::int64_t>(rng() % 6);
      clock.advance(std::chrono::milliseconds{d});
      now += d;
    }
    auto id = "chat:" + std::to_string(rng() % 120);
    expire();
    bool fresh = true;
    if (auto i = model.find(id); i != model.end()) {
      if (i->second + 20 > now)
        fresh = false;
      else
        i->second = now;
    } else {
      model.emplace(id, now);
    }
    if (fresh) {
      order.emplace_back(now, id);
      expire();
    }
    REQUIRE(set.insert(id) == fresh);
    REQUIRE(set.size() == model.size());
  }
}
