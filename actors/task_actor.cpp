// The actor of one durable task: its mailbox orders claim -> run -> renew
// -> commit. Store calls go to the store-I/O actor and come back as
// messages; the handler runs on the executor (the handler pool) and reports
// its end by message; wake-ups and renewals are CAF delayed messages.
// This file: the claim, the run's start and the behaviour; task_run.cpp:
// renewals, the end of a run and its commit.

#include <botmesh/actors/internal/task_actor_impl.hpp>
#include <botmesh/actors/internal/caf_logger.hpp>
#include <botmesh/scheduler/cron.hpp>
#include <botmesh/scheduler/internal/iso_time.hpp>

namespace botmesh::internal {

namespace task_impl {

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
      if (eng.now().time_since_epoch().count() >= ctx.held_until.load()) {
        eng.log(fmt::format("{} (token {}): its lease ran out before slot {} "
                            "(the process stood still?): not run here",
                            t.stored_id, ctx.token,
                            format_iso8601(slot, "UTC")));
        break;
      }
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

// Removes the record register_again made for a task cancelled meanwhile
// (below).
void unregister(task_actor* self, const std::string& id) {
  auto* eng = self->state.eng.get();
  auto now = eng->now();
  store_io<bool>(
    self, [=](scheduler_engine& e) { return e.store->remove(id, now); },
    [=](async_schedule_store& a, scheduler_engine&, auto done) {
      a.remove_async(id, now, std::move(done));
    },
    [=](bool, const std::string& failure) {
      if (!failure.empty())
        eng->log_failure(fmt::format("removing {} (registered again while "
                                     "it was cancelled) failed: {}",
                                     id, failure));
      claim_again_later(self, eng->now());
    });
}

// A claim found no record at all (tombstones purged by hand, a store that
// lost its data). A recurring task is registered again, as at its
// registration, from the slot this actor last knew (its due slot runs, as
// it would have), instead of claiming a record that is not there at every
// turn; claimed again a tick later at the earliest. A one-shot is taken as
// done: it may have run already, and its tombstone was what said so.
void register_again(task_actor* self, time_point now) {
  auto& st = self->state;
  auto* eng = st.eng.get();
  auto id = st.t->stored_id;
  if (st.t->kind == task_kind::delay) {
    eng->log(fmt::format("schedule {} (one-shot) has no stored record (purged, "
                         "or lost by the store): taken as done, not run",
                         id));
    st.t->st->active = false;
    claim_again_later(self, now);
    return;
  }
  auto spec = spec_of(*st.t);
  auto first = st.t->next;
  eng->log(fmt::format("schedule {} has no stored record (purged, or lost by "
                       "the store): registered again",
                       id));
  store_io<schedule_record>(
    self,
    [=](scheduler_engine& e) {
      return e.store->register_task(id, spec, first, now);
    },
    [=](async_schedule_store& a, scheduler_engine&, auto done) {
      a.register_async(id, spec, first, now, std::move(done));
    },
    [=](schedule_record& rec, const std::string& failure) {
      auto& st = self->state;
      if (!failure.empty()) {
        eng->log_failure(
          fmt::format("registering {} again failed: {}", id, failure));
      } else if (st.cancelled || !st.t->st->active) {
        // Cancelled meanwhile: its remove may have landed first, on no
        // record, and left nothing to keep this one from living on.
        unregister(self, id);
        return;
      } else {
        st.t->next = rec.next_run_at;
        if (rec.done || rec.deleted)
          st.t->st->active = false;
      }
      claim_again_later(self, eng->now());
    });
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
    // Kept should the cut or the confirmation fail: a stop then gives the
    // claim back, or a later look takes it up again, instead of waiting
    // out its lease.
    set_lost(st, lost);
    if (st.cancelled || eng->paused.load()) {
      hand_back(self, std::move(mine)); // (its lease cut, its mark kept)
      return;
    }
    confirm_late(self, std::move(mine), now, true);
    return;
  }
  if (!claim && !current && !st.cancelled && st.t->st->active) {
    register_again(self, now);
    return;
  }
  if (!claim) {
    st.ph = phase::idle;
    if (current && current->deleted) {
      // Out of the registry too: kept there, the id stayed taken (a
      // reminder registered again after another replica forgot it threw
      // "already registered") and this actor lived on, one per id. Before
      // run_finished, and the owner let go of before it: a scheduler
      // stopping waits for that count, and its last reference must not be
      // this actor's (its destructor would run on this thread).
      if (auto owner = t.st->owner.lock())
        owner->removed(t.st);
    }
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
  claim_holds_until(st, holds_until(held_from, lease));
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

} // namespace task_impl

caf::actor spawn_task_actor(caf::actor_system& sys,
                            std::shared_ptr<scheduler_engine> eng,
                            std::shared_ptr<task> t) {
  auto io = eng->io; // read here, on the scheduler's thread
  auto a = sys.spawn(task_impl::task_behavior, std::move(eng), std::move(t),
                     std::move(io));
  release_caf_logger();
  return a;
}

} // namespace botmesh::internal
