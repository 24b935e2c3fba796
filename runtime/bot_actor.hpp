#pragma once

// Embedding a bot in a CAF application: the bot as a typed actor, and what
// an application's actor system needs to talk to it.
//
//   caf::actor_system_config cfg;
//   botmesh::configure_actor_system(cfg); // message types, errors by name
//   botmesh::configure_scheduler(cfg);    // optional: the bot's settings
//   caf::actor_system sys{cfg};
//   botmesh::bot bot{sys, {.provider = p}};
//   ... in an actor of the application:
//   self->request(bot.actor(), 5s, msg).then(
//     [](const botmesh::delivery_receipt& r) { /* accepted as r.id */ },
//     [](caf::error& e) { /* refused: botmesh::code_of(e), what_of(e) */ });
//   self->request(bot.actor(), 5s, botmesh::subscribe_atom::value,
//                 caf::actor_cast<caf::actor>(self), botmesh::topics::outgoing)
//     .then([](bool) { /* outgoing_message handlers get the answers */ });
//
// Cost of this header: caf/fwd.hpp, caf/atom.hpp and caf/replies_to.hpp
// (type lists only). `bot_actor` is an alias of an incomplete
// `caf::typed_actor<...>` here: code that calls or stores `bot.actor()`
// includes <caf/typed_actor.hpp> (or caf/all.hpp) itself.

#include <cstdint>
#include <string>

#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>

#include <botmesh/actors/system_setup.hpp>
#include <botmesh/runtime/core/message.hpp>
#include <botmesh/runtime/events.hpp>

namespace botmesh {

/// `(subscribe_atom, caf::actor[, topics])` -> bool: see `bot_actor`.
using subscribe_atom = caf::atom_constant<caf::atom("bm_sub")>;

/// `(unsubscribe_atom, caf::actor)` -> bool: see `bot_actor`.
using unsubscribe_atom = caf::atom_constant<caf::atom("bm_unsub")>;

/// The answer to an `inbound_message` sent to the bot's actor: the bot took
/// it.
struct delivery_receipt {
  /// The message's id in the bot: the one it came with, or the one the bot
  /// stamped when it came without (`<provider>-<random>-<n>`). Replies to
  /// it carry it in `outgoing_message::reply_to`.
  std::string id;
  /// A redelivery of a message id the bot already took (same provider, chat
  /// and id within the retry window): dropped, no turn will run for it.
  bool duplicate = false;

  friend bool operator==(const delivery_receipt&,
                         const delivery_receipt&) = default;
};

/// `events::message_in` as a subscriber gets it: owned copies (the event's
/// fields are references, valid only during a listener call).
struct message_in_event {
  /// The chat key (`provider:chat[:participant]`).
  std::string key;
  inbound_message message;

