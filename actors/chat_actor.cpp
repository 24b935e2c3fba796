#include <botmesh/actors/chat_actor.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <fmt/format.h>

#include <botmesh/actors/messages.hpp>
#include <botmesh/runtime/core/internal/text.hpp>
#include <botmesh/runtime/core/log.hpp>

namespace botmesh::internal {

// Carried by the message that says a step returned. Its chat actor takes it
// (clearing `router`); freed untaken, the actor had ended (an exception)
// while the step ran, and the router, which holds the chat's events until
// then, hears that the step is over: the chat's next actor must not start
// a step of the same chat beside it.
struct step_end final : caf::ref_counted {
  step_end(caf::actor_addr r, caf::actor_addr c)
    : router(std::move(r)), chat(std::move(c)) {
    // nop
  }
  ~step_end() override {
    if (!router)
      return;
    try {
      if (auto r = caf::actor_cast<caf::actor>(router))
        caf::anon_send(r, step_done_atom::value, std::move(chat));
    } catch (...) {
      // nop: out of memory; the router holds the chat until its exit
    }
  }
  caf::actor_addr router;
  caf::actor_addr chat;
};

using step_end_ptr = caf::intrusive_ptr<step_end>;

// Without coordination a chat's events run on a handler thread that goes on
// with the chat's next events while there are any, instead of one hand-off
// and one reply per event. The chat actor pushes (one producer), a drain
// job on the handler pool pops (one consumer at a time: `scheduled_` lets
// only one job drain). A lock-free queue (D. Vyukov's intrusive MPSC).
class chat_runner {
 public:
  // The queue's nodes are the events' own boxes (no allocation per push);
  // the stub is a bare link: an idle runner costs a few words, not an event.
  using link = internal::run_link;

  chat_runner() : head_(&stub_), tail_(&stub_) {
    // nop
  }

  ~chat_runner() {
    while (auto* n = pop())
      adopt(n);
  }

  /// Chat actor: queues an event; true when a drain job must be posted.
  bool push(event_ptr ev, bool first) {
    ev->first = first;
    enqueue(ev.release());
    ++pushed_;
    return !scheduled_.exchange(true);
  }

  /// Chat actor: events pushed and not finished yet.
  std::uint64_t pending() const {
    return pushed_ - done_.load(std::memory_order_acquire);
  }

  /// Chat actor: events waiting behind the one that runs (the bound of
  /// max_pending_per_chat counts these, as the queue of a busy chat).
  std::uint64_t waiting() const {
    auto p = pending();
    return p > 0 ? p - 1 : 0;
  }

  bool idle() const {
    return pending() == 0 && !scheduled_.load();
  }

  /// Chat actor: the drain job push() asked for could not be posted (the
  /// post threw): the next push asks again, and its job drains all.
  void not_posted() {
    scheduled_.store(false);
  }

  /// Chat actor, taking over the queue of an ended one: true when events
  /// wait with no job to drain them (its post threw), and one must be
  /// posted now.
  bool orphaned() {
    return pending() > 0 && !scheduled_.exchange(true);
  }

  /// The chat actor that pushes: a later one when the first ended by an
  /// exception with this runner busy. Read by a job only to report idle,
  /// written once per actor: a spin lock (a mutex would cost every chat
  /// 40 bytes).
  caf::actor owner() {
    lock();
    auto a = caf::actor_cast<caf::actor>(owner_);
    owner_lock_.clear(std::memory_order_release);
    return a;
  }
  void set_owner(const caf::actor& a) {
    lock();
    owner_ = a.address(); // (weak: the actor's state holds this runner)
    owner_lock_.clear(std::memory_order_release);
  }

  /// A handler thread: runs events until none is left.
  template <class Run>
  void drain(Run&& run) {
    for (;;) {
      while (auto* l = pop()) {
        {
          auto ev = adopt(l);
          run(*ev);
        }
        done_.fetch_add(1, std::memory_order_release);
      }
      scheduled_.store(false);
      // A push between the last pop and the store saw `scheduled_` set and
      // posted nothing: take it (unless a new job already did).
      if (!maybe_nonempty() || scheduled_.exchange(true))
        return;
    }
  }

  /// Set by the chat actor when it waits for the runner to go idle (a
  /// drain): the job then reports it with one message, to owner().
  std::atomic<bool> notify{false};

