#pragma once

// The schedule-store conformance suite: written once, run for every backend.
//
// A backend test file defines a factory F with
//   std::shared_ptr<botmesh::schedule_store> make();   // fresh, empty, started
// and instantiates the suite with
//   TYPE_TO_STRING(F);
//   BOTMESH_SCHEDULE_STORE_CONFORMANCE(F);
// Times are explicit arguments, so no test waits for real time.

#include <atomic>
#include <barrier>
#include <future>
#include <thread>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/internal/async_schedule_store.hpp>
#include <botmesh/stores/schedule_store.hpp>

namespace sched_conformance {

using namespace std::chrono_literals;

inline botmesh::time_point t0() {
  return botmesh::from_unix_ms(1'780'000'000'000);
}

// Waits for one asynchronous call: its value, or what it failed with.
template <class T>
struct awaited {
  std::promise<std::pair<T, std::exception_ptr>> p;
  botmesh::internal::async_schedule_store::done<T> done() {
    return [this](T v, std::exception_ptr e) {
      p.set_value({std::move(v), e});
    };
  }
  std::pair<T, std::exception_ptr> get() {
    auto f = p.get_future();
    REQUIRE(f.wait_for(10s) == std::future_status::ready);
    return f.get();
  }
};

inline botmesh::internal::async_schedule_store&
async_face(const std::shared_ptr<botmesh::schedule_store>& s) {
  auto* a = dynamic_cast<botmesh::internal::async_schedule_store*>(s.get());
  REQUIRE(a != nullptr);
  return *a;
}

using claim_result = botmesh::internal::async_schedule_store::claim_result;

// Starts a call with `start(done)` and returns its value; a failure fails
// the test.
template <class T, class Start>
T await_ok(Start start) {
  awaited<T> w;
  start(w.done());
  auto [value, e] = w.get();
  REQUIRE_FALSE(e);
  return value;
}

inline claim_result claim_async(botmesh::internal::async_schedule_store& a,
                                std::string_view id, std::string_view owner,
                                botmesh::time_point now,
                                std::chrono::milliseconds lease) {
  return await_ok<claim_result>(
    [&](auto done) { a.claim_async(id, owner, now, lease, std::move(done)); });
}

inline bool renew_async(botmesh::internal::async_schedule_store& a,
                        std::string_view id, std::string_view owner,
                        std::uint64_t token, botmesh::time_point now,
                        std::chrono::milliseconds lease) {
  return await_ok<bool>([&](auto done) {
    a.renew_async(id, owner, token, now, lease, std::move(done));
  });
}

inline bool commit_async(botmesh::internal::async_schedule_store& a,
                         std::string_view id, std::string_view owner,
                         std::uint64_t token, botmesh::time_point next,
                         bool done_flag, botmesh::time_point now) {
  return await_ok<bool>([&](auto done) {
    a.commit_async(id, owner, token, next, done_flag, now, std::move(done));
  });
}

} // namespace sched_conformance

