#pragma once

// The coordinator conformance suite: written once, run for every backend.
//
// A backend test file defines a factory F with
//   std::unique_ptr<botmesh::coordinator> make(std::string replica_id);
//       // a coordinator with a lease of F::lease on one shared backend
//   void crash(botmesh::coordinator& c);          // simulate a dead replica
//   void advance(std::chrono::milliseconds d);    // let backend time pass
//   static constexpr std::chrono::milliseconds lease{...};
// and instantiates BOTMESH_COORDINATOR_CONFORMANCE(F).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/coordinator.hpp>

namespace cc {

using botmesh::blocking_coordinator;
using botmesh::turn_state;
using status = botmesh::turn_state::status;

/// A replica in a test: its coordinator and the grants pushed to it.
struct replica {
  // Declared before the coordinator so they outlive it: its threads may
  // still push a grant until it is destroyed.
  std::mutex mtx;
  std::vector<turn_state> pushed;
  std::unique_ptr<botmesh::coordinator> c;

  explicit replica(std::unique_ptr<botmesh::coordinator> coord)
    : c(std::move(coord)) {
    c->on_grant([this](turn_state g) {
      std::lock_guard guard{mtx};
      pushed.push_back(std::move(g));
    });
  }

  blocking_coordinator sync() {
    return blocking_coordinator{*c};
  }

  std::size_t pushes() {
    std::lock_guard guard{mtx};
    return pushed.size();
  }

  /// Waits for the n-th push (pushes on Redis travel through pub/sub).
  std::optional<turn_state> push(std::size_t n = 1) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard guard{mtx};
        if (pushed.size() >= n)
          return pushed[n - 1];
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return std::nullopt;
  }

  const std::string& inc() const {
    return c->incarnation();
  }
};

template <class F>
std::unique_ptr<replica> make(F& f, const char* id) {
  return std::make_unique<replica>(f.make(id));
}

/// Waits until the push channel is up (Redis: the subscription is made by
/// a thread of its own), so a test does not race it.
inline void await_push_channel(replica& r) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (r.c->push_epoch() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(r.c->push_epoch() > 0);
}

/// What `submit` gave each operation: the number of calls of its `done`,
/// and its result or error.
struct submitted {
  std::mutex mtx;
  std::map<std::size_t, int> calls;
  std::map<std::size_t, turn_state> entered;
  std::map<std::size_t, botmesh::release_result> released;
  std::map<std::size_t, std::string> failed;

  std::size_t done() {
    std::lock_guard guard{mtx};
    return calls.size();
  }
};

/// Builds `submit`'s operations, numbered in order, recording into `out`.
struct batch {
  std::shared_ptr<submitted> out = std::make_shared<submitted>();
  std::vector<botmesh::coordinator::turn_op> ops;

  template <class T>
  auto record(std::size_t n, std::map<std::size_t, T> submitted::*into) {
    return [o = out, n, into](T v, std::exception_ptr e) {
      std::lock_guard guard{o->mtx};
      ++o->calls[n];
      if (!e) {
        ((*o).*into)[n] = std::move(v);
        return;
      }
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        o->failed[n] = x.what();
      }
    };
  }

  std::size_t enter(std::string key, std::uint64_t req, bool retry = false) {
    auto n = ops.size();
    ops.push_back(botmesh::coordinator::enter_op{
      std::move(key), req, retry, record(n, &submitted::entered)});
    return n;
  }

  std::size_t release(std::string key, std::uint64_t fence) {
    auto n = ops.size();
    ops.push_back(botmesh::coordinator::release_op{
      {std::move(key), fence}, {}, record(n, &submitted::released)});
    return n;
  }

  /// Submits everything and waits until every `done` ran (5 s at most).
  std::shared_ptr<submitted> run(botmesh::coordinator& c) {
    auto n = ops.size();
    c.submit(std::move(ops));
    ops.clear();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (out->done() < n && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto res = out;
    out = std::make_shared<submitted>();
    return res;
  }
};

} // namespace cc

