#pragma once

// The durable-task actor's state and the helpers its two source files
// share (task_actor.cpp: claim, run and the behaviour; task_run.cpp:
// renewals, the end of a run and its commit). Private to the actors
// module: it pulls in CAF.

#include <algorithm>
#include <atomic>
#include <optional>
#include <stop_token>
#include <vector>

#include <caf/all.hpp>
#include <fmt/format.h>

#include <botmesh/actors/internal/scheduler_engine.hpp>
#include <botmesh/actors/messages.hpp>
#include <botmesh/runtime/core/internal/text.hpp>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::internal::store_call>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::internal::poll_ticket>)

namespace botmesh::internal::task_impl {


using ms = std::chrono::milliseconds;

enum class phase { idle, claiming, running, committing };

// A claimed run: its plan and the stop of its handler calls, in one
// allocation. The job reads the plan; the actor reads it again only once
// the job reported its end (that message orders the two). The job holds
// only this (one reference count, one small closure), so what it needs to
// run and report is here too.
struct run_ctx {
  run_plan plan;
  std::stop_source stop;
  caf::actor me;
  std::shared_ptr<task> t;
  std::shared_ptr<scheduler_engine> eng;
  std::uint64_t token = 0;
  // Slots whose handler returned, counted by the job.
  std::atomic<std::size_t> completed{0};
  // The actor's view of until when the claim surely holds (held_until, as
  // time since the epoch), published for the job: a catch-up starts each
  // slot only before it, on its own clock. After a stand-still (a frozen
  // process) the actor's renewal may not have run yet, and another replica
  // may already run the slot the job would start next.
  std::atomic<time_point::rep> held_until{time_point::max().time_since_epoch().count()};
  // The actor's: set when the lease was lost or surely ran out while it
  // ran, to how many slots had completed then (see run_ended).
  std::optional<std::size_t> completed_before_loss;
};

// Where the calendar goes once the claimed run ended (at `end`), having
// run `ran` slots of the plan. Nothing when there is nothing to commit.
struct outcome {
  std::optional<time_point> next;
  bool done = false;
  bool exhausted = false; // a calendar with no next slot: ended
  time_point end{};
};

struct task_state {
  std::shared_ptr<scheduler_engine> eng;
  // The store-I/O actor, copied at spawn: the scheduler clears the engine's
  // handle when it goes, while this actor may still be running.
  caf::actor io;
  std::shared_ptr<task> t;
  phase ph = phase::idle;
  // The current claim and its run (set from the claim to the commit).
  schedule_claim claim;
  std::shared_ptr<run_ctx> run;
  time_point next_renew = time_point::max();
  // Until when the claim surely holds: its last successful claim or renewal
  // was sent at T, so the store holds it until T + lease (a tenth less, for
  // the clocks). Failed renewals past it mean the lease is lost.
  time_point held_until = time_point::max();
  // The claim whose renewal is in flight (0: none). A token, not a flag: a
  // late reply for an older claim must not hold back the current one's
  // renewals (replies of the asynchronous face may come out of order).
  std::uint64_t renewing = 0;
  // The `now` of the first and last claims whose calls failed since the
  // last answered one: the store may have taken one of them, and then holds
  // a claim of this replica that no reply told it of (see claimed()).
  // Counted in the engine while set (see set_lost): stop() looks for such
  // claims to give them back.
  std::optional<std::pair<time_point, time_point>> lost_claims;
  // poll()'s tickets: let go once idle.
  std::vector<std::shared_ptr<poll_ticket>> polls;
  // The pending wake-up: only the latest generation counts.
  std::uint64_t wake_gen = 0;
  time_point armed = time_point::max();
  bool cancelled = false;
  // A commit whose store call failed is tried again while the claim's
  // lease surely holds (see commit()): what it writes, and the attempt a
  // pending retry is for (0: none pending).
  outcome to_commit;
  int commit_retry = 0;

  ~task_state() {
    if (lost_claims && eng)
      --eng->lost_claims;
  }

