#pragma once

// The store conformance suite: written once, run for every backend.
//
// A backend test file defines a factory type F with
//   std::shared_ptr<botmesh::store> make();       // a fresh, empty, started store
//   void advance(std::chrono::milliseconds d);    // let store time pass by d
// and instantiates the suite with
//   TYPE_TO_STRING(F);
//   BOTMESH_STORE_CONFORMANCE(F);

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/store.hpp>

using namespace std::chrono_literals;

namespace conformance {

inline botmesh::flow_checkpoint sample_checkpoint(std::string key) {
  botmesh::flow_checkpoint cp;
  cp.key = std::move(key);
  cp.flow = "pedido";
  cp.step = "cantidad";
  cp.waiting = true;
  cp.question = 1;
  cp.state = R"({"producto":"café","notas":"ñandú 🦤","n":3})";
  cp.fingerprint = "fp-1";
  return cp;
}

template <class F>
void expect_field(F&& fn, const char* field) {
  try {
    fn();
    FAIL("expected invalid_argument_error for field ", field);
  } catch (const botmesh::invalid_argument_error& e) {
    CHECK(e.field() == field);
  }
}

} // namespace conformance

TEST_CASE_TEMPLATE_DEFINE("a store saves, lists and deletes chats with their log",
                          F, sc_chats) {
  F f;
  auto s = f.make();
  botmesh::chat_record a{"test:a", "test", "a", "", botmesh::from_unix_ms(1000),
                         botmesh::from_unix_ms(2000), R"({"vip":true})"};
  botmesh::chat_record b{"test:b", "test", "b", "", botmesh::from_unix_ms(1500),
                         botmesh::from_unix_ms(1500), "{}"};
  s->save_chat(b);
  s->save_chat(a);
  CHECK(s->get_chat("test:a") == a);
  CHECK_FALSE(s->get_chat("test:zz").has_value());
  auto all = s->list_chats();
  REQUIRE(all.size() == 2);
  CHECK(all[0].key == "test:a");
  CHECK(all[1].key == "test:b");
  // Re-saving keeps the first created_at.
  auto a2 = a;
  a2.created_at = botmesh::from_unix_ms(9999);
  a2.last_message_at = botmesh::from_unix_ms(5000);
  s->save_chat(a2);
  auto got = s->get_chat("test:a");
  REQUIRE(got);
  CHECK(got->created_at == botmesh::from_unix_ms(1000));
  CHECK(got->last_message_at == botmesh::from_unix_ms(5000));
  s->append_message("test:a", botmesh::logged_message{0, botmesh::direction::in,
                                                      "m1", "a", "hola"});
  CHECK(s->delete_chat("test:a"));
  CHECK_FALSE(s->delete_chat("test:a"));
  CHECK_FALSE(s->get_chat("test:a").has_value());
  CHECK(s->messages("test:a", 10).empty());
  CHECK(s->list_chats().size() == 1);
}

TEST_CASE_TEMPLATE_DEFINE("a store keeps contacts by id", F, sc_contacts) {
  F f;
  auto s = f.make();
  botmesh::contact_record c{"test:42", "Ana Núñez", "+34600000000",
                            botmesh::from_unix_ms(10), R"({"lang":"es"})"};
  s->save_contact(c);
  CHECK(s->get_contact("test:42") == c);
  c.name = "Ana";
  s->save_contact(c);
  CHECK(s->get_contact("test:42")->name == "Ana");
  s->save_contact(botmesh::contact_record{"test:1", "B", "", {}, "{}"});
  auto all = s->list_contacts();
  REQUIRE(all.size() == 2);
  CHECK(all[0].id == "test:1");
  CHECK(s->delete_contact("test:42"));
  CHECK_FALSE(s->get_contact("test:42").has_value());
  conformance::expect_field([&] { s->save_contact({}); }, "id");
}

TEST_CASE_TEMPLATE_DEFINE("a store's message log is ordered per chat", F,
                          sc_log) {
  F f;
  auto s = f.make();
  for (int i = 1; i <= 5; ++i) {
    auto seq = s->append_message(
      "test:x", botmesh::logged_message{0, botmesh::direction::in,
                                        "m" + std::to_string(i), "x",
                                        "texto " + std::to_string(i)});
    CHECK(seq == static_cast<std::uint64_t>(i));
  }
  s->append_message("test:y", botmesh::logged_message{0, botmesh::direction::out,
                                                      "", "", "otro chat"});
  auto last3 = s->messages("test:x", 3);
  REQUIRE(last3.size() == 3);
  CHECK(last3[0].text == "texto 3");
  CHECK(last3[2].text == "texto 5");
  CHECK(last3[2].seq == 5);
  CHECK(s->messages("test:x", 100).size() == 5);
  auto y = s->messages("test:y", 10);
  REQUIRE(y.size() == 1);
  CHECK(y[0].dir == botmesh::direction::out);
}

