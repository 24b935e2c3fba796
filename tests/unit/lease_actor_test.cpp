// The lease actor under faults, on virtual time: replies delayed, lost or
// never sent, processes frozen, late results about earlier turns. Every
// test drives CAF's test coordinator by hand (see lease_test_kit.hpp); no
// test sleeps or measures real time.
//
// The fixture's lease is 3000 ms: renewals go out at 0, 1000, 2000...
// (lease/3) and a lease the replica may assume ends lease/10 = 300 ms
// before the backend's.

#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>

#include <botmesh/actors/chat_services.hpp>
#include <botmesh/actors/router.hpp>
#include <botmesh/actors/session_actor.hpp>
#include <botmesh/runtime/core/message.hpp>
#include <botmesh/stores/memory_coordinator.hpp>

#include "lease_test_kit.hpp"
#include "test_util.hpp"
#include "log_capture.hpp"

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::event_ptr)

using namespace std::chrono_literals;
using namespace lease_kit;
using botmesh::turn_end;
using sc = scripted_coordinator;

namespace {

const std::string key_a = "test:a";
const std::string key_b = "test:b";
const std::string lead_name = "provider:wa";

bool has_loss(const probe_log& log, std::uint64_t req, std::uint64_t fence,
              const std::string& why) {
  for (auto& l : log.losses)
    if (l.req == req && l.fence == fence && l.why == why)
      return true;
  return false;
}

bool listener_saw(const listener_log& l, const std::string& key,
                  std::uint64_t fence, turn_end why) {
  for (auto& e : l.lost)
    if (e.key == key && e.fence == fence && e.why == why)
      return true;
  return false;
}

// Asks the lease actor to shut down; the reply lands in `replies`.
void request_shutdown(caf::actor_system& sys, const caf::actor& lease,
                      std::shared_ptr<std::vector<bool>> replies) {
  sys.spawn([lease, replies](caf::event_based_actor* self) {
    self->request(lease, caf::infinite, botmesh::shutdown_atom::value)
      .then([replies](bool ok) { replies->push_back(ok); });
  });
}

} // namespace

// -- 1. a lease counts from when its request left ---------------------------

TEST_CASE("a grant whose reply comes late is valid from when the enter left, "
          "minus lease/10") {
  lease_fixture f;
  f.coord->fail_renewals(); // nothing extends it
  f.vs.advance_to(100);
  f.acquire(key_a, 1); // the enter leaves at 100
  auto& enter = f.coord->last(op::enter);
  auto ran_at = enter.sent_ms; // the backend granted at once...
  f.vs.advance_to(1100);       // ...and the reply travelled for a second
  sc::answer(enter, f.coord->granted(key_a, 1, 7, ran_at));
  f.vs.run();
  auto token = f.chat_log->token_of(1);
  REQUIRE(token);
  CHECK(token->valid());
  f.vs.advance_to(100 + 2700 - 1);
  CHECK(token->valid());
  CHECK(f.chat_log->losses.empty());
  f.vs.advance_to(100 + 2700); // not 1100 + 2700
  CHECK_FALSE(token->valid());
  CHECK(token->ended() == turn_end::frozen);
  CHECK_THROWS_AS(token->check(), botmesh::lease_lost_error);
  CHECK(has_loss(*f.chat_log, 1, 7, "frozen"));
  CHECK(listener_saw(f.listener, key_a, 7, turn_end::frozen));
  CHECK(f.releases(key_a, 7) == 1);
}

TEST_CASE("a renewal whose reply comes late extends the lease from when the "
          "renewal left, not from when its reply came") {
  lease_fixture f;
  auto token = f.hold(key_a, 1, 7); // at 0: valid until 2700
  f.coord->hold_renewals();
  f.vs.advance_to(1000); // the renewal with the turn leaves
  auto& renewal = f.coord->next(op::renew);
  REQUIRE(renewal.renewal.turns.size() == 1);
  f.coord->fail_renewals(); // every later one fails
  f.vs.advance_to(2500);
  // The backend ran it only now: its deadline is 2500 + lease, but the
  // replica may count only from when the renewal left.
  sc::answer(renewal, f.coord->renewed(renewal, f.coord->backend_ms()));
  f.vs.run();
  f.vs.advance_to(2700); // the grant's own bound is passed
  CHECK(token->valid());
  f.vs.advance_to(1000 + 2700 - 1);
  CHECK(token->valid());
  f.vs.advance_to(1000 + 2700);
  CHECK_FALSE(token->valid());
  CHECK(has_loss(*f.chat_log, 1, 7, "frozen"));
}

TEST_CASE("a pushed grant that arrives after its lease ran out is not used: "
          "the chat is told frozen and the turn is released") {
  lease_fixture f;
  f.coord->set_policy(op::poll, [&](call& c) {
    sc::answer(c, f.coord->waiting(c.key, c.req));
  });
  f.acquire(key_a, 1);
  sc::answer(f.coord->last(op::enter), f.coord->waiting(key_a, 1));
  f.vs.advance_to(1000);
  // Granted by another replica's release at 1500, while this process stood
  // still from 1000 to 6000; the push is read when it resumes.
  f.vs.freeze(5000ms);
  f.coord->push(f.coord->granted(key_a, 1, 9, virtual_system::backend_at(1500)));
  f.vs.run();
  CHECK(f.chat_log->grants.empty());
  CHECK(has_loss(*f.chat_log, 1, 0, "frozen"));
  CHECK(f.releases(key_a, 9) == 1);
}

TEST_CASE("an enter whose grant is answered after its lease ran out is not "
          "used: the chat is told frozen and the turn is released") {
  lease_fixture f;
  f.acquire(key_a, 1);
  auto& enter = f.coord->last(op::enter);
  auto ran_at = enter.sent_ms;
  f.vs.freeze(3500ms);
  sc::answer(enter, f.coord->granted(key_a, 1, 7, ran_at));
  f.vs.run();
  CHECK(f.chat_log->grants.empty());
  CHECK(has_loss(*f.chat_log, 1, 0, "frozen"));
  CHECK(f.releases(key_a, 7) == 1);
}

TEST_CASE("a pushed grant in time is valid until its backend deadline as "
          "seen through earlier replies, minus lease/10") {
  lease_fixture f;
  f.coord->fail_renewals();
  f.coord->set_policy(op::poll, [&](call& c) {
    sc::answer(c, f.coord->waiting(c.key, c.req));
  });
  f.vs.advance_to(100);
  f.acquire(key_a, 1);
  sc::answer(f.coord->last(op::enter), f.coord->waiting(key_a, 1));
  f.vs.advance_to(1500);
  // Granted at backend time 1200 (deadline 4200), read at 1500.
  f.coord->push(f.coord->granted(key_a, 1, 9, virtual_system::backend_at(1200)));
  f.vs.run();
  auto token = f.chat_log->token_of(1);
  REQUIRE(token);
  f.vs.advance_to(4200 - 300 - 1);
  CHECK(token->valid());
  f.vs.advance_to(4200 - 300);
  CHECK_FALSE(token->valid());
  CHECK(has_loss(*f.chat_log, 1, 9, "frozen"));
}

TEST_CASE("a grant carried by a late release reply is valid from when the "
          "release left") {
  lease_fixture f;
  f.coord->fail_renewals();
  f.hold(key_a, 1, 7);
  f.acquire(key_a, 2);
  sc::answer(f.coord->last(op::enter), f.coord->waiting(key_a, 2));
  f.coord->set_policy(op::release, nullptr);
  f.vs.advance_to(200);
  f.release(key_a, 7); // leaves at 200, granting the next ticket at once
  auto& rel = f.coord->last(op::release);
  auto ran_at = rel.sent_ms;
  f.vs.advance_to(1200);
  auto res = f.coord->released(rel);
  res.now_ms = ran_at;
  res.next = f.coord->granted(key_a, 2, 8, ran_at);
  sc::answer(rel, res);
  f.vs.run();
  auto token = f.chat_log->token_of(2);
  REQUIRE(token);
  f.vs.advance_to(200 + 2700 - 1);
  CHECK(token->valid());
  f.vs.advance_to(200 + 2700);
  CHECK_FALSE(token->valid());
  CHECK(has_loss(*f.chat_log, 2, 8, "frozen"));
}

// -- 2. renewals ----------------------------------------------------------------

TEST_CASE("every lease/3 one batch renews every held turn and every "
          "leadership") {
  lease_fixture f;
  auto [session, session_log] = f.another_probe();
  f.hold(key_a, 1, 7);
  f.hold(key_b, 2, 8);
  f.tell(session, botmesh::lead_atom::value, lead_name);
  REQUIRE(session_log->leaders.size() == 1);
  auto before = f.coord->count(op::renew);
  f.vs.advance_to(1000);
  REQUIRE(f.coord->count(op::renew) == before + 1);
  auto& batch = f.coord->last(op::renew);
  CHECK(batch.renewal.turns.size() == 2);
  CHECK(batch.renewal.leads == std::vector<std::string>{lead_name});
  // With the term it leads at: a backend that lost the term makes the
  // next one above it.
  CHECK(batch.renewal.known_terms
        == std::vector<std::uint64_t>{session_log->leaders[0].second});
  f.vs.advance_to(3000);
  CHECK(f.coord->count(op::renew) == before + 3);
  caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
}

TEST_CASE("a renewal that says a turn is lost ends it as expired and tells "
          "the chat with its fence") {
  lease_fixture f;
  auto token = f.hold(key_a, 1, 7);
  f.coord->set_policy(op::renew, [&](call& c) {
    auto r = f.coord->renewed(c);
    for (auto& t : r.turns)
      t = 0;
    sc::answer(c, r);
  });
  f.vs.advance_to(1000);
  CHECK(token->ended() == turn_end::expired);
  CHECK(token->stop_token().stop_requested());
  CHECK(has_loss(*f.chat_log, 1, 7, "expired"));
  CHECK(listener_saw(f.listener, key_a, 7, turn_end::expired));
  CHECK(f.releases(key_a, 7) == 1);
}

TEST_CASE("a renewal that failed for one turn leaves that turn's validity "
          "as it was and renews the others and the leaderships") {
  lease_fixture f;
  auto [session, session_log] = f.another_probe();
  auto a = f.hold(key_a, 1, 7); // the backend holds both until 3000
  auto b = f.hold(key_b, 2, 8);
  f.tell(session, botmesh::lead_atom::value, lead_name);
  REQUIRE(session_log->leaders.size() == 1);
  f.coord->set_policy(op::renew, [&](call& c) {
    auto r = f.coord->renewed(c);
    for (std::size_t i = 0; i < c.renewal.turns.size(); ++i)
      if (c.renewal.turns[i].key == key_a)
        r.turns[i] = botmesh::renewal_result::failed;
    r.errors.push_back("renewing a: CLUSTERDOWN");
    sc::answer(c, r);
  });
  f.vs.advance_to(2699);
  CHECK(a->valid());
  CHECK(b->valid());
  CHECK(f.chat_log->losses.empty());
  // a's lease was never extended: it lapses as frozen before the backend
  // would let it go; b and the leadership are renewed all along.
  f.vs.advance_to(2700);
  CHECK(a->ended() == turn_end::frozen);
  f.vs.advance_to(6000);
  CHECK(b->valid());
  CHECK(session_log->followers.empty());
  caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
}