TEST_CASE_TEMPLATE_DEFINE("registering keeps a stored time and a changed spec "
                          "reschedules",
                          F, ssc_register) {
  using namespace sched_conformance;
  F f;
  auto s = f.make();
  CHECK_FALSE(s->get("a").has_value());
  auto rec = s->register_task("a", "every 60000", t0() + 60s, t0());
  CHECK(rec.id == "a");
  CHECK(rec.spec == "every 60000");
  CHECK(rec.next_run_at == t0() + 60s);
  CHECK(rec.fencing_token == 0);
  // Same spec later (a restart): the original time stays.
  rec = s->register_task("a", "every 60000", t0() + 5min, t0() + 4min);
  CHECK(rec.next_run_at == t0() + 60s);
  // A changed spec reschedules from the given first run.
  rec = s->register_task("a", "every 30000", t0() + 5min, t0() + 4min);
  CHECK(rec.spec == "every 30000");
  CHECK(rec.next_run_at == t0() + 5min);
  auto got = s->get("a");
  REQUIRE(got);
  CHECK(*got == rec);
  // A spec changed while a run is under way (a rolling deploy): the run
  // keeps its lease, so no claim on the new spec overlaps it, and its
  // token moves on, so its renewal and its commit on the old calendar are
  // refused. The lease was cleared, and the new spec ran beside it.
  auto run = s->claim("a", "old", t0() + 5min, 30s);
  REQUIRE(run);
  rec = s->register_task("a", "every 1000", t0() + 5min + 1s, t0() + 5min);
  CHECK(rec.next_run_at == t0() + 5min + 1s);
  CHECK(rec.lease_owner == "old");
  CHECK(rec.fencing_token == run->token + 1);
  CHECK_FALSE(s->claim("a", "new", t0() + 5min + 2s, 30s).has_value());
  CHECK_FALSE(s->renew("a", "old", run->token, t0() + 5min + 3s, 30s));
  CHECK_FALSE(s->commit("a", "old", run->token, t0() + 6min, false,
                        t0() + 5min + 4s));
  auto taken = s->claim("a", "new", t0() + 5min + 31s, 30s);
  REQUIRE(taken);
  CHECK(taken->token > rec.fencing_token);
  CHECK(s->commit("a", "new", taken->token, t0() + 5min + 32s, false,
                  t0() + 5min + 31s));
  CHECK(s->get("a")->next_run_at == t0() + 5min + 32s);
}

TEST_CASE_TEMPLATE_DEFINE("a due slot is claimed by one owner while its lease "
                          "runs",
                          F, ssc_claim) {
  using namespace sched_conformance;
  F f;
  auto s = f.make();
  s->register_task("job", "every 60000", t0() + 60s, t0());
  CHECK_FALSE(s->claim("job", "a", t0() + 59s, 10s).has_value()); // not due
  CHECK_FALSE(s->claim("missing", "a", t0() + 60s, 10s).has_value());
  auto c = s->claim("job", "a", t0() + 60s, 10s);
  REQUIRE(c);
  CHECK(c->token == 1);
  CHECK_FALSE(c->interrupted);
  CHECK(c->record.next_run_at == t0() + 60s);
  CHECK(c->record.lease_owner == "a");
  CHECK_FALSE(s->claim("job", "b", t0() + 65s, 10s).has_value());
  CHECK(s->renew("job", "a", c->token, t0() + 65s, 10s));
  CHECK_FALSE(s->claim("job", "b", t0() + 72s, 10s).has_value());
  CHECK(s->commit("job", "a", c->token, t0() + 120s, false, t0() + 73s));
  auto rec = s->get("job");
  CHECK(rec->next_run_at == t0() + 120s);
  CHECK(rec->lease_owner.empty());
  CHECK(rec->fencing_token == 1);
  auto c2 = s->claim("job", "b", t0() + 120s, 10s);
  REQUIRE(c2);
  CHECK(c2->token == 2);
}

TEST_CASE_TEMPLATE_DEFINE("an expired claim is taken over and the stale "
                          "executor's renew and commit are rejected",
                          F, ssc_takeover) {
  using namespace sched_conformance;
  F f;
  auto s = f.make();
  s->register_task("job", "every 60000", t0(), t0());
  auto dead = s->claim("job", "a", t0() + 1s, 10s);
  REQUIRE(dead);
  auto taken = s->claim("job", "b", t0() + 12s, 10s);
  REQUIRE(taken);
  CHECK(taken->interrupted);
  CHECK(taken->token > dead->token);
  CHECK(taken->record.claimed_at == t0() + 1s);
  CHECK(taken->record.next_run_at == t0()); // the same slot runs again
  CHECK_FALSE(s->renew("job", "a", dead->token, t0() + 13s, 10s));
  CHECK_FALSE(s->commit("job", "a", dead->token, t0() + 999s, false, t0() + 13s));
  CHECK(s->get("job")->next_run_at == t0());
  CHECK(s->commit("job", "b", taken->token, t0() + 60s, false, t0() + 14s));
  CHECK(s->get("job")->next_run_at == t0() + 60s);
}