TEST_CASE_TEMPLATE_DEFINE("an uncontended enter is granted at once, a release "
                          "grants the next ticket and pushes it to its owner "
                          "only",
                          F, cc_order) {
  F f;
  auto a = cc::make(f, "a");
  auto b = cc::make(f, "b");
  auto c = cc::make(f, "c");
  for (auto* r : {a.get(), b.get(), c.get()})
    cc::await_push_channel(*r);
  auto ga = a->sync().enter("chat", 1);
  REQUIRE(ga.granted());
  CHECK_FALSE(ga.previous_holder.has_value()); // a new chat
  CHECK(ga.deadline_ms - ga.now_ms == F::lease.count());
  auto wb = b->sync().enter("chat", 1);
  CHECK(wb.state == cc::status::waiting);
  CHECK(wb.blocker == a->inc());
  auto wc = c->sync().enter("chat", 7);
  CHECK(wc.state == cc::status::waiting);
  CHECK(wc.ticket > wb.ticket);
  auto rel = a->sync().release({"chat", ga.fence});
  CHECK(rel.released);
  CHECK_FALSE(rel.next.has_value()); // b's, not ours
  auto gb = b->push();
  REQUIRE(gb);
  CHECK(gb->key == "chat");
  CHECK(gb->req == 1);
  CHECK(gb->fence > ga.fence);
  CHECK(gb->previous_holder == "a");
  CHECK(gb->deadline_ms > gb->now_ms);
  // What the push said is what a poll says.
  auto pb = b->sync().poll("chat", 1);
  REQUIRE(pb.granted());
  CHECK(pb.fence == gb->fence);
  auto pc = c->sync().poll("chat", 7);
  CHECK(pc.state == cc::status::waiting);
  CHECK(pc.blocker == b->inc());
  CHECK(b->sync().release({"chat", gb->fence}).released);
  auto gc = c->push();
  REQUIRE(gc);
  CHECK(gc->req == 7);
  CHECK(gc->previous_holder == "b");
  CHECK(c->sync().release({"chat", gc->fence}).released);
  CHECK(a->pushes() == 0); // nobody else heard of it
  CHECK(b->pushes() == 1);
  CHECK(c->pushes() == 1);
  // Different chats do not wait for each other.
  CHECK(a->sync().enter("other", 2).granted());
}

TEST_CASE_TEMPLATE_DEFINE("an enter retried after a lost reply gets the same "
                          "ticket or grant back",
                          F, cc_retry) {
  F f;
  auto a = cc::make(f, "a");
  auto b = cc::make(f, "b");
  cc::await_push_channel(*b);
  auto ga = a->sync().enter("chat", 5);
  REQUIRE(ga.granted());
  auto again = a->sync().enter("chat", 5, true);
  REQUIRE(again.granted());
  CHECK(again.fence == ga.fence);
  CHECK(again.ticket == ga.ticket);
  auto wb = b->sync().enter("chat", 9);
  REQUIRE(wb.state == cc::status::waiting);
  auto wb2 = b->sync().enter("chat", 9, true);
  CHECK(wb2.state == cc::status::waiting);
  CHECK(wb2.ticket == wb.ticket);
  // One ticket only: after b's turn the chat is free.
  REQUIRE(a->sync().release({"chat", ga.fence}).released);
  auto gb = b->push();
  REQUIRE(gb);
  CHECK(b->sync().release({"chat", gb->fence}).released);
  CHECK(a->sync().enter("chat", 6).granted());
}

TEST_CASE_TEMPLATE_DEFINE("a replica's own next ticket comes back in its "
                          "release reply",
                          F, cc_self) {
  F f;
  auto a = cc::make(f, "a");
  auto g1 = a->sync().enter("chat", 1);
  REQUIRE(g1.granted());
  CHECK(a->sync().enter("chat", 2).state == cc::status::waiting);
  auto rel = a->sync().release({"chat", g1.fence});
  CHECK(rel.released);
  REQUIRE(rel.next.has_value());
  CHECK(rel.next->req == 2);
  CHECK(rel.next->fence > g1.fence);
  CHECK(rel.next->previous_holder == "a");
  CHECK(a->sync().poll("chat", 2).fence == rel.next->fence);
}