TEST_CASE("renewals that fail for the whole lease end the turn as frozen "
          "before the backend would expire it") {
  lease_fixture f;
  auto token = f.hold(key_a, 1, 7); // the backend holds it until 3000
  f.coord->fail_renewals();
  f.vs.advance_to(2699);
  CHECK(token->valid());
  CHECK(f.chat_log->losses.empty());
  f.vs.advance_to(2700);
  CHECK(token->ended() == turn_end::frozen);
  CHECK(token->stop_token().stop_requested());
  CHECK(has_loss(*f.chat_log, 1, 7, "frozen"));
  CHECK(listener_saw(f.listener, key_a, 7, turn_end::frozen));
  CHECK(f.releases(key_a, 7) == 1);
}

TEST_CASE("a slow renewal does not hold back the next batch: one leaves "
          "every lease/3 and the turn stays valid") {
  lease_fixture f;
  auto token = f.hold(key_a, 1, 7);
  f.coord->hold_renewals();
  // Every reply takes half a lease (the backend ran the renewal when it
  // left): slow, but every renewal succeeds.
  for (int t = 1; t <= 9000; ++t) {
    f.vs.advance(1ms);
    for (auto* c : f.coord->pending(op::renew))
      if (c->sent_ms + 1500 <= f.coord->backend_ms())
        sc::answer(*c, f.coord->renewed(*c));
    f.vs.run();
    if (!token->valid())
      break;
  }
  CHECK(token->valid());
  CHECK(f.chat_log->losses.empty());
  CHECK(f.coord->count(op::renew) >= 9);
}

// -- 3. turns are (chat, fence) ---------------------------------------------------

TEST_CASE("a late renewal saying a chat's previous turn is lost does not end "
          "its next turn") {
  lease_fixture f;
  f.hold(key_a, 1, 7);
  f.acquire(key_a, 2);
  sc::answer(f.coord->last(op::enter), f.coord->waiting(key_a, 2));
  f.coord->hold_renewals();
  f.vs.advance_to(1000);
  auto& late = f.coord->next(op::renew); // about (a, 7)
  f.coord->keep_renewing();
  f.coord->set_policy(op::release, nullptr);
  f.release(key_a, 7);
  auto& rel = f.coord->last(op::release);
  REQUIRE(rel.fence == 7);
  auto res = f.coord->released(rel);
  res.next = f.coord->granted(key_a, 2, 8);
  sc::answer(rel, res);
  f.vs.run();
  auto next = f.chat_log->token_of(2);
  REQUIRE(next);
  auto r = f.coord->renewed(late);
  r.turns.assign(r.turns.size(), 0); // "(a, 7) is lost"
  sc::answer(late, r);
  f.vs.run();
  CHECK(next->valid());
  CHECK(next->ended() == turn_end::holding);
  CHECK(f.chat_log->losses_of(2) == 0);
  CHECK(f.releases(key_a, 8) == 0);
  CHECK(f.listener.lost.empty());
}

TEST_CASE("a late failed release of a chat's previous turn is repeated for "
          "that turn only and does not end its next turn") {
  lease_fixture f;
  f.hold(key_a, 1, 7);
  f.acquire(key_a, 2);
  sc::answer(f.coord->last(op::enter), f.coord->waiting(key_a, 2));
  f.coord->set_policy(op::release, nullptr);
  f.release(key_a, 7);
  auto& rel = f.coord->last(op::release);
  f.coord->push(f.coord->granted(key_a, 2, 8));
  f.vs.run();
  auto next = f.chat_log->token_of(2);
  REQUIRE(next);
  f.coord->answer_cleanups();
  sc::fail(rel);
  f.vs.advance_to(500); // the watchdog repeats it
  CHECK(f.releases(key_a, 7) == 2);
  CHECK(f.releases(key_a, 8) == 0);
  CHECK(next->valid());
  CHECK(f.chat_log->losses_of(2) == 0);
}

TEST_CASE("a stale grant of a chat's previous turn is released by its fence "
          "and leaves the current turn alone") {
  lease_fixture f;
  f.hold(key_a, 1, 7);
  f.release(key_a, 7);
  auto current = f.hold(key_a, 2, 8);
  auto before = f.releases(key_a, 7);
  f.coord->push(f.coord->granted(key_a, 1, 7)); // heard late
  f.vs.run();
  CHECK(f.releases(key_a, 7) == before + 1);
  CHECK(f.releases(key_a, 8) == 0);
  CHECK(current->valid());
  CHECK(f.chat_log->losses.empty());
}

TEST_CASE("a release or start naming another fence of the chat leaves its "
          "current turn alone") {
  lease_fixture f{1500ms};
  auto token = f.hold(key_a, 1, 7);
  f.release(key_a, 6);
  f.start(key_a, 6);
  CHECK(f.coord->count(op::release) == 0);
  f.vs.advance_to(5000); // no settle bound started, renewals keep it
  CHECK(token->valid());
  CHECK(f.chat_log->losses.empty());
}

// -- 4. settle ----------------------------------------------------------------------

TEST_CASE("settle ends a started step on time: the token ends, its stop "
          "token fires, the chat and the listener are told and the turn is "
          "released") {
  lease_fixture f{1500ms};
  auto token = f.hold(key_a, 1, 7);
  f.vs.advance_to(100);
  f.start(key_a, 7); // settle at 1600, between two renewals
  f.vs.advance_to(1599);
  CHECK(token->valid());
  CHECK_FALSE(token->stop_token().stop_requested());
  CHECK(f.releases(key_a, 7) == 0);
  f.vs.advance_to(1600);
  CHECK_FALSE(token->valid());
  CHECK(token->ended() == turn_end::settle);
  CHECK(token->stop_token().stop_requested());
  CHECK(has_loss(*f.chat_log, 1, 7, "settle"));
  CHECK(listener_saw(f.listener, key_a, 7, turn_end::settle));
  CHECK(f.releases(key_a, 7) == 1);
}

TEST_CASE("settle counts from the step's start, not from the grant") {
  lease_fixture f{1500ms};
  auto token = f.hold(key_a, 1, 7);
  f.vs.advance_to(2000);
  CHECK(token->valid()); // granted 2 s ago, not started
  f.start(key_a, 7);
  f.vs.advance_to(3499);
  CHECK(token->valid());
  f.vs.advance_to(3500);
  CHECK(token->ended() == turn_end::settle);
}

// -- 5. nothing is left behind --------------------------------------------------------

TEST_CASE("an enter whose reply is lost is retried as a retry, never as a "
          "second ticket") {
  lease_fixture f;
  f.acquire(key_a, 1);
  sc::fail(f.coord->last(op::enter));
  f.vs.advance(50ms);
  REQUIRE(f.coord->count(op::enter) == 2);
  CHECK(f.coord->last(op::enter).req == 1);
  CHECK(f.coord->last(op::enter).retry);
  sc::fail(f.coord->last(op::enter));
  f.vs.advance(50ms);
  REQUIRE(f.coord->count(op::enter) == 3);
  CHECK(f.coord->last(op::enter).retry);
  // The ticket existed all along: now it is found.
  sc::answer(f.coord->last(op::enter), f.coord->waiting(key_a, 1));
  f.vs.advance(1500ms);
  CHECK(f.coord->count(op::enter) == 3); // from now on it is polled
  REQUIRE(f.coord->count(op::poll) >= 1);
  std::size_t first_takes = 0;
  for (auto* c : f.coord->all(op::enter))
    first_takes += c->retry ? 0 : 1;
  CHECK(first_takes == 1);
  sc::answer(f.coord->next(op::poll), f.coord->granted(key_a, 1, 7));
  f.vs.run();
  CHECK(f.chat_log->token_of(1));
}

TEST_CASE("a request given up while its enter is in flight is released, or "
          "left, once the enter answers") {
  lease_fixture f;
  SUBCASE("granted") {
    f.acquire(key_a, 1);
    f.leave(key_a, 1);
    sc::answer(f.coord->last(op::enter), f.coord->granted(key_a, 1, 7));
    f.vs.run();
    CHECK(f.releases(key_a, 7) == 1);
  }
  SUBCASE("waiting") {
    f.acquire(key_a, 1);
    f.leave(key_a, 1);
    CHECK(f.coord->count(op::leave) == 0);
    sc::answer(f.coord->last(op::enter), f.coord->waiting(key_a, 1));
    f.vs.run();
    CHECK(f.coord->count(op::leave, key_a, 1) == 1);
  }
  SUBCASE("reply lost: it may have run") {
    f.acquire(key_a, 1);
    f.leave(key_a, 1);
    sc::fail(f.coord->last(op::enter));
    f.vs.run();
    CHECK(f.coord->count(op::leave, key_a, 1) == 1);
  }
  f.vs.advance(2000ms);
  CHECK(f.chat_log->grants.empty());
  CHECK(f.coord->count(op::enter) == 1);
  CHECK(f.coord->count(op::poll) == 0);
}

TEST_CASE("enters and releases that reach the lease actor together go to "
          "the backend as one submit, in order, a lone one goes at once") {
  lease_fixture f;
  f.hold(key_b, 1, 7);
  f.coord->submits.clear();
  auto [other, other_log] = f.another_probe();
  caf::send_as(f.chat, f.lease_actor, botmesh::acquire_atom::value, key_a,
               std::uint64_t{2});
  caf::send_as(f.chat, f.lease_actor, botmesh::release_atom::value, key_b,
               std::uint64_t{7});
  caf::send_as(other, f.lease_actor, botmesh::acquire_atom::value, key_b,
               std::uint64_t{3});
  f.vs.run();
  REQUIRE(f.coord->submits == std::vector<std::size_t>{3});
  // In the order decided: b's release before b's next enter.
  auto enters = f.coord->all(op::enter);
  REQUIRE(enters.size() == 3);
  CHECK(enters[1]->key == key_a);
  CHECK(enters[2]->key == key_b);
  CHECK(f.releases(key_b, 7) == 1);
  sc::answer(*enters[1], f.coord->granted(key_a, 2, 8));
  sc::answer(*enters[2], f.coord->granted(key_b, 3, 9));
  f.vs.run();
  CHECK(f.chat_log->token_of(2));
  CHECK(other_log->token_of(3));
  f.release(key_a, 8);
  CHECK(f.coord->submits == std::vector<std::size_t>{3, 1});
  CHECK(f.releases(key_a, 8) == 1);
  caf::anon_send_exit(other, caf::exit_reason::user_shutdown);
}

TEST_CASE("a release held for its batch goes out when the lease actor is "
          "told to exit right behind it") {
  lease_fixture f;
  f.hold(key_a, 1, 7);
  f.coord->submits.clear();
  // The exit is queued before the flush the release schedules, so the
  // actor handles the exit first: its handler must send what it holds.
  caf::send_as(f.chat, f.lease_actor, botmesh::release_atom::value, key_a,
               std::uint64_t{7});
  caf::anon_send_exit(f.lease_actor, caf::exit_reason::user_shutdown);
  f.vs.run();
  CHECK(f.releases(key_a, 7) == 1);
  CHECK(f.coord->submits == std::vector<std::size_t>{1});
}

