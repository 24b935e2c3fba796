#include <botmesh/runtime/bot_actor.hpp>
#include <botmesh/actors/internal/caf_logger.hpp>

#include <algorithm>
#include <atomic>
#include <unordered_map>
#include <vector>

#include <caf/all.hpp>
#include <fmt/format.h>

#include <botmesh/runtime/core/caf_error.hpp>
#include <botmesh/runtime/core/checkpoint.hpp>
#include <botmesh/runtime/internal/bot_actor_link.hpp>

namespace botmesh {

namespace {

// Internal messages of the bot's actor (not part of `bot_actor`):
/// link -> actor: (topic, event): send `event` to the subscribers of `topic`.
using fan_atom = caf::atom_constant<caf::atom("bm_fan")>;
/// a delivery's `accepted` callback -> actor: (req): its answer is ready.
using receipt_atom = caf::atom_constant<caf::atom("bm_rcpt")>;
/// link -> actor: let go of the bot, answer what is pending, exit.
using close_atom = caf::atom_constant<caf::atom("bm_close")>;

// The phases of one delivery's answer. Whichever of the actor (back from
// `deliver`) and the `accepted` callback comes second answers: the actor at
// once when acceptance happened inside `deliver` (no durability), else the
// callback wakes the actor with a message.
enum phase : int {
  delivering, // the actor is in `deliver`; no acceptance yet
  answered,   // `accepted` was called: code and note are set
  waiting,    // the actor stored the promise; `accepted` will wake it
};

struct receipt_state {
  internal::receipt_note note;
  errc code = errc::none;
  std::atomic<int> phase{delivering};
};

// The `accepted` callback of a delivery the bot's actor made. The bot
// finds it with `receipt_of` to fill in the note first.
struct receipt_acceptance {
  std::shared_ptr<receipt_state> st;
  caf::actor self;
  std::uint64_t req = 0;

  void operator()(errc code) const {
    st->code = code;
    if (st->phase.exchange(answered, std::memory_order_acq_rel) == waiting)
      caf::anon_send(self, receipt_atom::value, req);
  }
};

caf::expected<delivery_receipt> outcome(const receipt_state& st) {
  if (st.code == errc::none)
    return delivery_receipt{st.note.id, st.note.duplicate};
  if (!st.note.why.empty())
    return make_error(st.code, st.note.why);
  switch (st.code) {
    case errc::store_error:
    case errc::timeout:
      return make_error(st.code,
                        "the inbound journal write failed: deliver it again "
                        "later");
    default:
      return make_error(st.code, "the bot refused the message");
  }
}

void answer(caf::typed_response_promise<delivery_receipt>& rp,
            const receipt_state& st) {
  auto r = outcome(st);
  if (r)
    rp.deliver(std::move(*r));
  else
    rp.deliver(std::move(r.error()));
}

struct subscriber {
  caf::actor who;
  std::uint32_t topics = 0;
};

struct pending {
  caf::typed_response_promise<delivery_receipt> rp;
  std::shared_ptr<receipt_state> st;
};

struct bot_actor_state {
  /// Null once the bot let go (closing).
  provider_host* host = nullptr;
  std::shared_ptr<std::atomic<std::uint32_t>> wanted;
  std::vector<subscriber> subs;
  /// Requests whose acceptance completes on another thread (durability).
  std::unordered_map<std::uint64_t, pending> waiting;
  std::uint64_t next_req = 0;

  void update_wanted() {
    std::uint32_t all = 0;
    for (auto& s : subs)
      all |= s.topics;
    wanted->store(all, std::memory_order_release);
  }