TEST_CASE_TEMPLATE_DEFINE("leave gives up a queued ticket or a granted turn",
                          F, cc_leave) {
  F f;
  auto a = cc::make(f, "a");
  auto b = cc::make(f, "b");
  auto c = cc::make(f, "c");
  cc::await_push_channel(*c);
  auto ga = a->sync().enter("chat", 1);
  REQUIRE(ga.granted());
  REQUIRE(b->sync().enter("chat", 2).state == cc::status::waiting);
  REQUIRE(c->sync().enter("chat", 3).state == cc::status::waiting);
  CHECK(b->sync().leave("chat", 2));
  CHECK_FALSE(b->sync().leave("chat", 2)); // idempotent
  CHECK(b->sync().poll("chat", 2).state == cc::status::gone);
  REQUIRE(a->sync().release({"chat", ga.fence}).released);
  auto gc = c->push();
  REQUIRE(gc); // b's ticket was skipped
  CHECK(gc->req == 3);
  CHECK(c->sync().leave("chat", 3)); // gives the granted turn back
  CHECK(b->sync().enter("chat", 4).granted());
  CHECK_FALSE(a->sync().leave("chat", 99));
}

TEST_CASE_TEMPLATE_DEFINE("a release hands what its holder gives to the "
                          "grant it makes, and to no other grant",
                          F, cc_handed) {
  using namespace std::string_literals;
  F f;
  auto a = cc::make(f, "a");
  auto b = cc::make(f, "b");
  for (auto* r : {a.get(), b.get()})
    cc::await_push_channel(*r);
  auto ga = a->sync().enter("chat", 1);
  REQUIRE(ga.granted());
  CHECK(ga.handed.empty()); // nobody released before
  REQUIRE(b->sync().enter("chat", 1).state == cc::status::waiting);
  // Any bytes travel unchanged: spaces, digits, the push format's own
  // separators, a newline, a NUL.
  auto payload = "1{\"k\":\"a b\"} 12 h3 x\n\0y"s;
  REQUIRE(a->sync().release({"chat", ga.fence}, payload).released);
  auto gb = b->push();
  REQUIRE(gb);
  CHECK(gb->handed == payload);
  CHECK(gb->previous_holder == "a");
  // A poll finds the same grant without it: only the release's own push
  // carries it.
  auto pb = b->sync().poll("chat", 1);
  REQUIRE(pb.granted());
  CHECK(pb.fence == gb->fence);
  CHECK(pb.handed.empty());
  // A stale release (that turn is over) hands nothing and grants nothing.
  REQUIRE(a->sync().enter("chat", 2).state == cc::status::waiting);
  CHECK_FALSE(a->sync().release({"chat", ga.fence}, "stale").released);
  CHECK(a->pushes() == 0);
  // A release without a payload: the grant carries none.
  REQUIRE(b->sync().release({"chat", gb->fence}).released);
  auto ga2 = a->push();
  REQUIRE(ga2);
  CHECK(ga2->handed.empty());
  // A turn that expired passes on without what its late release says.
  REQUIRE(b->sync().enter("chat", 2).state == cc::status::waiting);
  f.advance(F::lease + F::lease / 3);
  CHECK_FALSE(a->sync().release({"chat", ga2->fence}, "late").released);
  auto gb2 = b->sync().poll("chat", 2);
  REQUIRE(gb2.granted());
  CHECK(gb2.handed.empty());
  if (auto pushed = b->push(2))
    CHECK(pushed->handed.empty());
}

