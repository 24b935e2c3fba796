#include <botmesh/actors/chat_actor.hpp>

#include <algorithm>
#include <deque>
#include <vector>

#include <caf/all.hpp>
#include <fmt/format.h>

#include <botmesh/actors/messages.hpp>


namespace botmesh {

namespace {

struct chat_state {
  std::string key;
  router_config cfg;
  caf::actor router;
  std::deque<chat_event> queue;
  bool busy = false;
  bool first = true;        // the next turn is the first of this activation
  bool asking = false;      // an idle request to the router is in flight
  bool check_armed = false; // an idle check is scheduled
  std::chrono::steady_clock::time_point last_activity{};
  std::uint64_t received = 0;
  std::vector<caf::typed_response_promise<bool>> drain_waiters;

  static inline const char* name = "botmesh.chat";
};

using chat_actor_t = caf::stateful_actor<chat_state>;

// One timer per idle period, not one per message: re-arming a CAF timeout
// on every message costs a clock-thread wake-up each time.
void arm_idle_check(chat_actor_t* self, std::chrono::nanoseconds in) {
  self->state.check_armed = true;
  self->delayed_send(self, in, idle_atom::value);
}

// Starts the next queued turn, or answers drain waiters when nothing is left.
void next_turn(chat_actor_t* self) {
  auto& st = self->state;
  if (st.busy)
    return;
  if (st.queue.empty()) {
    for (auto& rp : st.drain_waiters)
      rp.deliver(true);
    st.drain_waiters.clear();
    st.last_activity = std::chrono::steady_clock::now();
    if (!st.check_armed)
      arm_idle_check(self, st.cfg.passivate_after);
    return;
  }
  st.busy = true;
  auto n = std::min(st.queue.size(), std::max<std::size_t>(1, st.cfg.max_batch));
  std::vector<chat_event> batch;
  batch.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    batch.push_back(std::move(st.queue.front()));
    st.queue.pop_front();
  }
  auto first = st.first;
  st.first = false;
  auto handle = caf::actor_cast<caf::actor>(self);
  st.cfg.services->run_turns(st.key, std::move(batch), first, [handle] {
    caf::anon_send(handle, turn_done_atom::value);
  });
}

caf::behavior chat_actor(chat_actor_t* self, std::string key,
                         router_config cfg, caf::actor router) {
  self->state.key = std::move(key);
  self->state.cfg = cfg;
  self->state.router = std::move(router);
  self->state.last_activity = std::chrono::steady_clock::now();
  return {
    [=](inbound_message& msg) {
      auto& st = self->state;
      ++st.received;
      if (st.queue.size() >= st.cfg.max_pending_per_chat) {
        st.cfg.services->refused(
          st.key, std::move(msg), errc::overloaded,
          fmt::format("chat {} has {} messages waiting (max_pending_per_chat)",
                      st.key, st.queue.size()));
        return;
      }
      st.queue.push_back(chat_event{std::move(msg), 0});
      next_turn(self);
    },
    // Timers are internal and never refused: they do not count against the
    // pending bound.
    [=](timer_atom, std::uint64_t id) {
      auto& st = self->state;
      ++st.received;
      st.queue.push_back(chat_event{{}, id});
      next_turn(self);
    },
    [=](turn_done_atom) {
      self->state.busy = false;
      next_turn(self);
    },
    [=](drain_atom) -> caf::result<bool> {
      auto& st = self->state;
      if (!st.busy && st.queue.empty())
        return true;
      auto rp = self->make_response_promise<bool>();
      st.drain_waiters.push_back(rp);
      return rp;
    },
    [=](abandon_atom) {
      auto& st = self->state;
      for (auto& ev : st.queue)
        if (!ev.is_timer())
          st.cfg.services->refused(st.key, std::move(ev.message), errc::stopped,
                                   fmt::format("chat {}: the bot stopped before "
                                               "this message's turn",
                                               st.key));
      st.queue.clear();
    },
    [=](idle_atom) {
      auto& st = self->state;
      st.check_armed = false;
      if (st.busy || !st.queue.empty() || st.asking)
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
