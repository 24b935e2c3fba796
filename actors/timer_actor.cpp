// The timer actor: in-memory tasks (no id) on their grid, never overlapping
// themselves; with a leader lease, its renewal every tick; at start, the
// orphan check. One CAF delayed message is pending at a time.

#include <algorithm>
#include <array>
#include <set>
#include <stop_token>
#include <vector>

#include <caf/all.hpp>
#include <fmt/format.h>

#include <botmesh/actors/internal/scheduler_engine.hpp>
#include <botmesh/actors/internal/caf_logger.hpp>
#include <botmesh/actors/messages.hpp>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::internal::store_call>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::internal::poll_ticket>)

namespace botmesh::internal {

namespace {

using ms = std::chrono::milliseconds;

// A task's next slot. Every entry not running has exactly one (pushed when
// it is added and when its run ended, popped when it fires), so the heap
// holds the entry itself and firing looks nothing up.
struct due_item {
  time_point at;
  timer_entry* e;
  bool operator>(const due_item& other) const {
    return at > other.at;
  }
};

// A min-heap of slots (std::push_heap / pop_heap on a vector, so that
// cancelled slots can be swept out).
struct due_heap {
  std::vector<due_item> items;

  bool empty() const {
    return items.empty();
  }
  std::size_t size() const {
    return items.size();
  }
  const due_item& top() const {
    return items.front();
  }
  void push(due_item item) {
    items.push_back(item);
    std::push_heap(items.begin(), items.end(), std::greater<>{});
  }
  void pop() {
    std::pop_heap(items.begin(), items.end(), std::greater<>{});
    items.pop_back();
  }
};

struct timer_state {
  std::shared_ptr<scheduler_engine> eng;
  // The store-I/O actor, copied at spawn: the scheduler clears the engine's
  // handle when it goes, while this actor may still be running.
  caf::actor io;
  due_heap due;
  std::size_t cancelled_due = 0; // cancelled entries whose slot is in `due`
  std::size_t running = 0;
  // The stop token of every in-memory run: only a pause stops them, and it
  // stops them all, so one source serves every run since the last pause
  // (a pause fires it and starts a new one) instead of one per run.
  std::stop_source stop;
  std::vector<std::function<void()>> jobs; // reused by fire_due
  // Swapped with the inbox's, so that neither side grows a vector anew for
  // every batch.
  std::vector<std::shared_ptr<timer_entry>> added;
  std::vector<std::shared_ptr<timer_entry>> cancelled;
  std::vector<std::shared_ptr<poll_ticket>> polls; // poll()'s, held until idle
  std::uint64_t wake_gen = 0;
  time_point armed = time_point::max();
  bool leading_in_flight = false;
  bool listing_in_flight = false;
  std::set<std::string> logged_orphans;

  static inline const char* name = "botmesh.timers";