  static inline const char* name = "botmesh.bot";
};

using bot_actor_impl = caf::stateful_actor<bot_actor_state>;

caf::behavior bot_actor_behavior(
  bot_actor_impl* self, provider_host* host,
  std::shared_ptr<std::atomic<std::uint32_t>> wanted) {
  self->state.host = host;
  self->state.wanted = std::move(wanted);
  // It lives as long as the bot: an application actor linked to it that
  // exits does not take the bot's way in along.
  self->set_exit_handler([](caf::exit_msg&) {
    // nop
  });
  // A subscriber that exits is dropped.
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& subs = self->state.subs;
    subs.erase(std::remove_if(subs.begin(), subs.end(),
                              [&](const subscriber& s) {
                                return s.who.address() == dm.source;
                              }),
               subs.end());
    self->state.update_wanted();
  });
  auto subscribe = [=](caf::actor who,
                       std::uint32_t topics) -> caf::result<bool> {
    if (!who)
      return make_error(errc::invalid_argument,
                        "subscribe: \"who\" is not a valid actor handle");
    topics &= topics::all;
    if (topics == 0)
      return make_error(errc::invalid_argument,
                        "subscribe: \"topics\" names no topic");
    auto& st = self->state;
    for (auto& s : st.subs) {
      if (s.who == who) {
        s.topics = topics;
        st.update_wanted();
        return false;
      }
    }
    self->monitor(who);
    st.subs.push_back(subscriber{std::move(who), topics});
    st.update_wanted();
    return true;
  };
  return {
    [=](inbound_message& msg) -> caf::result<delivery_receipt> {
      auto& st = self->state;
      if (!st.host)
        return make_error(errc::stopped, "the bot is being destroyed");
      auto rs = std::make_shared<receipt_state>();
      rs->note.id = msg.id;
      auto req = ++st.next_req;
      delivery_callbacks cb;
      cb.accepted = receipt_acceptance{rs, caf::actor_cast<caf::actor>(self),
                                       req};
      // The provider's entry point: validation, id stamping, dedupe,
      // counters and, with durability, the journal.
      st.host->deliver(std::move(msg), std::move(cb));
      if (rs->phase.exchange(waiting, std::memory_order_acq_rel) == answered) {
        auto r = outcome(*rs);
        if (r)
          return std::move(*r);
        return std::move(r.error());
      }
      auto rp = self->make_response_promise<delivery_receipt>();
      st.waiting.emplace(req, pending{rp, std::move(rs)});
      return rp;
    },
    [=](receipt_atom, std::uint64_t req) {
      auto& st = self->state;
      auto i = st.waiting.find(req);
      if (i == st.waiting.end())
        return;
      answer(i->second.rp, *i->second.st);
      st.waiting.erase(i);
    },
    [=](subscribe_atom, caf::actor& who) -> caf::result<bool> {
      return subscribe(std::move(who), topics::all);
    },
    [=](subscribe_atom, caf::actor& who,
        std::uint32_t topics) -> caf::result<bool> {
      return subscribe(std::move(who), topics);
    },
    [=](unsubscribe_atom, const caf::actor& who) {
      auto& st = self->state;
      auto i = std::find_if(st.subs.begin(), st.subs.end(),
                            [&](const subscriber& s) { return s.who == who; });
      if (i == st.subs.end())
        return false;
      self->demonitor(i->who);
      st.subs.erase(i);
      st.update_wanted();
      return true;
    },
    [=](fan_atom, std::uint32_t topic, const caf::message& ev) {
      for (auto& s : self->state.subs)
        if ((s.topics & topic) != 0)
          self->send(s.who, ev);
    },
    [=](close_atom) -> caf::result<bool> {
      auto& st = self->state;
      st.host = nullptr;
      st.wanted->store(0, std::memory_order_release);
      for (auto& [req, p] : st.waiting) {
        if (p.st->phase.load(std::memory_order_acquire) == answered)
          answer(p.rp, *p.st); // its wake-up is still on its way
        else
          p.rp.deliver(make_error(errc::stopped,
                                  "the bot was destroyed before it took the "
                                  "message"));
      }
      st.waiting.clear();
      for (auto& s : st.subs)
        self->demonitor(s.who);
      st.subs.clear();
      auto rp = self->make_response_promise<bool>();
      rp.deliver(true);
      self->quit();
      return rp;
    },
  };
}

} // namespace