  friend bool operator==(const message_in_event&,
                         const message_in_event&) = default;
};

/// What a subscriber gets, as a bit set (combine with `|`).
namespace topics {
/// `outgoing_message`: every message the provider sent (replies and
/// `bot::send`), after the provider's `send` returned; `provider` is set.
/// The `events::message_out` of a listener.
inline constexpr std::uint32_t outgoing = 1;
/// `events::error`.
inline constexpr std::uint32_t errors = 2;
/// `message_in_event`: a message starts its turn.
inline constexpr std::uint32_t message_in = 4;
/// `events::lease_lost`, `events::leader`, `events::follower`,
/// `events::handover` (with coordination).
inline constexpr std::uint32_t coordination = 8;
inline constexpr std::uint32_t all = 15;
} // namespace topics

/// The bot as a typed actor (`bot::actor()`): the way an application's
/// actors talk to a bot in their actor system.
///
/// - `inbound_message` -> `delivery_receipt`: delivers the message the way a
///   provider does (`provider_host::deliver`): the same validation
///   (`message_limits`), id stamping, deduplication, counters, and with
///   durability the inbound journal. The answer leaves once the bot
///   *accepted* the message — exactly when a provider's
///   `delivery_callbacks::accepted` is called: at once without durability,
///   after the journal write landed with it. A receipt says nothing about
///   the turn: its handlers run later; what they send reaches subscribers
///   (`topics::outgoing`), and a turn that fails or is refused after
///   acceptance (a full chat queue, no turn) raises an `events::error`
///   (`topics::errors`). `provider` is filled with the bot's provider id
///   when empty.
///   Errors (`caf::error` of category `botmesh`, see caf_error.hpp; with
///   `configure_actor_system` they render as `botmesh.<code>: <text>`):
///   `errc::invalid_argument` (a field is empty or over the limits: the
///   text names it, as the `events::error` raised with it does; the refusal
///   counts in `bot_stats::refused_invalid` and no handler runs),
///   `errc::stopped` (before `start()`, after `stop()`, or once the bot is
///   being destroyed), and with durability `errc::store_error` /
///   `errc::timeout` (the journal write failed: retry later). Once the bot
///   is destroyed the actor is gone: requests fail with CAF's
///   `sec::request_receiver_down`. The `events::error` of a refusal reaches
///   the bot's listeners on its handler pool, never on this actor's CAF
///   worker; before `start()` and once the bot stops, only subscribers and
///   the log get it (the sender has the refusal as its answer).
/// - `(subscribe_atom, caf::actor who)` -> bool: `who` gets every topic;
///   `(subscribe_atom, caf::actor who, std::uint32_t topics)` only those
///   (`topics::outgoing | topics::errors`...). True when `who` was not
///   subscribed yet (false: its topics were replaced). Events raised after
///   the answer reaches the subscriber are sent to it. Error
///   `errc::invalid_argument` for an invalid handle or no topic. The bot
///   monitors its subscribers: one that exits is dropped.
/// - `(unsubscribe_atom, caf::actor who)` -> bool: true when `who` was
///   subscribed.
///
/// Subscribers receive plain CAF messages, sent by the bot's actor:
/// `outgoing_message`, `events::error`, `message_in_event`,
/// `events::lease_lost`, `events::leader`, `events::follower` and
/// `events::handover`, one message per event. The events of one chat's turn
/// (its `message_in_event`, its `outgoing_message`s, its errors) arrive in
/// the order they happened; events of different chats or threads are not
/// ordered among themselves.
///
/// Guarantees: the actor never blocks a CAF worker (delivery only queues
/// the message; with durability the journal write is asynchronous and the
/// answer follows its completion). The messages one actor sends to the bot
/// enter their chats in the order it sent them.
///
/// Costs: a request is one message to the bot's actor and its answer (one
/// more internal message when the acceptance completes on another thread,
/// as with durability). With no subscriber for a topic, an event costs one
/// atomic load; with subscribers, a copy of the event into a CAF message
/// and one message per subscriber.
///
/// It lives as long as the bot: it exists from the bot's construction (so
/// an application can subscribe before `start()`), answers `errc::stopped`
/// after `stop()`, and exits when the bot is destroyed (pending answers get
/// `errc::stopped`).
using bot_actor = caf::typed_actor<
  caf::replies_to<inbound_message>::with<delivery_receipt>,
  caf::replies_to<subscribe_atom, caf::actor>::with<bool>,
  caf::replies_to<subscribe_atom, caf::actor, std::uint32_t>::with<bool>,
  caf::replies_to<unsubscribe_atom, caf::actor>::with<bool>>;

/// Registers botmesh's error category and message types in a CAF config:
/// `inbound_message`, `outgoing_message`, `flow_checkpoint`,
/// `delivery_receipt`, `message_in_event` and the events a subscriber gets
/// (named `botmesh.<type>`, `botmesh.events.<type>`). Call it before
/// creating the `caf::actor_system` that embeds a bot: errors then render
/// by name (`sys.render(e)` gives `botmesh.invalid_argument: ...`) and the
/// messages can be sent to remote actors. Local use works without it (CAF
/// 0.17 needs registration only to serialize a type or to render it by
/// name). A bot that owns its actor system calls it itself.
void configure_actor_system(caf::actor_system_config& cfg);

// -- inspection (CAF 0.17) ----------------------------------------------------

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, delivery_receipt& x) {
  return f(caf::meta::type_name("botmesh.delivery_receipt"), x.id,
           x.duplicate);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, message_in_event& x) {
  return f(caf::meta::type_name("botmesh.message_in_event"), x.key,
           x.message);
}

namespace events {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, error& x) {
  auto code = static_cast<std::uint8_t>(x.code);
  // CAF 0.17 has no std::optional: a flag and a message.
  bool has_message = x.message.has_value();
  inbound_message message = has_message ? *x.message : inbound_message{};
  return detail::inspect_then(
    f,
    [&] {
      x.code = static_cast<errc>(code);
      if (has_message)
        x.message = std::move(message);
      else
        x.message.reset();
    },
    caf::meta::type_name("botmesh.events.error"), code, x.what, x.key,
    has_message, message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, lease_lost& x) {
  return f(caf::meta::type_name("botmesh.events.lease_lost"), x.key,
           x.reason);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, leader& x) {
  return f(caf::meta::type_name("botmesh.events.leader"), x.name, x.fence);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, follower& x) {
  return f(caf::meta::type_name("botmesh.events.follower"), x.name,
           x.reason);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, handover& x) {
  return f(caf::meta::type_name("botmesh.events.handover"), x.key, x.name,
           x.outcome, x.reason);
}

} // namespace events

} // namespace botmesh
