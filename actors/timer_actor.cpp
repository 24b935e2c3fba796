// The timer actor: in-memory tasks (no id) on their grid, never overlapping
// themselves; with a leader lease, its renewal every tick; at start, the
// orphan check. One CAF delayed message is pending at a time.

#include <algorithm>
#include <queue>
#include <set>
#include <stop_token>
#include <unordered_map>
#include <vector>

#include <caf/all.hpp>
#include <fmt/format.h>

#include <botmesh/actors/internal/scheduler_engine.hpp>
#include <botmesh/actors/messages.hpp>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::internal::store_call>)

namespace botmesh::internal {

namespace {

using ms = std::chrono::milliseconds;

struct entry {
  std::shared_ptr<task> t;
  std::shared_ptr<std::stop_source> stop; // set while it runs
};

struct due_item {
  time_point at;
  std::uint64_t handle;
  bool operator>(const due_item& other) const {
    return at > other.at;
  }
};

struct timer_state {
  std::shared_ptr<scheduler_engine> eng;
  // The store-I/O actor, copied at spawn: the scheduler clears the engine's
  // handle when it goes, while this actor may still be running.
  caf::actor io;
  std::unordered_map<std::uint64_t, entry> tasks;
  std::priority_queue<due_item, std::vector<due_item>, std::greater<>> due;
  std::size_t running = 0;
  std::vector<caf::response_promise> polls;
  std::uint64_t wake_gen = 0;
  time_point armed = time_point::max();
  bool leading_in_flight = false;
  bool listing_in_flight = false;
  bool fire_pending = false; // fire once the lease call answered
  std::set<std::string> logged_orphans;