 private:
  // Takes back the reference the queue held.
  static event_ptr adopt(link* l) {
    return event_ptr{static_cast<event_box*>(l), false};
  }

  void enqueue(link* n) {
    n->next.store(nullptr, std::memory_order_relaxed);
    auto* prev = tail_.exchange(n);
    prev->next.store(n, std::memory_order_release);
  }

  link* pop() {
    auto* head = head_.load(std::memory_order_relaxed);
    auto* next = head->next.load(std::memory_order_acquire);
    if (head == &stub_) {
      if (!next)
        return nullptr;
      head_.store(next, std::memory_order_relaxed);
      head = next;
      next = next->next.load(std::memory_order_acquire);
    }
    if (next) {
      head_.store(next, std::memory_order_relaxed);
      return head;
    }
    if (tail_.load() != head)
      return nullptr; // a push is half done: drain() comes back for it
    enqueue(&stub_);
    next = head->next.load(std::memory_order_acquire);
    if (next) {
      head_.store(next, std::memory_order_relaxed);
      return head;
    }
    return nullptr;
  }

  bool maybe_nonempty() const {
    return !(head_.load(std::memory_order_relaxed) == &stub_
             && tail_.load() == &stub_);
  }

  // (The flags first, side by side with notify: one word for the three,
  // in a block every chat that ran without coordination has.)
  std::atomic<bool> scheduled_{false};
  std::atomic_flag owner_lock_ = ATOMIC_FLAG_INIT;
  link stub_;
  // The consumer's (one drain job at a time). Atomic because a job that just
  // gave up the queue still reads it in maybe_nonempty() while the job that
  // took over pops; that read's answer is then discarded (the exchange on
  // scheduled_ decides), but it must not be a data race.
  std::atomic<link*> head_;
  std::atomic<link*> tail_;    // the producers'
  std::uint64_t pushed_ = 0;   // the chat actor's
  std::atomic<std::uint64_t> done_{0};
  void lock() {
    while (owner_lock_.test_and_set(std::memory_order_acquire))
      std::this_thread::yield();
  }
  caf::actor_addr owner_;
};

} // namespace botmesh::internal

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::turn_token>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::event_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::internal::step_end_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::internal::chat_runner>)

namespace botmesh {

namespace {

// Request ids: unique in the process, so unique per coordinator incarnation.
std::atomic<std::uint64_t> next_request{1};

// One event waiting in a chat, with what it has of its turn.
struct entry {
  event_ptr ev;
  std::uint64_t req = 0;             // with coordination: its request
  std::shared_ptr<turn_token> token; // granted
  // When its turn_wait bound ends, while counting (else the epoch). Kept
  // with the entry, not the request: a grant can move a request to another
  // entry, and the bound must stay with the entry.
  caf::actor_clock::time_point wait_until{};
};

// A chat's FIFO: a vector and a head index (one allocation for a burst,
// none while idle: `release` gives the memory back).
class event_queue {
 public:
  bool empty() const noexcept {
    return head_ == items_.size();
  }
  std::size_t size() const noexcept {
    return items_.size() - head_;
  }
  entry& front() {
    return items_[head_];
  }
  entry& back() {
    return items_.back();
  }
  entry& operator[](std::size_t i) {
    return items_[head_ + i];
  }
  void push_back(entry e) {
    items_.push_back(std::move(e));
  }
  void pop_front() {
    items_[head_] = entry{};
    if (++head_ == items_.size()) {
      items_.clear();
      head_ = 0;
    } else if (head_ >= 32 && head_ * 2 >= items_.size()) {
      items_.erase(items_.begin(), items_.begin()
                                     + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }
  /// Drops the entry at position `i`, keeping the order of the others.
  void erase(std::size_t i) {
    items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(head_ + i));
    if (empty()) {
      items_.clear();
      head_ = 0;
    }
  }
  /// Drops the entries from position `from` on.
  void truncate(std::size_t from) {
    items_.resize(head_ + from);
    if (empty()) {
      items_.clear();
      head_ = 0;
    }
  }
  void release() {
    std::vector<entry>{}.swap(items_);
    head_ = 0;
  }

 private:
  std::vector<entry> items_;
  std::size_t head_ = 0;
};


struct chat_state {
  std::string key;
  std::shared_ptr<const router_config> config; // shared with the router
  caf::actor router;
  event_queue queue; // released when idle: an idle chat holds no queue memory
  // Without coordination: where events go (allocated on first use).
  std::shared_ptr<internal::chat_runner> run;
  bool busy = false;
  // Set while the running step's turn ended under it (settle, a lost
  // lease) and the step has not returned (it ignores its stop token, or is
  // slow to see it): the number of its grace timer.
  std::uint64_t cut_wait = 0;
  // While cut, past the grace: the entries behind it hold no ticket (they
  // enter again, in order, once the step returns).
  bool given_back = false;
  bool first = true;   // the next turn is the first of this activation
  bool asking = false; // an idle request to the router is in flight
  // A turn_wait tick is pending: one at most, since CAF cannot cancel a
  // delayed message and each holds the actor (one per message would pile
  // up for turn_wait under load). The bounds all last turn_wait and start
  // in order, so the pending tick comes no later than any of them ends.
  bool wait_armed = false;
  std::uint64_t waits = 0; // cut grace timers armed so far
  std::uint64_t received = 0;
  std::vector<caf::typed_response_promise<bool>> drain_waiters;