TEST_CASE_TEMPLATE_DEFINE("a turn not renewed expires with its replica's "
                          "queued tickets, renewals keep it",
                          F, cc_expire) {
  F f;
  auto a = cc::make(f, "a");
  auto b = cc::make(f, "b");
  auto ga = a->sync().enter("chat", 1);
  REQUIRE(ga.granted());
  REQUIRE(a->sync().enter("chat", 2).state == cc::status::waiting);
  REQUIRE(b->sync().enter("chat", 3).state == cc::status::waiting);
  for (int i = 0; i < 4; ++i) {
    f.advance(F::lease / 3);
    botmesh::renewal r;
    r.turns.push_back({"chat", ga.fence});
    auto res = a->sync().renew(r);
    REQUIRE(res.turns.size() == 1);
    CHECK(res.turns[0] > 0);
    CHECK(b->sync().poll("chat", 3).state == cc::status::waiting);
  }
  f.advance(F::lease + F::lease / 3); // a stops renewing
  auto gb = b->sync().poll("chat", 3);
  REQUIRE(gb.granted());
  // Whether a ran its expired turn is unknown: so is the previous holder.
  CHECK_FALSE(gb.previous_holder.has_value());
  CHECK(gb.fence > ga.fence);
  CHECK(a->sync().poll("chat", 2).state == cc::status::gone);
  botmesh::renewal r;
  r.turns.push_back({"chat", ga.fence});
  CHECK(a->sync().renew(r).turns.at(0) == 0);
}

TEST_CASE_TEMPLATE_DEFINE("an expired turn takes every queued ticket of its "
                          "replica with it, also one behind another replica's",
                          F, cc_expire_all) {
  F f;
  auto a = cc::make(f, "a");
  auto b = cc::make(f, "b");
  auto c = cc::make(f, "c");
  REQUIRE(a->sync().enter("chat", 1).granted());
  REQUIRE(b->sync().enter("chat", 2).state == cc::status::waiting);
  REQUIRE(a->sync().enter("chat", 3).state == cc::status::waiting);
  REQUIRE(c->sync().enter("chat", 4).state == cc::status::waiting);
  f.advance(F::lease + F::lease / 3); // a stops renewing
  auto gb = b->sync().poll("chat", 2);
  REQUIRE(gb.granted());
  CHECK(a->sync().poll("chat", 3).state == cc::status::gone);
  REQUIRE(b->sync().release({"chat", gb.fence}).released);
  // Next is c's ticket, not the dead replica's.
  CHECK(c->sync().poll("chat", 4).granted());
}

TEST_CASE_TEMPLATE_DEFINE("a late renewal or release of a chat's previous "
                          "turn never touches its next turn",
                          F, cc_fence) {
  F f;
  auto a = cc::make(f, "a");
  auto b = cc::make(f, "b");
  auto g1 = a->sync().enter("chat", 1);
  REQUIRE(g1.granted());
  REQUIRE(a->sync().release({"chat", g1.fence}).released);
  auto g2 = a->sync().enter("chat", 2);
  REQUIRE(g2.granted());
  REQUIRE(g2.fence > g1.fence);
  botmesh::renewal r;
  r.turns.push_back({"chat", g1.fence});
  r.turns.push_back({"chat", g2.fence});
  auto res = a->sync().renew(r);
  CHECK(res.turns.at(0) == 0); // the old turn: lost
  CHECK(res.turns.at(1) > 0);  // the new one: renewed
  CHECK_FALSE(a->sync().release({"chat", g1.fence}).released);
  CHECK(b->sync().enter("chat", 3).state == cc::status::waiting);
  CHECK(b->sync().poll("chat", 3).blocker == a->inc());
}