TEST_CASE_TEMPLATE_DEFINE("checkpoint compare-and-set chains revisions per key",
                          F, sc_cas) {
  F f;
  auto s = f.make();
  auto cp = conformance::sample_checkpoint("test:c");
  CHECK_FALSE(s->get_checkpoint("test:c").has_value());
  // A writer that saw a revision that does not exist is refused.
  CHECK_FALSE(s->set_checkpoint_if(cp, 7).has_value());
  auto r1 = s->set_checkpoint_if(cp, 0);
  REQUIRE(r1);
  CHECK(*r1 > 0);
  auto got = s->get_checkpoint("test:c");
  REQUIRE(got);
  CHECK(got->revision == *r1);
  CHECK(got->state == cp.state);
  CHECK(got->flow == "pedido");
  CHECK(got->step == "cantidad");
  CHECK(got->waiting);
  CHECK(got->question == 1);
  CHECK(got->fingerprint == "fp-1");
  // Creating again as if absent is refused: someone wrote r1.
  CHECK_FALSE(s->set_checkpoint_if(cp, 0).has_value());
  cp.step = "confirmar";
  auto r2 = s->set_checkpoint_if(cp, *r1);
  REQUIRE(r2);
  CHECK(*r2 > *r1);
  // A stale writer (still at r1) changes nothing.
  auto stale = cp;
  stale.step = "stale";
  CHECK_FALSE(s->set_checkpoint_if(stale, *r1).has_value());
  CHECK(s->get_checkpoint("test:c")->step == "confirmar");
  CHECK_FALSE(s->clear_checkpoint_if("test:c", *r1));
  CHECK(s->get_checkpoint("test:c").has_value());
  CHECK(s->clear_checkpoint_if("test:c", *r2));
  CHECK_FALSE(s->get_checkpoint("test:c").has_value());
  // After a clear, the old revision can never match again...
  CHECK_FALSE(s->set_checkpoint_if(stale, *r2).has_value());
  // ...and a new conversation continues the chain.
  auto r3 = s->set_checkpoint_if(cp, 0);
  REQUIRE(r3);
  CHECK(*r3 > *r2);
  auto r4 = s->set_checkpoint(cp);
  CHECK(r4 > *r3);
  s->clear_checkpoint("test:c");
  CHECK_FALSE(s->get_checkpoint("test:c").has_value());
  s->clear_checkpoint("test:never");
}

TEST_CASE_TEMPLATE_DEFINE("a checkpoint round-trips every field", F,
                          sc_roundtrip) {
  F f;
  auto s = f.make();
  auto cp = conformance::sample_checkpoint("test:full");
  cp.ephemeral = true;
  cp.expires_at = botmesh::from_unix_ms(4'102'444'800'000); // year 2100
  botmesh::inbound_message answer;
  answer.id = "m-9";
  answer.provider = "test";
  answer.chat = "full";
  answer.sender = "full";
  answer.text = "dos, por favor ☕";
  answer.timestamp = botmesh::from_unix_ms(1234);
  cp.saved_answer = answer;
  cp.answer_ref = "journal:17";
  auto rev = s->set_checkpoint(cp);
  auto got = s->get_checkpoint("test:full");
  REQUIRE(got);
  CHECK(got->revision == rev);
  CHECK(got->ephemeral);
  CHECK(got->expires_at == cp.expires_at);
  REQUIRE(got->saved_answer.has_value());
  CHECK(*got->saved_answer == answer);
  CHECK(got->answer_ref == "journal:17");
  CHECK(got->created_at != botmesh::time_point{});
  conformance::expect_field(
    [&] {
      auto bad = cp;
      bad.state = "{not json";
      s->set_checkpoint(bad);
    },
    "state");
  CHECK(s->get_checkpoint("test:full")->revision == rev);
}

TEST_CASE_TEMPLATE_DEFINE("an ephemeral checkpoint expires", F,
                          sc_ephemeral) {
  F f;
  auto s = f.make();
  auto cp = conformance::sample_checkpoint("test:eph");
  cp.ephemeral = true;
  // Backends read expiry against wall-clock time (the factory's clock starts
  // at the system's now), so stamp it relative to that; a second, so a
  // loaded machine (CI, sanitizers) still reads it back before it expires.
  cp.expires_at = std::chrono::time_point_cast<std::chrono::milliseconds>(
                    std::chrono::system_clock::now())
                  + 1s;
  auto rev = s->set_checkpoint(cp);
  REQUIRE(s->get_checkpoint("test:eph").has_value());
  f.advance(1500ms);
  CHECK_FALSE(s->get_checkpoint("test:eph").has_value());
  // Expiry behaves like a clear: the revision chain goes on.
  CHECK_FALSE(s->set_checkpoint_if(cp, rev).has_value());
  auto next = s->set_checkpoint_if(conformance::sample_checkpoint("test:eph"), 0);
  REQUIRE(next);
  CHECK(*next > rev);
}

