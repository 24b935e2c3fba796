#include <botmesh/actors/router.hpp>

#include <algorithm>
#include <memory>
#include <thread>
#include <unordered_map>

#include <caf/all.hpp>
#include <fmt/format.h>

#include <botmesh/actors/chat_actor.hpp>
#include <botmesh/actors/messages.hpp>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::event_ptr)


namespace botmesh {

namespace {

using sweep_atom = caf::atom_constant<caf::atom("bm_sweep")>;
using clk = std::chrono::steady_clock;

struct chat_entry {
  caf::actor handle;
  std::uint64_t forwarded = 0; // messages sent to this activation
  clk::time_point last{};      // when the last one was sent
};

struct router_state {
  // Shared with every chat actor (one copy, not one per chat).
  std::shared_ptr<const router_config> cfg;
  std::unordered_map<std::string, chat_entry> chats;
  bool draining = false;

  static inline const char* name = "botmesh.router";
};

using router_actor_t = caf::stateful_actor<router_state>;

caf::behavior router(router_actor_t* self, router_config cfg) {
  self->state.cfg = std::make_shared<const router_config>(std::move(cfg));
  // Chat actors are not linked (unlinking costs O(links) per passivation):
  // the router forwards its own exit to every live chat instead.
  self->set_exit_handler([=](caf::exit_msg& msg) {
    for (auto& [key, entry] : self->state.chats)
      self->send_exit(entry.handle, msg.reason);
    self->state.chats.clear();
    self->quit(msg.reason);
  });
  // A message (with the provider's turn-end notice, if any) goes to its
  // chat actor, spawned on first use.
  auto forward = [=](event_ptr& ev) {
    auto& st = self->state;
    const auto& key = ev->key;
    if (st.draining) {
      st.cfg->services->refused(key, std::move(ev->ev), errc::stopped,
                               fmt::format("chat {}: the bot is stopping",
                                           key));
      return;
    }
    auto& entry = st.chats[key];
    if (!entry.handle) {
      entry.handle = spawn_chat(self, key, st.cfg);
      st.cfg->services->chat_activated(key);
    }
    ++entry.forwarded;
    entry.last = clk::now();
    ev->via = self->address(); // cleared by the chat actor that takes it
    self->send(entry.handle, std::move(ev));
  };
  // One sweep for all chats instead of a timer per chat: a chat that got
  // nothing for passivate_after is asked whether it is idle; if it is, it
  // asks to exit (the received == forwarded handshake below).
  auto sweep_every = std::max(std::chrono::milliseconds{10},
                              self->state.cfg->passivate_after / 4);
  self->delayed_send(self, sweep_every, sweep_atom::value);
  return {
    [=](event_ptr& ev) { forward(ev); },
    // Sent on to a chat actor that ended before it took it (see
    // event_box::via). Its chat_gone came first (sent before it ended), so
    // the chat's next actor takes it; after a few round trips (a chat that
    // keeps ending) it is refused.
    [=](bounced_atom, event_ptr& ev) {
      if (ev->bounces > 3) {
        auto key = ev->key;
        self->state.cfg->services->refused(
          key, std::move(ev->ev), errc::handler_failed,
          fmt::format("chat {}: its chat actor ended {} times before taking "
                      "this message",
                      key, ev->bounces));
        return;
      }
      forward(ev);
    },
    [=](timer_atom, const std::string& key, std::uint64_t id) {
      auto& st = self->state;
      if (st.draining)
        return; // a stopping bot runs no more timers
      auto& entry = st.chats[key];
      if (!entry.handle) {
        entry.handle = spawn_chat(self, key, st.cfg);
        st.cfg->services->chat_activated(key);
      }
      ++entry.forwarded;
      entry.last = clk::now();
      self->send(entry.handle, timer_atom::value, id);
    },
    [=](sweep_atom) {
      auto& st = self->state;
      if (st.draining)
        return;
      auto now = clk::now();
      for (auto& [key, entry] : st.chats)
        if (now - entry.last >= st.cfg->passivate_after)
          self->send(entry.handle, idle_atom::value);
      self->delayed_send(self, sweep_every, sweep_atom::value);
    },
    // A chat may exit only if it has seen everything forwarded to it;
    // otherwise a message is on its way and the chat stays.
    [=](idle_atom, const std::string& key, std::uint64_t received) {
      auto& st = self->state;
      auto i = st.chats.find(key);
      if (i == st.chats.end() || i->second.forwarded != received
          || i->second.handle != self->current_sender())
        return false;
      st.chats.erase(i);
      st.cfg->services->chat_passivated(key);
      return true;
    },
    // A chat ended by an exception: forgotten (if it is still the chat's
    // actor), so the next message spawns another. What was sent to it on
    // the way ends as refused when it is freed.
    [=](chat_gone_atom, const std::string& key) {
      auto& st = self->state;
      auto i = st.chats.find(key);
      if (i == st.chats.end() || i->second.handle != self->current_sender())
        return;
      st.chats.erase(i);
      st.cfg->services->chat_passivated(key);
    },
    [=](drain_atom, std::chrono::milliseconds bound) -> caf::result<bool> {
      auto& st = self->state;
      st.draining = true;
      if (st.chats.empty())
        return true;
      auto rp = self->make_response_promise<bool>();
      struct progress {
        std::size_t pending;
        bool all_drained = true;
      };
      auto prog = std::make_shared<progress>(progress{st.chats.size()});
      auto finish_one = [rp, prog]() mutable {
        if (--prog->pending == 0)
          rp.deliver(prog->all_drained);
      };
      for (auto& [key, entry] : st.chats) {
        auto chat = entry.handle;
        self->request(chat, bound, drain_atom::value)
          .then([finish_one](bool) mutable { finish_one(); },
                [=](caf::error&) mutable {
                  // Timed out (or the chat is gone): refuse what it still holds.
                  prog->all_drained = false;
                  self->send(chat, abandon_atom::value);
                  finish_one();
                });
      }
      return rp;
    },
  };
}

} // namespace

caf::actor spawn_router(caf::actor_system& sys, router_config cfg) {
  return sys.spawn(router, cfg);
}

void configure_scheduler(caf::actor_system_config& cfg, std::size_t threads,
                         std::size_t max_throughput) {
  if (threads == 0)
    threads = std::max(2u, std::thread::hardware_concurrency());
  cfg.set("scheduler.max-threads", threads);
  cfg.set("scheduler.max-throughput", std::max<std::size_t>(1, max_throughput));
  cfg.set("work-stealing.moderate-poll-attempts", std::size_t{0});
}

} // namespace botmesh
