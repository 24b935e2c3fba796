#include <botmesh/actors/router.hpp>
#include <botmesh/actors/internal/caf_logger.hpp>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <caf/all.hpp>
#include <fmt/format.h>

#include <botmesh/actors/chat_actor.hpp>
#include <botmesh/actors/messages.hpp>
#include <botmesh/runtime/core/internal/text.hpp>
#include <botmesh/runtime/core/log.hpp>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::event_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::internal::chat_runner>)

namespace botmesh {

namespace {

// A refusal or failure report the router makes for chat `key`. What the
// bot does with one (a journal release, an end notice, an error event) must
// not end the router: a CAF actor ends with any exception it lets out, and
// every later message of every chat would then go to a dead mailbox,
// unrefused. So anything thrown is logged here.
void contained(const std::string& key, const std::function<void()>& f) noexcept {
  try {
    f();
  } catch (...) {
    log::error("router",
               fmt::format("chat {}: refusing a message threw: {}", key,
                           internal::what_of(std::current_exception())));
  }
}

void refuse(chat_services& services, const std::string& key, chat_event ev,
            errc code, std::string why) noexcept {
  contained(key, [&] {
    services.refused(key, std::move(ev), code, std::move(why));
  });
}

using sweep_atom = caf::atom_constant<caf::atom("bm_sweep")>;
// (chat actor address): an ending chat's step still runs a turn_wait after
// the actor's down (see ending_chat).
using step_wait_atom = caf::atom_constant<caf::atom("bm_stwait")>;
using clk = std::chrono::steady_clock;

// A chat actor that ended by an exception, from its chat_gone until its
// down message: what it held comes back (bounced_atom) and waits here with
// what arrives meanwhile, then all of it goes to the chat's next actor in
// the chat's order. CAF frees an ended actor's mailbox (each box bouncing)
// before it sends the down message, so nothing of it comes after. A step
// of the chat still running then (on a handler thread) is waited for too:
// the next actor's step would run beside it, in the same conversation.
struct ending_chat {
  caf::actor_addr actor;          // the chat actor that ends
  std::vector<event_ptr> bounced; // sorted by event_box::seq at the end
  std::vector<event_ptr> fresh;   // arrived since chat_gone, in order
  // When each of `fresh` arrived: with a step still running, a message
  // waits for it turn_wait from its arrival or the actor's down, whichever
  // is later (so a message that arrives just before a tick is not failed
  // by it).
  std::vector<caf::actor_clock::time_point> fresh_at;
  caf::actor_clock::time_point down_at{};
  bool step_running = false;      // until its step_done
  bool down = false;              // its down message came
  // Without coordination: its run queue, which may still run or hold
  // events; the chat's next actor goes on with it.
  std::shared_ptr<internal::chat_runner> run;

  // Hands every held message that has waited since `before` or earlier to
  // `f` (bounced ones first) and drops its box; timers stay (they are
  // never refused or failed). The rest keep their order.
  template <class F>
  void take_messages(caf::actor_clock::time_point before, F f) {
    auto is_message = [](const event_ptr& ev) { return !ev->ev.is_timer(); };
    if (down_at <= before) {
      for (auto& ev : bounced)
        if (is_message(ev))
          f(std::move(ev->ev)); // (a moved-from event keeps its timer id)
      std::erase_if(bounced, is_message);
    }
    std::size_t kept = 0;
    for (std::size_t i = 0; i < fresh.size(); ++i) {
      if (is_message(fresh[i]) && std::max(fresh_at[i], down_at) <= before) {
        f(std::move(fresh[i]->ev));
        continue;
      }
      fresh[kept] = std::move(fresh[i]);
      fresh_at[kept] = fresh_at[i];
      ++kept;
    }
    fresh.resize(kept);
    fresh_at.resize(kept);
  }

