#pragma once

// The coordinator conformance suite: written once, run for every backend.
//
// A backend test file defines a factory F with
//   std::unique_ptr<botmesh::coordinator> make(std::string replica_id);
//       // a coordinator with a lease of F::lease on one shared backend
//   void advance(std::chrono::milliseconds d);  // let backend time pass
//   static constexpr std::chrono::milliseconds lease{...};
// and instantiates BOTMESH_COORDINATOR_CONFORMANCE(F).

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/coordinator.hpp>

TEST_CASE_TEMPLATE_DEFINE("turns are granted in ticket order across replicas, "
                          "one holder at a time",
                          F, cc_order) {
  F f;
  auto a = f.make("a");
  auto b = f.make("b");
  auto ta = a->take_ticket("chat");
  auto tb = b->take_ticket("chat");
  CHECK(tb > ta);
  CHECK_FALSE(b->try_acquire("chat", tb).has_value()); // a's ticket is first
  auto turn_a = a->try_acquire("chat", ta);
  REQUIRE(turn_a);
  CHECK_FALSE(turn_a->previous_holder.has_value()); // a new chat
  CHECK_FALSE(b->try_acquire("chat", tb).has_value()); // a holds it
  CHECK(a->release(*turn_a));
  CHECK_FALSE(a->release(*turn_a)); // released already
  auto turn_b = b->try_acquire("chat", tb);
  REQUIRE(turn_b);
  CHECK(turn_b->previous_holder == "a");
  CHECK(turn_b->fence > turn_a->fence);
  // Different chats do not wait for each other.
  auto other = a->take_ticket("other");
  CHECK(a->try_acquire("other", other).has_value());
  CHECK(b->release(*turn_b));
}

TEST_CASE_TEMPLATE_DEFINE("a dead replica's tickets and turn are skipped after "
                          "its lease",
                          F, cc_dead) {
  F f;
  auto a = f.make("a");
  auto b = f.make("b");
  auto ta = a->take_ticket("chat");
  auto held = a->try_acquire("chat", ta);
  REQUIRE(held);
  auto ta2 = a->take_ticket("chat"); // queued behind its own turn
  auto tb = b->take_ticket("chat");
  (void) ta2;
  f.crash(*a); // a dies holding the turn, with a ticket queued
  CHECK_FALSE(b->try_acquire("chat", tb).has_value());
  f.advance(F::lease + F::lease / 2);
  auto turn_b = b->try_acquire("chat", tb);
  REQUIRE(turn_b);
  CHECK(turn_b->previous_holder == "a");
  CHECK(turn_b->fence > held->fence);
}

TEST_CASE_TEMPLATE_DEFINE("renewals keep a turn past its lease; a turn not "
                          "renewed is lost",
                          F, cc_renew) {
  F f;
  auto a = f.make("a");
  auto b = f.make("b");
  auto t = a->take_ticket("chat");
  auto held = a->try_acquire("chat", t);
  REQUIRE(held);
  auto tb = b->take_ticket("chat");
  for (int i = 0; i < 4; ++i) {
    f.advance(F::lease / 3);
    CHECK(a->renew({*held}).empty());
    CHECK_FALSE(b->try_acquire("chat", tb).has_value());
  }
  // a stops renewing the turn (its heartbeat goes on through other calls).
  f.advance(F::lease + F::lease / 3);
  a->take_ticket("keepalive");
  auto turn_b = b->try_acquire("chat", tb);
  REQUIRE(turn_b);
  CHECK(a->renew({*held}) == std::vector<std::string>{"chat"});
  CHECK_FALSE(a->release(*held)); // a stale holder changes nothing
  CHECK(b->release(*turn_b));
}