  static inline const char* name = "botmesh.chat";

  event_queue& q() {
    return queue;
  }

  bool empty() const {
    return queue.empty();
  }

  // Nothing queued, nothing running.
  bool idle() const {
    return !busy && queue.empty() && (!run || run->idle());
  }

  const router_config& cfg() const {
    return *config;
  }

  bool coordinated() const {
    return static_cast<bool>(config->lease);
  }
};

using chat_actor_t = caf::stateful_actor<chat_state>;

// Its turn_wait bound, when counting, goes on: entered again after a lost
// ticket or turn, the message has waited since the bound began.
void enter(chat_actor_t* self, entry& e) {
  e.req = next_request.fetch_add(1, std::memory_order_relaxed);
  e.token.reset();
  self->send(self->state.cfg().lease, acquire_atom::value, self->state.key,
             e.req);
}

// Gives up the requests of entries [from, end) and enters them again, in
// order, so the chat keeps its order when one request lost its ticket.
void enter_again(chat_actor_t* self, std::size_t from) {
  auto& st = self->state;
  auto& q = st.q();
  for (auto i = from; i < q.size(); ++i) {
    if (st.busy && i == 0)
      continue; // running: its turn ends with its step
    if (q[i].req != 0)
      self->send(st.cfg().lease, leave_atom::value, st.key, q[i].req);
    enter(self, q[i]);
  }
}

// How long a chat whose running step was cut keeps the tickets (and a
// grant) of the events behind it, for the step to see its stop token and
// return. Past it they are given back: a step that never returns must not
// keep the chat from every other replica (a grant held here is renewed for
// as long as it waits, and it waits for that step).
constexpr std::chrono::milliseconds cut_grace{1000};

// Gives back what `e` holds of its turn: the turn when granted, else its
// ticket.
void give_back_turn(chat_actor_t* self, entry& e) {
  auto& st = self->state;
  if (e.token)
    self->send(st.cfg().lease, release_atom::value, st.key, e.token->fence());
  else if (e.req != 0)
    self->send(st.cfg().lease, leave_atom::value, st.key, e.req);
  e.req = 0;
  e.token.reset();
}

// The running step was cut and did not return within cut_grace: the
// entries behind it give back their tickets and turns, so the chat goes on
// elsewhere; here they wait for the step, the first bounded by turn_wait.
void give_back(chat_actor_t* self) {
  auto& st = self->state;
  auto& q = st.q();
  for (std::size_t i = 1; i < q.size(); ++i) {
    give_back_turn(self, q[i]);
    q[i].wait_until = {};
  }
  st.given_back = true;
}

void went_idle(chat_actor_t* self) {
  auto& st = self->state;
  for (auto& rp : st.drain_waiters)
    rp.deliver(true);
  st.drain_waiters.clear();
  st.queue.release();
}

// Arms a tick unless one is pending; `in` from now.
void arm_wait(chat_actor_t* self, caf::timespan in) {
  auto& st = self->state;
  if (st.wait_armed)
    return;
  st.wait_armed = true;
  self->delayed_send(self, in, turn_wait_atom::value, std::uint64_t{0});
}

// `e` waits for its turn from now, for at most turn_wait.
void bound_wait(chat_actor_t* self, entry& e) {
  e.wait_until = self->clock().now() + self->state.cfg().turn_wait;
  arm_wait(self, self->state.cfg().turn_wait);
}

// Starts the next turn, or answers drain waiters when nothing is left.
void next_turn(chat_actor_t* self) {
  auto& st = self->state;
  if (st.busy) {
    // Behind a cut step that keeps running, the next event's wait for a
    // turn is bounded as the head's would be.
    auto& q = st.q();
    if (st.given_back && q.size() > 1
        && q[1].wait_until == caf::actor_clock::time_point{})
      bound_wait(self, q[1]);
    return;
  }
  if (st.empty()) {
    went_idle(self);
    return;
  }
  auto& q = st.q();
  auto first = st.first;
  auto& head = q.front();
  if (!head.token) {
    // Waiting for the head's turn: bounded by turn_wait from now.
    if (head.wait_until == caf::actor_clock::time_point{})
      bound_wait(self, head);
    return;
  }
  st.first = false;
  auto handle = caf::actor_cast<caf::actor>(self);
  auto end = caf::make_counted<internal::step_end>(st.router.address(),
                                                   self->address());
  // The event goes with its turn (it is freed where the turn ends); the
  // entry stays, holding the turn, until turn_done. The entry lets go of
  // it only once run_turn returned.
  try {
    st.cfg().services->run_turn(st.key, head.ev, first, head.token,
                                [handle, end]() mutable {
      caf::anon_send(handle, turn_done_atom::value, std::move(end));
    });
  } catch (...) {
    // The services could not start the turn: this actor ends (its
    // exception handler gives back the turns and the other events). The
    // event is refused, settled as any refused one (a journal record is
    // released), not sent on: it would end the chat's next actor too.
    auto ev = std::move(head.ev);
    st.cfg().services->refused(
      st.key, std::move(ev->ev), errc::handler_failed,
      fmt::format("chat {}: its turn could not start: {}", st.key,
                  internal::what_of(std::current_exception())));
    throw;
  }
  head.ev.reset();
  // Only now: a run_turn that throws started no step (the chat's next
  // actor need not wait for one).
  st.busy = true;
}

// Answers drain waiters once nothing is queued or running.
void check_idle(chat_actor_t* self) {
  auto& st = self->state;
  if (!st.idle())
    return;
  for (auto& rp : st.drain_waiters)
    rp.deliver(true);
  st.drain_waiters.clear();
}

// Without coordination: posts the job that drains the run queue (the
// caller won its `scheduled_` flag).
void post_job(chat_actor_t* self) {
  auto& st = self->state;
  auto* services = st.cfg().services;
  try {
    services->post([run = st.run, services] {
      // The event's box carries its key: the job may outlive the actor.
      run->drain([&](event_box& e) {
        // Every handler, store and listener call inside catches its own;
        // what gets past them still must not end the process on a handler
        // thread, nor leave the chat's run queue marked busy for good.
        try {
          services->run_event(e.key, e.ev, e.first);
        } catch (...) {
          log::error("chat", fmt::format("chat {}: an event's turn threw: {}",
                                         e.key,
                                         internal::what_of(std::current_exception())));
        }
      });
      if (run->notify.exchange(false))
        if (auto owner = run->owner())
          caf::anon_send(owner, turn_done_atom::value);
    });
  } catch (...) {
    // The events stay queued; this actor ends (its exception handler) and
    // the chat's next one goes on with the queue (see chat_runner::orphaned).
    st.run->not_posted();
    throw;
  }
}

// Queues an event; with coordination it takes its ticket right away, so
// the chat's order across replicas is the order events arrived.
void push(chat_actor_t* self, event_ptr ev) {
  auto& st = self->state;
  if (!st.coordinated()) {
    if (!st.run) {
      st.run = std::make_shared<internal::chat_runner>();
      st.run->set_owner(caf::actor_cast<caf::actor>(self));
    }
    auto first = st.first;
    st.first = false;
    if (st.run->push(std::move(ev), first))
      post_job(self);
    return;
  }
  auto& q = st.q();
  q.push_back(entry{std::move(ev), 0, nullptr, {}});
  if (st.coordinated() && !st.given_back)
    enter(self, q.back()); // else it enters when the cut step returns
  next_turn(self);
}

// A chat that dies otherwise than idle (an exception out of its services,
// an exit the router passes on) gives back every ticket and turn it holds:
// nothing else would, and a turn granted to a chat that is gone would be
// renewed for as long as the lease actor lives, keeping the chat from
// every replica. A running step's turn goes too: its token ends, so its
// effects are refused from then on. Its waiting messages are refused as
// at stop, which releases their journal records for another try (freed
// unsettled, a record would stay held by this replica's heartbeat); with
// `bounce` (the chat ends by an exception, the router lives on) they go
// back to the router instead, in order, for the chat's next actor: after
// the chat_gone already sent, and before what is still in the mailbox
// (which CAF frees, bouncing it, once this actor ended).
void give_back_all(chat_actor_t* self, std::string_view why,
                   bool bounce = false) {
  auto& st = self->state;
  if (!st.coordinated() || st.empty())
    return;
  auto& q = st.q();
  for (std::size_t i = 0; i < q.size(); ++i) {
    auto& e = q[i];
    give_back_turn(self, e);
    if ((i == 0 && st.busy) || !e.ev)
      continue;
    if (bounce) { // (timers too: a flow waits for them)
      ++e.ev->bounces;
      self->send(st.router, bounced_atom::value, std::move(e.ev));
    } else if (!e.ev->ev.is_timer()) {
      st.cfg().services->refused(
        st.key, std::move(e.ev->ev), errc::stopped,
        fmt::format("chat {} ended ({}) before this message's turn", st.key,
                    why));
    }
  }
}

// Refuses every event but the running head (which finishes), giving back
// their tickets: the bot stops (`why` says how).
void abandon_waiting(chat_actor_t* self, std::string_view why) {
  auto& st = self->state;
  if (st.empty())
    return;
  auto& q = st.queue;
  std::size_t from = st.busy ? 1 : 0;
  // Taken out of the queue first: a refusal that throws ends this actor,
  // whose exception handler must give back only the events not refused yet
  // (put back for it), not send the refused ones on to be refused again.
  std::vector<entry> out;
  out.reserve(q.size() - from);
  for (auto i = from; i < q.size(); ++i)
    out.push_back(std::move(q[i]));
  q.truncate(from);
  for (std::size_t k = 0; k < out.size(); ++k) {
    auto& e = out[k];
    if (e.req != 0)
      self->send(st.cfg().lease, leave_atom::value, st.key, e.req);
    if (e.ev->ev.is_timer())
      continue;
    auto ev = std::move(e.ev);
    try {
      st.cfg().services->refused(
        st.key, std::move(ev->ev), errc::stopped,
        fmt::format("chat {}: {} before this message's turn", st.key, why));
    } catch (...) {
      for (auto j = k + 1; j < out.size(); ++j)
        q.push_back(std::move(out[j]));
      throw;
    }
  }
  if (!st.busy)
    went_idle(self);
}

entry* find(chat_actor_t* self, std::uint64_t req, std::size_t* index = nullptr) {
  auto& st = self->state;
  if (st.empty())
    return nullptr;
  auto& q = st.queue;
  for (std::size_t i = 0; i < q.size(); ++i) {
    if (q[i].req == req) {
      if (index)
        *index = i;
      return &q[i];
    }
  }
  return nullptr;
}

caf::behavior chat_actor(chat_actor_t* self, std::string key,
                         std::shared_ptr<const router_config> cfg,
                         caf::actor router,
                         std::shared_ptr<internal::chat_runner> run) {
  self->state.key = std::move(key);
  self->state.config = std::move(cfg);
  self->state.router = std::move(router);
  if (run) { // the chat's previous actor ended with it busy: go on with it
    run->set_owner(caf::actor_cast<caf::actor>(self));
    self->state.run = std::move(run);
  }
  // As CAF's defaults (an exit of a non-normal reason ends the actor, an
  // exception ends it), giving back what it holds first. No captures: the
  // handlers allocate nothing per chat.
  self->set_exit_handler([](caf::scheduled_actor* ptr, caf::exit_msg& m) {
    if (!m.reason)
      return;
    auto* me = static_cast<chat_actor_t*>(ptr);
    give_back_all(me, "an exit: " + caf::to_string(m.reason));
    me->quit(m.reason);
  });
  self->set_exception_handler(
    [](caf::scheduled_actor* ptr, std::exception_ptr& e) -> caf::error {
      auto* me = static_cast<chat_actor_t*>(ptr);
      auto what = internal::what_of(e);
      log::error("chat", fmt::format("chat {} ended by an exception: {}; its "
                                     "tickets and turns are given back",
                                     me->state.key, what));
      // (With a step still running, the router waits for it too.)
      me->send(me->state.router, chat_gone_atom::value, me->state.key,
               me->state.busy, me->state.run);
      give_back_all(me, "an exception: " + what, true);
      // A drain waiting here is answered (the router refuses what comes
      // back, since it drains), or the bot's stop would wait its bound.
      for (auto& rp : me->state.drain_waiters)
        rp.deliver(false);
      me->state.drain_waiters.clear();
      return caf::exit_reason::unhandled_exception;
    });
  // Events that the ended actor queued with no job to drain them (its
  // post threw) are drained now. If the post throws again, they wait for
  // the chat's next message (which tries again): ending this actor too
  // would start the next one, and so on, as long as posts fail.
  if (self->state.run && self->state.run->orphaned()) {
    try {
      post_job(self);
    } catch (const std::exception& e) {
      log::error("chat", fmt::format("chat {}: its messages wait for the next "
                                     "one: posting their job failed: {}",
                                     self->state.key, e.what()));
    }
  }
  return {
    [=](event_ptr& ev) {
      auto& st = self->state;
      ev->via = nullptr; // taken: this actor ends it
      ++st.received;
      // Waiting ones only, as the option says: not the running head (nor
      // does the run queue of an uncoordinated chat, or the router's hold
      // for an ending one, count it).
      auto pending = st.run ? st.run->waiting()
                            : st.queue.size() - (st.busy && !st.empty() ? 1 : 0);
      // (Timers are internal and never refused: they do not count against
      // the pending bound.)
      if (pending >= st.cfg().max_pending_per_chat && !ev->ev.is_timer()) {
        st.cfg().services->refused(
          st.key, std::move(ev->ev), errc::overloaded,
          fmt::format("chat {} has {} messages waiting (max_pending_per_chat)",
                      st.key, pending));
        return;
      }
      push(self, std::move(ev));
    },
    [=](granted_atom, std::uint64_t req, std::shared_ptr<turn_token>& token) {
      std::size_t i = 0;
      auto e = find(self, req, &i);
      if (!e) {
        // Given up meanwhile (turn_wait, stop): pass the turn on.
        self->send(self->state.cfg().lease, release_atom::value, token->key(),
                   token->fence());
        return;
      }
      // A turn granted to a later event while an earlier one still waits:
      // the earlier request's ticket came after it (its enter was lost on
      // the way and retried once the later one had entered). Only the
      // earliest event may run, and its ticket waits behind this very turn:
      // the chat would be blocked until turn_wait. The turn is the chat's,
      // whichever of its requests took it, so the earliest waiting event
      // runs in it and the later one waits with the earlier request.
      auto& q = self->state.queue;
      for (std::size_t j = 0; j < i; ++j) {
        if (!q[j].token) {
          // The request moves; each entry's turn_wait bound stays its
          // own (q[j]'s is moot now that it is granted).
          std::swap(q[j].req, q[i].req);
          e = &q[j];
          break;
        }
      }
      e->token = std::move(token);
      next_turn(self);
    },
    [=](lost_atom, std::uint64_t req, std::uint64_t, const std::string& why) {
      auto& st = self->state;
      std::size_t i = 0;
      auto e = find(self, req, &i);
      if (!e)
        return;
      if (why == "stopped") {
        // The lease actor shuts down and grants nothing more: asking again
        // would get this answer at once, in a loop for as long as it lives.
        abandon_waiting(self, "the replica's lease actor stopped");
        return;
      }
      if (st.busy && i == 0) {
        // A running step sees its token ended. Until it returns, the
        // events behind it cannot run here: a grace for it to stop, then
        // their turns go back (give_back).
        if (st.cut_wait == 0) {
          st.cut_wait = ++st.waits;
          self->delayed_send(self, cut_grace, turn_wait_atom::value,
                             st.cut_wait);
        }
        return;
      }
      // Its ticket or its granted turn is gone before it ran: enter again,
      // with every later event of the chat after it.
      enter_again(self, i);
      next_turn(self);
    },
    [=](turn_wait_atom, std::uint64_t wait) {
      auto& st = self->state;
      if (st.cut_wait != 0 && wait == st.cut_wait) {
        if (!st.given_back) {
          give_back(self);
          next_turn(self);
        }
        return;
      }
      if (wait != 0)
        return; // a cut grace of a step that returned meanwhile
      st.wait_armed = false;
      // The entry waiting for a turn: the head, or the one behind a cut
      // step that keeps running.
      std::size_t at = st.busy ? 1 : 0;
      if (st.busy && !st.given_back)
        return;
      auto& q = st.queue;
      if (q.size() <= at)
        return;
      auto& e = q[at];
      if (e.token || e.wait_until == caf::actor_clock::time_point{})
        return; // granted, or not counting
      if (auto now = self->clock().now(); e.wait_until > now) {
        arm_wait(self, e.wait_until - now); // its bound began after the tick
        return;
      }
      if (e.req != 0)
        self->send(st.cfg().lease, leave_atom::value, st.key, e.req);
      auto ev = std::move(e.ev->ev);
      q.erase(at);
      st.cfg().services->turn_failed(
        st.key, std::move(ev),
        at == 0 ? fmt::format("within turn_wait ({} ms)",
                              st.cfg().turn_wait.count())
                : fmt::format("within turn_wait ({} ms): the chat's previous "
                              "step still runs after its turn ended (settle "
                              "or a lost lease) and ignores its stop token",
                              st.cfg().turn_wait.count()));
      next_turn(self);
    },
    [=](turn_done_atom) {
      auto& st = self->state;
      check_idle(self); // the runner went idle while a drain waited
      // Not idle after all: the flag was taken by a job that had just
      // finished when this actor posted the next one. That job must report
      // in its turn, or the drain would wait for its bound.
      if (!st.drain_waiters.empty() && st.run) {
        st.run->notify.store(true);
        check_idle(self); // (it may have finished before seeing the flag)
      }
    },
    [=](turn_done_atom, internal::step_end_ptr& end) {
      auto& st = self->state;
      end->router = nullptr; // taken: nobody else waits for this step
      st.busy = false;
      st.cut_wait = 0;
      if (st.coordinated() && !st.empty()) {
        auto& head = st.queue.front();
        if (head.token && head.token->untouched())
          self->send(st.cfg().lease, pass_atom::value, st.key,
                     head.token->fence());
        else if (head.token)
          self->send(st.cfg().lease, release_atom::value, st.key,
                     head.token->fence(), head.token->take_handoff());
        st.queue.pop_front();
      }
      if (st.given_back) {
        // The cut step returned: the events behind it take tickets again,
        // in their order, each waiting anew (the bound behind the step
        // was for the step to return, and it did).
        st.given_back = false;
        for (std::size_t i = 0; i < st.queue.size(); ++i)
          st.queue[i].wait_until = {};
        enter_again(self, 0);
      }
      next_turn(self);
    },
    [=](drain_atom) -> caf::result<bool> {
      auto& st = self->state;
      if (st.idle())
        return true;
      auto rp = self->make_response_promise<bool>();
      st.drain_waiters.push_back(rp);
      if (st.run) {
        st.run->notify.store(true);
        check_idle(self); // it may have gone idle before seeing the flag
      }
      return rp;
    },
    [=](abandon_atom) {
      abandon_waiting(self, "the bot stopped");
    },
    // The router's sweep asks: exit if idle (the router allows it only when
    // nothing was forwarded meanwhile).
    [=](idle_atom) {
      auto& st = self->state;
      if (!st.idle() || st.asking)
        return;
      st.asking = true;
      self->request(st.router, caf::infinite, idle_atom::value, st.key,
                    st.received)
        .then([=](bool allowed) {
          self->state.asking = false;
          if (allowed)
            self->quit();
        });
    },
  };
}

} // namespace

caf::actor spawn_chat(caf::event_based_actor* parent, std::string key,
                      std::shared_ptr<const router_config> cfg,
                      std::shared_ptr<internal::chat_runner> run) {
  return parent->spawn(chat_actor, std::move(key), std::move(cfg),
                       caf::actor_cast<caf::actor>(parent), std::move(run));
}

} // namespace botmesh
