// The durable-task actor's renewals and the end of its runs: the lease
// kept while a handler runs, what the calendar does once it ended, and the
// commit (see task_actor.cpp for the claim and the behaviour).

#include <botmesh/actors/internal/task_actor_impl.hpp>

#include <algorithm>

namespace botmesh::internal::task_impl {

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
  auto* eng = st.eng.get(); // (the actor holds it)
  // Past the lease, with no renewal answered since (they failed, or the
  // process stood still): the run stops now; a renewal answered later
  // would not cover the time between.
  if (st.run && eng->now() >= st.held_until) {
    lease_ran_out(self, "while its renewals failed");
    return;
  }
  st.renewing = st.claim.token;
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
        // Try again next tick, or when the lease ends if that is sooner
        // (renew() then stops the run): a tick longer than a tenth of the
        // lease would otherwise let the run go on past it, beside the
        // replica that claims the slot next.
        eng->log_failure(fmt::format("renewing the lease of {} failed: {}", id, failure));
        st.next_renew = std::min(now + eng->opts.tick.ms(), st.held_until);
      } else if (ok) {
        claim_holds_until(st, holds_until(now, lease));
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
    // (After the slot that ran, too: a clock stepped back during the run
    // would otherwise give it, or an earlier cron slot, again.)
    o.next = t.opts.missed == missed_policy::skip
               ? t.first_slot_after(slot, std::max(end, slot))
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
      if (!committed && !st.cancelled) {
        if (attempt > 1)
          eng->log(fmt::format("commit of {} with token {} refused after a "
                               "failed attempt: that attempt landed, or a "
                               "newer claim exists",
                               id, token));
        else
          eng->log(fmt::format("commit of {} with token {} rejected: a newer "
                               "claim exists (this executor was stale)",
                               id, token));
      } else if (committed) {
        st.t->next = *o.next;
        if (o.done)
          st.t->st->active = false;
      }
      // Refused while cancelled (often by its own handler: forget_task of a
      // reminder that ran): the refusal is its removal, not a stale
      // executor. (Committed anyway: a remove that failed leaves the
      // record to the other replicas, which must not run the slot again.)
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

} // namespace botmesh::internal::task_impl