  // When the next held message has waited turn_wait (`wait`), if any is.
  std::optional<caf::actor_clock::time_point>
  next_due(caf::actor_clock::duration_type wait) const {
    auto is_message = [](const event_ptr& ev) { return !ev->ev.is_timer(); };
    if (std::any_of(bounced.begin(), bounced.end(), is_message))
      return down_at + wait;
    for (std::size_t i = 0; i < fresh.size(); ++i)
      if (is_message(fresh[i]))
        return std::max(fresh_at[i], down_at) + wait;
    return std::nullopt;
  }
};

struct chat_entry {
  caf::actor handle;
  std::uint64_t forwarded = 0; // messages sent to this activation
  clk::time_point last{};      // when the last one was sent
};

struct router_state {
  // Shared with every chat actor (one copy, not one per chat).
  std::shared_ptr<const router_config> cfg;
  std::unordered_map<std::string, chat_entry> chats;
  // Chats whose actor ends by an exception (rare): apart, so a live chat's
  // entry costs no more for them.
  std::unordered_map<std::string, ending_chat> ending;
  bool draining = false;
  // Chat actors that may still run though no entry names them: passivated
  // ones until their end, and (once the router's exit came) every chat it
  // passed that exit to. The router ends only after all of them, since
  // they refer to the bot (chat_services), which may go once it ended.
  std::unordered_set<caf::actor_addr> leaving;
  std::optional<caf::error> closing; // the exit's reason, once it came

