#pragma once

// The durable backend conformance suite: written once, run for every
// backend (memory, SQLite, Redis).
//
// A backend test file defines a factory F with
//   std::shared_ptr<botmesh::durable_backend> make();
//       // a started backend; every call of one factory shares its data
//   void advance(std::chrono::milliseconds d);   // let backend time pass
//   static constexpr std::chrono::milliseconds lease{...};
// and instantiates BOTMESH_DURABLE_CONFORMANCE(F).

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/durable_backend.hpp>

namespace dc {

using namespace std::chrono_literals;
using botmesh::durable_backend;
using botmesh::journal_put;
using botmesh::journal_record;
using botmesh::outbox_verdict;

/// The backend's operations as blocking calls (completions may come from
/// another thread).
struct sync {
  durable_backend& b;

  template <class T, class Call>
  T wait(Call call) {
    std::promise<T> p;
    auto f = p.get_future();
    call([&p](T v, std::exception_ptr e) {
      if (e)
        p.set_exception(e);
      else
        p.set_value(std::move(v));
    });
    return f.get();
  }

  journal_put record(std::string id, std::string holder,
                     std::chrono::milliseconds ttl = 60s) {
    journal_record r;
    r.id = id;
    r.key = id.substr(0, id.find('#'));
    r.message = "{\"text\":\"" + id + "\"}";
    return wait<journal_put>([&](auto done) {
      b.record(std::move(r), holder, ttl, std::move(done));
    });
  }
  bool confirm(std::string id, std::string holder) {
    return wait<bool>([&](auto done) { b.confirm(id, holder, std::move(done)); });
  }
  bool release(std::string id, std::string holder) {
    return wait<bool>([&](auto done) { b.release(id, holder, std::move(done)); });
  }
  bool release_unhandled(std::string id, std::string holder) {
    return wait<bool>([&](auto done) {
      b.release_unhandled(id, holder, std::move(done));
    });
  }
  durable_backend::claim_result claim(std::string holder,
                                      std::chrono::milliseconds lease,
                                      std::uint32_t max_attempts = 5,
                                      std::size_t limit = 100) {
    return wait<durable_backend::claim_result>([&](auto done) {
      b.beat_and_claim(holder, lease, limit, max_attempts, std::move(done));
    });
  }
  bool retire(std::string holder) {
    return wait<bool>([&](auto done) { b.retire(holder, std::move(done)); });
  }
  outbox_verdict send(std::string id, std::string key, std::uint64_t fence,
                     std::chrono::milliseconds ttl = 60s,
                     std::string writer = "w") {
    return wait<outbox_verdict>([&](auto done) {
      b.outbox_claim(id, key, fence, writer, ttl, std::move(done));
    });
  }
  outbox_verdict record(std::string id, std::string key, std::uint64_t fence,
                        std::chrono::milliseconds ttl = 60s,
                        std::string writer = "w") {
    return wait<outbox_verdict>([&](auto done) {
      b.outbox_record(id, key, fence, writer, ttl, std::move(done));
    });
  }
  bool forget(std::string id, std::string writer = "w") {
    return wait<bool>(
      [&](auto done) { b.outbox_forget(id, writer, std::move(done)); });
  }
};

inline std::vector<std::string> ids(const std::vector<journal_record>& rs) {
  std::vector<std::string> out;
  for (auto& r : rs)
    out.push_back(r.id);
  return out;
}

// Records `id` (holder "a") and has it handled twice without a confirm:
// released by "a", claimed by "b" (its attempt 2) and released again.
inline void handled_twice(sync& s, const std::string& id,
                          std::chrono::milliseconds lease) {
  REQUIRE(s.record(id, "a") == journal_put::recorded);
  REQUIRE(s.release(id, "a"));
  REQUIRE(s.claim("b", lease).records.size() == 1); // attempt 2
  REQUIRE(s.release(id, "b"));
}

} // namespace dc