TEST_CASE_TEMPLATE_DEFINE("a dead replica's queued ticket is skipped once its "
                          "heartbeat is gone",
                          F, cc_dead) {
  F f;
  auto a = cc::make(f, "a");
  auto b = cc::make(f, "b");
  auto c = cc::make(f, "c");
  cc::await_push_channel(*c);
  auto gb = b->sync().enter("chat", 1);
  REQUIRE(gb.granted());
  REQUIRE(a->sync().enter("chat", 2).state == cc::status::waiting);
  REQUIRE(c->sync().enter("chat", 3).state == cc::status::waiting);
  // A poll names who else is queued ahead (not the holder, not itself), so
  // that the waiter can skip it before it is granted.
  CHECK(c->sync().poll("chat", 3).queued_ahead == std::vector<std::string>{a->inc()});
  CHECK(a->sync().poll("chat", 2).queued_ahead.empty());
  CHECK_FALSE(c->sync().skip_if_dead("chat", a->inc())); // alive
  f.crash(*a->c);
  for (int i = 0; i < 4; ++i) { // b keeps its turn, c its heartbeat
    f.advance(F::lease / 3);
    botmesh::renewal r;
    r.turns.push_back({"chat", gb.fence});
    REQUIRE(b->sync().renew(r).turns.at(0) > 0);
    (void) c->sync().renew({});
  }
  CHECK(c->sync().skip_if_dead("chat", a->inc()));
  CHECK_FALSE(c->sync().skip_if_dead("chat", b->inc()));
  // a's ticket is gone: b's release goes straight to c.
  (void) b->sync().release({"chat", gb.fence});
  auto gc = c->sync().poll("chat", 3);
  CHECK(gc.granted());
}

TEST_CASE_TEMPLATE_DEFINE("a turn granted to a replica whose heartbeat is "
                          "gone holds until its deadline, skipping the "
                          "replica does not take it",
                          F, cc_dead_holder) {
  // A frozen replica (not dead) may be granted a turn while frozen and use
  // it when it resumes, within the lease counted from that grant: nobody
  // else may hold the chat before that lease ran out.
  F f;
  auto a = cc::make(f, "a");
  auto b = cc::make(f, "b");
  auto c = cc::make(f, "c");
  cc::await_push_channel(*a);
  auto gb = b->sync().enter("chat", 1);
  REQUIRE(gb.granted());
  REQUIRE(a->sync().enter("chat", 2).state == cc::status::waiting);
  REQUIRE(c->sync().enter("chat", 3).state == cc::status::waiting);
  for (int i = 0; i < 4; ++i) { // a renews nothing: its heartbeat goes
    f.advance(F::lease / 3);
    botmesh::renewal r;
    r.turns.push_back({"chat", gb.fence});
    REQUIRE(b->sync().renew(r).turns.at(0) > 0);
    (void) c->sync().renew({});
  }
  REQUIRE(b->sync().release({"chat", gb.fence}).released);
  auto ga = a->push();
  REQUIRE(ga);
  CHECK(ga->req == 2);
  CHECK_FALSE(c->sync().skip_if_dead("chat", a->inc()));
  CHECK(c->sync().poll("chat", 3).state == cc::status::waiting);
  // Past a's lease the turn expires and goes on.
  f.advance(F::lease + F::lease / 4);
  CHECK(c->sync().poll("chat", 3).granted());
}

TEST_CASE_TEMPLATE_DEFINE("a restarted replica with the same id never "
                          "inherits the dead process's turn",
                          F, cc_incarnation) {
  F f;
  auto old_a = cc::make(f, "a");
  auto held = old_a->sync().enter("chat", 1);
  REQUIRE(held.granted());
  f.crash(*old_a->c);
  auto new_a = cc::make(f, "a");
  CHECK(new_a->inc() != old_a->inc());
  CHECK(new_a->c->replica_id() == "a");
  CHECK_FALSE(new_a->sync().release({"chat", held.fence}).released);
  CHECK(new_a->sync().enter("chat", 1).state == cc::status::waiting);
  f.advance(F::lease + F::lease / 2);
  auto fresh = new_a->sync().poll("chat", 1);
  REQUIRE(fresh.granted());
  CHECK(fresh.fence > held.fence);
}

