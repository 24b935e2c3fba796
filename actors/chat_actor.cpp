#include <botmesh/actors/chat_actor.hpp>

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <vector>

#include <caf/all.hpp>
#include <fmt/format.h>

#include <botmesh/actors/messages.hpp>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::turn_token>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::chat_event)

namespace botmesh {

namespace {

// Request ids: unique in the process, so unique per coordinator incarnation.
std::atomic<std::uint64_t> next_request{1};

// One event waiting in a chat, with what it has of its turn.
struct entry {
  chat_event ev;
  std::uint64_t req = 0;             // with coordination: its request
  std::shared_ptr<turn_token> token; // granted
  bool wait_armed = false;           // its turn_wait bound is counting
};

struct chat_state {
  std::string key;
  router_config cfg;
  caf::actor router;
  // Allocated on the first event: an idle chat holds no queue memory.
  std::unique_ptr<std::deque<entry>> queue;
  bool busy = false;
  bool first = true;        // the next turn is the first of this activation
  bool asking = false;      // an idle request to the router is in flight
  bool check_armed = false; // an idle check is scheduled
  std::chrono::steady_clock::time_point last_activity{};
  std::uint64_t received = 0;
  std::vector<caf::typed_response_promise<bool>> drain_waiters;

  static inline const char* name = "botmesh.chat";

  std::deque<entry>& q() {
    if (!queue)
      queue = std::make_unique<std::deque<entry>>();
    return *queue;
  }

  bool empty() const {
    return !queue || queue->empty();
  }