TEST_CASE_TEMPLATE_DEFINE("a platform message is journaled once: a second "
                          "delivery is a duplicate, also from another holder",
                          F, dc_dup) {
  F f;
  auto b = f.make();
  dc::sync s{*b};
  CHECK(s.record("t:1#m1", "a") == dc::journal_put::recorded);
  CHECK(s.record("t:1#m1", "a") == dc::journal_put::duplicate);
  CHECK(s.record("t:1#m1", "b") == dc::journal_put::duplicate);
  // Still a duplicate once done: the tombstone stays for the retry window.
  CHECK(s.confirm("t:1#m1", "a"));
  CHECK(s.record("t:1#m1", "b") == dc::journal_put::duplicate);
  CHECK(s.record("t:1#m2", "b") == dc::journal_put::recorded);
}

TEST_CASE_TEMPLATE_DEFINE("a journal record is forgotten after its TTL (the "
                          "platform's retry window)",
                          F, dc_ttl) {
  F f;
  auto b = f.make();
  dc::sync s{*b};
  CHECK(s.record("t:1#m1", "a", F::lease) == dc::journal_put::recorded);
  f.advance(F::lease * 2);
  s.claim("a", F::lease); // purges what expired
  CHECK(s.record("t:1#m1", "a", F::lease) == dc::journal_put::recorded);
}

TEST_CASE_TEMPLATE_DEFINE("a journal record past its TTL is recorded anew "
                          "with no beat in between",
                          F, dc_ttl_nobeat) {
  F f;
  auto b = f.make();
  dc::sync s{*b};
  CHECK(s.record("t:1#m1", "a", F::lease) == dc::journal_put::recorded);
  CHECK(s.confirm("t:1#m1", "a"));
  f.advance(F::lease * 2);
  CHECK(s.record("t:1#m1", "b", F::lease) == dc::journal_put::recorded);
  // Recorded anew: held by its new holder, not the old tombstone.
  CHECK_FALSE(s.confirm("t:1#m1", "a"));
  CHECK(s.confirm("t:1#m1", "b"));
  CHECK(s.record("t:1#m1", "a", F::lease) == dc::journal_put::duplicate);
}

TEST_CASE_TEMPLATE_DEFINE("only the holder confirms or releases a record, a "
                          "released record is claimed again, in arrival order",
                          F, dc_settle) {
  F f;
  auto b = f.make();
  dc::sync s{*b};
  for (auto id : {"t:1#m1", "t:1#m2", "t:2#m3"})
    REQUIRE(s.record(id, "a") == dc::journal_put::recorded);
  CHECK_FALSE(s.confirm("t:1#m1", "b"));
  CHECK_FALSE(s.release("t:1#m1", "b"));
  CHECK_FALSE(s.confirm("t:1#nope", "a"));
  CHECK(s.confirm("t:1#m2", "a"));
  CHECK_FALSE(s.confirm("t:1#m2", "a")); // done already
  CHECK(s.release("t:2#m3", "a"));
  CHECK(s.release("t:1#m1", "a"));
  // Free records go to whoever claims first, in arrival order.
  auto c = s.claim("b", F::lease);
  CHECK(dc::ids(c.records) == std::vector<std::string>{"t:1#m1", "t:2#m3"});
  REQUIRE(c.records.size() == 2);
  CHECK(c.records[0].key == "t:1");
  CHECK(c.records[0].message == "{\"text\":\"t:1#m1\"}");
  CHECK(c.records[0].attempts == 2);
  CHECK(c.records[0].seq < c.records[1].seq);
  // Claimed: b holds them now, a no longer does.
  CHECK_FALSE(s.confirm("t:1#m1", "a"));
  CHECK(s.confirm("t:1#m1", "b"));
  CHECK(s.claim("a", F::lease).records.empty());
}

TEST_CASE_TEMPLATE_DEFINE("records of a holder whose heartbeat lapsed are "
                          "claimed by a live holder, a live holder's are not",
                          F, dc_dead) {
  F f;
  auto b = f.make();
  dc::sync s{*b};
  s.claim("a", F::lease);
  s.claim("b", F::lease);
  for (auto id : {"t:1#m1", "t:1#m2", "t:1#m3"})
    REQUIRE(s.record(id, "a") == dc::journal_put::recorded);
  CHECK(s.claim("b", F::lease).records.empty()); // a is alive
  f.advance(F::lease + F::lease / 2);            // a's heartbeat lapses
  auto c = s.claim("b", F::lease);
  CHECK(dc::ids(c.records)
        == std::vector<std::string>{"t:1#m1", "t:1#m2", "t:1#m3"});
  // A holder that never beat at all is dead too.
  REQUIRE(s.record("t:2#m4", "ghost") == dc::journal_put::recorded);
  CHECK(dc::ids(s.claim("b", F::lease).records)
        == std::vector<std::string>{"t:2#m4"});
  // Once claimed, a's late confirm is refused.
  CHECK_FALSE(s.confirm("t:1#m1", "a"));
}