TEST_CASE_TEMPLATE_DEFINE("one replica leads a name, a release or a dead "
                          "leader hands it on with a higher fence",
                          F, cc_lead) {
  F f;
  auto a = cc::make(f, "a");
  auto b = cc::make(f, "b");
  auto la = a->sync().lead("provider:test");
  REQUIRE(la);
  CHECK(la->deadline_ms - la->now_ms == F::lease.count());
  CHECK_FALSE(b->sync().lead("provider:test").has_value());
  auto again = a->sync().lead("provider:test"); // renewal keeps the fence
  REQUIRE(again);
  CHECK(again->fence == la->fence);
  CHECK(a->sync().unlead("provider:test", again->fence));
  auto lb = b->sync().lead("provider:test");
  REQUIRE(lb);
  CHECK(lb->fence > la->fence);
  CHECK_FALSE(a->sync().unlead("provider:test", la->fence)); // not a's
  f.crash(*b->c);
  CHECK_FALSE(a->sync().lead("provider:test").has_value());
  f.advance(F::lease + F::lease / 2);
  auto la2 = a->sync().lead("provider:test");
  REQUIRE(la2);
  CHECK(la2->fence > lb->fence);
}

TEST_CASE_TEMPLATE_DEFINE("racing replicas serve one chat in ticket order, "
                          "never two at once",
                          F, cc_race) {
  F f;
  std::vector<std::unique_ptr<cc::replica>> replicas;
  for (auto id : {"a", "b", "c"})
    replicas.push_back(cc::make(f, id));
  for (auto& r : replicas)
    cc::await_push_channel(*r);
  std::atomic<int> holders{0};
  std::atomic<int> overlaps{0};
  std::mutex mtx;
  std::vector<std::uint64_t> served; // tickets in the order they were served
  std::vector<std::thread> pool;
  for (auto& r : replicas) {
    pool.emplace_back([&, r = r.get()] {
      for (std::uint64_t req = 1; req <= 30; ++req) {
        auto s = r->sync().enter("shared", req);
        // Wait for the push; poll now and then as the runtime does.
        while (!s.granted()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          s = r->sync().poll("shared", req);
          REQUIRE(s.state != cc::status::gone);
        }
        if (holders.fetch_add(1) != 0)
          ++overlaps;
        {
          std::lock_guard guard{mtx};
          served.push_back(s.ticket);
        }
        holders.fetch_sub(1);
        REQUIRE(r->sync().release({"shared", s.fence}).released);
      }
    });
  }
  for (auto& t : pool)
    t.join();
  CHECK(overlaps.load() == 0);
  REQUIRE(served.size() == 90);
  CHECK(std::is_sorted(served.begin(), served.end()));
}