TEST_CASE_TEMPLATE_DEFINE("user data is namespaced, listed and expires", F,
                          sc_user) {
  F f;
  auto s = f.make();
  s->set_user_data("u1", "perfil", "nombre", R"("Ana")");
  s->set_user_data("u1", "perfil", "edad", "31");
  s->set_user_data("u1", "carrito", "items", "[1,2]");
  s->set_user_data("u2", "perfil", "nombre", R"("Luis")");
  s->set_user_data("u1", "perfil", "token", R"("x")", 200ms);
  CHECK(s->get_user_data("u1", "perfil", "nombre") == R"("Ana")");
  CHECK(s->get_user_data("u2", "perfil", "nombre") == R"("Luis")");
  CHECK_FALSE(s->get_user_data("u1", "perfil", "nada").has_value());
  auto perfil = s->list_user_data("u1", "perfil");
  REQUIRE(perfil.size() == 3);
  CHECK(perfil[0].first == "edad");
  CHECK(perfil[1].first == "nombre");
  CHECK(perfil[2].first == "token");
  f.advance(300ms);
  CHECK_FALSE(s->get_user_data("u1", "perfil", "token").has_value());
  CHECK(s->list_user_data("u1", "perfil").size() == 2);
  CHECK(s->get_user_data("u1", "perfil", "nombre").has_value());
  CHECK(s->delete_user_data("u1", "perfil", "nombre"));
  CHECK_FALSE(s->delete_user_data("u1", "perfil", "nombre"));
  CHECK_FALSE(s->get_user_data("u1", "perfil", "nombre").has_value());
  conformance::expect_field(
    [&] { s->set_user_data("u1", "perfil", "x", "{nope"); }, "value");
  conformance::expect_field([&] { s->set_user_data("", "perfil", "x", "1"); },
                            "user");
  conformance::expect_field([&] { s->set_user_data("u1", "", "x", "1"); }, "ns");
  conformance::expect_field(
    [&] { s->set_user_data("u1", "perfil", "x", "1", 0ms); }, "ttl");
  // A TTL past 100 years (milliseconds::max(), a natural "never") is
  // refused: now + ttl wrapped into the past, and the value read back absent.
  conformance::expect_field(
    [&] {
      s->set_user_data("u1", "perfil", "x", "1",
                       std::chrono::milliseconds::max());
    },
    "ttl");
  CHECK_FALSE(s->get_user_data("u1", "perfil", "x").has_value());
  // A user and a namespace that hold a 0x1f byte stay apart from those the
  // byte would split them into.
  s->set_user_data("a\x1f" "b", "c", "k", "1");
  CHECK_FALSE(s->get_user_data("a", "b\x1f" "c", "k").has_value());
  CHECK(s->list_user_data("a", "b\x1f" "c").empty());
  CHECK(s->get_user_data("a\x1f" "b", "c", "k") == "1");
  CHECK(s->list_user_data("a\x1f" "b", "c").size() == 1);
}

TEST_CASE_TEMPLATE_DEFINE("fenced locks exclude, expire and never reuse a fence",
                          F, sc_locks) {
  F f;
  auto s = f.make();
  auto a = s->acquire_lock_fenced("job", 200ms);
  REQUIRE(a);
  CHECK_FALSE(s->acquire_lock_fenced("job", 200ms).has_value());
  CHECK(s->renew_lock("job", a->token, 200ms));
  CHECK_FALSE(s->release_lock("job", "not-the-token"));
  CHECK_FALSE(s->acquire_lock_fenced("job", 200ms).has_value());
  CHECK(s->release_lock("job", a->token));
  CHECK_FALSE(s->release_lock("job", a->token));
  auto b = s->acquire_lock_fenced("job", 200ms);
  REQUIRE(b);
  CHECK(b->fence > a->fence);
  CHECK(b->token != a->token);
  // b's owner freezes past its TTL: c takes the lock with a higher fence.
  f.advance(300ms);
  CHECK_FALSE(s->renew_lock("job", b->token, 200ms));
  auto c = s->acquire_lock_fenced("job", 5000ms);
  REQUIRE(c);
  CHECK(c->fence > b->fence);
  // The stale owner's release changes nothing.
  CHECK_FALSE(s->release_lock("job", b->token));
  CHECK_FALSE(s->acquire_lock_fenced("job", 200ms).has_value());
  CHECK(s->renew_lock("job", c->token, 5000ms));
  // Locks of other keys are independent.
  CHECK(s->acquire_lock_fenced("other", 200ms).has_value());
  conformance::expect_field([&] { s->acquire_lock_fenced("", 200ms); }, "key");
  conformance::expect_field([&] { s->acquire_lock_fenced("k", 0ms); }, "ttl");
  // A TTL whose expiry would wrap into the past would give a lock free at
  // once: refused, and a later taker still excluded by c.
  conformance::expect_field(
    [&] { s->acquire_lock_fenced("k", std::chrono::milliseconds::max()); },
    "ttl");
  conformance::expect_field(
    [&] { s->renew_lock("job", c->token, std::chrono::milliseconds::max()); },
    "ttl");
  CHECK_FALSE(s->acquire_lock_fenced("job", 200ms).has_value());
}