TEST_CASE_TEMPLATE_DEFINE("a restarted replica with the same id never "
                          "inherits the dead process's turn",
                          F, cc_incarnation) {
  F f;
  auto old_a = f.make("a");
  auto t = old_a->take_ticket("chat");
  auto held = old_a->try_acquire("chat", t);
  REQUIRE(held);
  f.crash(*old_a);
  auto new_a = f.make("a");
  CHECK(new_a->incarnation() != old_a->incarnation());
  CHECK(new_a->replica_id() == "a");
  CHECK_FALSE(new_a->release(*held));
  auto t2 = new_a->take_ticket("chat");
  CHECK_FALSE(new_a->try_acquire("chat", t2).has_value()); // old turn holds
  f.advance(F::lease + F::lease / 2);
  auto fresh = new_a->try_acquire("chat", t2);
  REQUIRE(fresh);
  CHECK(fresh->fence > held->fence);
}

TEST_CASE_TEMPLATE_DEFINE("a given-up ticket is skipped", F, cc_cancel) {
  F f;
  auto a = f.make("a");
  auto t1 = a->take_ticket("chat");
  auto t2 = a->take_ticket("chat");
  a->cancel_ticket("chat", t1);
  CHECK(a->try_acquire("chat", t2).has_value());
  try {
    a->try_acquire("chat", t1);
    FAIL("a cancelled ticket was served");
  } catch (const botmesh::coordination_unavailable_error& e) {
    CHECK(std::string{e.what()}.find("ticket") != std::string::npos);
  }
}

TEST_CASE_TEMPLATE_DEFINE("one replica leads a name; a release or a dead "
                          "leader hands it on with a higher fence",
                          F, cc_lead) {
  F f;
  auto a = f.make("a");
  auto b = f.make("b");
  auto la = a->try_lead("provider:test");
  REQUIRE(la);
  CHECK_FALSE(b->try_lead("provider:test").has_value());
  auto again = a->try_lead("provider:test"); // renewal keeps the fence
  REQUIRE(again);
  CHECK(again->fence == la->fence);
  a->release_lead(*again);
  auto lb = b->try_lead("provider:test");
  REQUIRE(lb);
  CHECK(lb->fence > la->fence);
  f.crash(*b);
  CHECK_FALSE(a->try_lead("provider:test").has_value());
  f.advance(F::lease + F::lease / 2);
  auto la2 = a->try_lead("provider:test");
  REQUIRE(la2);
  CHECK(la2->fence > lb->fence);
}

TEST_CASE_TEMPLATE_DEFINE("racing replicas serve one chat in ticket order, "
                          "never two at once",
                          F, cc_race) {
  F f;
  std::vector<std::unique_ptr<botmesh::coordinator>> replicas;
  for (auto id : {"a", "b", "c"})
    replicas.push_back(f.make(id));
  std::atomic<int> holders{0};
  std::atomic<int> overlaps{0};
  std::mutex mtx;
  std::vector<std::uint64_t> served; // tickets in the order they were served
  std::vector<std::thread> pool;
  for (auto& r : replicas) {
    pool.emplace_back([&, c = r.get()] {
      for (int i = 0; i < 30; ++i) {
        auto t = c->take_ticket("shared");
        std::optional<botmesh::turn> held;
        while (!(held = c->try_acquire("shared", t)))
          c->wait_change("shared", std::chrono::milliseconds(5));
        if (holders.fetch_add(1) != 0)
          ++overlaps;
        {
          std::lock_guard guard{mtx};
          served.push_back(t);
        }
        holders.fetch_sub(1);
        REQUIRE(c->release(*held));
      }
    });
  }
  for (auto& t : pool)
    t.join();
  CHECK(overlaps.load() == 0);
  REQUIRE(served.size() == 90);
  CHECK(std::is_sorted(served.begin(), served.end()));
}

#define BOTMESH_COORDINATOR_CONFORMANCE(F)                                     \
  TEST_CASE_TEMPLATE_INVOKE(cc_order, F);                                      \
  TEST_CASE_TEMPLATE_INVOKE(cc_dead, F);                                       \
  TEST_CASE_TEMPLATE_INVOKE(cc_renew, F);                                      \
  TEST_CASE_TEMPLATE_INVOKE(cc_incarnation, F);                                \
  TEST_CASE_TEMPLATE_INVOKE(cc_cancel, F);                                     \
  TEST_CASE_TEMPLATE_INVOKE(cc_lead, F);                                       \
  TEST_CASE_TEMPLATE_INVOKE(cc_race, F)