  static inline const char* name = "botmesh.router";
};

using router_actor_t = caf::stateful_actor<router_state>;

caf::behavior router(router_actor_t* self, router_config cfg) {
  self->state.cfg = std::make_shared<const router_config>(std::move(cfg));
  // Chat actors are not linked (unlinking costs O(links) per passivation):
  // the router forwards its own exit to every live chat instead.
  self->set_exit_handler([=](caf::exit_msg& msg) {
    auto& st = self->state;
    // As CAF's default: a normal exit (a linked actor that ended) ends
    // nothing. Passed on, the chats would ignore it, and the router would
    // wait for them for good.
    if (!msg.reason || st.closing)
      return;
    st.closing = msg.reason;
    st.draining = true; // what still comes is refused
    for (auto& [key, entry] : st.chats) {
      self->monitor(entry.handle);
      st.leaving.insert(entry.handle.address());
      self->send_exit(entry.handle, msg.reason);
    }
    st.chats.clear();
    // What waits for an ending chat is refused as a live chat's queue is.
    for (auto& [key, ending] : st.ending)
      ending.take_messages(caf::actor_clock::time_point::max(),
                           [&, &key = key](chat_event ev) {
        refuse(*st.cfg->services, key, std::move(ev), errc::stopped,
               fmt::format("chat {}: the router ended before this message's "
                           "turn",
                           key));
      });
    for (auto& [key, ending] : st.ending)
      if (!ending.down) // (monitored since its chat_gone)
        st.leaving.insert(ending.actor);
    st.ending.clear();
    if (st.leaving.empty())
      self->quit(msg.reason);
  });
  // Where what comes for chat `key` goes: while its actor ends, that ending
  // chat's holding; otherwise its actor's entry (the actor spawned on first
  // use), counting what is sent to it.
  struct target {
    chat_entry* entry = nullptr;
    ending_chat* ending = nullptr;
  };
  // Spawns the actor of chat `key` (going on with `run`, see spawn_chat).
  auto activate = [=](const std::string& key, chat_entry& entry,
                      std::shared_ptr<internal::chat_runner> run = nullptr) {
    entry.handle = spawn_chat(self, key, self->state.cfg, std::move(run));
    self->state.cfg->services->chat_activated(key);
  };
  auto target_of = [=](const std::string& key) -> target {
    auto& st = self->state;
    if (!st.ending.empty())
      if (auto e = st.ending.find(key); e != st.ending.end())
        return {nullptr, &e->second};
    auto& entry = st.chats[key];
    if (!entry.handle)
      activate(key, entry);
    ++entry.forwarded;
    entry.last = clk::now();
    return {&entry, nullptr};
  };
  // A message (with the provider's turn-end notice, if any) goes to its
  // chat actor.
  auto forward = [=](event_ptr& ev) {
    auto& st = self->state;
    const auto& key = ev->key;
    if (st.draining) {
      if (!ev->ev.is_timer()) // (a stopping bot runs no more timers)
        refuse(*st.cfg->services, key, std::move(ev->ev), errc::stopped,
               fmt::format("chat {}: the bot is stopping", key));
      return;
    }
    auto t = target_of(key);
    if (t.ending) {
      // Bounded as the chat's own queue: an ending chat may wait long for
      // a step that ignores its stop token.
      auto held = t.ending->bounced.size() + t.ending->fresh.size();
      if (held >= st.cfg->max_pending_per_chat && !ev->ev.is_timer()) {
        refuse(*st.cfg->services, key, std::move(ev->ev), errc::overloaded,
               fmt::format("chat {} has {} messages waiting "
                           "(max_pending_per_chat) while its chat actor ends",
                           key, held));
        return;
      }
      t.ending->fresh.emplace_back(std::move(ev));
      t.ending->fresh_at.push_back(self->clock().now());
      return;
    }
    ev->seq = t.entry->forwarded;
    ev->via = self->address(); // cleared by the chat actor that takes it
    self->send(t.entry->handle, std::move(ev));
  };
  // A timer goes as an event box, as a message does: one that its chat
  // actor ends before taking comes back (event_box::via) instead of being
  // freed with the mailbox, and a flow waiting for it would wait forever.
  auto forward_timer = [=](const std::string& key, std::uint64_t id,
                           std::uint32_t retries) {
    chat_event ev{{}, id, {}};
    ev.attempt = retries;
    auto box = make_event(key, std::move(ev));
    forward(box);
  };
  // A bounced event: sent on again. Each time the chat's actor ended by an
  // exception on another message (the message that ends it is not sent
  // back), so this does not loop; the bound is a safety net against one
  // that would.
  auto resend = [=](event_ptr& ev) {
    if (ev->bounces > 100) {
      auto key = ev->key;
      refuse(*self->state.cfg->services, key, std::move(ev->ev),
             errc::handler_failed,
             fmt::format("chat {}: its chat actor ended {} times before "
                         "taking this message",
                         key, ev->bounces));
      return;
    }
    forward(ev);
  };
  auto ending_of = [=](const caf::actor_addr& actor) {
    auto& st = self->state;
    return std::find_if(st.ending.begin(), st.ending.end(), [&](auto& kv) {
      return kv.second.actor == actor;
    });
  };
  // The ended chat actor is gone for good, and its step (if one ran) is
  // over: what it held, then what came since, goes to the chat's next
  // actor.
  auto pass_on = [=](std::unordered_map<std::string, ending_chat>::iterator i) {
    auto key = i->first;
    auto ending = std::move(i->second);
    self->state.ending.erase(i);
    if (ending.run)
      activate(key, self->state.chats[key], std::move(ending.run));
    std::stable_sort(ending.bounced.begin(), ending.bounced.end(),
                     [](const event_ptr& a, const event_ptr& b) {
                       return a->seq < b->seq;
                     });
    for (auto& ev : ending.bounced)
      resend(ev);
    for (auto& ev : ending.fresh)
      forward(ev);
  };
  self->set_down_handler([=](caf::down_msg& down) {
    auto& st = self->state;
    if (st.leaving.erase(down.source) > 0) {
      if (st.leaving.empty()) {
        if (st.closing) {
          self->quit(*st.closing);
          return;
        }
        // Its buckets stay when it empties: after a wave of passivations
        // they would cost every router a word per chat of that wave.
        if (st.leaving.bucket_count() > 64)
          std::unordered_set<caf::actor_addr>{}.swap(st.leaving);
      }
      return;
    }
    auto i = ending_of(down.source);
    if (i == self->state.ending.end())
      return;
    i->second.down = true;
    i->second.down_at = self->clock().now();
    if (!i->second.step_running) {
      pass_on(i);
      return;
    }
    self->delayed_send(self, self->state.cfg->turn_wait, step_wait_atom::value,
                       down.source);
  });
  // One sweep for all chats instead of a timer per chat: a chat that got
  // nothing for passivate_after is asked whether it is idle; if it is, it
  // asks to exit (the received == forwarded handshake below).
  auto sweep_every = std::max(std::chrono::milliseconds{10},
                              self->state.cfg->passivate_after / 4);
  self->delayed_send(self, sweep_every, sweep_atom::value);
  return {
    [=](event_ptr& ev) { forward(ev); },
    // Held by a chat actor that ended before it ran it (see
    // event_box::via): its chat_gone came first (sent before it ended), so
    // it waits for the actor's end with the rest (ending_chat).
    [=](bounced_atom, event_ptr& ev) {
      auto& st = self->state;
      if (auto e = st.ending.find(ev->key); e != st.ending.end()) {
        e->second.bounced.push_back(std::move(ev));
        return;
      }
      resend(ev);
    },
    [=](timer_atom, const std::string& key, std::uint64_t id,
        std::uint32_t retries) {
      // A timer that can do nothing more takes no turn (see
      // chat_services::timer_live).
      if (self->state.cfg->services->timer_live(id))
        forward_timer(key, id, retries);
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
      // Until it ended: the router's exit waits for it.
      self->monitor(i->second.handle);
      st.leaving.insert(i->second.handle.address());
      st.chats.erase(i);
      st.cfg->services->chat_passivated(key);
      return true;
    },
    // A chat ended by an exception (if it is still the chat's actor): what
    // it held and what comes meanwhile waits for its end (ending_chat), then
    // goes to the chat's next actor.
    [=](chat_gone_atom, const std::string& key, bool step_running,
        std::shared_ptr<internal::chat_runner>& run) {
      auto& st = self->state;
      auto i = st.chats.find(key);
      if (i == st.chats.end() || i->second.handle != self->current_sender())
        return;
      auto& ending = st.ending[key];
      ending.actor = i->second.handle.address();
      ending.step_running = step_running;
      ending.run = std::move(run);
      self->monitor(i->second.handle);
      st.chats.erase(i);
      st.cfg->services->chat_passivated(key);
    },
    // The step an ending chat actor left running returned (see
    // ending_chat). It says so after that actor's chat_gone.
    [=](step_done_atom, const caf::actor_addr& actor) {
      auto i = ending_of(actor);
      if (i == self->state.ending.end() || !i->second.step_running)
        return;
      i->second.step_running = false;
      if (i->second.down)
        pass_on(i);
    },
    // The step keeps running (it ignores its stop token): what has waited
    // for it turn_wait got no turn, as behind a cut step in a live chat
    // actor; what came later waits as long from its arrival. One tick at
    // a time (CAF cannot cancel one), due when the next message's wait
    // ends.
    [=](step_wait_atom, const caf::actor_addr& actor) {
      auto i = ending_of(actor);
      if (i == self->state.ending.end())
        return;
      caf::actor_clock::duration_type wait = self->state.cfg->turn_wait;
      auto now = self->clock().now();
      // (Timers stay: the next actor runs them.)
      i->second.take_messages(now - wait, [&](chat_event ev) {
        contained(i->first, [&] {
          self->state.cfg->services->turn_failed(
            i->first, std::move(ev),
            fmt::format("within turn_wait ({} ms): the chat's previous step "
                        "still runs after its chat actor ended and ignores "
                        "its stop token",
                        self->state.cfg->turn_wait.count()));
        });
      });
      // (A message that comes before the next tick is due no sooner than
      // it: turn_wait from now at the earliest.)
      auto due = i->second.next_due(wait).value_or(now + wait);
      self->delayed_send(self, std::max(due - now, caf::timespan{0}),
                         step_wait_atom::value, actor);
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
          .then([=](bool all) mutable {
                  if (!all) // (a chat that ended by an exception meanwhile)
                    prog->all_drained = false;
                  finish_one();
                },
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
  auto a = sys.spawn(router, cfg);
  internal::release_caf_logger();
  return a;
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