TEST_CASE_TEMPLATE_DEFINE(
  "racing set_checkpoint_if calls have exactly one winner per revision", F,
  sc_race_cas) {
  F f;
  auto s = f.make();
  constexpr int threads = 8;
  constexpr int rounds = 40;
  std::barrier sync{threads};
  std::atomic<std::uint64_t> expected{0};
  std::vector<std::atomic<int>> winners(rounds);
  std::vector<std::uint64_t> revisions(rounds, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int r = 0; r < rounds; ++r) {
        sync.arrive_and_wait(); // everyone read the same `expected`
        auto cp = conformance::sample_checkpoint("test:race");
        cp.step = "t" + std::to_string(t);
        auto seen = expected.load();
        sync.arrive_and_wait();
        if (auto rev = s->set_checkpoint_if(cp, seen)) {
          winners[r]++;
          revisions[r] = *rev;
          expected.store(*rev);
        }
        sync.arrive_and_wait(); // the winner published its revision
      }
    });
  }
  for (auto& th : pool)
    th.join();
  for (int r = 0; r < rounds; ++r) {
    CHECK(winners[r].load() == 1);
    if (r > 0)
      CHECK(revisions[r] > revisions[r - 1]);
  }
  CHECK(s->get_checkpoint("test:race")->revision == revisions[rounds - 1]);
}

TEST_CASE_TEMPLATE_DEFINE("racing lock acquisitions get strictly growing fences",
                          F, sc_race_locks) {
  F f;
  auto s = f.make();
  constexpr int threads = 8;
  constexpr int per_thread = 50;
  std::mutex mtx;
  std::vector<std::uint64_t> fences; // appended while holding the lock
  std::atomic<int> holders{0};
  std::atomic<int> max_holders{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = 0; i < per_thread;) {
        auto l = s->acquire_lock_fenced("race", 10'000ms);
        if (!l) {
          std::this_thread::yield();
          continue;
        }
        auto h = ++holders;
        int m = max_holders.load();
        while (h > m && !max_holders.compare_exchange_weak(m, h)) {
        }
        {
          std::lock_guard guard{mtx};
          fences.push_back(l->fence);
        }
        --holders;
        REQUIRE(s->release_lock("race", l->token));
        ++i;
      }
    });
  }
  for (auto& th : pool)
    th.join();
  CHECK(max_holders.load() == 1);
  REQUIRE(fences.size() == threads * per_thread);
  CHECK(std::is_sorted(fences.begin(), fences.end()));
  CHECK(std::adjacent_find(fences.begin(), fences.end()) == fences.end());
}

/// Runs every case above against the store factory F.
#define BOTMESH_STORE_CONFORMANCE(F)                                           \
  TEST_CASE_TEMPLATE_INVOKE(sc_chats, F);                                      \
  TEST_CASE_TEMPLATE_INVOKE(sc_contacts, F);                                   \
  TEST_CASE_TEMPLATE_INVOKE(sc_log, F);                                        \
  TEST_CASE_TEMPLATE_INVOKE(sc_cas, F);                                        \
  TEST_CASE_TEMPLATE_INVOKE(sc_roundtrip, F);                                  \
  TEST_CASE_TEMPLATE_INVOKE(sc_ephemeral, F);                                  \
  TEST_CASE_TEMPLATE_INVOKE(sc_user, F);                                       \
  TEST_CASE_TEMPLATE_INVOKE(sc_locks, F);                                      \
  TEST_CASE_TEMPLATE_INVOKE(sc_race_cas, F);                                   \
  TEST_CASE_TEMPLATE_INVOKE(sc_race_locks, F)