TEST_CASE("a grant for a request nobody waits for is released at once") {
  lease_fixture f;
  f.coord->push(f.coord->granted(key_a, 99, 5));
  f.vs.run();
  CHECK(f.releases(key_a, 5) == 1);
  CHECK(f.chat_log->grants.empty());
}

namespace {

const std::string me = "replica-under-test"; // the scripted coordinator's

// Acquires `key` for `req` and answers with a grant at `fence` whose
// previous holder is `previous`; returns the token the chat got.
std::shared_ptr<botmesh::turn_token>
granted_after(lease_fixture& f, const std::string& key, std::uint64_t req,
              std::uint64_t fence, std::string previous) {
  f.acquire(key, req);
  auto s = f.coord->granted(key, req, fence);
  s.previous_holder = std::move(previous);
  sc::answer(f.coord->last(op::enter), s);
  f.vs.run();
  auto t = f.chat_log->token_of(req);
  REQUIRE(t);
  return t;
}

// Pushes a grant of `key` at `fence` that nobody waits for (released at
// once, its step never started); its previous holder was "b".
void passed_over(lease_fixture& f, const std::string& key, std::uint64_t fence) {
  auto passed = f.coord->granted(key, 99, fence);
  passed.previous_holder = "b";
  f.coord->push(passed);
  f.vs.run();
  REQUIRE(f.releases(key, fence) == 1);
}

} // namespace

TEST_CASE("a grant given up before its step started, after another replica "
          "held the chat, makes the next grant's previous holder unknown") {
  lease_fixture f;
  passed_over(f, key_a, 5);
  // The backend names this replica as the last holder now; it is not.
  CHECK_FALSE(granted_after(f, key_a, 1, 6, me)->previous_holder());
  // Only once: a grant after a turn this replica ran keeps its holder.
  f.start(key_a, 6);
  f.release(key_a, 6);
  CHECK(granted_after(f, key_a, 2, 7, me)->previous_holder() == me);
}