TEST_CASE_TEMPLATE_DEFINE("a retired holder's records are claimable at once",
                          F, dc_retire) {
  F f;
  auto b = f.make();
  dc::sync s{*b};
  s.claim("a", std::chrono::seconds(60));
  REQUIRE(s.record("t:1#m1", "a") == dc::journal_put::recorded);
  CHECK(s.claim("b", F::lease).records.empty());
  CHECK(s.retire("a"));
  CHECK(dc::ids(s.claim("b", F::lease).records)
        == std::vector<std::string>{"t:1#m1"});
}

TEST_CASE_TEMPLATE_DEFINE("a record reprocessed max_attempts times is given "
                          "up and reported as dropped",
                          F, dc_attempts) {
  F f;
  auto b = f.make();
  dc::sync s{*b};
  dc::handled_twice(s, "t:1#m1", F::lease);
  auto c = s.claim("b", F::lease, 2);
  CHECK(c.records.empty());
  CHECK(dc::ids(c.dropped) == std::vector<std::string>{"t:1#m1"});
  // Held by b until b confirms it, having reported it: not given up
  // again while b lives.
  CHECK(s.claim("b", F::lease, 2).dropped.empty());
  CHECK(s.claim("c", F::lease, 2).dropped.empty());
  CHECK(s.record("t:1#m1", "a") == dc::journal_put::duplicate);
  // b died before its confirm landed: the next holder gives it up again
  // (its attempts stay), and its confirm ends it.
  f.advance(F::lease * 2);
  c = s.claim("c", F::lease, 2);
  CHECK(c.records.empty());
  REQUIRE(dc::ids(c.dropped) == std::vector<std::string>{"t:1#m1"});
  CHECK(c.dropped[0].attempts == 2);
  CHECK_FALSE(c.dropped[0].message.empty()); // dropped by the confirm
  CHECK_FALSE(s.confirm("t:1#m1", "b"));
  CHECK(s.confirm("t:1#m1", "c"));
  // Done: never claimed again, still a duplicate.
  f.advance(F::lease * 2);
  c = s.claim("d", F::lease, 2);
  CHECK(c.dropped.empty());
  CHECK(c.records.empty());
  CHECK(s.record("t:1#m1", "a") == dc::journal_put::duplicate);
}

TEST_CASE_TEMPLATE_DEFINE("records given up do not count against a claim's "
                          "limit",
                          F, dc_attempts_limit) {
  F f;
  auto b = f.make();
  dc::sync s{*b};
  dc::handled_twice(s, "t:1#m1", F::lease);
  for (auto id : {"t:1#m2", "t:1#m3"}) {
    REQUIRE(s.record(id, "a") == dc::journal_put::recorded);
    REQUIRE(s.release(id, "a"));
  }
  auto c = s.claim("c", F::lease, 2, 1);
  CHECK(dc::ids(c.dropped) == std::vector<std::string>{"t:1#m1"});
  CHECK(dc::ids(c.records) == std::vector<std::string>{"t:1#m2"});
}