TEST_CASE_TEMPLATE_DEFINE("a one-shot leaves a tombstone, removal keeps the "
                          "fencing token",
                          F, ssc_tombstone) {
  using namespace sched_conformance;
  F f;
  auto s = f.make();
  s->register_task("once", "delay 1000", t0() + 1s, t0());
  auto c = s->claim("once", "a", t0() + 1s, 10s);
  REQUIRE(c);
  CHECK(s->commit("once", "a", c->token, t0() + 1s, true, t0() + 2s));
  CHECK(s->get("once")->done);
  CHECK_FALSE(s->claim("once", "a", t0() + 5s, 10s).has_value());
  // Re-registering the same spec keeps the tombstone.
  CHECK(s->register_task("once", "delay 1000", t0() + 9s, t0() + 8s).done);
  CHECK(s->remove("once", t0() + 10s));
  CHECK_FALSE(s->remove("once", t0() + 10s));
  auto marker = s->get("once");
  REQUIRE(marker);
  CHECK(marker->deleted);
  CHECK(marker->fencing_token == c->token);
  auto all = s->list();
  REQUIRE(all.size() == 1);
  CHECK(all[0].deleted);
  // A new registration continues the token sequence.
  auto rec = s->register_task("once", "delay 1000", t0() + 20s, t0() + 19s);
  CHECK_FALSE(rec.deleted);
  CHECK_FALSE(rec.done);
  auto c2 = s->claim("once", "a", t0() + 20s, 10s);
  REQUIRE(c2);
  CHECK(c2->token > c->token);
  CHECK_FALSE(s->commit("once", "a", c->token, t0(), true, t0() + 21s));
}

TEST_CASE_TEMPLATE_DEFINE("racing claims of one slot have exactly one winner",
                          F, ssc_race) {
  using namespace sched_conformance;
  F f;
  auto s = f.make();
  s->register_task("race", "every 1000", t0(), t0());
  constexpr int threads = 8;
  constexpr int rounds = 30;
  std::barrier sync{threads};
  std::vector<std::atomic<int>> winners(rounds);
  std::vector<std::uint64_t> tokens(rounds, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto owner = "o" + std::to_string(t);
      for (int r = 0; r < rounds; ++r) {
        auto now = t0() + std::chrono::seconds(r);
        sync.arrive_and_wait();
        if (auto c = s->claim("race", owner, now, 60s)) {
          winners[r]++;
          tokens[r] = c->token;
          CHECK(s->commit("race", owner, c->token, now + 1s, false, now));
        }
        sync.arrive_and_wait();
      }
    });
  }
  for (auto& th : pool)
    th.join();
  for (int r = 0; r < rounds; ++r) {
    CHECK(winners[r].load() == 1);
    if (r > 0)
      CHECK(tokens[r] > tokens[r - 1]);
  }
}