void configure_actor_system(caf::actor_system_config& cfg) {
  cfg.add_message_type<inbound_message>("botmesh.inbound_message");
  cfg.add_message_type<outgoing_message>("botmesh.outgoing_message");
  cfg.add_message_type<flow_checkpoint>("botmesh.flow_checkpoint");
  cfg.add_message_type<delivery_receipt>("botmesh.delivery_receipt");
  cfg.add_message_type<message_in_event>("botmesh.message_in_event");
  cfg.add_message_type<events::error>("botmesh.events.error");
  cfg.add_message_type<events::lease_lost>("botmesh.events.lease_lost");
  cfg.add_message_type<events::leader>("botmesh.events.leader");
  cfg.add_message_type<events::follower>("botmesh.events.follower");
  cfg.add_message_type<events::handover>("botmesh.events.handover");
  cfg.add_error_category(error_category::value,
                         [](uint8_t code, caf::atom_value,
                            const caf::message& msg) {
                           auto name = to_string(static_cast<errc>(code));
                           std::string ctx;
                           if (msg.match_elements<std::string>())
                             ctx = msg.get_as<std::string>(0);
                           return ctx.empty()
                                    ? fmt::format("botmesh.{}", name)
                                    : fmt::format("botmesh.{}: {}", name, ctx);
                         });
}

namespace internal {

receipt_note* receipt_of(delivery_callbacks& cb) noexcept {
  if (auto* a = cb.accepted.target<receipt_acceptance>())
    return &a->st->note;
  return nullptr;
}

bot_actor_link::bot_actor_link(caf::actor_system& sys, provider_host& host)
  : sys_(sys),
    wanted_(std::make_shared<std::atomic<std::uint32_t>>(0)) {
  actor_ = sys.spawn(bot_actor_behavior, &host, wanted_);
  release_caf_logger();
}

bot_actor_link::~bot_actor_link() {
  close();
}

bot_actor bot_actor_link::handle() const {
  return caf::actor_cast<bot_actor>(actor_);
}

namespace {

template <class T>
void fan_out(const caf::actor& a, std::uint32_t topic, T&& ev) {
  caf::anon_send(a, fan_atom::value, topic,
                 caf::make_message(std::forward<T>(ev)));
}

} // namespace

void bot_actor_link::outgoing(const outgoing_message& msg) {
  if (wanted(topics::outgoing))
    fan_out(actor_, topics::outgoing, msg);
}

void bot_actor_link::error(errc code, const std::string& what,
                           const std::string& key,
                           const std::optional<inbound_message>& msg) {
  if (wanted(topics::errors))
    fan_out(actor_, topics::errors, events::error{code, what, key, msg});
}

void bot_actor_link::message_in(const std::string& key,
                                const inbound_message& msg) {
  if (wanted(topics::message_in))
    fan_out(actor_, topics::message_in, message_in_event{key, msg});
}

void bot_actor_link::lease_lost(const events::lease_lost& ev) {
  if (wanted(topics::coordination))
    fan_out(actor_, topics::coordination, ev);
}

void bot_actor_link::leader(const events::leader& ev) {
  if (wanted(topics::coordination))
    fan_out(actor_, topics::coordination, ev);
}

void bot_actor_link::follower(const events::follower& ev) {
  if (wanted(topics::coordination))
    fan_out(actor_, topics::coordination, ev);
}

void bot_actor_link::handover(const events::handover& ev) {
  if (wanted(topics::coordination))
    fan_out(actor_, topics::coordination, ev);
}

void bot_actor_link::close() {
  if (closed_)
    return;
  closed_ = true;
  wanted_->store(0, std::memory_order_release);
  // No bound: the actor's handlers never block, so it gets here; a bound
  // could let it run `deliver` on a bot that is gone.
  {
    caf::scoped_actor self{sys_};
    self->request(actor_, caf::infinite, close_atom::value)
      .receive([](bool) {}, [](caf::error&) {});
  }
  release_caf_logger();
}

} // namespace internal

} // namespace botmesh