TEST_CASE_TEMPLATE_DEFINE("a record released as unhandled gives its attempt "
                          "back: refusals alone never reach max_attempts",
                          F, dc_unhandled) {
  F f;
  auto b = f.make();
  dc::sync s{*b};
  REQUIRE(s.record("t:1#m1", "a") == dc::journal_put::recorded);
  CHECK_FALSE(s.release_unhandled("t:1#m1", "b")); // not b's
  CHECK(s.release_unhandled("t:1#m1", "a"));
  CHECK_FALSE(s.release_unhandled("t:1#m1", "a")); // free already
  for (int round = 0; round < 4; ++round) {
    auto c = s.claim("b", F::lease, 2);
    REQUIRE(c.records.size() == 1);
    CHECK(c.dropped.empty());
    CHECK(c.records[0].attempts == 1);
    REQUIRE(s.release_unhandled("t:1#m1", "b"));
  }
  // A handled attempt counts: the second one is the last.
  auto c = s.claim("b", F::lease, 2);
  REQUIRE(c.records.size() == 1);
  REQUIRE(s.release("t:1#m1", "b"));
  c = s.claim("b", F::lease, 2);
  REQUIRE(c.records.size() == 1);
  CHECK(c.records[0].attempts == 2);
  REQUIRE(s.release("t:1#m1", "b"));
  c = s.claim("b", F::lease, 2);
  CHECK(c.records.empty());
  CHECK(dc::ids(c.dropped) == std::vector<std::string>{"t:1#m1"});
}

TEST_CASE_TEMPLATE_DEFINE("the outbox sends a send id once and refuses a "
                          "sender with a lower fence than the chat's last",
                          F, dc_outbox) {
  F f;
  auto b = f.make();
  dc::sync s{*b};
  CHECK(s.send("t:1#m1/0", "t:1", 5) == dc::outbox_verdict::send);
  CHECK(s.send("t:1#m1/0", "t:1", 5) == dc::outbox_verdict::duplicate);
  CHECK(s.send("t:1#m1/1", "t:1", 5) == dc::outbox_verdict::send);
  CHECK(s.send("t:1#m2/0", "t:1", 6) == dc::outbox_verdict::send);
  CHECK(s.send("t:1#m1/2", "t:1", 5) == dc::outbox_verdict::fenced);
  // Fences are per chat.
  CHECK(s.send("t:2#m1/0", "t:2", 1) == dc::outbox_verdict::send);
}

TEST_CASE_TEMPLATE_DEFINE("a send made before its verdict is recorded even "
                          "when fenced: a replay skips it, the chat's fence "
                          "stays",
                          F, dc_outbox_record) {
  F f;
  auto b = f.make();
  dc::sync s{*b};
  CHECK(s.send("t:1#m2/0", "t:1", 6) == dc::outbox_verdict::send);
  // Written after a send of the chat under fence 6: fenced, and kept.
  CHECK(s.record("t:1#m1/0", "t:1", 5) == dc::outbox_verdict::fenced);
  CHECK(s.send("t:1#m1/0", "t:1", 7) == dc::outbox_verdict::duplicate);
  CHECK(s.send("t:1#m1/1", "t:1", 5) == dc::outbox_verdict::fenced);
  CHECK(s.send("t:1#m1/1", "t:1", 6) == dc::outbox_verdict::send);
  // Otherwise as a claim.
  CHECK(s.record("t:2#m1/0", "t:2", 1) == dc::outbox_verdict::send);
  CHECK(s.record("t:2#m1/0", "t:2", 1) == dc::outbox_verdict::duplicate);
  CHECK(s.send("t:2#m1/0", "t:2", 1) == dc::outbox_verdict::duplicate);
}

TEST_CASE_TEMPLATE_DEFINE("a send taken back is sent again, the chat's fence "
                          "stays",
                          F, dc_outbox_forget) {
  F f;
  auto b = f.make();
  dc::sync s{*b};
  CHECK(s.send("t:1#m1/0", "t:1", 5) == dc::outbox_verdict::send);
  CHECK(s.send("t:1#m1/1", "t:1", 5) == dc::outbox_verdict::send);
  CHECK(s.forget("t:1#m1/0"));
  CHECK_FALSE(s.forget("t:1#m1/0"));
  CHECK_FALSE(s.forget("t:1#m9/0"));
  CHECK(s.send("t:1#m1/0", "t:1", 5) == dc::outbox_verdict::send);
  CHECK(s.send("t:1#m1/0", "t:1", 5) == dc::outbox_verdict::duplicate);
  // The other send is kept, and so is the fence.
  CHECK(s.send("t:1#m1/1", "t:1", 5) == dc::outbox_verdict::duplicate);
  CHECK(s.forget("t:1#m1/1"));
  CHECK(s.send("t:1#m1/1", "t:1", 4) == dc::outbox_verdict::fenced);
  // Taken back right after its claim, issued without waiting for it: in
  // the order issued.
  std::promise<dc::outbox_verdict> first;
  std::promise<bool> second;
  b->outbox_claim("t:2#m1/0", "t:2", 1, "w", std::chrono::seconds{60},
                  [&](dc::outbox_verdict v, std::exception_ptr) {
                    first.set_value(v);
                  });
  b->outbox_forget("t:2#m1/0", "w",
                   [&](bool r, std::exception_ptr) { second.set_value(r); });
  CHECK(first.get_future().get() == dc::outbox_verdict::send);
  CHECK(second.get_future().get());
  CHECK(s.send("t:2#m1/0", "t:2", 1) == dc::outbox_verdict::send);
}