  // A waiting entry holds itself (the heap points to it); the actor's end
  // lets it go, with its handler (a handle may keep the entry). No run is
  // in flight then (the scheduler waited for them).
  ~timer_state();
};

using timer_actor = caf::stateful_actor<timer_state>;

void arm(timer_actor* self) {
  auto& st = self->state;
  if (!st.eng->started.load() || st.eng->paused.load()) {
    // Nothing fires until start() or poll(), and both take the inbox
    // before anything fires: adds wait there without a message each.
    st.eng->timers.armed(time_point::min());
    return;
  }
  auto now = st.eng->now();
  // The next in-memory slot, and a tick for the leader lease.
  auto at = now + st.eng->opts.tick.ms();
  if (!st.due.empty())
    at = std::min(at, st.due.top().at);
  if (at < st.armed) {
    st.armed = at;
    self->delayed_send(self, std::max(ms{0}, at - now), task_tick_atom::value,
                       ++st.wake_gen);
  }
  // Tells the inbox which wake-up takes what is added (see timer_inbox):
  // only a pending tick of the current generation, whose handler takes the
  // inbox first, may stand in for a message.
  st.eng->timers.armed(st.armed);
}

void reply_if_idle(timer_actor* self) {
  auto& st = self->state;
  if (st.running != 0 || st.leading_in_flight || st.listing_in_flight)
    return;
  st.polls.clear(); // poll() goes on once every actor let its ticket go
}

// The actor lets an entry go: the task is done or cancelled and nothing
// points to it any longer. Its handler (and what that captured) goes now,
// even while a handle still holds the entry, as it did when the actor kept
// the task apart from the handle's state.
void release(timer_entry& e) {
  e.fn = nullptr;
  e.job = nullptr;
  e.self.reset(); // may destroy `e`
}

timer_state::~timer_state() {
  for (auto& d : due.items)
    release(*d.e);
  // Tasks still in the inbox (added while nothing fired: before start(),
  // or after stop()) are let go too: a handler that holds its own handle
  // would otherwise keep its entry alive for good.
  if (!eng)
    return;
  eng->timers.take(added, cancelled);
  for (auto& e : added)
    release(*e);
  for (auto& e : cancelled)
    release(*e);
}

// One run of `e`'s handler; a failure is counted and logged.
void run_handler(scheduler_engine* eng, timer_entry* e) {
  eng->runs.fetch_add(1, std::memory_order_relaxed);
  try {
    if (e->job) {
      e->job();
    } else {
      scheduled_run run;
      run.scheduled_at = e->next;
      run.stop = e->run_stop;
      e->fn(run);
    }
  } catch (const std::exception& ex) {
    eng->failed.fetch_add(1, std::memory_order_relaxed);
    eng->log(fmt::format("task run failed: {}", ex.what()));
  } catch (...) {
    eng->failed.fetch_add(1, std::memory_order_relaxed);
    eng->log("task run failed");
  }
}

// The job of one run on the handler pool. It captures two pointers, small
// enough for std::function's inline storage (no allocation per run); both
// outlive it: the entry stays until its end was taken, the engine until
// stop() saw every run end.
void run_job(scheduler_engine* eng, timer_entry* e) {
  // cancel() clears `active` before it returns and tells the actor later:
  // a run posted meanwhile, not started yet, does not start.
  if (e->active.load())
    run_handler(eng, e);
  // After end() the actor may let `e` go; the engine and its actor handle
  // stay while this run counts as in flight (see timer_inbox::end).
  if (eng->timers.end(e))
    caf::anon_send(eng->timers.actor, task_done_atom::value);
}

void fire_batches(timer_actor* self) {
  auto& st = self->state;
  auto now = st.eng->now();
  auto* eng = st.eng.get();
  // Due runs go to the pool in batches: one lock and only the wake-ups
  // needed per batch, and the first handlers start while later ones are
  // still being prepared. A batch's slots are popped first and their
  // entries (scattered in memory) prefetched, so their cache misses overlap
  // instead of stalling the loop one after another.
  constexpr std::size_t batch = 256;
  std::array<timer_entry*, batch> popped;
  for (;;) {
    std::size_t n = 0;
    while (n < batch && !st.due.empty() && st.due.top().at <= now) {
      popped[n] = st.due.top().e;
      __builtin_prefetch(&popped[n]->running, 1);
      ++n;
      st.due.pop();
    }
    if (n == 0)
      return;
    for (std::size_t i = 0; i < n; ++i) {
      auto& e = *popped[i];
      if (e.cancelled) {
        --st.cancelled_due;
        release(e);
        continue;
      }
      e.running = true;
      if (e.fn)
        e.run_stop = st.stop.get_token();
      st.jobs.emplace_back([eng, ep = &e] { run_job(eng, ep); });
    }
    if (!st.jobs.empty()) {
      st.running += st.jobs.size();
      eng->run_started(st.jobs.size());
      eng->execute_all(st.jobs);
    }
  }
}

// Posts the runs due.
void fire_due(timer_actor* self) {
  auto* eng = self->state.eng.get();
  // Counted while it posts, before pause is checked (stop() sets pause,
  // then waits for zero runs): one of the two sees the other, so no run
  // starts after stop() returned.
  eng->run_started();
  if (eng->paused.load()) {
    eng->run_finished();
    return;
  }
  fire_batches(self);
  eng->run_finished();
}

// With `fire`, runs the in-memory tasks due; with a leader lease, takes or
// renews it (on the store-I/O actor). In-memory tasks run on every replica,
// leader or not: they never wait for the lease's call, which may be slow
// (a store timing out, SQLite behind durable calls).
void refresh_leadership(timer_actor* self, bool fire = false) {
  auto& st = self->state;
  auto eng = st.eng;
  if (fire)
    fire_due(self);
  if (!eng->opts.lease)
    return;
  // Stopped: no new acquire. stop() gives the lease back once the one in
  // flight answered (an acquire landing after that release would hold the
  // lease for a stopped replica until leader_ttl).
  if (eng->paused.load())
    return;
  if (st.leading_in_flight)
    return; // one call at a time
  st.leading_in_flight = true;
  auto now = eng->now();
  auto won = std::make_shared<bool>(false);
  auto call = std::make_shared<store_call>();
  call->fn = [=] {
    // Queued behind other store calls past stop(): not made (stop() may
    // have given the lease back already, and gives up waiting after 10 s).
    if (eng->paused.load())
      return;
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
      arm(self);
      reply_if_idle(self);
    });
}

void check_orphans(timer_actor* self, std::vector<std::string> registered) {
  auto& st = self->state;
  auto eng = st.eng;
  if (!eng->store_ready.load(std::memory_order_acquire))
    return; // no durable task registered yet: nothing to compare with
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

void cancel(timer_actor* self, timer_entry& e);

// Takes the tasks added and cancelled since the last batch. A task is
// always added in an earlier batch than its cancel, or in the same one.
void take_inbox(timer_actor* self) {
  auto& st = self->state;
  st.eng->timers.take(st.added, st.cancelled);
  for (auto& e : st.added) {
    auto* p = e.get();
    st.due.push({p->next, p});
    p->self = std::move(e);
  }
  st.added.clear();
  for (auto& e : st.cancelled)
    cancel(self, *e);
  st.cancelled.clear();
}

// Takes the runs that ended since the last batch: each task goes on with
// the first slot after now on its grid, a one-shot is done. Called only on
// the wake-up the first run of a batch sends (see timer_inbox::end).
void take_ended(timer_actor* self) {
  auto& st = self->state;
  auto* n = st.eng->timers.take_ended();
  if (n == nullptr)
    return;
  auto now = st.eng->now();
  std::size_t ended = 0;
  while (n != nullptr) {
    auto& e = *n;
    n = n->next_ended;
    ++ended;
    e.running = false;
    if (e.cancelled) {
      release(e);
      continue;
    }
    // After the slot that ran too: a clock stepped back during the run
    // would otherwise give that slot again.
    if (auto next = e.grid.first_slot_after(e.next, std::max(e.next, now))) {
      e.next = *next;
      st.due.push({*next, &e});
    } else {
      e.active = false; // a one-shot that ran
      release(e);
    }
  }
  st.running -= ended;
  st.eng->run_finished(ended);
}

// Ends a task. A running one goes when its run ended (its job reads the
// entry). One that waits keeps its slot in the heap, which points to the
// entry, until that slot is popped, or until cancelled slots are half the
// heap and are swept out together; what the task holds (its handler and
// what that captured) is released now, as a cancel always did.
void cancel(timer_actor* self, timer_entry& e) {
  auto& st = self->state;
  if (!e.self || e.cancelled)
    return; // a one-shot that ran, or cancelled already
  e.cancelled = true;
  if (e.running)
    return;
  e.fn = nullptr;
  e.job = nullptr;
  ++st.cancelled_due;
  if (st.cancelled_due < 64 || st.cancelled_due * 2 < st.due.size())
    return;
  auto& items = st.due.items;
  auto gone = std::remove_if(items.begin(), items.end(), [](const due_item& d) {
    if (!d.e->cancelled)
      return false;
    release(*d.e);
    return true;
  });
  items.erase(gone, items.end());
  std::make_heap(items.begin(), items.end(), std::greater<>{});
  st.cancelled_due = 0;
}

caf::behavior timer_behavior(timer_actor* self,
                             std::shared_ptr<scheduler_engine> eng,
                             caf::actor io) {
  self->state.io = std::move(io);
  self->state.eng = std::move(eng);
  return {
    [=](timer_add_atom) {
      take_inbox(self);
      arm(self);
    },
    [=](task_tick_atom, std::uint64_t gen) {
      auto& st = self->state;
      if (gen != st.wake_gen)
        return;
      st.armed = time_point::max();
      // Tasks added since the last batch without a message (they were due
      // no earlier than this wake-up) go in before anything fires.
      take_inbox(self);
      refresh_leadership(self, true);
      arm(self);
    },
    [=](task_poll_atom, std::shared_ptr<poll_ticket>& ticket) {
      auto& st = self->state;
      st.polls.push_back(std::move(ticket));
      take_inbox(self);
      fire_due(self);
      reply_if_idle(self);
    },
    [=](task_done_atom) {
      take_ended(self);
      reply_if_idle(self);
      arm(self);
    },
    [=](task_pause_atom) {
      // Every run in progress holds a token of this source.
      auto& st = self->state;
      if (st.running != 0) {
        st.stop.request_stop();
        st.stop = std::stop_source{};
      }
    },
    [=](task_resume_atom, std::vector<std::string>& registered) {
      auto& st = self->state;
      // The pending tick is given up here (the next arm() supersedes it,
      // possibly later): what was added without a message, counting on
      // that tick, goes into the heap now so the new wake-up sees it.
      take_inbox(self);
      st.armed = time_point::max();
      check_orphans(self, std::move(registered));
      refresh_leadership(self);
      arm(self);
    },
    [=](leader_atom, std::shared_ptr<poll_ticket>& ticket) {
      // poll()'s first step: the leader lease only, the ticket held until
      // its call answered. (From stop(): no call, the ticket held until
      // the one in flight answered.)
      auto& st = self->state;
      st.polls.push_back(std::move(ticket));
      refresh_leadership(self);
      reply_if_idle(self);
    },
  };
}

} // namespace

caf::actor spawn_timer_actor(caf::actor_system& sys,
                             std::shared_ptr<scheduler_engine> eng) {
  auto io = eng->io; // read here, on the scheduler's thread
  auto a = sys.spawn(timer_behavior, std::move(eng), std::move(io));
  release_caf_logger();
  return a;
}

} // namespace botmesh::internal
