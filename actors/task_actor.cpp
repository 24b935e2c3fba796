// The actor of one durable task: its mailbox orders claim -> run -> renew
// -> commit. Store calls go to the store-I/O actor and come back as
// messages; the handler runs on the executor (the handler pool) and reports
// its end by message; wake-ups and renewals are CAF delayed messages.

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
#include <botmesh/scheduler/cron.hpp>
#include <botmesh/scheduler/internal/iso_time.hpp>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::internal::store_call>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::internal::poll_ticket>)

namespace botmesh::internal {

namespace {

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

// Every change of task_state::lost_claims goes through here: the engine
// counts the actors that have one.
void set_lost(task_state& st,
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
void note_lost(task_state& st, time_point at) {
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

void evaluate(task_actor* self);

void reply_if_idle(task_actor* self) {
  auto& st = self->state;
  if (st.ph != phase::idle)
    return;
  st.polls.clear(); // poll() goes on once every actor let its ticket go
  if (st.cancelled)
    self->quit();
}

// Arms one wake-up at `at` (at the latest one tick ahead, so a change of
// leadership or a clock step is seen within a tick).
void arm(task_actor* self, time_point at) {
  auto& st = self->state;
  if (!st.eng->started.load() || st.cancelled)
    return;
  auto now = st.eng->now();
  at = std::min(at, now + st.eng->opts.tick.ms());
  if (at >= st.armed)
    return; // an earlier wake-up is pending
  st.armed = at;
  self->delayed_send(self, std::max(ms{0}, at - now), task_tick_atom::value,
                     ++st.wake_gen);
}

void arm_renewal(task_actor* self) {
  auto& st = self->state;
  // poll() renews on its own. A stopped scheduler (paused) still renews
  // what runs: stop() waits for a handler that may ignore its stop token,
  // and a lease left to lapse meanwhile would let another replica run the
  // same slot at once.
  if (!st.eng->started.load() && !st.eng->paused.load())
    return;
  auto delay = std::max(ms{0}, st.next_renew - st.eng->now());
  self->delayed_send(self, delay, task_renew_atom::value, st.claim.token);
}

// Until when a claim or renewal sent at `sent` surely holds: the store
// keeps it a lease from when it ran, after `sent`; a tenth less, for the
// clocks.
time_point holds_until(time_point sent, ms lease) {
  return sent + lease - lease / 10;
}

// A claim that was not taken (its call failed, or its late reply could not
// be confirmed): idle, and claiming again at the next tick.
void claim_again_later(task_actor* self, time_point now) {
  auto& st = self->state;
  st.ph = phase::idle;
  st.eng->run_finished();
  arm(self, now + st.eng->opts.tick.ms());
  reply_if_idle(self);
}

// The run's lease is gone: its handler is asked to stop, and what it
// completed so far is noted (the slots after it are not committed).
void lease_gone(run_ctx& run) {
  if (run.completed_before_loss)
    return;
  run.completed_before_loss = run.completed.load();
  run.stop.request_stop();
}

// The claim's lease surely ran out (renewals failed or went unanswered
// past it): another replica may take the slot over now. The run is asked to
// stop, as on a lost lease; said once.
void lease_ran_out(task_actor* self, std::string_view why) {
  auto& st = self->state;
  st.eng->log(fmt::format("lease of {} (token {}) ran out {}: its run is asked "
                          "to stop",
                          st.t->stored_id, st.claim.token, why));
  lease_gone(*st.run);
  st.next_renew = time_point::max();
  st.held_until = time_point::max();
}

void renew(task_actor* self) {
  auto& st = self->state;
  if (st.ph != phase::running || st.renewing == st.claim.token)
    return; // (the reply in flight arms the next one)
  st.renewing = st.claim.token;
  auto* eng = st.eng.get(); // (the actor holds it)
  auto id = st.t->stored_id;
  auto token = st.claim.token;
  auto lease = st.t->opts.lease.ms();
  auto now = eng->now();
  // If this reply does not come back in time, evaluate() sees the lease
  // run out.
  if (st.held_until != time_point::max())
    arm(self, st.held_until);
  store_io<bool>(
    self,
    [=](scheduler_engine& e) {
      return e.store->renew(id, e.owner, token, now, lease);
    },
    [=](async_schedule_store& a, scheduler_engine& e, auto done) {
      a.renew_async(id, e.owner, token, now, lease, std::move(done));
    },
    [=](bool ok, const std::string& failure) {
      auto& st = self->state;
      if (st.renewing == token)
        st.renewing = 0;
      if (st.ph != phase::running || st.claim.token != token)
        return;
      if (!failure.empty()) {
        if (eng->now() >= st.held_until) {
          lease_ran_out(self, fmt::format("while its renewals failed ({})",
                                          failure));
          return;
        }
        // Try again next tick; the lease still holds.
        eng->log_failure(fmt::format("renewing the lease of {} failed: {}", id, failure));
        st.next_renew = now + eng->opts.tick.ms();
      } else if (ok) {
        st.held_until = holds_until(now, lease);
        st.next_renew = now + lease / 3;
      } else {
        eng->log(fmt::format("lease of {} (token {}) lost: its run is asked to "
                             "stop",
                             id, token));
        lease_gone(*st.run);
        st.next_renew = time_point::max();
        return;
      }
      arm_renewal(self);
    });
}

outcome after_run(const task_state& st, std::size_t ran, time_point end) {
  auto& t = *st.t;
  auto& plan = st.run->plan;
  outcome o;
  o.end = end;
  if (ran < plan.slots.size()) {
    o.next = plan.slots[ran]; // a stop: resume from the first slot not run
  } else if (plan.one_shot) {
    o.next = st.claim.record.next_run_at;
    o.done = true;
  } else if (plan.next_if_completed) {
    o.next = plan.next_if_completed;
  } else {
    auto slot = st.claim.record.next_run_at;
    o.next = t.opts.missed == missed_policy::skip ? t.first_slot_after(slot, end)
                                                  : t.slot_after(slot);
    if (!o.next) {
      // No slot after this one (none within the cron search's horizon,
      // which every expression that runs at all fits): the task ends, as a
      // one-shot does. Left uncommitted, the claim would lapse and the
      // same slot run again after every lease.
      o.next = slot;
      o.done = true;
      o.exhausted = true;
    }
  }
  return o;
}

// The claim ended (committed, refused, or its commit failed: `retry`).
void finish(task_actor* self, bool retry = false) {
  auto& st = self->state;
  st.ph = phase::idle;
  // No retry waits any more. Left set, a later cut_lease (also
  // `committing`) would look like a waiting retry to give_up_commit, which
  // would finish it while its store call is in flight: finished twice, the
  // scheduler's count of runs would wrap and a later stop() wait forever.
  st.commit_retry = 0;
  st.run.reset();
  st.next_renew = time_point::max();
  st.held_until = time_point::max();
  if (retry)
    arm(self, st.eng->now() + st.eng->opts.tick.ms()); // (a started scheduler)
  else
    evaluate(self); // slots that fell due meanwhile are claimed next
  // Only now: a claim evaluate() started is counted already, so stop()
  // never sees zero runs between this claim and the next.
  st.eng->run_finished();
  reply_if_idle(self);
}

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

// Writes the claim's outcome (st.to_commit): attempt `attempt`. A failed
// call (the store down, a lost reply) is tried again every tick while the
// lease surely holds and the scheduler runs: the slot ran, and a claim left
// to lapse would run it again once its lease is out. Past that, or once
// stopped or cancelled while waiting to try again (give_up_commit), the
// claim is left to lapse: the slot runs again as interrupted (at least
// once). A retry refused may be the earlier attempt that landed, its reply
// lost: the record is then committed already.
void commit(task_actor* self, int attempt) {
  auto& st = self->state;
  auto* eng = st.eng.get();
  st.ph = phase::committing;
  st.commit_retry = 0;
  auto id = st.t->stored_id;
  auto token = st.claim.token;
  auto o = st.to_commit;
  store_io<bool>(
    self,
    [=](scheduler_engine& e) {
      return e.store->commit(id, e.owner, token, *o.next, o.done, o.end);
    },
    [=](async_schedule_store& a, scheduler_engine& e, auto done) {
      a.commit_async(id, e.owner, token, *o.next, o.done, o.end,
                     std::move(done));
    },
    [=](bool committed, const std::string& failure) {
      auto& st = self->state;
      if (!failure.empty()) {
        eng->log_failure(fmt::format("committing {} failed: {}", id, failure));
        auto delay = eng->opts.tick.ms();
        // (A lease lost or run out while the run went on: no retry, the
        // claim is not this replica's to keep.)
        bool held = st.run && !st.run->completed_before_loss
                    && st.held_until != time_point::max()
                    && eng->now() + delay < st.held_until;
        if (held && eng->started.load() && !eng->paused.load()
            && !st.cancelled) {
          st.commit_retry = attempt + 1;
          self->delayed_send(self, delay, task_commit_atom::value, token,
                             attempt + 1);
          return;
        }
        // Tried again as a claim: refused while this claim's lease holds,
        // then taken as interrupted.
        finish(self, true);
        return;
      }
      if (!committed) {
        if (attempt > 1)
          eng->log(fmt::format("commit of {} with token {} refused after a "
                               "failed attempt: that attempt landed, or a "
                               "newer claim exists",
                               id, token));
        else
          eng->log(fmt::format("commit of {} with token {} rejected: a newer "
                               "claim exists (this executor was stale)",
                               id, token));
      } else {
        st.t->next = *o.next;
        if (o.done)
          st.t->st->active = false;
      }
      finish(self);
    });
}

void run_ended(task_actor* self, std::size_t ran) {
  auto& st = self->state;
  auto* eng = st.eng.get();
  if (st.run->completed_before_loss) {
    // A slot running when the lease was lost may have been cut short (its
    // stop token fired), and another replica may take it over: it is not
    // committed as done. The slots completed before are (the commit is
    // fenced: refused if someone claimed since); with none, the claim is
    // left to lapse and the next one (this replica's too) runs it again
    // as interrupted, not missed.
    ran = std::min(ran, *st.run->completed_before_loss);
    if (ran == 0) {
      eng->log(fmt::format("{} (token {}): not committed, its lease was lost "
                           "while it ran: the slot runs again as interrupted",
                           st.t->stored_id, st.claim.token));
      // Given back rather than left to lapse: a lease believed lost (its
      // renewals unanswered in time) may still hold in the store, and the
      // slot would wait for it. Fenced by the token: refused when another
      // replica claimed since.
      cut_lease(self, st.claim.token, [self] { finish(self, true); });
      return;
    }
  }
  if (ran == 0 && !st.run->plan.slots.empty()) {
    // Stopped before its slot started: given back with its mark, as a
    // claim handed back on its way is (a commit of the same slot would
    // have a later claimer judge it missed).
    cut_lease(self, st.claim.token, [self] { finish(self, true); });
    return;
  }
  auto end = eng->now();
  auto o = after_run(st, ran, end);
  if (!o.next) {
    finish(self);
    return;
  }
  if (o.exhausted)
    eng->log(fmt::format("{}: its calendar has no slot after {}: the task "
                         "ends",
                         st.t->stored_id, format_iso8601(*o.next, "UTC")));
  st.to_commit = o;
  commit(self, 1);
}

// Stopped or cancelled while a failed commit waits to be tried again: given
// up, the claim lapses (see commit()).
void give_up_commit(task_actor* self) {
  auto& st = self->state;
  if (st.ph == phase::committing && st.commit_retry > 0)
    finish(self, true);
}

// Posts the plan's runs to the executor; the job reports how many ran.
void start_run(task_actor* self) {
  auto& st = self->state;
  if (st.run->plan.slots.empty()) { // skip: nothing to run, only the commit
    run_ended(self, 0);
    return;
  }
  auto& ctx = *st.run;
  ctx.me = caf::actor_cast<caf::actor>(self);
  ctx.t = st.t;
  ctx.eng = st.eng;
  ctx.token = st.claim.token;
  st.eng->execute([c = st.run] {
    auto& ctx = *c;
    auto& t = *ctx.t;
    auto& eng = *ctx.eng;
    auto& plan = ctx.plan;
    std::size_t ran = 0;
    for (auto slot : plan.slots) {
      // cancel() clears `active` before it returns; the actor hears of it
      // later (a catch-up's next slot must not run after a cancel).
      if (ctx.stop.stop_requested() || !t.st->active.load())
        break;
      scheduled_run run;
      run.task_id = t.opts.id;
      run.occurrence_key = occurrence_key(t.opts.id, slot);
      run.scheduled_at = slot;
      run.fencing_token = ctx.token;
      run.missed = plan.missed;
      run.stop = ctx.stop.get_token();
      eng.runs.fetch_add(1, std::memory_order_relaxed);
      try {
        t.fn(run);
      } catch (const std::exception& e) {
        eng.failed.fetch_add(1, std::memory_order_relaxed);
        eng.log(fmt::format("durable task {} failed: {}", run.occurrence_key,
                            e.what()));
      } catch (...) {
        eng.failed.fetch_add(1, std::memory_order_relaxed);
        eng.log(fmt::format("durable task {} failed", run.occurrence_key));
      }
      ++ran;
      ctx.completed.store(ran);
    }
    // Moved out: the context outlives the job in the actor's state until
    // the commit, and it must not keep the actor alive meanwhile.
    auto me = std::move(ctx.me);
    caf::anon_send(me, task_done_atom::value, ctx.token, ran);
  });
}

void hand_back(task_actor* self, schedule_claim claim);

void run_claimed(task_actor* self, schedule_claim claim, time_point claimed_at,
                 time_point held_from);
void confirm_late(task_actor* self, schedule_claim claim, time_point now,
                  bool adopted = false);

// Whether `current` (the record that refused a claim) holds a claim of this
// replica that one of its failed claim calls made: same owner, last written
// at the `now` of one of them.
bool own_lost_claim(const task_state& st,
                    const std::pair<time_point, time_point>& lost,
                    const schedule_record& current, time_point now) {
  if (current.deleted || current.done || current.lease_owner != st.eng->owner
      || current.lease_until <= now || current.next_run_at > now)
    return false;
  auto [first, last] = lost;
  return current.updated_at >= first && current.updated_at <= last;
}

void claimed(task_actor* self, std::optional<schedule_claim> claim,
             std::optional<schedule_record> current, time_point now) {
  auto& st = self->state;
  auto& t = *st.t;
  auto* eng = st.eng.get();
  auto lost = st.lost_claims;
  set_lost(st, std::nullopt);
  if (!claim && current && lost && own_lost_claim(st, *lost, *current, now)) {
    // Refused because the store took an earlier claim of this replica whose
    // reply was lost: taken up again (renewed first, as a late reply is)
    // instead of waiting out its lease. As interrupted: the record keeps
    // when that claim (or the one it took over) was taken, which decides
    // whether the slot was missed.
    schedule_claim mine{*current, current->fencing_token, true};
    if (st.cancelled || eng->paused.load()) {
      hand_back(self, std::move(mine)); // (its lease cut, its mark kept)
      return;
    }
    set_lost(st, lost); // (kept should the confirmation fail)
    confirm_late(self, std::move(mine), now, true);
    return;
  }
  if (!claim) {
    st.ph = phase::idle;
    eng->run_finished();
    if (current) {
      if (current->deleted) {
        eng->log(fmt::format("schedule {} was removed elsewhere: the task stops",
                             t.stored_id));
        t.st->active = false;
      } else if (current->done) {
        t.st->active = false;
      } else {
        t.next = current->next_run_at;
        // Someone runs it: look again when their lease ends, or when the
        // slot after theirs is due if that comes first (they commit it and
        // may stop or die before it: waiting for their lease would find it
        // late, and missed).
        if (!current->lease_owner.empty() && current->lease_until > now) {
          auto again = current->lease_until;
          // (Only while ahead: a holder past its next slot, or one
          // catching up on old slots, must not make this claim in a loop.)
          if (auto after = t.slot_after(current->next_run_at);
              after && *after > now)
            again = std::min(again, *after);
          t.next = std::max(t.next, again);
        }
      }
    }
    if (t.st->active && !st.cancelled)
      arm(self, eng->due_at(t.next));
    reply_if_idle(self);
    return;
  }
  if (st.cancelled || eng->paused.load()) {
    hand_back(self, std::move(*claim));
    return;
  }
  auto lease = t.opts.lease.ms();
  if (eng->now() >= holds_until(now, lease)) {
    confirm_late(self, std::move(*claim), now);
    return;
  }
  run_claimed(self, std::move(*claim), now, now);
}

// Given up while the claim was on its way: the slot goes back by
// cut_lease, which keeps the claim's mark (when it was claimed), as a
// crash would have left it. Committed instead, the mark would go, and a
// replica that looks again only later (it saw this claim's lease) would
// judge the slot missed and skip it under `missed_policy::skip`.
void hand_back(task_actor* self, schedule_claim claim) {
  cut_lease(self, claim.token,
            [self] { claim_again_later(self, self->state.eng->now()); });
}

// Runs what `claim` (sent at `claimed_at`) covers; the store holds it for a
// lease from `held_from`, when the request that last extended it was sent.
void run_claimed(task_actor* self, schedule_claim claim, time_point claimed_at,
                 time_point held_from) {
  auto& st = self->state;
  auto& t = *st.t;
  auto* eng = st.eng.get();
  auto lease = t.opts.lease.ms();
  st.claim = std::move(claim);
  std::size_t skipped = 0;
  st.run = std::make_shared<run_ctx>();
  auto& plan = st.run->plan;
  plan = plan_claim(t, st.claim, claimed_at, eng->grace(), skipped);
  if (plan.missed)
    eng->missed.fetch_add(1, std::memory_order_relaxed);
  if (skipped > 0)
    eng->log(fmt::format("{}: catch-up runs the {} oldest missed slots and "
                         "skips {} more (max_catch_up)",
                         t.stored_id, plan.slots.size(), skipped));
  st.ph = phase::running;
  st.next_renew = held_from + lease / 3;
  st.held_until = holds_until(held_from, lease);
  arm_renewal(self);
  start_run(self);
}

// The claim's reply came after its lease ran out (it counts from when the
// request was sent: a slow store, a freeze): another replica may run the
// slot already. A renewal tells: if it still holds, it runs; otherwise it
// is left to lapse, untouched, so whoever claims next takes it over as
// interrupted (keeping when it was first claimed: not missed).
void confirm_late(task_actor* self, schedule_claim claim, time_point now,
                  bool adopted) {
  auto& st = self->state;
  auto* eng = st.eng.get();
  auto id = st.t->stored_id;
  auto token = claim.token;
  auto lease = st.t->opts.lease.ms();
  auto sent = eng->now();
  store_io<bool>(
    self,
    [=](scheduler_engine& e) {
      return e.store->renew(id, e.owner, token, sent, lease);
    },
    [=](async_schedule_store& a, scheduler_engine& e, auto done) {
      a.renew_async(id, e.owner, token, sent, lease, std::move(done));
    },
    [=](bool ok, const std::string& failure) {
      auto& st = self->state;
      if (st.cancelled || eng->paused.load()) {
        hand_back(self, claim);
        return;
      }
      if (failure.empty() && ok && eng->now() < holds_until(sent, lease)) {
        set_lost(st, std::nullopt);
        run_claimed(self, claim, now, sent);
        return;
      }
      // The renewal may have landed (its reply lost, or answered too late
      // to run on): the record then says it was last written at `sent`,
      // and the next refused claim must still know it for this replica's
      // own. A refused one wrote nothing.
      if (!failure.empty() || ok)
        note_lost(st, sent);
      if (adopted)
        eng->log(fmt::format("claim of {} (token {}) whose reply was lost could "
                             "not be renewed{}: left to lapse",
                             id, token,
                             failure.empty() ? "" : " (" + failure + ")"));
      else
        eng->log(fmt::format("claim of {} (token {}) answered after its lease "
                             "ran out, and not renewed: not run, left to lapse",
                             id, token));
      claim_again_later(self, eng->now());
    });
}

// stop(), once nothing runs: a claim whose reply was lost and that was not
// taken up again may still hold the slot in the store until its lease ends.
// Found by reading the record (this replica's own, written at the time of
// one of the failed calls) and its lease cut, as a hand-back does: another
// replica runs the slot at once. `ticket` is let go once done.
void give_back_lost(task_actor* self, std::shared_ptr<poll_ticket> ticket) {
  auto& st = self->state;
  if (st.ph != phase::idle || !st.lost_claims)
    return;
  // The window stays whatever happens: a claim still on its way may land,
  // a cut may fail, and after a later start() the next refused claim must
  // know such a claim for this replica's own (a record of this owner with
  // a live lease can only be one of them).
  auto lost = *st.lost_claims;
  st.polls.push_back(std::move(ticket));
  st.ph = phase::committing;
  auto* eng = st.eng.get();
  auto id = st.t->stored_id;
  using record = std::optional<schedule_record>;
  store_io<record>(
    self, [=](scheduler_engine& e) { return e.store->get(id); },
    [=](async_schedule_store& a, scheduler_engine&, auto done) {
      a.get_async(id, std::move(done));
    },
    [=](record& r, const std::string& failure) {
      auto& st = self->state;
      // Back to idle, and looking at what is due: a start() or poll() that
      // came while this ran (a stop() that gave up waiting) found the actor
      // busy and armed nothing.
      auto idle = [self] {
        self->state.ph = phase::idle;
        evaluate(self);
        reply_if_idle(self);
      };
      if (failure.empty() && r && own_lost_claim(st, lost, *r, eng->now())) {
        cut_lease(self, r->fencing_token, idle);
        return;
      }
      if (!failure.empty())
        eng->log_failure(fmt::format("reading {} to hand back a claim whose "
                                     "reply was lost failed: {}",
                                     id, failure));
      idle();
    });
}

void claim(task_actor* self, time_point now) {
  auto& st = self->state;
  auto* eng = st.eng.get();
  auto id = st.t->stored_id;
  auto lease = st.t->opts.lease.ms();
  // Counted before pause is checked (the other order of stop(), which sets
  // pause, then waits for zero runs): one of the two sees the other, so no
  // claim starts after stop() returned.
  eng->run_started();
  if (eng->paused.load()) {
    eng->run_finished();
    return;
  }
  st.ph = phase::claiming;
  using result = async_schedule_store::claim_result;
  store_io<result>(
    self,
    [=](scheduler_engine& e) {
      result r;
      r.claim = e.store->claim(id, e.owner, now, lease);
      if (!r.claim)
        r.current = e.store->get(id);
      return r;
    },
    [=](async_schedule_store& a, scheduler_engine& e, auto done) {
      a.claim_async(id, e.owner, now, lease, std::move(done));
    },
    [=](result& r, const std::string& failure) {
      if (!failure.empty()) {
        eng->log_failure(fmt::format("claiming {} failed: {}", id, failure));
        note_lost(self->state, now);
        claim_again_later(self, now);
        return;
      }
      eng->failure_ended();
      claimed(self, std::move(r.claim), std::move(r.current), now);
    });
}

void evaluate(task_actor* self) {
  auto& st = self->state;
  if (st.eng->paused.load() || st.cancelled)
    return;
  auto now = st.eng->now();
  if (st.ph == phase::running) {
    // A renewal that does not come back in time (a hung store call) must
    // not keep the run going past its lease either.
    if (st.renewing == st.claim.token && st.run) {
      if (now >= st.held_until) {
        lease_ran_out(self, "with a renewal unanswered");
        return;
      }
      arm(self, st.held_until); // look again then
    }
    if (st.next_renew <= now)
      renew(self);
    return;
  }
  if (st.ph != phase::idle || !st.t->st->active.load())
    return;
  auto due = st.eng->due_at(st.t->next);
  if (due <= now)
    claim(self, now);
  else
    arm(self, due);
}

caf::behavior task_behavior(task_actor* self,
                            std::shared_ptr<scheduler_engine> eng,
                            std::shared_ptr<task> t, caf::actor io) {
  self->state.io = std::move(io);
  self->state.eng = std::move(eng);
  self->state.t = std::move(t);
  return {
    [=](task_tick_atom, std::uint64_t gen) {
      auto& st = self->state;
      if (gen != st.wake_gen)
        return; // superseded by an earlier wake-up
      st.armed = time_point::max();
      evaluate(self);
    },
    [=](io_atom, std::shared_ptr<store_call>& call) {
      // A reply through the store's asynchronous face (the store-I/O
      // actor's replies go to their request's handler, not here).
      call->resume(call->failure);
    },
    [=](task_poll_atom, std::shared_ptr<poll_ticket>& ticket) {
      auto& st = self->state;
      st.polls.push_back(std::move(ticket));
      evaluate(self);
      reply_if_idle(self);
    },
    [=](task_resume_atom) {
      self->state.armed = time_point::max();
      evaluate(self);
    },
    [=](task_renew_atom, std::uint64_t token) {
      auto& st = self->state;
      if (st.ph == phase::running && st.claim.token == token)
        renew(self);
    },
    [=](task_done_atom, std::uint64_t token, std::size_t ran) {
      auto& st = self->state;
      if (st.ph != phase::running || st.claim.token != token)
        return;
      run_ended(self, ran);
    },
    [=](task_give_back_atom, std::shared_ptr<poll_ticket>& ticket) {
      give_back_lost(self, std::move(ticket));
    },
    [=](task_pause_atom) {
      auto& st = self->state;
      if (st.run)
        st.run->stop.request_stop();
      // Not tried again: stop() waits for what is in flight, and a store
      // that fails would hold it a call more per task.
      give_up_commit(self);
    },
    [=](task_commit_atom, std::uint64_t token, int attempt) {
      auto& st = self->state;
      if (st.ph == phase::committing && st.claim.token == token
          && st.commit_retry == attempt)
        commit(self, attempt);
    },
    [=](task_cancel_atom) {
      auto& st = self->state;
      st.cancelled = true;
      st.t->st->active = false;
      if (st.run)
        st.run->stop.request_stop();
      give_up_commit(self); // (its record is gone: nothing to commit)
      reply_if_idle(self);
    },
  };
}

} // namespace

caf::actor spawn_task_actor(caf::actor_system& sys,
                            std::shared_ptr<scheduler_engine> eng,
                            std::shared_ptr<task> t) {
  auto io = eng->io; // read here, on the scheduler's thread
  return sys.spawn(task_behavior, std::move(eng), std::move(t), std::move(io));
}

} // namespace botmesh::internal