TEST_CASE_TEMPLATE_DEFINE("a send is taken back only by the writer that took "
                          "it: another attempt's entry stays sent",
                          F, dc_outbox_forget_writer) {
  F f;
  auto b = f.make();
  dc::sync s{*b};
  const std::chrono::milliseconds m = std::chrono::seconds{60};
  // Taken by attempt "a1" (its send may have been made).
  CHECK(s.send("t:1#m1/0", "t:1", 5, m, "a1") == dc::outbox_verdict::send);
  // Attempt "a2" finds it sent; its take-back (its claim's reply was lost)
  // leaves a1's entry.
  CHECK(s.send("t:1#m1/0", "t:1", 5, m, "a2")
        == dc::outbox_verdict::duplicate);
  CHECK_FALSE(s.forget("t:1#m1/0", "a2"));
  CHECK(s.send("t:1#m1/0", "t:1", 5, m, "a3")
        == dc::outbox_verdict::duplicate);
  // a1's own take-back removes it; the next attempt sends, and owns it.
  CHECK(s.forget("t:1#m1/0", "a1"));
  CHECK(s.send("t:1#m1/0", "t:1", 5, m, "a3") == dc::outbox_verdict::send);
  CHECK_FALSE(s.forget("t:1#m1/0", "a1"));
  CHECK(s.send("t:1#m1/0", "t:1", 5, m, "a4")
        == dc::outbox_verdict::duplicate);
  CHECK(s.forget("t:1#m1/0", "a3"));
  // An entry written ahead of its send (even when fenced) names its writer
  // too.
  CHECK(s.send("t:2#m2/0", "t:2", 9) == dc::outbox_verdict::send);
  CHECK(s.record("t:2#m1/0", "t:2", 8, m, "r1")
        == dc::outbox_verdict::fenced);
  CHECK_FALSE(s.forget("t:2#m1/0", "r2"));
  CHECK(s.send("t:2#m1/0", "t:2", 9, m, "r2")
        == dc::outbox_verdict::duplicate);
  CHECK(s.forget("t:2#m1/0", "r1"));
  CHECK(s.send("t:2#m1/0", "t:2", 9, m, "r2") == dc::outbox_verdict::send);
  // Written ahead (the send made) by a holder that was fenced meanwhile,
  // over the later holder's live entry: both made or may make the send,
  // so neither take-back removes the entry.
  CHECK(s.send("t:3#m1/0", "t:3", 9, m, "b1") == dc::outbox_verdict::send);
  CHECK(s.record("t:3#m1/0", "t:3", 8, m, "a1") == dc::outbox_verdict::fenced);
  CHECK_FALSE(s.forget("t:3#m1/0", "a1"));
  CHECK_FALSE(s.forget("t:3#m1/0", "b1"));
  CHECK(s.send("t:3#m1/0", "t:3", 9, m, "c1")
        == dc::outbox_verdict::duplicate);
  // The same without a fence in between.
  CHECK(s.send("t:4#m1/0", "t:4", 5, m, "b1") == dc::outbox_verdict::send);
  CHECK(s.record("t:4#m1/0", "t:4", 5, m, "a1")
        == dc::outbox_verdict::duplicate);
  CHECK_FALSE(s.forget("t:4#m1/0", "b1"));
  CHECK_FALSE(s.forget("t:4#m1/0", "a1"));
  // A writer's own entry written again (a retry) stays its own.
  CHECK(s.record("t:5#m1/0", "t:5", 5, m, "a1") == dc::outbox_verdict::send);
  CHECK(s.record("t:5#m1/0", "t:5", 5, m, "a1")
        == dc::outbox_verdict::duplicate);
  CHECK(s.forget("t:5#m1/0", "a1"));
}