  static inline const char* name = "botmesh.timers";
};

using timer_actor = caf::stateful_actor<timer_state>;

void arm(timer_actor* self) {
  auto& st = self->state;
  if (!st.eng->started.load() || st.eng->paused.load() || st.leading_in_flight)
    return; // (the lease call's reply arms)
  auto now = st.eng->now();
  // The next in-memory slot, and a tick for the leader lease.
  auto at = now + st.eng->opts.tick.ms();
  if (!st.due.empty())
    at = std::min(at, st.due.top().at);
  if (at >= st.armed)
    return;
  st.armed = at;
  self->delayed_send(self, std::max(ms{0}, at - now), task_tick_atom::value,
                     ++st.wake_gen);
}

void reply_if_idle(timer_actor* self) {
  auto& st = self->state;
  if (st.running != 0 || st.leading_in_flight || st.listing_in_flight)
    return;
  for (auto& rp : st.polls)
    rp.deliver(task_poll_atom::value);
  st.polls.clear();
}

void fire_due(timer_actor* self) {
  auto& st = self->state;
  if (st.eng->paused.load())
    return;
  auto now = st.eng->now();
  auto me = caf::actor_cast<caf::actor>(self);
  while (!st.due.empty() && st.due.top().at <= now) {
    auto item = st.due.top();
    st.due.pop();
    auto i = st.tasks.find(item.handle);
    if (i == st.tasks.end() || i->second.stop || i->second.t->next != item.at)
      continue; // cancelled, running or rescheduled
    auto& e = i->second;
    e.stop = std::make_shared<std::stop_source>();
    ++st.running;
    st.eng->run_started();
    scheduled_run run;
    run.scheduled_at = item.at;
    run.stop = e.stop->get_token();
    st.eng->execute([me, t = e.t, run = std::move(run), eng = st.eng,
                     handle = item.handle] {
      eng->runs.fetch_add(1, std::memory_order_relaxed);
      try {
        if (t->job)
          t->job();
        else
          t->fn(run);
      } catch (const std::exception& ex) {
        eng->failed.fetch_add(1, std::memory_order_relaxed);
        eng->log(fmt::format("task run failed: {}", ex.what()));
      } catch (...) {
        eng->failed.fetch_add(1, std::memory_order_relaxed);
        eng->log("task run failed");
      }
      if (eng->timers.end(handle))
        caf::anon_send(me, task_done_atom::value);
    });
  }
}

// With a leader lease: take or renew it (on the store-I/O actor), then,
// with `fire`, run the in-memory tasks due (as one tick: the lease first).
void refresh_leadership(timer_actor* self, bool fire = false) {
  auto& st = self->state;
  auto eng = st.eng;
  if (!eng->opts.lease) {
    if (fire)
      fire_due(self);
    return;
  }
  st.fire_pending = st.fire_pending || fire;
  if (st.leading_in_flight)
    return; // the pending reply fires
  st.leading_in_flight = true;
  auto now = eng->now();
  auto won = std::make_shared<bool>(false);
  auto call = std::make_shared<store_call>();
  call->fn = [=] {
    *won = eng->opts.lease
             ->try_acquire(eng->leader_name(), eng->owner, now,
                           eng->opts.leader_ttl.ms())
             .has_value();
  };
  self->request(self->state.io, caf::infinite, io_atom::value, call)
    .then([=](io_atom, std::shared_ptr<store_call>& c) {
      if (!c->failure.empty())
        eng->log_failure(fmt::format("leader lease failed: {}", c->failure));
      else
        eng->failure_ended();
      eng->leader = c->failure.empty() && *won;
      self->state.leading_in_flight = false;
      if (self->state.fire_pending) {
        self->state.fire_pending = false;
        fire_due(self);
      }
      arm(self);
      reply_if_idle(self);
    });
}

void check_orphans(timer_actor* self, std::vector<std::string> registered) {
  auto& st = self->state;
  auto eng = st.eng;
  if (!eng->store)
    return;
  auto all = std::make_shared<std::vector<schedule_record>>();
  st.listing_in_flight = true;
  auto call = std::make_shared<store_call>();
  call->fn = [=] { *all = eng->store->list(); };
  self->request(self->state.io, caf::infinite, io_atom::value, call)
    .then([=](io_atom, std::shared_ptr<store_call>& c) {
      self->state.listing_in_flight = false;
      reply_if_idle(self);
      if (!c->failure.empty()) {
        eng->log_failure(fmt::format("listing schedules failed: {}", c->failure));
        return;
      }
      std::set<std::string> mine(registered.begin(), registered.end());
      auto prefix = eng->opts.ns.empty() ? std::string{} : eng->opts.ns + ":";
      for (auto& rec : *all) {
        if (rec.deleted || !rec.id.starts_with(prefix) || mine.count(rec.id))
          continue;
        if (self->state.logged_orphans.insert(rec.id).second)
          eng->log(fmt::format("orphan schedule {}: stored, but no task with "
                               "this id is registered; kept and never run "
                               "(forget_task removes it)",
                               rec.id));
      }
    });
}

// Takes the tasks added since the last batch.
void take_added(timer_actor* self) {
  auto& st = self->state;
  std::vector<std::pair<std::uint64_t, std::shared_ptr<task>>> batch;
  {
    std::lock_guard guard{st.eng->timers.mtx};
    batch.swap(st.eng->timers.added);
  }
  for (auto& [handle, t] : batch) {
    st.due.push({t->next, handle});
    st.tasks.emplace(handle, entry{std::move(t), nullptr});
  }
}

// Takes the runs that ended since the last batch: each task goes on with
// the first slot after now on its grid, a one-shot is done.
void take_ended(timer_actor* self) {
  auto& st = self->state;
  std::vector<std::uint64_t> batch;
  {
    std::lock_guard guard{st.eng->timers.mtx};
    batch.swap(st.eng->timers.ended);
  }
  auto now = st.eng->now();
  for (auto handle : batch) {
    --st.running;
    st.eng->run_finished();
    auto i = st.tasks.find(handle);
    if (i == st.tasks.end())
      continue;
    auto& t = *i->second.t;
    i->second.stop.reset();
    if (auto next = t.first_slot_after(t.next, now)) {
      t.next = *next;
      st.due.push({*next, handle});
    } else {
      t.st->active = false;
      st.tasks.erase(i);
    }
  }
}

caf::behavior timer_behavior(timer_actor* self,
                             std::shared_ptr<scheduler_engine> eng,
                             caf::actor io) {
  self->state.io = std::move(io);
  self->state.eng = std::move(eng);
  return {
    [=](timer_add_atom) {
      take_added(self);
      arm(self);
    },
    [=](timer_cancel_atom, std::uint64_t handle) {
      take_added(self); // it may be in the batch not taken yet
      self->state.tasks.erase(handle);
    },
    [=](task_tick_atom, std::uint64_t gen) {
      auto& st = self->state;
      if (gen != st.wake_gen)
        return;
      st.armed = time_point::max();
      refresh_leadership(self, true);
      arm(self);
    },
    [=](task_poll_atom) {
      auto& st = self->state;
      st.polls.push_back(self->make_response_promise());
      take_added(self);
      fire_due(self);
      reply_if_idle(self);
    },
    [=](task_done_atom) {
      take_ended(self);
      reply_if_idle(self);
      arm(self);
    },
    [=](task_pause_atom) {
      for (auto& [h, e] : self->state.tasks)
        if (e.stop)
          e.stop->request_stop();
    },
    [=](task_resume_atom, std::vector<std::string>& registered) {
      auto& st = self->state;
      st.armed = time_point::max();
      check_orphans(self, std::move(registered));
      refresh_leadership(self);
      arm(self);
    },
    [=](task_poll_atom, bool lead_only) {
      // poll(): refresh the leader lease first; reply once answered.
      auto& st = self->state;
      if (!lead_only)
        fire_due(self);
      st.polls.push_back(self->make_response_promise());
      refresh_leadership(self);
      reply_if_idle(self);
    },
  };
}

} // namespace

caf::actor spawn_timer_actor(caf::actor_system& sys,
                             std::shared_ptr<scheduler_engine> eng) {
  auto io = eng->io; // read here, on the scheduler's thread
  return sys.spawn(timer_behavior, std::move(eng), std::move(io));
}

} // namespace botmesh::internal