  static inline const char* name = "botmesh.task";
};

using task_actor = caf::stateful_actor<task_state>;

// The running claim surely holds until `t` (a claim or renewal answered in
// time): kept by the actor and published for the run's job.
inline void claim_holds_until(task_state& st, time_point t) {
  st.held_until = t;
  st.run->held_until.store(t.time_since_epoch().count());
}

// Every change of task_state::lost_claims goes through here: the engine
// counts the actors that have one.
inline void set_lost(task_state& st,
              std::optional<std::pair<time_point, time_point>> lost) {
  if (st.lost_claims.has_value() != lost.has_value()) {
    if (lost)
      ++st.eng->lost_claims;
    else
      --st.eng->lost_claims;
  }
  st.lost_claims = lost;
}

// A claim call made at `at` failed (or its confirmation did): the window
// of failed calls widens to include it.
inline void note_lost(task_state& st, time_point at) {
  auto& l = st.lost_claims;
  set_lost(st, std::pair{l ? std::min(l->first, at) : at,
                         l ? std::max(l->second, at) : at});
}

// A store call, and `then(result, failure)` in this actor once it ended
// (`failure`: the error's text, empty on success). Where the call runs:
// - a store with an asynchronous face (Redis): `async(store, engine, done)`
//   sends it, and the client's callback sends the outcome back here as a
//   message; no thread waits on the round trip;
// - a store that does no I/O (the memory store): `sync(engine)`, right here;
// - any other store (SQLite): `sync(engine)` on the store-I/O actor, whose
//   reply comes back as a message.
template <class Result, class Sync, class Async, class Then>
void store_io(task_actor* self, Sync sync, Async async, Then then) {
  auto& eng = *self->state.eng;
  if (auto* a = eng.async_store) {
    auto box = std::make_shared<Result>();
    auto call = std::make_shared<store_call>();
    call->resume = [box, then = std::move(then)](const std::string& failure) {
      then(*box, failure);
    };
    async(*a, eng,
          [me = caf::actor_cast<caf::actor>(self), box,
           call](Result r, std::exception_ptr e) mutable {
            if (e)
              call->failure = what_of(e);
            else
              *box = std::move(r);
            caf::anon_send(me, io_atom::value, std::move(call));
          });
    return;
  }
  if (!eng.store->blocks()) {
    Result r{};
    std::string failure;
    try {
      r = sync(eng);
    } catch (...) {
      failure = what_of(std::current_exception());
    }
    then(r, failure);
    return;
  }
  auto box = std::make_shared<Result>();
  auto call = std::make_shared<store_call>();
  // The engine is held: the call may outlive this actor.
  call->fn = [box, sync = std::move(sync), e = self->state.eng] {
    *box = sync(*e);
  };
  self->request(self->state.io, caf::infinite, io_atom::value, call)
    .then([box, then = std::move(then)](io_atom,
                                        std::shared_ptr<store_call>& c) {
      then(*box, c->failure);
    });
}

// task_actor.cpp
void evaluate(task_actor* self);

// task_run.cpp
void reply_if_idle(task_actor* self);
void arm(task_actor* self, time_point at);
void arm_renewal(task_actor* self);
time_point holds_until(time_point sent, ms lease);
void claim_again_later(task_actor* self, time_point now);
void lease_ran_out(task_actor* self, std::string_view why);
void renew(task_actor* self);
void commit(task_actor* self, int attempt);
void run_ended(task_actor* self, std::size_t ran);
void give_up_commit(task_actor* self);

// Gives claim `token` back untouched, keeping an interrupted slot's mark
// (its owner and first claim time, which a commit would clear): its lease
// is cut to a millisecond, so the next claim takes it over at once, as
// interrupted. `then` runs once the store answered (refused or failed: the
// claim lapses with its lease, and keeps the mark all the same).
template <class Then>
void cut_lease(task_actor* self, std::uint64_t token, Then then) {
  auto& st = self->state;
  auto* eng = st.eng.get();
  auto id = st.t->stored_id;
  auto now = eng->now();
  st.ph = phase::committing;
  store_io<bool>(
    self,
    [=](scheduler_engine& e) {
      return e.store->renew(id, e.owner, token, now, ms{1});
    },
    [=](async_schedule_store& a, scheduler_engine& e, auto done) {
      a.renew_async(id, e.owner, token, now, ms{1}, std::move(done));
    },
    [=](bool, const std::string& failure) {
      if (!failure.empty())
        eng->log_failure(fmt::format("handing back {} failed: {}", id, failure));
      then();
    });
}

} // namespace botmesh::internal::task_impl