TEST_CASE_TEMPLATE_DEFINE("an outbox entry and a chat's fence are forgotten "
                          "after their TTL, a sender without coordination "
                          "(fence 0) is refused once a fence sent",
                          F, dc_outbox_ttl) {
  F f;
  auto b = f.make();
  dc::sync s{*b};
  CHECK(s.send("t:1#m1/0", "t:1", 5, F::lease) == dc::outbox_verdict::send);
  CHECK(s.send("t:1#m1/0", "t:1", 5, F::lease)
        == dc::outbox_verdict::duplicate);
  f.advance(F::lease * 2);
  // Both the entry and the fence 5 expired: a send under fence 3 goes out.
  CHECK(s.send("t:1#m1/0", "t:1", 3) == dc::outbox_verdict::send);
  CHECK(s.send("t:1#m1/0", "t:1", 3) == dc::outbox_verdict::duplicate);
  CHECK(s.send("t:1#m1/1", "t:1", 2) == dc::outbox_verdict::fenced);
  CHECK(s.send("t:1#m1/1", "t:1", 3) == dc::outbox_verdict::send);
  // Fence 0 throughout: only the send ids count.
  CHECK(s.send("t:2#m1/0", "t:2", 0) == dc::outbox_verdict::send);
  CHECK(s.send("t:2#m1/0", "t:2", 0) == dc::outbox_verdict::duplicate);
  CHECK(s.send("t:2#m1/1", "t:2", 0) == dc::outbox_verdict::send);
  CHECK(s.send("t:2#m2/0", "t:2", 4) == dc::outbox_verdict::send);
  CHECK(s.send("t:2#m3/0", "t:2", 0) == dc::outbox_verdict::fenced);
  CHECK(s.send("t:2#m3/0", "t:2", 4) == dc::outbox_verdict::send);
}

TEST_CASE_TEMPLATE_DEFINE("the same id recorded by two holders at once is "
                          "recorded by exactly one",
                          F, dc_race) {
  F f;
  auto b = f.make();
  for (int round = 0; round < 20; ++round) {
    auto id = "t:1#race" + std::to_string(round);
    std::atomic<int> recorded{0};
    std::vector<std::thread> ts;
    for (auto holder : {"a", "b", "c"})
      ts.emplace_back([&, holder] {
        dc::sync s{*b};
        if (s.record(id, holder) == dc::journal_put::recorded)
          ++recorded;
      });
    for (auto& t : ts)
      t.join();
    CHECK(recorded == 1);
  }
}

#define BOTMESH_DURABLE_CONFORMANCE(F)                                         \
  TEST_CASE_TEMPLATE_INVOKE(dc_dup, F);                                        \
  TEST_CASE_TEMPLATE_INVOKE(dc_ttl, F);                                        \
  TEST_CASE_TEMPLATE_INVOKE(dc_ttl_nobeat, F);                                 \
  TEST_CASE_TEMPLATE_INVOKE(dc_settle, F);                                     \
  TEST_CASE_TEMPLATE_INVOKE(dc_dead, F);                                       \
  TEST_CASE_TEMPLATE_INVOKE(dc_retire, F);                                     \
  TEST_CASE_TEMPLATE_INVOKE(dc_attempts, F);                                   \
  TEST_CASE_TEMPLATE_INVOKE(dc_unhandled, F);                                  \
  TEST_CASE_TEMPLATE_INVOKE(dc_outbox, F);                                     \
  TEST_CASE_TEMPLATE_INVOKE(dc_outbox_ttl, F);                                 \
  TEST_CASE_TEMPLATE_INVOKE(dc_outbox_forget, F);                              \
  TEST_CASE_TEMPLATE_INVOKE(dc_outbox_forget_writer, F);                       \
  TEST_CASE_TEMPLATE_INVOKE(dc_attempts_limit, F);                             \
  TEST_CASE_TEMPLATE_INVOKE(dc_outbox_record, F);                              \
  TEST_CASE_TEMPLATE_INVOKE(dc_race, F)