TEST_CASE("a grant given up before its step started is remembered for as "
          "long as the backend may name this replica, not 40 leases") {
  lease_fixture f;
  passed_over(f, key_a, 5);
  // Another chat's turn keeps the actor busy (its wake-ups) while this
  // chat is idle past 40 leases of 3 s: the backend still names this
  // replica (the memory hub never forgets a chat it keeps; Redis keeps an
  // idle chat's keys ten minutes or more).
  f.hold(key_b, 50, 9);
  f.vs.advance(130'000ms);
  CHECK_FALSE(granted_after(f, key_a, 1, 6, me)->previous_holder());
}

TEST_CASE("a held turn released by its chat before its step started makes "
          "the chat's next grant here say the previous holder is unknown") {
  lease_fixture f;
  granted_after(f, key_a, 1, 5, "b");
  // The chat gave it up (turn_wait, stop) before running anything.
  f.release(key_a, 5);
  REQUIRE(f.releases(key_a, 5) == 1);
  CHECK_FALSE(granted_after(f, key_a, 2, 6, me)->previous_holder());
}

TEST_CASE("a grant answering an enter its chat gave up on the way makes the "
          "chat's next grant here say the previous holder is unknown") {
  lease_fixture f;
  f.acquire(key_a, 1);
  auto& enter = f.coord->last(op::enter);
  f.leave(key_a, 1); // turn_wait, while the enter is in flight
  auto s = f.coord->granted(key_a, 1, 5);
  s.previous_holder = "b";
  sc::answer(enter, s);
  f.vs.run();
  REQUIRE(f.releases(key_a, 5) == 1);
  CHECK_FALSE(granted_after(f, key_a, 2, 6, me)->previous_holder());
}

TEST_CASE("a failed release is repeated until the backend answers it") {
  lease_fixture f;
  f.hold(key_a, 1, 7);
  f.coord->fail_first(op::release, 3);
  f.release(key_a, 7);
  f.vs.advance(2000ms);
  CHECK(f.releases(key_a, 7) == 4);
  f.vs.advance(5000ms);
  CHECK(f.releases(key_a, 7) == 4);
}

TEST_CASE("a release that keeps failing is repeated for about a lease, not "
          "forever") {
  lease_fixture f;
  f.hold(key_a, 1, 7);
  f.coord->set_policy(op::release, [](call& c) { sc::fail(c); });
  f.release(key_a, 7);
  // Lease 3 s: the turn it left behind has expired in the backend by then.
  f.vs.advance(3200ms);
  auto after_a_lease = f.releases(key_a, 7);
  CHECK(after_a_lease > 3);
  f.vs.advance(6000ms);
  CHECK(f.releases(key_a, 7) == after_a_lease);
}

TEST_CASE("a failed leave is repeated until the backend answers it") {
  lease_fixture f;
  f.acquire(key_a, 1);
  sc::answer(f.coord->last(op::enter), f.coord->waiting(key_a, 1));
  f.coord->fail_first(op::leave, 2);
  f.leave(key_a, 1);
  f.vs.advance(2000ms);
  CHECK(f.coord->count(op::leave, key_a, 1) == 3);
  f.vs.advance(5000ms);
  CHECK(f.coord->count(op::leave, key_a, 1) == 3);
  CHECK(f.coord->count(op::poll) == 0);
}

TEST_CASE("a turn that changed nothing is given up as a grant that never "
          "ran (a leave of its request), repeated when it fails, and ends "
          "its token") {
  lease_fixture f;
  auto token = f.hold(key_a, 1, 7);
  f.start(key_a, 7);
  f.coord->fail_first(op::leave, 2);
  f.pass(key_a, 6); // another fence of the chat: not this turn
  CHECK(f.coord->count(op::leave, key_a, 1) == 0);
  CHECK(token->valid());
  f.pass(key_a, 7);
  CHECK_FALSE(token->valid());
  CHECK(f.releases(key_a, 7) == 0);
  f.vs.advance(2000ms);
  CHECK(f.coord->count(op::leave, key_a, 1) == 3);
  f.vs.advance(5000ms);
  CHECK(f.coord->count(op::leave, key_a, 1) == 3);
  CHECK(f.releases(key_a, 7) == 0);
  // Given up, it is no longer renewed.
  f.vs.advance(1000ms);
  auto& r = f.coord->last(op::renew);
  CHECK(std::none_of(r.renewal.turns.begin(), r.renewal.turns.end(),
                     [](auto& t) { return t.key == key_a; }));
}

TEST_CASE("a failed unlead is repeated until the backend answers it") {
  lease_fixture f;
  auto [session, session_log] = f.elected_session(lead_name);
  f.coord->fail_first(op::unlead, 2);
  f.tell(session, botmesh::unlead_atom::value, lead_name);
  f.vs.advance(2000ms);
  CHECK(f.coord->count(op::unlead, lead_name, 1) == 3);
  f.vs.advance(5000ms);
  CHECK(f.coord->count(op::unlead, lead_name, 1) == 3);
  caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
}

TEST_CASE("a name presented again while its unlead is on its way is renewed "
          "only once that unlead is answered") {
  lease_fixture f;
  auto [session, session_log] = f.elected_session(lead_name);
  f.coord->set_policy(op::unlead, nullptr); // answered by the test
  f.tell(session, botmesh::unlead_atom::value, lead_name);
  REQUIRE(f.coord->count(op::unlead, lead_name, 1) == 1);
  auto renewals = f.coord->count(op::renew);
  // Presented again at once: a renewal now could run before the unlead
  // (another connection) and be undone by it.
  f.tell(session, botmesh::lead_atom::value, lead_name);
  CHECK(f.coord->count(op::renew) == renewals);
  sc::answer(f.coord->next(op::unlead), true);
  f.vs.run();
  CHECK(f.coord->count(op::renew) == renewals + 1);
  caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
}

namespace {

// `session` leads lead_name at fence 1; the tick's renewal naming it is held
// on its way (returned), and the session gives the name up (its unlead,
// answered by the test, on its way too).
call& given_up_under_renewal(lease_fixture& f, const caf::actor& session) {
  f.coord->hold_renewals();
  f.vs.advance(1000ms);
  auto& kept = f.coord->last(op::renew);
  REQUIRE(kept.renewal.leads == std::vector<std::string>{lead_name});
  f.coord->set_policy(op::unlead, nullptr);
  f.tell(session, botmesh::unlead_atom::value, lead_name);
  REQUIRE(f.coord->count(op::unlead, lead_name, 1) == 1);
  return kept;
}

// The next presenter's own election, answered at fence 2: it leads.
void elected_at_2(lease_fixture& f, call& election, const probe_log& log) {
  sc::answer(election, f.coord->renewed(election, {}, 2));
  f.vs.run();
  REQUIRE(log.leaders.size() == 1);
  CHECK(log.leaders[0].second == 2);
}

} // namespace

TEST_CASE("a renewal sent before a name was given up does not elect the "
          "name's next presenter") {
  lease_fixture f;
  auto [s1, log1] = f.elected_session(lead_name); // fence 1
  auto& kept = given_up_under_renewal(f, s1);
  auto [s2, log2] = f.another_probe();
  f.tell(s2, botmesh::lead_atom::value, lead_name);
  // The backend ran the renewal before the unlead (it kept term 1, which
  // the unlead then deleted): its answer must not make s2 lead a name
  // nobody holds, which a standby takes at its next renewal.
  sc::answer(kept, f.coord->renewed(kept, {}, 1));
  f.vs.run();
  CHECK(log2->leaders.empty());
  // Once the unlead is answered, s2 is elected by a renewal of its own.
  sc::answer(f.coord->next(op::unlead), true);
  f.vs.run();
  auto& election = f.coord->last(op::renew);
  REQUIRE(&election != &kept);
  elected_at_2(f, election, *log2);
  caf::anon_send_exit(s1, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(s2, caf::exit_reason::user_shutdown);
}

TEST_CASE("a renewal sent before a name was given up does not elect its next "
          "presenter when the unlead was answered first") {
  lease_fixture f;
  auto [s1, log1] = f.elected_session(lead_name); // fence 1
  auto& kept = given_up_under_renewal(f, s1);
  // The unlead's answer comes first (replies come out of order: on a
  // cluster a renewal waits for every node it touches), and only then is
  // the name presented again: nothing is unleading any more.
  sc::answer(f.coord->next(op::unlead), true);
  f.vs.run();
  auto [s2, log2] = f.another_probe();
  f.tell(s2, botmesh::lead_atom::value, lead_name);
  auto& election = f.coord->last(op::renew);
  REQUIRE(&election != &kept);
  sc::answer(kept, f.coord->renewed(kept, {}, 1)); // term 1, deleted since
  f.vs.run();
  CHECK(log2->leaders.empty());
  elected_at_2(f, election, *log2);
  caf::anon_send_exit(s1, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(s2, caf::exit_reason::user_shutdown);
}

TEST_CASE("shutdown releases held turns, leaves waiting requests, gives up "
          "leaderships, and replies once the backend answered") {
  lease_fixture f;
  auto [session, session_log] = f.another_probe();
  auto token = f.hold(key_a, 1, 7);
  f.acquire(key_b, 2);
  sc::answer(f.coord->last(op::enter), f.coord->waiting(key_b, 2));
  f.tell(session, botmesh::lead_atom::value, lead_name);
  REQUIRE(session_log->leaders.size() == 1);
  f.coord->set_policy(op::release, nullptr);
  f.coord->set_policy(op::leave, nullptr);
  f.coord->set_policy(op::unlead, nullptr);
  auto replies = std::make_shared<std::vector<bool>>();
  request_shutdown(f.vs.sys(), f.lease_actor, replies);
  f.vs.run();
  CHECK(token->ended() == turn_end::stopped);
  REQUIRE(f.releases(key_a, 7) == 1);
  REQUIRE(f.coord->count(op::leave, key_b, 2) == 1);
  REQUIRE(f.coord->count(op::unlead, lead_name, 1) == 1);
  CHECK(replies->empty()); // not before the backend answered
  sc::answer(f.coord->next(op::release), f.coord->released(f.coord->next(op::release)));
  sc::answer(f.coord->next(op::leave), true);
  f.vs.run();
  CHECK(replies->empty());
  sc::answer(f.coord->next(op::unlead), true);
  f.vs.run();
  CHECK(*replies == std::vector<bool>{true});
  caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
}

TEST_CASE("a lease actor ended by an exit releases held turns, leaves "
          "waiting requests and gives up leaderships on its way out") {
  lease_fixture f;
  auto token = f.hold(key_a, 1, 7);
  f.acquire(key_b, 2); // its enter in flight
  auto [session, log] = f.elected_session(lead_name);
  auto fence = log->leaders.back().second;
  caf::anon_send_exit(f.lease_actor, caf::exit_reason::user_shutdown);
  f.vs.run();
  CHECK(token->ended() == turn_end::stopped);
  CHECK(token->stop_token().stop_requested());
  CHECK(f.releases(key_a, 7) == 1);
  CHECK(f.coord->count(op::leave, key_b, 2) == 1);
  CHECK(f.coord->count(op::unlead, lead_name, fence) == 1);
  caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
}

TEST_CASE("shutdown replies after a lease when the backend never answers") {
  lease_fixture f;
  f.hold(key_a, 1, 7);
  f.coord->set_policy(op::release, nullptr);
  auto replies = std::make_shared<std::vector<bool>>();
  request_shutdown(f.vs.sys(), f.lease_actor, replies);
  f.vs.advance(2999ms);
  CHECK(replies->empty());
  f.vs.advance(1ms);
  CHECK(*replies == std::vector<bool>{true});
}

TEST_CASE("a leadership won by a renewal answered after it was given up is "
          "given back") {
  lease_fixture f;
  auto [session, session_log] = f.another_probe();
  f.coord->hold_renewals();
  f.tell(session, botmesh::lead_atom::value, lead_name);
  auto& election = f.coord->last(op::renew);
  REQUIRE(election.renewal.leads == std::vector<std::string>{lead_name});
  f.tell(session, botmesh::unlead_atom::value, lead_name);
  sc::answer(election, f.coord->renewed(election, {}, 4)); // won at fence 4
  f.vs.run();
  CHECK(f.coord->count(op::unlead, lead_name, 4) == 1);
  CHECK(session_log->leaders.empty());
  caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
}

// The renewals after call `from` that name only `name`, no turn.
std::vector<call*> probes_after(scripted_coordinator& c, std::size_t from,
                                const std::string& name) {
  std::vector<call*> out;
  auto all = c.all(op::renew);
  for (auto i = from; i < all.size(); ++i)
    if (all[i]->renewal.turns.empty()
        && all[i]->renewal.leads == std::vector<std::string>{name})
      out.push_back(all[i]);
  return out;
}

// `session` presents lead_name and gives it up while its election renewal
// is held, and that renewal's reply is lost (it may have run). Returns the
// number of renewals before the loss.
std::size_t lose_election_reply(lease_fixture& f, const caf::actor& session) {
  f.coord->hold_renewals();
  f.tell(session, botmesh::lead_atom::value, lead_name);
  auto& election = f.coord->last(op::renew);
  f.tell(session, botmesh::unlead_atom::value, lead_name);
  auto before = f.coord->count(op::renew);
  sc::fail(election);
  f.vs.run();
  return before;
}

TEST_CASE("a leadership given up while its renewal's reply was lost is "
          "probed, and given back when that renewal had won it") {
  lease_fixture f;
  auto [session, session_log] = f.another_probe();
  auto before = lose_election_reply(f, session);
  f.vs.advance(150ms);
  auto probes = probes_after(*f.coord, before, lead_name);
  REQUIRE(probes.size() == 1);
  // Its answer lost too: probed again, within a lease.
  sc::fail(*probes[0]);
  f.vs.run();
  f.vs.advance(150ms);
  probes = probes_after(*f.coord, before, lead_name);
  REQUIRE(probes.size() == 2);
  sc::answer(*probes[1], f.coord->renewed(*probes[1], {}, 4)); // held, fence 4
  f.vs.run();
  CHECK(f.coord->count(op::unlead, lead_name, 4) == 1);
  CHECK(session_log->leaders.empty());
  // Known now: no more probes.
  f.vs.advance(1000ms);
  CHECK(probes_after(*f.coord, before, lead_name).size() == 2);
  caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
}

TEST_CASE("a leadership probe stops when another replica leads the name, "
          "when it is presented again, or after a lease") {
  lease_fixture f;
  auto [session, session_log] = f.another_probe();
  auto before = lose_election_reply(f, session);
  SUBCASE("another replica leads it") {
    f.vs.advance(150ms);
    auto probes = probes_after(*f.coord, before, lead_name);
    REQUIRE(probes.size() == 1);
    auto r = f.coord->renewed(*probes[0]);
    r.leads[0].reset(); // someone else leads
    sc::answer(*probes[0], r);
    f.vs.run();
    f.vs.advance(3000ms);
    CHECK(probes_after(*f.coord, before, lead_name).size() == 1);
    CHECK(f.coord->count(op::unlead) == 0);
  }
  SUBCASE("presented again before the probe") {
    f.tell(session, botmesh::lead_atom::value, lead_name); // its own renewal
    auto presented = f.coord->count(op::renew);
    f.vs.advance(150ms);
    CHECK(f.coord->count(op::renew) == presented);
  }
  SUBCASE("every answer lost: given up after a lease") {
    for (int i = 0; i < 60; ++i) {
      f.vs.advance(100ms);
      for (auto* p : probes_after(*f.coord, before, lead_name))
        if (!p->answered)
          sc::fail(*p);
      f.vs.run();
    }
    auto n = probes_after(*f.coord, before, lead_name).size();
    CHECK(n >= 2);
    CHECK(n <= 31); // one per lease/30 at most, for one lease
    f.vs.advance(3000ms);
    CHECK(probes_after(*f.coord, before, lead_name).size() == n);
  }
  caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
}

TEST_CASE("a leadership won by a renewal answered during shutdown is given "
          "back before the reply") {
  lease_fixture f;
  auto [session, session_log] = f.another_probe();
  f.coord->hold_renewals();
  f.tell(session, botmesh::lead_atom::value, lead_name);
  auto& election = f.coord->last(op::renew);
  auto replies = std::make_shared<std::vector<bool>>();
  request_shutdown(f.vs.sys(), f.lease_actor, replies);
  f.vs.run();
  sc::answer(election, f.coord->renewed(election, {}, 4));
  f.vs.run();
  CHECK(f.coord->count(op::unlead, lead_name, 4) == 1);
  CHECK(*replies == std::vector<bool>{true});
  caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
}

// -- 7. a vanished ticket -------------------------------------------------------------

TEST_CASE("a waiting request whose ticket vanished is reported gone") {
  lease_fixture f;
  f.acquire(key_a, 1);
  sc::answer(f.coord->last(op::enter), f.coord->waiting(key_a, 1));
  f.vs.advance_to(1100);
  sc::answer(f.coord->next(op::poll), f.coord->gone(key_a, 1));
  f.vs.run();
  CHECK(has_loss(*f.chat_log, 1, 0, "gone"));
  auto polls = f.coord->count(op::poll);
  f.vs.advance(5000ms);
  CHECK(f.coord->count(op::poll) == polls); // forgotten
}

TEST_CASE("a request blocked by the same holder for half a lease asks to "
          "skip that holder if it is dead") {
  lease_fixture f;
  f.coord->set_policy(op::poll, [&](call& c) {
    sc::answer(c, f.coord->waiting(c.key, c.req, "dead-incarnation"));
  });
  f.coord->set_policy(op::skip, [](call& c) { sc::answer(c, true); });
  f.acquire(key_a, 1);
  sc::answer(f.coord->last(op::enter),
             f.coord->waiting(key_a, 1, "dead-incarnation"));
  f.vs.advance_to(1000);
  CHECK(f.coord->count(op::skip) == 0); // a third of a lease: not yet
  f.vs.advance_to(2000);
  REQUIRE(f.coord->count(op::skip) == 1);
  CHECK(f.coord->last(op::skip).key == key_a);
  CHECK(f.coord->last(op::skip).incarnation == "dead-incarnation");
}

TEST_CASE("a request waiting half a lease asks to skip the other replicas "
          "queued ahead of it, if they are dead, while their tickets are "
          "still queued") {
  lease_fixture f;
  // A live holder that changes at every poll (a busy chat), and a replica
  // queued ahead all along.
  int polls = 0;
  f.coord->set_policy(op::poll, [&](call& c) {
    auto s = f.coord->waiting(c.key, c.req, "holder-" + std::to_string(++polls));
    s.queued_ahead = {"dead-incarnation", "other-incarnation"};
    sc::answer(c, s);
  });
  f.coord->set_policy(op::skip, [](call& c) { sc::answer(c, false); });
  f.acquire(key_a, 1);
  // An enter's answer names no ticket ahead.
  sc::answer(f.coord->last(op::enter), f.coord->waiting(key_a, 1, "holder-0"));
  f.vs.advance_to(1000);
  CHECK(f.coord->count(op::skip) == 0); // a third of a lease: not yet
  f.vs.advance_to(2100);
  // Each named once; the holders, each new at its poll, are not.
  REQUIRE(f.coord->count(op::skip) == 2);
  std::vector<std::string> asked;
  for (auto* c : f.coord->all(op::skip)) {
    CHECK(c->key == key_a);
    asked.push_back(c->incarnation);
  }
  CHECK(asked == std::vector<std::string>{"dead-incarnation", "other-incarnation"});
  // Looked at again every half lease of waiting, not at every poll.
  f.vs.advance_to(3200);
  CHECK(f.coord->count(op::skip) == 2);
  f.vs.advance_to(4200);
  CHECK(f.coord->count(op::skip) == 4);
}

// -- 8. leaderships -----------------------------------------------------------------

TEST_CASE("lead elects at once, not at the next renewal") {
  lease_fixture f;
  auto [session, session_log] = f.another_probe();
  f.vs.advance_to(100);
  f.tell(session, botmesh::lead_atom::value, lead_name);
  CHECK(f.vs.elapsed_ms() == 100);
  REQUIRE(session_log->leaders.size() == 1);
  CHECK(session_log->leaders[0] == std::pair<std::string, std::uint64_t>{lead_name, 1});
  caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
}

TEST_CASE("a leadership's validity goes to the session when it leads and "
          "again with every renewal that extends it") {
  lease_fixture f;
  auto [session, session_log] = f.elected_session(lead_name); // until 2700
  // steady_clock ticks at `ms` virtual ms since the start.
  auto tick_at = [&](std::int64_t ms) {
    return (f.vs.now() - std::chrono::milliseconds{f.vs.elapsed_ms()}
            + std::chrono::milliseconds{ms})
      .time_since_epoch()
      .count();
  };
  CHECK(session_log->valid_until.at(lead_name) == tick_at(2700));
  f.vs.advance_to(1100); // renewed at 1000
  CHECK(session_log->valid_until.at(lead_name) == tick_at(3700));
  f.coord->fail_renewals(); // the validity runs out as it was
  f.vs.advance_to(2100);
  CHECK(session_log->valid_until.at(lead_name) == tick_at(3700));
  caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
}

TEST_CASE("a leadership a renewal says is lost tells the session") {
  lease_fixture f;
  auto [session, session_log] = f.elected_session(lead_name);
  f.coord->set_policy(op::renew, [&](call& c) {
    auto r = f.coord->renewed(c);
    for (auto& l : r.leads)
      l.reset();
    sc::answer(c, r);
  });
  f.vs.advance_to(1000);
  REQUIRE(session_log->followers.size() == 1);
  CHECK(session_log->followers[0].second == "lost");
  caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
}

TEST_CASE("a leadership whose renewals fail tells the session it is lost "
          "before the backend expires it") {
  lease_fixture f;
  auto [session, session_log] = f.elected_session(lead_name); // until 2700
  // Renewals at 1000 and 2000 succeed (until 4700 locally, 5000 in the
  // backend); every later one fails.
  f.vs.advance_to(2900);
  CHECK(session_log->followers.empty());
  f.coord->fail_renewals();
  f.vs.advance_to(4699);
  CHECK(session_log->followers.empty());
  f.vs.advance_to(4700);
  REQUIRE(session_log->followers.size() == 1);
  CHECK(session_log->followers[0]
        == std::pair<std::string, std::string>{lead_name, "lost"});
  caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
}

TEST_CASE("a leadership renewal answered after the lease it reports ran out "
          "does not make the session lead again") {
  lease_fixture f;
  auto [session, session_log] = f.elected_session(lead_name); // until 2700
  f.coord->hold_renewals(); // the renewal at 1000 reaches the backend, its
                            // reply stalls
  f.vs.advance_to(2700);
  REQUIRE(session_log->followers.size() == 1);
  CHECK(session_log->followers[0].second == "lost");
  // The backend let the lease go at 4000 and another replica leads; the
  // stalled reply ("still yours", valid until 3700 here) comes at 4100.
  f.vs.advance_to(4100);
  auto& stalled = f.coord->next(op::renew); // the one sent at 1000
  sc::answer(stalled, f.coord->renewed(stalled));
  f.vs.run();
  CHECK(session_log->leaders.size() == 1); // before: told to lead again
  caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
}

// -- 6. chat actor and lease actor together -------------------------------------------

namespace {

// What the bot sends its router for message `text` of chat "x": a chat
// event (it validated the message).
botmesh::event_ptr
event_of_x(const std::string& text,
           std::function<void(botmesh::turn_outcome)> on_end = {}) {
  botmesh::inbound_message m;
  m.provider = "test";
  m.chat = "x";
  m.sender = "x";
  m.text = text;
  botmesh::chat_event ev{std::move(m), 0, {}};
  ev.on_end = std::move(on_end);
  return botmesh::make_event(std::move(ev));
}

// Runs nothing: records what the chat actor hands over.
struct recording_services final : botmesh::chat_services {
  struct run {
    std::string key;
    std::shared_ptr<botmesh::turn_token> turn;
    std::function<void()> done;
    std::uint64_t timer = 0; // a timer's id (0: a message)
  };
  std::vector<run> runs;
  std::vector<std::string> failed;
  std::vector<std::string> refused_keys;
  bool throw_on_run = false; // run_turn throws (a services bug)
  bool throw_on_refused = false; // refused throws, after it noted the key

  void run_turn(const std::string& key, botmesh::event_ptr ev, bool,
                std::shared_ptr<botmesh::turn_token> turn,
                std::function<void()> done) override {
    if (throw_on_run)
      throw std::runtime_error("run_turn failed");
    runs.push_back({key, std::move(turn), std::move(done), ev->ev.timer});
  }

  // Only used without coordination; these tests always coordinate.
  void run_event(const std::string& key, botmesh::chat_event&,
                 bool) override {
    runs.push_back({key, nullptr, nullptr});
  }

  void post(std::function<void()> job) override {
    job();
  }

  void turn_failed(const std::string& key, botmesh::chat_event,
                   std::string) override {
    failed.push_back(key);
  }

  void refused(const std::string& key, botmesh::chat_event ev,
               botmesh::errc, std::string) override {
    refused_keys.push_back(key);
    if (throw_on_refused)
      throw std::runtime_error("refused failed");
    ev.end(botmesh::turn_outcome::refused); // as the bot's services do
  }
};

// A router with one chat on the fixture's lease actor.
struct chat_fixture : lease_fixture {
  recording_services services;
  caf::actor router;
  std::string key = botmesh::chat_key("test", "x");

  explicit chat_fixture(ms turn_wait = 2000ms,
                        std::size_t max_pending = 10'000) {
    botmesh::router_config cfg{.services = &services,
                               .lease = lease_actor,
                               .turn_wait = turn_wait};
    cfg.max_pending_per_chat = max_pending;
    router = botmesh::spawn_router(vs.sys(), std::move(cfg));
  }

  ~chat_fixture() {
    caf::anon_send_exit(router, caf::exit_reason::user_shutdown);
    vs.run();
  }

  // Asks the router to drain (bound 60 s); its answer lands in the result
  // once the test runs the actors.
  std::shared_ptr<std::optional<bool>> drain() {
    auto answer = std::make_shared<std::optional<bool>>();
    vs.sys().spawn([r = router, answer](caf::event_based_actor* self) {
      self->request(r, caf::infinite, botmesh::drain_atom::value,
                    std::chrono::milliseconds{60'000})
        .then([answer](bool all) { *answer = all; }, [](caf::error&) {});
    });
    return answer;
  }

  void inject(const std::string& text,
              std::function<void(botmesh::turn_outcome)> on_end = {}) {
    send(text, std::move(on_end));
    vs.run();
  }

  // As inject, without running what follows.
  void send(const std::string& text,
            std::function<void(botmesh::turn_outcome)> on_end = {}) {
    caf::anon_send(router, event_of_x(text, std::move(on_end)));
  }

  // Grants the last enter at `fence`, up to the chat actor's mailbox: the
  // grant waits there unread.
  void grant_unread(std::uint64_t fence) {
    auto& enter = coord->last(op::enter);
    REQUIRE(enter.key == key);
    sc::answer(enter, coord->granted(key, enter.req, fence));
    REQUIRE(vs.sched().prioritize(lease_actor));
    vs.sched().run_once();
  }

  // Grants the chat's turn to enter `c` at `fence`, and runs what follows.
  void grant(call& c, std::uint64_t fence) {
    sc::answer(c, coord->granted(key, c.req, fence));
    vs.run();
  }
};

} // namespace

TEST_CASE("events a chat actor still holds when the router exits end as "
          "refused, once each") {
  chat_fixture f;
  std::vector<std::string> ended;
  auto note = [&](std::string name) {
    return [&ended, name](botmesh::turn_outcome o) {
      ended.push_back(name + ":" + std::string{to_string(o)});
    };
  };
  f.inject("uno", note("uno")); // waits for its grant
  f.inject("dos", note("dos")); // queued behind it
  REQUIRE(f.coord->last(op::enter).key == f.key);
  CHECK(ended.empty());
  caf::anon_send_exit(f.router, caf::exit_reason::user_shutdown);
  f.vs.run();
  std::sort(ended.begin(), ended.end());
  CHECK(ended == std::vector<std::string>{"dos:refused", "uno:refused"});
  // Sent after the exit: the dead router lets it go, and it ends too.
  f.inject("tres", note("tres"));
  f.vs.run();
  REQUIRE(ended.size() == 3);
  CHECK(ended.back() == "tres:refused");
}

// Whether a renewal after `from` (a call index) names `key`.
bool renewed_after(scripted_coordinator& c, std::size_t from,
                   const std::string& key) {
  auto all = c.all(op::renew);
  for (auto i = from; i < all.size(); ++i)
    for (auto& t : all[i]->renewal.turns)
      if (t.key == key)
        return true;
  return false;
}

// After its chat ended: the turn granted at fence 7 was released once, the
// ticket of `waiting` left once, and nothing of the chat is renewed.
void check_given_back(chat_fixture& f, const call& waiting) {
  CHECK(f.releases(f.key, 7) == 1);
  CHECK(f.coord->count(op::leave, f.key, waiting.req) == 1);
  auto renewals = f.coord->count(op::renew);
  f.vs.advance(3000ms);
  CHECK_FALSE(renewed_after(*f.coord, renewals, f.key));
}

TEST_CASE("a chat ended by an exit gives its requests back: a grant that "
          "comes after is released at once, not held and renewed") {
  chat_fixture f;
  f.inject("uno");
  f.inject("dos");
  auto enters = f.coord->all(op::enter);
  REQUIRE(enters.size() == 2);
  // The router passes its exit on to the chat while both enters are in
  // flight.
  caf::anon_send_exit(f.router, caf::exit_reason::user_shutdown);
  f.vs.run();
  sc::answer(*enters[0], f.coord->granted(f.key, enters[0]->req, 7));
  sc::answer(*enters[1], f.coord->waiting(f.key, enters[1]->req));
  f.vs.run();
  check_given_back(f, *enters[1]);
  CHECK(f.services.runs.empty());
  // Both messages refused through the services (which release their
  // journal records), not only freed.
  CHECK(f.services.refused_keys == std::vector<std::string>{f.key, f.key});
}

TEST_CASE("a chat ended by an exception out of its services gives back the "
          "turn it was granted and the tickets behind it") {
  chat_fixture f;
  f.services.throw_on_run = true;
  f.inject("uno");
  f.inject("dos");
  auto enters = f.coord->all(op::enter);
  REQUIRE(enters.size() == 2);
  sc::answer(*enters[1], f.coord->waiting(f.key, enters[1]->req));
  f.vs.run();
  // The grant makes the chat run "uno": run_turn throws, the chat ends.
  sc::answer(*enters[0], f.coord->granted(f.key, enters[0]->req, 7));
  f.vs.run();
  f.services.throw_on_run = false;
  // "dos", waiting behind it, goes back to the router and to the chat's
  // next actor, which asks again. "uno", whose run_turn threw, is refused
  // through the services (its journal record released), not run again.
  CHECK(f.services.refused_keys == std::vector<std::string>{f.key});
  auto again = f.coord->all(op::enter);
  REQUIRE(again.size() == 3);
  f.grant(*again[2], 8);
  REQUIRE(f.services.runs.size() == 1);
  CHECK(f.services.runs[0].turn->fence() == 8);
  f.services.runs[0].done();
  f.vs.run();
  check_given_back(f, *enters[1]);
  // The next message goes to that actor too.
  f.inject("tres");
  auto later = f.coord->all(op::enter);
  REQUIRE(later.size() == 4);
  f.grant(*later[3], 9);
  REQUIRE(f.services.runs.size() == 2);
  CHECK(f.services.runs[1].turn->fence() == 9);
}

TEST_CASE("a message sent on to a chat that ends by an exception before "
          "taking it goes to the chat's next actor, not lost") {
  chat_fixture f;
  f.services.throw_on_run = true;
  std::vector<std::string> ended;
  f.inject("uno");
  // The grant reaches the chat's mailbox, and "dos" behind it: the chat
  // ends on the grant (run_turn throws) with "dos" not yet taken.
  f.grant_unread(7);
  auto& sched = f.vs.sched();
  f.send("dos", [&ended](botmesh::turn_outcome o) {
    ended.push_back(std::string{to_string(o)});
  });
  REQUIRE(sched.prioritize(f.router));
  sched.run_once(); // the router sends "dos" on to the chat
  f.vs.run();
  f.services.throw_on_run = false;
  // A new chat actor asks a turn for "dos", and runs it.
  auto enters = f.coord->all(op::enter);
  REQUIRE(enters.size() == 2);
  CHECK(ended.empty()); // not ended (a dropped event ends refused)
  // Only "uno", whose run_turn threw.
  CHECK(f.services.refused_keys == std::vector<std::string>{f.key});
  f.grant(*enters[1], 8);
  REQUIRE(f.services.runs.size() == 1);
  CHECK(f.services.runs[0].turn->fence() == 8);
}

TEST_CASE("what the router holds for a chat whose actor ends is refused, "
          "once each, when the router exits before that actor's end") {
  chat_fixture f;
  f.services.throw_on_run = true;
  std::vector<std::string> ended;
  auto note = [&](std::string name) {
    return [&ended, name](botmesh::turn_outcome o) {
      ended.push_back(name + ":" + std::string{to_string(o)});
    };
  };
  f.inject("uno");
  f.inject("dos", note("dos")); // waits behind "uno"
  auto enters = f.coord->all(op::enter);
  REQUIRE(enters.size() == 2);
  // Granted: run_turn throws, the chat actor ends and sends "dos" back.
  sc::answer(*enters[0], f.coord->granted(f.key, enters[0]->req, 7));
  auto& sched = f.vs.sched();
  REQUIRE(sched.prioritize(f.lease_actor));
  sched.run_once(); // the grant goes to the chat actor
  sched.run_once(); // which throws and ends
  CHECK(f.coord->all(op::enter).size() == 2);
  // The router hears chat_gone, holds "dos" (it came back) and "tres" (it
  // came meanwhile), then exits before the ended actor's down message.
  f.send("tres", note("tres"));
  caf::anon_send_exit(f.router, caf::exit_reason::user_shutdown);
  f.vs.run();
  f.services.throw_on_run = false;
  CHECK(f.services.runs.empty());
  // "uno" (its run_turn threw), then "dos" and "tres".
  CHECK(f.services.refused_keys
        == std::vector<std::string>{f.key, f.key, f.key});
  std::sort(ended.begin(), ended.end());
  CHECK(ended == std::vector<std::string>{"dos:refused", "tres:refused"});
}

TEST_CASE("a chat whose lease actor shuts down refuses its waiting "
          "messages instead of asking again and again") {
  chat_fixture f;
  f.inject("uno"); // its enter stays unanswered: the shutdown waits for it
  auto replies = std::make_shared<std::vector<bool>>();
  request_shutdown(f.vs.sys(), f.lease_actor, replies);
  f.vs.run();
  auto enters = f.coord->count(op::enter);
  f.send("dos"); // asks a lease actor that shuts down
  int steps = 0;
  while (steps < 10'000 && f.vs.sched().try_run_once())
    ++steps;
  CHECK(steps < 10'000); // it settles: no acquire -> lost loop
  CHECK(f.coord->count(op::enter) == enters);
  // Both waited for a turn that will not come: refused, as on a stop.
  CHECK(f.services.refused_keys == std::vector<std::string>{f.key, f.key});
}

TEST_CASE("a refusal that throws in the router is logged, and the router "
          "goes on refusing and routing") {
  test::log_capture logs;
  chat_fixture f;
  auto answer = f.drain();
  f.vs.run();
  REQUIRE(answer->has_value()); // nothing queued: drained at once
  // Draining, the router refuses what comes; the first refusal throws.
  f.services.throw_on_refused = true;
  f.inject("uno");
  f.services.throw_on_refused = false;
  f.inject("dos");
  CHECK(f.services.refused_keys == std::vector<std::string>{f.key, f.key});
  CHECK(logs.count("router", "refusing a message threw: refused failed") == 1);
}

TEST_CASE("a chat that ends by an exception while the router drains "
          "answers the drain at once, not at its bound") {
  chat_fixture f;
  f.services.throw_on_run = true;
  f.inject("uno");
  auto& enter = f.coord->last(op::enter);
  auto answer = f.drain();
  f.vs.run();
  CHECK_FALSE(answer->has_value()); // "uno" still waits for its turn
  // Granted: run_turn throws and the chat ends while the drain waits.
  sc::answer(enter, f.coord->granted(f.key, enter.req, 7));
  f.vs.run();
  REQUIRE(answer->has_value());
  CHECK_FALSE(**answer);
}

TEST_CASE("a chat actor that ends by an exception while its step runs: the "
          "chat's next actor starts no step before that step returned") {
  chat_fixture f{2000ms, 1}; // one message may wait behind the running one
  f.inject("uno");
  auto& first = f.coord->last(op::enter);
  f.grant(first, 7);
  REQUIRE(f.services.runs.size() == 1); // "uno" runs (and has not returned)
  f.inject("dos"); // waits behind it
  // "tres" is one too many: refused, and the refusal throws (a services
  // bug): the chat actor ends while "uno"'s step still runs.
  f.services.throw_on_refused = true;
  f.inject("tres");
  f.services.throw_on_refused = false;
  REQUIRE(f.services.refused_keys.size() == 1);
  CHECK(f.releases(f.key, 7) == 1); // its turn ended: its effects are refused
  // "dos" waits in the router: a next actor would run it beside "uno".
  // What comes meanwhile waits with it, bounded as the chat's queue.
  f.inject("cuatro"); // one waits already: refused
  CHECK(f.services.refused_keys.size() == 2);
  auto enters = f.coord->all(op::enter);
  CHECK(enters.size() == 2); // "uno"'s and "dos"'s first, given back
  f.services.runs[0].done(); // "uno"'s step returns
  f.vs.run();
  enters = f.coord->all(op::enter);
  REQUIRE(enters.size() == 3); // "dos" asks again
  f.grant(*enters[2], 8);
  REQUIRE(f.services.runs.size() == 2);
  CHECK(f.services.runs[1].turn->fence() == 8);
}

TEST_CASE("max_pending_per_chat counts the messages that wait, not the one "
          "that runs, as without coordination") {
  chat_fixture f{2000ms, 2};
  f.inject("uno");
  f.grant(f.coord->last(op::enter), 7);
  REQUIRE(f.services.runs.size() == 1); // "uno" runs
  f.inject("dos");
  f.inject("tres"); // two wait: the bound
  CHECK(f.services.refused_keys.empty());
  f.inject("cuatro");
  CHECK(f.services.refused_keys == std::vector<std::string>{f.key});
  CHECK(f.coord->all(op::enter).size() == 3); // "uno", "dos", "tres"
}

TEST_CASE("a provider's turn-end notice that throws on a refusal is logged "
          "and does not end the chat actor") {
  test::log_capture logs;
  chat_fixture f{2000ms, 1};
  f.inject("uno"); // waits for its turn
  f.inject("dos", [](botmesh::turn_outcome) {
    throw std::runtime_error("notice failed");
  }); // one too many: refused, and its notice throws
  REQUIRE(f.services.refused_keys.size() == 1);
  CHECK(logs.count("chat", "turn-end notice threw (refused): notice failed")
        == 1);
  // The same actor goes on: "uno" keeps its one request, and runs.
  auto enters = f.coord->all(op::enter);
  REQUIRE(enters.size() == 1);
  f.grant(*enters[0], 7);
  CHECK(f.services.runs.size() == 1);
  CHECK(logs.count("chat", "ended by an exception") == 0);
}

TEST_CASE("what waits for the step of an ended chat actor that ignores its "
          "stop token gets no turn within turn_wait: it fails, the chat goes "
          "on once the step returns") {
  chat_fixture f{2000ms, 1};
  f.inject("uno");
  f.grant(f.coord->last(op::enter), 7);
  REQUIRE(f.services.runs.size() == 1); // "uno" runs, and does not return
  f.inject("dos");
  f.services.throw_on_refused = true;
  f.inject("tres"); // refused, the refusal throws: the chat actor ends
  f.services.throw_on_refused = false;
  CHECK(f.services.failed.empty());
  f.vs.advance(2100ms); // turn_wait
  // "dos" got no turn: failed, as behind a cut step in a live chat actor.
  CHECK(f.services.failed == std::vector<std::string>{f.key});
  f.inject("cuatro"); // waits again
  f.services.runs[0].done();
  f.vs.run();
  auto enters = f.coord->all(op::enter);
  REQUIRE(enters.size() == 3); // "uno", "dos" (given back), "cuatro"
  f.grant(*enters[2], 8);
  REQUIRE(f.services.runs.size() == 2);
  CHECK(f.services.failed.size() == 1);
}

TEST_CASE("a message that comes for an ended chat actor whose step ignores "
          "its stop token waits turn_wait from its arrival, not until the "
          "next tick") {
  chat_fixture f{2000ms, 1};
  f.inject("uno");
  f.grant(f.coord->last(op::enter), 7);
  REQUIRE(f.services.runs.size() == 1); // "uno" runs, and does not return
  f.inject("dos");
  f.services.throw_on_refused = true;
  f.inject("tres"); // refused, the refusal throws: the chat actor ends
  f.services.throw_on_refused = false;
  auto start = f.vs.elapsed_ms();
  f.vs.advance(2100ms);
  REQUIRE(f.services.failed.size() == 1); // "dos", as in the case above
  f.vs.advance_to(start + 3600);
  f.inject("cuatro"); // 400 ms before the tick turn_wait after the first
  f.vs.advance_to(start + 4100);
  // The tick at 4000 left it: it had waited 400 ms.
  CHECK(f.services.failed.size() == 1);
  f.vs.advance_to(start + 5500);
  CHECK(f.services.failed.size() == 1);
  f.vs.advance_to(start + 5700);
  CHECK(f.services.failed.size() == 2); // turn_wait after it came
  // A message after that one waits as long from its own arrival.
  f.vs.advance_to(start + 6000);
  f.inject("cinco");
  f.vs.advance_to(start + 7900);
  CHECK(f.services.failed.size() == 2);
  f.vs.advance_to(start + 8100);
  CHECK(f.services.failed.size() == 3);
  f.services.runs[0].done();
  f.vs.run();
  f.inject("seis");
  auto enters = f.coord->all(op::enter);
  REQUIRE(!enters.empty());
  f.grant(*enters.back(), 8);
  REQUIRE(f.services.runs.size() == 2);
}

TEST_CASE("a step that returned while its chat actor ended by an exception, "
          "its done unread, does not hold the chat") {
  chat_fixture f{2000ms, 1};
  f.inject("uno");
  auto& first = f.coord->last(op::enter);
  f.grant(first, 7);
  REQUIRE(f.services.runs.size() == 1);
  f.inject("dos");
  // "tres" reaches the chat's mailbox, then "uno"'s step returns: the
  // chat ends on "tres" with that news unread (freed with the mailbox).
  f.services.throw_on_refused = true;
  f.send("tres");
  auto& sched = f.vs.sched();
  REQUIRE(sched.prioritize(f.router));
  sched.run_once();
  f.services.runs[0].done();
  f.vs.run();
  f.services.throw_on_refused = false;
  REQUIRE(f.services.refused_keys.size() == 1);
  auto enters = f.coord->all(op::enter);
  REQUIRE(enters.size() == 3); // "dos" asks again from the next actor
  f.grant(*enters[2], 8);
  REQUIRE(f.services.runs.size() == 2);
  CHECK(f.services.runs[1].turn->fence() == 8);
}

namespace {

// Without coordination: posted jobs wait until the test runs them.
struct queued_services final : botmesh::chat_services {
  std::vector<std::function<void()>> jobs;
  std::vector<std::string> ran; // texts, in run order
  std::vector<std::string> refused_texts;
  bool throw_on_refused = false; // refused throws, after it noted the text
  int throw_posts = 0;           // the next N posts throw, posting nothing

  void run_turn(const std::string&, botmesh::event_ptr, bool,
                std::shared_ptr<botmesh::turn_token>,
                std::function<void()>) override {
    FAIL("chats without coordination only");
  }
  void run_event(const std::string&, botmesh::chat_event& ev, bool) override {
    ran.push_back(ev.message.text);
  }
  void post(std::function<void()> job) override {
    if (throw_posts > 0) {
      --throw_posts;
      throw std::runtime_error("post failed");
    }
    jobs.push_back(std::move(job));
  }
  void turn_failed(const std::string&, botmesh::chat_event,
                   std::string) override {
    FAIL("no turn waits without coordination");
  }
  void refused(const std::string&, botmesh::chat_event ev, botmesh::errc,
               std::string) override {
    refused_texts.push_back(ev.message.text);
    if (throw_on_refused)
      throw std::runtime_error("refused failed");
  }
};

} // namespace

// A router without coordination on `services`, and a sender of messages
// to chat "x" that runs what follows.
struct uncoordinated_chat {
  virtual_system vs;
  queued_services services;
  caf::actor router;

  uncoordinated_chat() {
    botmesh::router_config cfg{.services = &services};
    cfg.max_pending_per_chat = 2;
    router = botmesh::spawn_router(vs.sys(), std::move(cfg));
  }

  ~uncoordinated_chat() {
    caf::anon_send_exit(router, caf::exit_reason::user_shutdown);
    vs.run();
  }

  void send(const std::string& text) {
    caf::anon_send(router, event_of_x(text));
    vs.run();
  }

  void run_jobs() {
    for (std::size_t i = 0; i < services.jobs.size(); ++i)
      if (auto job = std::exchange(services.jobs[i], {}))
        job();
    vs.run();
  }
};

TEST_CASE("without coordination, a chat actor that ends by an exception "
          "hands its run queue on: what waits in it runs first, never beside "
          "the chat's newer messages") {
  uncoordinated_chat f;
  f.send("uno"); // its job is posted, not run yet
  f.send("dos");
  f.send("tres"); // two wait behind "uno"
  REQUIRE(f.services.jobs.size() == 1);
  // "cuatro" is one too many: refused, and the refusal throws (a services
  // bug): the chat actor ends with its run queue busy.
  f.services.throw_on_refused = true;
  f.send("cuatro");
  f.services.throw_on_refused = false;
  // The chat's next actor has that queue: still full, and no second job
  // runs beside the first.
  f.send("cinco");
  CHECK(f.services.jobs.size() == 1);
  auto refused = std::vector<std::string>{"cuatro", "cinco"};
  CHECK(f.services.refused_texts == refused);
  f.run_jobs();
  f.send("seis");
  f.run_jobs();
  std::string got;
  for (auto& t : f.services.ran)
    got += t + " ";
  std::vector<std::string> want{"uno", "dos", "tres", "seis"};
  CHECK_MESSAGE(f.services.ran == want, got);
}

TEST_CASE("without coordination, a message whose drain job could not be "
          "posted runs from the chat's next actor") {
  uncoordinated_chat f;
  f.services.throw_posts = 1;
  f.send("uno"); // queued; the post throws, the chat actor ends
  // The chat's next actor takes the queue over and posts its job.
  REQUIRE(f.services.jobs.size() == 1);
  f.run_jobs();
  CHECK(f.services.ran == std::vector<std::string>{"uno"});
  // Its post failing too, the next actor lives on (no actor after actor
  // while posts fail), and the next message's job runs both.
  test::log_capture logs;
  f.services.throw_posts = 2;
  f.send("dos");
  CHECK(f.services.jobs.size() == 1);
  CHECK(logs.count("chat", "posting their job failed: post failed") == 1);
  f.send("tres");
  f.run_jobs();
  std::vector<std::string> want{"uno", "dos", "tres"};
  CHECK(f.services.ran == want);
}

TEST_CASE("a flow timer waiting in a chat that ends by an exception goes to "
          "the chat's next actor and runs") {
  chat_fixture f;
  f.services.throw_on_run = true;
  f.inject("uno");
  caf::anon_send(f.router, botmesh::timer_atom::value, f.key,
                 std::uint64_t{42}, std::uint32_t{0});
  f.vs.run();
  auto enters = f.coord->all(op::enter);
  REQUIRE(enters.size() == 2); // "uno", then the timer behind it
  sc::answer(*enters[0], f.coord->granted(f.key, enters[0]->req, 7));
  f.vs.run();
  f.services.throw_on_run = false;
  auto again = f.coord->all(op::enter);
  REQUIRE(again.size() == 3);
  f.grant(*again[2], 8);
  REQUIRE(f.services.runs.size() == 1);
  CHECK(f.services.runs[0].timer == 42);
  CHECK(f.services.runs[0].turn->fence() == 8);
}

TEST_CASE("a flow timer sent on to a chat that ends by an exception before "
          "taking it goes to the chat's next actor and runs") {
  chat_fixture f;
  f.services.throw_on_run = true;
  f.inject("uno");
  // The grant reaches the chat's mailbox, and the timer behind it: the chat
  // ends on the grant (run_turn throws) with the timer not yet taken.
  f.grant_unread(7);
  auto& sched = f.vs.sched();
  caf::anon_send(f.router, botmesh::timer_atom::value, f.key,
                 std::uint64_t{42}, std::uint32_t{0});
  REQUIRE(sched.prioritize(f.router));
  sched.run_once(); // the router sends the timer on to the chat
  f.vs.run();
  f.services.throw_on_run = false;
  auto enters = f.coord->all(op::enter);
  REQUIRE(enters.size() == 2); // the next actor asks a turn for the timer
  f.grant(*enters[1], 8);
  REQUIRE(f.services.runs.size() == 1);
  CHECK(f.services.runs[0].timer == 42);
  CHECK(f.services.runs[0].turn->fence() == 8);
}

TEST_CASE("a grant that arrives after the chat's turn_wait gave up is "
          "released and its message never runs") {
  chat_fixture f;
  f.inject("uno");
  auto& enter = f.coord->last(op::enter);
  REQUIRE(enter.key == f.key);
  f.vs.advance(2000ms); // turn_wait passes while the enter is in flight
  CHECK(f.services.failed.size() == 1);
  sc::answer(enter, f.coord->granted(f.key, enter.req, 7));
  f.vs.run();
  CHECK(f.releases(f.key, 7) == 1);
  f.vs.advance(3000ms);
  CHECK(f.services.runs.empty());
  CHECK(f.releases(f.key, 7) == 1);
}

TEST_CASE("a grant that crosses the chat's turn_wait on the way is released "
          "once and its message never runs") {
  chat_fixture f;
  f.inject("uno");
  auto& enter = f.coord->last(op::enter);
  // turn_wait falls due in the chat's mailbox; the grant is answered and
  // sent to the chat before the lease actor hears the chat gave up.
  f.vs.freeze(2000ms);
  sc::answer(enter, f.coord->granted(f.key, enter.req, 7));
  auto& sched = f.vs.sched();
  REQUIRE(sched.prioritize(f.lease_actor));
  sched.run_once();
  f.vs.run();
  CHECK(f.services.failed.size() == 1);
  CHECK(f.releases(f.key, 7) == 1);
  f.vs.advance(3000ms);
  CHECK(f.services.runs.empty());
  CHECK(f.releases(f.key, 7) == 1);
}

TEST_CASE("a message whose request moved to the running one in a grant "
          "keeps a turn_wait bound of its own once it waits at the head") {
  chat_fixture f{100ms};
  f.inject("uno");
  f.inject("dos");
  auto enters = f.coord->all(op::enter);
  REQUIRE(enters.size() == 2);
  // The later request is granted first: "uno" runs in that turn, and "dos"
  // waits with the earlier request, which is never granted.
  sc::answer(*enters[1], f.coord->granted(f.key, enters[1]->req, 7));
  f.vs.run();
  REQUIRE(f.services.runs.size() == 1);
  // "uno" runs past the bound armed for it when it waited at the head.
  f.vs.advance(150ms);
  CHECK(f.services.failed.empty());
  f.services.runs[0].done();
  f.vs.run();
  // "dos" now waits at the head: turn_wait from now, not at once, not never.
  f.vs.advance(99ms);
  CHECK(f.services.failed.empty());
  f.vs.advance(2ms);
  CHECK(f.services.failed.size() == 1);
}

TEST_CASE("a chat's turn lost before its step ran is asked for again, in "
          "order with the chat's later messages") {
  chat_fixture f{10'000ms};
  f.coord->set_policy(op::poll, [&](call& c) {
    sc::answer(c, f.coord->waiting(c.key, c.req));
  });
  f.inject("uno");
  f.inject("dos");
  auto enters = f.coord->all(op::enter);
  REQUIRE(enters.size() == 2);
  auto first = enters[0]->req;
  auto second = enters[1]->req;
  sc::answer(*enters[1], f.coord->waiting(f.key, second));
  // The first grant comes too late to be used.
  f.vs.freeze(3500ms);
  sc::answer(*enters[0], f.coord->granted(f.key, first, 7,
                                          virtual_system::backend_at(0)));
  f.vs.run();
  CHECK(f.services.runs.empty());
  CHECK(f.releases(f.key, 7) == 1);
  // Both are entered again, first before second, and the second's old
  // ticket is given up.
  auto again = f.coord->all(op::enter);
  REQUIRE(again.size() == 4);
  CHECK(again[2]->req != first);
  CHECK(again[3]->req != second);
  CHECK(again[2]->req < again[3]->req);
  CHECK(f.coord->count(op::leave, f.key, second) == 1);
}

TEST_CASE("a message entered again after its ticket was lost keeps the "
          "turn_wait bound it began with") {
  chat_fixture f{2000ms};
  f.inject("uno");
  auto& enter = f.coord->last(op::enter);
  sc::answer(enter, f.coord->waiting(f.key, enter.req));
  f.vs.run();
  // Its ticket is gone 1.5 s into the wait (another replica skipped this
  // one's tickets): it enters again and waits on.
  f.vs.advance(1500ms);
  f.coord->set_policy(op::poll, nullptr); // answered by the test
  f.vs.advance(50ms);
  auto& poll = f.coord->next(op::poll);
  sc::answer(poll, f.coord->gone(f.key, poll.req));
  f.vs.run();
  auto& again = f.coord->last(op::enter);
  REQUIRE(&again != &enter);
  sc::answer(again, f.coord->waiting(f.key, again.req));
  f.vs.run();
  CHECK(f.services.failed.empty());
  // 2 s after it began waiting, not 2 s after it entered again.
  f.vs.advance(500ms);
  CHECK(f.services.failed.size() == 1);
  CHECK(f.coord->count(op::leave, f.key, again.req) == 1);
}

TEST_CASE("what waited behind a cut step waits anew once that step returns: "
          "turn_wait from its next request, not from the cut") {
  chat_fixture f{2000ms};
  f.coord->set_policy(op::poll, [&](call& c) {
    sc::answer(c, f.coord->waiting(c.key, c.req));
  });
  f.inject("uno");
  f.grant(f.coord->last(op::enter), 7);
  REQUIRE(f.services.runs.size() == 1); // "uno" runs, deaf to its stop token
  f.inject("dos");
  auto& dos = f.coord->last(op::enter);
  sc::answer(dos, f.coord->waiting(f.key, dos.req));
  f.vs.run();
  // The next renewal finds "uno"'s turn gone: its step is cut, and after
  // the grace "dos" gives its ticket back and waits here, bounded.
  f.coord->set_policy(op::renew, [&](call& c) {
    auto r = f.coord->renewed(c);
    for (auto& t : r.turns)
      t = 0;
    sc::answer(c, r);
  });
  // (Its request may have been granted meanwhile: given back as a release
  // then, else as a leave.)
  auto given_back = [&] {
    return f.coord->count(op::leave, f.key, dos.req) == 1
           || f.coord->count(op::release) == 2;
  };
  for (int steps = 0; !given_back() && steps < 100; ++steps)
    f.vs.advance(100ms);
  REQUIRE(given_back());
  f.vs.advance(1800ms); // within the 2 s bound that began at the give-back
  CHECK(f.services.failed.empty());
  f.services.runs[0].done(); // the step returns: "dos" asks again
  f.vs.run();
  auto& again = f.coord->last(op::enter);
  REQUIRE(&again != &dos);
  sc::answer(again, f.coord->waiting(f.key, again.req));
  f.vs.run();
  f.vs.advance(500ms); // past the old bound, within the new one
  CHECK(f.services.failed.empty());
  f.vs.advance(1600ms);
  CHECK(f.services.failed.size() == 1);
}

// -- on the memory hub ------------------------------------------------------------------

namespace {

// One replica: a memory coordinator on the shared hub, its lease actor and a
// chat probe.
struct hub_replica {
  virtual_system& vs;
  std::shared_ptr<botmesh::memory_coordinator> coord;
  listener_log listener;
  caf::actor lease;
  std::shared_ptr<probe_log> log = std::make_shared<probe_log>();
  caf::actor chat;

  hub_replica(virtual_system& sys, botmesh::memory_coordination_hub& hub,
              std::string id, ms settle = 60'000ms)
    : vs(sys) {
    coord = std::make_shared<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = std::move(id),
                                               .lease = "3s"});
    lease = botmesh::spawn_lease_actor(
      vs.sys(), botmesh::lease_config{.coordinator = coord,
                                      .settle = settle,
                                      .listener = &listener});
    chat = vs.sys().spawn(chat_probe, log);
    vs.run();
  }

  hub_replica(const hub_replica&) = delete;
  hub_replica& operator=(const hub_replica&) = delete;

  ~hub_replica() {
    caf::anon_send_exit(lease, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(chat, caf::exit_reason::user_shutdown);
    vs.run();
  }
};

struct hub_fixture {
  botmesh::manual_clock clock;
  botmesh::memory_coordination_hub hub{{.clock = &clock}};
  virtual_system vs;

  hub_fixture() {
    vs.attach(clock);
  }

  template <class... Ts>
  void tell(hub_replica& r, Ts&&... xs) {
    caf::send_as(r.chat, r.lease, std::forward<Ts>(xs)...);
    vs.run();
  }
};

} // namespace

TEST_CASE("on a memory hub, a frozen holder has fenced itself before the "
          "next replica is granted the chat") {
  hub_fixture f;
  hub_replica a{f.vs, f.hub, "a"};
  hub_replica b{f.vs, f.hub, "b"};
  f.tell(a, botmesh::acquire_atom::value, key_a, std::uint64_t{1});
  auto held = a.log->token_of(1);
  REQUIRE(held);
  f.vs.advance_to(500);
  f.tell(b, botmesh::acquire_atom::value, key_a, std::uint64_t{2});
  REQUIRE(b.log->grants.empty());
  f.vs.advance_to(1500);
  a.coord->crash(); // a stops reaching the backend: renewals fail
  bool a_fenced_first = true;
  for (int t = 0; t < 6000 && b.log->grants.empty(); ++t) {
    f.vs.advance(1ms);
    if (!b.log->grants.empty() && held->valid())
      a_fenced_first = false;
  }
  REQUIRE(b.log->grants.size() == 1);
  CHECK(a_fenced_first);
  CHECK(held->ended() == turn_end::frozen);
  CHECK(has_loss(*a.log, 1, held->fence(), "frozen"));
  CHECK(b.log->grants[0].token->valid());
}

TEST_CASE("on a memory hub, settle releases the turn in the backend so the "
          "next replica is granted the chat at once") {
  hub_fixture f;
  hub_replica a{f.vs, f.hub, "a", 1500ms};
  hub_replica b{f.vs, f.hub, "b"};
  f.tell(a, botmesh::acquire_atom::value, key_a, std::uint64_t{1});
  auto held = a.log->token_of(1);
  REQUIRE(held);
  f.tell(b, botmesh::acquire_atom::value, key_a, std::uint64_t{2});
  f.vs.advance_to(100);
  f.tell(a, botmesh::start_atom::value, key_a, held->fence());
  f.vs.advance_to(1599);
  CHECK(b.log->grants.empty());
  f.vs.advance_to(1600);
  CHECK(held->ended() == turn_end::settle);
  CHECK(listener_saw(a.listener, key_a, held->fence(), turn_end::settle));
  REQUIRE(b.log->grants.size() == 1); // pushed by a's release, not polled
  CHECK(b.log->grants[0].token->valid());
}

TEST_CASE("on a memory hub, a shut down replica leaves no turn, ticket or "
          "leadership behind") {
  hub_fixture f;
  hub_replica a{f.vs, f.hub, "a"};
  hub_replica b{f.vs, f.hub, "b"};
  f.tell(b, botmesh::acquire_atom::value, key_b, std::uint64_t{10});
  auto b_turn = b.log->token_of(10);
  REQUIRE(b_turn);
  f.tell(a, botmesh::acquire_atom::value, key_a, std::uint64_t{1});
  REQUIRE(a.log->token_of(1));
  f.tell(a, botmesh::acquire_atom::value, key_b, std::uint64_t{2}); // waits
  f.tell(a, botmesh::lead_atom::value, lead_name);
  REQUIRE(a.log->leaders.size() == 1);
  auto replies = std::make_shared<std::vector<bool>>();
  request_shutdown(f.vs.sys(), a.lease, replies);
  f.vs.run();
  CHECK(*replies == std::vector<bool>{true});
  // b gets everything at once, without waiting out a's lease.
  f.tell(b, botmesh::acquire_atom::value, key_a, std::uint64_t{11});
  CHECK(b.log->token_of(11));
  f.tell(b, botmesh::release_atom::value, key_b, b_turn->fence());
  f.tell(b, botmesh::acquire_atom::value, key_b, std::uint64_t{12});
  CHECK(b.log->token_of(12));
  f.tell(b, botmesh::lead_atom::value, lead_name);
  CHECK(b.log->leaders.size() == 1);
}

// -- the session actor ---------------------------------------------------------

namespace {

// What a session actor asks of its bot, in order.
class hooks_log final : public botmesh::session_hooks {
 public:
  void set_transport(bool open, std::function<void()> applied) override {
    add(open ? "open" : "close");
    if (applied)
      applied();
  }
  std::optional<std::chrono::steady_clock::duration> closed_for() override {
    return std::nullopt; // open: never provider_down
  }
  void leader(const std::string&, std::uint64_t fence) override {
    add("leader " + std::to_string(fence));
  }
  void follower(const std::string&, const std::string& reason) override {
    add("follower " + reason);
  }
  std::vector<std::string> get() {
    std::lock_guard guard{mtx_};
    return lines_;
  }

 private:
  void add(std::string line) {
    std::lock_guard guard{mtx_};
    lines_.push_back(std::move(line));
  }
  std::mutex mtx_;
  std::vector<std::string> lines_;
};

} // namespace

TEST_CASE("a session told of a new fence while it leads reports the loss, "
          "then the new leadership") {
  // Before, the new fence replaced the old one silently: listeners kept
  // the old one, though another replica may have led in between.
  caf::actor_system_config cfg;
  cfg.set("logger.console-verbosity", caf::atom("quiet"));
  caf::actor_system sys{cfg};
  hooks_log h;
  botmesh::session_config sc;
  sc.lease = sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
    self->set_default_handler(caf::drop);
    return {[](int) {}};
  });
  sc.name = lead_name;
  sc.period = std::chrono::hours{1}; // no transport checks meanwhile
  sc.hooks = &h;
  sc.leading = std::make_shared<std::atomic<bool>>(false);
  auto s = botmesh::spawn_session_actor(sys, sc);
  for (std::uint64_t fence : {7, 7, 9}) // 7 presented again, then a new term
    caf::anon_send(s, botmesh::leader_atom::value, lead_name, fence);
  REQUIRE(test::eventually([&] { return h.get().size() >= 6; }));
  CHECK(h.get()
        == std::vector<std::string>{"open", "leader 7", "close",
                                    "follower lost", "open", "leader 9"});
  CHECK(sc.leading->load());
  caf::anon_send_exit(s, caf::exit_reason::kill);
  caf::anon_send_exit(sc.lease, caf::exit_reason::kill);
}