TEST_CASE_TEMPLATE_DEFINE("submit runs enters and releases in order, each "
                          "exactly as its own call would",
                          F, cc_submit) {
  F f;
  auto a = cc::make(f, "a");
  auto b = cc::make(f, "b");
  for (auto* r : {a.get(), b.get()})
    cc::await_push_channel(*r);
  // More operations than one batch holds, on many chats: every done once.
  cc::batch first;
  for (std::uint64_t n = 0; n < 60; ++n)
    first.enter("s" + std::to_string(n), n + 1);
  auto behind = first.enter("s0", 61); // queued behind our own turn
  auto r1 = first.run(*a->c);
  REQUIRE(r1->calls.size() == 61);
  for (auto& [n, calls] : r1->calls)
    CHECK(calls == 1);
  CHECK(r1->failed.empty());
  for (std::size_t n = 0; n < 60; ++n) {
    CAPTURE(n);
    REQUIRE(r1->entered[n].granted());
    CHECK(r1->entered[n].key == "s" + std::to_string(n));
    CHECK(r1->entered[n].req == n + 1);
  }
  CHECK(r1->entered[behind].state == cc::status::waiting);
  CHECK(r1->entered[behind].blocker == a->inc());
  // b waits for s2.
  auto wb = b->sync().enter("s2", 1);
  REQUIRE(wb.state == cc::status::waiting);
  // In one submit: s0's release grants our own next ticket; s2's grants
  // b's (pushed to b); an enter after that waits behind b; a stale
  // release changes nothing; a retried enter finds its grant again.
  cc::batch second;
  auto rel0 = second.release("s0", r1->entered[0].fence);
  auto rel2 = second.release("s2", r1->entered[2].fence);
  auto again2 = second.enter("s2", 62);
  auto stale = second.release("s1", r1->entered[1].fence + 1);
  auto retried = second.enter("s3", 4, true);
  auto r2 = second.run(*a->c);
  REQUIRE(r2->calls.size() == 5);
  CHECK(r2->failed.empty());
  CHECK(r2->released[rel0].released);
  REQUIRE(r2->released[rel0].next.has_value());
  CHECK(r2->released[rel0].next->req == 61);
  CHECK(r2->released[rel0].next->fence > r1->entered[0].fence);
  CHECK(r2->released[rel2].released);
  CHECK_FALSE(r2->released[rel2].next.has_value());
  auto gb = b->push();
  REQUIRE(gb);
  CHECK(gb->key == "s2");
  CHECK(gb->previous_holder == "a");
  CHECK(r2->entered[again2].state == cc::status::waiting);
  CHECK(r2->entered[again2].blocker == b->inc());
  CHECK_FALSE(r2->released[stale].released);
  REQUIRE(r2->entered[retried].granted());
  CHECK(r2->entered[retried].fence == r1->entered[3].fence);
  // s1 is still ours at its fence.
  CHECK(a->sync().release({"s1", r1->entered[1].fence}).released);
}

TEST_CASE_TEMPLATE_DEFINE("a granted request that leaves never ran: the "
                          "next grant names the holder before it",
                          F, cc_leave_granted) {
  F f;
  auto a = cc::make(f, "a");
  auto b = cc::make(f, "b");
  auto c = cc::make(f, "c");
  auto ga = a->sync().enter("chat", 1);
  REQUIRE(ga.granted());
  CHECK(a->sync().release({"chat", ga.fence}).released);
  auto gb = b->sync().enter("chat", 2);
  REQUIRE(gb.granted());
  CHECK(gb.previous_holder == "a");
  CHECK(b->sync().leave("chat", 2)); // given up before its step ran
  auto gc = c->sync().enter("chat", 3);
  REQUIRE(gc.granted());
  CHECK(gc.previous_holder == "a");
}

#define BOTMESH_COORDINATOR_CONFORMANCE(F)                                     \
  TEST_CASE_TEMPLATE_INVOKE(cc_submit, F);                                     \
  TEST_CASE_TEMPLATE_INVOKE(cc_order, F);                                      \
  TEST_CASE_TEMPLATE_INVOKE(cc_retry, F);                                      \
  TEST_CASE_TEMPLATE_INVOKE(cc_self, F);                                       \
  TEST_CASE_TEMPLATE_INVOKE(cc_leave, F);                                      \
  TEST_CASE_TEMPLATE_INVOKE(cc_handed, F);                                     \
  TEST_CASE_TEMPLATE_INVOKE(cc_expire, F);                                     \
  TEST_CASE_TEMPLATE_INVOKE(cc_expire_all, F);                                 \
  TEST_CASE_TEMPLATE_INVOKE(cc_fence, F);                                      \
  TEST_CASE_TEMPLATE_INVOKE(cc_dead, F);                                       \
  TEST_CASE_TEMPLATE_INVOKE(cc_dead_holder, F);                                \
  TEST_CASE_TEMPLATE_INVOKE(cc_incarnation, F);                                \
  TEST_CASE_TEMPLATE_INVOKE(cc_lead, F);                                       \
  TEST_CASE_TEMPLATE_INVOKE(cc_race, F);                                       \
  TEST_CASE_TEMPLATE_INVOKE(cc_leave_granted, F)