TEST_CASE_TEMPLATE_DEFINE("the asynchronous face claims, renews and commits "
                          "as the synchronous calls do",
                          F, ssc_async) {
  using namespace sched_conformance;
  F f;
  auto s = f.make();
  auto& a = async_face(s);
  s->register_task("a", "every 60000", t0(), t0());
  // Not due yet: nothing claimed, the record as it stands.
  auto r = claim_async(a, "a", "x", t0() - 1s, 10s);
  CHECK_FALSE(r.claim);
  REQUIRE(r.current);
  CHECK(r.current->next_run_at == t0());
  CHECK(r.current->lease_owner.empty());
  // Unknown id: neither.
  r = claim_async(a, "nope", "x", t0(), 10s);
  CHECK_FALSE(r.claim);
  CHECK_FALSE(r.current);
  // Due: claimed, with the next token.
  r = claim_async(a, "a", "x", t0(), 10s);
  REQUIRE(r.claim);
  CHECK(r.claim->token == 1);
  CHECK_FALSE(r.claim->interrupted);
  CHECK(r.claim->record.lease_owner == "x");
  CHECK(r.claim->record.lease_until == t0() + 10s);
  CHECK(*s->get("a") == r.claim->record);
  auto token = r.claim->token;
  // Another owner meanwhile: refused, and told who holds it until when.
  r = claim_async(a, "a", "y", t0() + 1s, 10s);
  CHECK_FALSE(r.claim);
  REQUIRE(r.current);
  CHECK(r.current->lease_owner == "x");
  CHECK(r.current->lease_until == t0() + 10s);
  // A read: the record as the synchronous get has it; none for an unknown id.
  auto got = await_ok<std::optional<botmesh::schedule_record>>(
    [&](auto done) { a.get_async("a", std::move(done)); });
  REQUIRE(got);
  CHECK(*got == *s->get("a"));
  CHECK_FALSE(await_ok<std::optional<botmesh::schedule_record>>(
    [&](auto done) { a.get_async("nope", std::move(done)); }));
  // Renewals: the holder's extends it, a stale token or owner does not.
  CHECK(renew_async(a, "a", "x", token, t0() + 2s, 10s));
  CHECK(s->get("a")->lease_until == t0() + 12s);
  CHECK_FALSE(renew_async(a, "a", "x", token + 1, t0() + 3s, 10s));
  CHECK_FALSE(renew_async(a, "a", "y", token, t0() + 3s, 10s));
  CHECK(s->get("a")->lease_until == t0() + 12s);
  // Commit: the next slot stored, the lease cleared; a second one is stale.
  CHECK(commit_async(a, "a", "x", token, t0() + 60s, false, t0() + 4s));
  auto rec = *s->get("a");
  CHECK(rec.next_run_at == t0() + 60s);
  CHECK(rec.lease_owner.empty());
  CHECK(rec.fencing_token == token);
  CHECK_FALSE(commit_async(a, "a", "x", token, t0() + 120s, false, t0() + 5s));
  CHECK(s->get("a")->next_run_at == t0() + 60s);
  // The two faces share one record: a synchronous claim, renewed and
  // committed asynchronously (a one-shot: its tombstone).
  auto c = s->claim("a", "z", t0() + 60s, 10s);
  REQUIRE(c);
  CHECK(c->token == token + 1);
  CHECK(renew_async(a, "a", "z", c->token, t0() + 61s, 10s));
  CHECK(commit_async(a, "a", "z", c->token, t0() + 60s, true, t0() + 62s));
  CHECK(s->get("a")->done);
  r = claim_async(a, "a", "x", t0() + 1h, 10s);
  CHECK_FALSE(r.claim);
  REQUIRE(r.current);
  CHECK(r.current->done);
  // A registration: the record as the synchronous one stores it.
  auto reg = await_ok<botmesh::schedule_record>([&](auto done) {
    a.register_async("b", "every 1000", t0() + 5s, t0(), std::move(done));
  });
  CHECK(reg.next_run_at == t0() + 5s);
  CHECK(reg.spec == "every 1000");
  CHECK(*s->get("b") == reg);
  // A removal: its marker, as the synchronous one leaves it.
  CHECK(await_ok<bool>(
    [&](auto done) { a.remove_async("b", t0() + 1s, std::move(done)); }));
  CHECK(s->get("b")->deleted);
  CHECK_FALSE(await_ok<bool>(
    [&](auto done) { a.remove_async("b", t0() + 2s, std::move(done)); }));
  // A bad argument comes back through the callback, not thrown.
  awaited<claim_result> bad;
  a.claim_async("a", "", t0(), 10s, bad.done());
  auto [none, e] = bad.get();
  REQUIRE(e);
  CHECK_THROWS_AS(std::rethrow_exception(e), botmesh::invalid_argument_error);
}

#define BOTMESH_ASYNC_SCHEDULE_STORE_CONFORMANCE(F)                            \
  TEST_CASE_TEMPLATE_INVOKE(ssc_async, F)

#define BOTMESH_SCHEDULE_STORE_CONFORMANCE(F)                                  \
  TEST_CASE_TEMPLATE_INVOKE(ssc_register, F);                                  \
  TEST_CASE_TEMPLATE_INVOKE(ssc_claim, F);                                     \
  TEST_CASE_TEMPLATE_INVOKE(ssc_takeover, F);                                  \
  TEST_CASE_TEMPLATE_INVOKE(ssc_tombstone, F);                                 \
  TEST_CASE_TEMPLATE_INVOKE(ssc_race, F)