  bool coordinated() const {
    return static_cast<bool>(cfg.lease);
  }
};

using chat_actor_t = caf::stateful_actor<chat_state>;

// One timer per idle period, not one per message: re-arming a CAF timeout
// on every message costs a clock-thread wake-up each time.
void arm_idle_check(chat_actor_t* self, std::chrono::nanoseconds in) {
  self->state.check_armed = true;
  self->delayed_send(self, in, idle_atom::value);
}

void enter(chat_actor_t* self, entry& e) {
  e.req = next_request.fetch_add(1, std::memory_order_relaxed);
  e.token.reset();
  e.wait_armed = false;
  self->send(self->state.cfg.lease, acquire_atom::value, self->state.key,
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
      self->send(st.cfg.lease, leave_atom::value, st.key, q[i].req);
    enter(self, q[i]);
  }
}

void went_idle(chat_actor_t* self) {
  auto& st = self->state;
  for (auto& rp : st.drain_waiters)
    rp.deliver(true);
  st.drain_waiters.clear();
  st.last_activity = std::chrono::steady_clock::now();
  st.queue.reset();
  if (!st.check_armed)
    arm_idle_check(self, st.cfg.passivate_after);
}

// Starts the next turn, or answers drain waiters when nothing is left.
void next_turn(chat_actor_t* self) {
  auto& st = self->state;
  if (st.busy)
    return;
  if (st.empty()) {
    went_idle(self);
    return;
  }
  auto& q = st.q();
  auto first = st.first;
  if (!st.coordinated()) {
    // Hand over a batch: one hand-off to a handler thread for several
    // queued messages.
    st.busy = true;
    auto n = std::min(q.size(), std::max<std::size_t>(1, st.cfg.max_batch));
    std::vector<chat_event> batch;
    batch.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      batch.push_back(std::move(q.front().ev));
      q.pop_front();
    }
    st.first = false;
    auto handle = caf::actor_cast<caf::actor>(self);
    st.cfg.services->run_turns(st.key, std::move(batch), first, nullptr,
                               [handle] {
                                 caf::anon_send(handle, turn_done_atom::value);
                               });
    return;
  }
  auto& head = q.front();
  if (!head.token) {
    // Waiting for the head's turn: bounded by turn_wait from now.
    if (!head.wait_armed) {
      head.wait_armed = true;
      self->delayed_send(self, st.cfg.turn_wait, turn_wait_atom::value,
                         head.req);
    }
    return;
  }
  st.busy = true;
  st.first = false;
  self->send(st.cfg.lease, start_atom::value, st.key, head.token->fence());
  auto handle = caf::actor_cast<caf::actor>(self);
  st.cfg.services->run_turns(st.key, {head.ev}, first, head.token, [handle] {
    caf::anon_send(handle, turn_done_atom::value);
  });
}

// Queues an event; with coordination it takes its ticket right away, so
// the chat's order across replicas is the order events arrived.
void push(chat_actor_t* self, chat_event ev) {
  auto& st = self->state;
  auto& q = st.q();
  q.push_back(entry{std::move(ev), 0, nullptr, false});
  if (st.coordinated())
    enter(self, q.back());
  next_turn(self);
}

entry* find(chat_actor_t* self, std::uint64_t req, std::size_t* index = nullptr) {
  auto& st = self->state;
  if (st.empty())
    return nullptr;
  auto& q = *st.queue;
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
                         router_config cfg, caf::actor router) {
  self->state.key = std::move(key);
  self->state.cfg = cfg;
  self->state.router = std::move(router);
  self->state.last_activity = std::chrono::steady_clock::now();
  return {
    [=](chat_event& ev) {
      auto& st = self->state;
      ++st.received;
      auto pending = st.empty() ? 0 : st.queue->size();
      if (pending >= st.cfg.max_pending_per_chat) {
        st.cfg.services->refused(
          st.key, std::move(ev), errc::overloaded,
          fmt::format("chat {} has {} messages waiting (max_pending_per_chat)",
                      st.key, pending));
        return;
      }
      push(self, std::move(ev));
    },
    // Timers are internal and never refused: they do not count against the
    // pending bound.
    [=](timer_atom, std::uint64_t id) {
      ++self->state.received;
      push(self, chat_event{{}, id, {}});
    },
    [=](granted_atom, std::uint64_t req, std::shared_ptr<turn_token>& token) {
      std::size_t i = 0;
      auto e = find(self, req, &i);
      if (!e) {
        // Given up meanwhile (turn_wait, stop): pass the turn on.
        self->send(self->state.cfg.lease, release_atom::value, token->key(),
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
      auto& q = *self->state.queue;
      for (std::size_t j = 0; j < i; ++j) {
        if (!q[j].token) {
          std::swap(q[j].req, q[i].req);
          std::swap(q[j].wait_armed, q[i].wait_armed);
          e = &q[j];
          break;
        }
      }
      e->token = std::move(token);
      next_turn(self);
    },
    [=](lost_atom, std::uint64_t req, std::uint64_t, const std::string&) {
      auto& st = self->state;
      std::size_t i = 0;
      auto e = find(self, req, &i);
      if (!e || (st.busy && i == 0))
        return; // a running step sees its token ended
      // Its ticket or its granted turn is gone before it ran: enter again,
      // with every later event of the chat after it.
      enter_again(self, i);
      next_turn(self);
    },
    [=](turn_wait_atom, std::uint64_t req) {
      auto& st = self->state;
      if (st.empty() || st.busy)
        return;
      auto& q = *st.queue;
      auto& head = q.front();
      if (head.req != req || head.token)
        return; // stale: granted, or entered again
      self->send(st.cfg.lease, leave_atom::value, st.key, req);
      auto ev = std::move(head.ev);
      q.pop_front();
      st.cfg.services->turn_failed(
        st.key, std::move(ev),
        fmt::format("within turn_wait ({} ms)", st.cfg.turn_wait.count()));
      next_turn(self);
    },
    [=](turn_done_atom) {
      auto& st = self->state;
      st.busy = false;
      if (st.coordinated() && !st.empty()) {
        auto& head = st.queue->front();
        if (head.token)
          self->send(st.cfg.lease, release_atom::value, st.key,
                     head.token->fence());
        st.queue->pop_front();
      }
      next_turn(self);
    },
    [=](drain_atom) -> caf::result<bool> {
      auto& st = self->state;
      if (!st.busy && st.empty())
        return true;
      auto rp = self->make_response_promise<bool>();
      st.drain_waiters.push_back(rp);
      return rp;
    },
    [=](abandon_atom) {
      auto& st = self->state;
      if (st.empty())
        return;
      auto& q = *st.queue;
      // The running head (if any) finishes; everything else is refused.
      std::size_t from = st.busy ? 1 : 0;
      for (auto i = from; i < q.size(); ++i) {
        if (q[i].req != 0)
          self->send(st.cfg.lease, leave_atom::value, st.key, q[i].req);
        if (!q[i].ev.is_timer())
          st.cfg.services->refused(st.key, std::move(q[i].ev), errc::stopped,
                                   fmt::format("chat {}: the bot stopped before "
                                               "this message's turn",
                                               st.key));
      }
      q.erase(q.begin() + static_cast<std::ptrdiff_t>(from), q.end());
      if (!st.busy)
        went_idle(self);
    },
    [=](idle_atom) {
      auto& st = self->state;
      st.check_armed = false;
      if (st.busy || !st.empty() || st.asking)
        return; // next_turn re-arms once the chat is idle again
      auto idle_for = std::chrono::steady_clock::now() - st.last_activity;
      if (idle_for < st.cfg.passivate_after) {
        arm_idle_check(self, st.cfg.passivate_after - idle_for);
        return;
      }
      st.asking = true;
      self->request(st.router, caf::infinite, idle_atom::value, st.key,
                    st.received)
        .then([=](bool allowed) {
          self->state.asking = false;
          if (allowed)
            self->quit();
          else if (!self->state.check_armed)
            arm_idle_check(self, self->state.cfg.passivate_after);
        });
    },
  };
}

} // namespace

caf::actor spawn_chat(caf::event_based_actor* parent, std::string key,
                      const router_config& cfg) {
  return parent->spawn(chat_actor, std::move(key), cfg,
                       caf::actor_cast<caf::actor>(parent));
}

} // namespace botmesh
