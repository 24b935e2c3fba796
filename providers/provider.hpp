#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <stop_token>
#include <string>
#include <string_view>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/message.hpp>

namespace botmesh {

/// What a provider's transport allows.
struct provider_capabilities {
  /// Only one connection may exist at a time (a WhatsApp Web session, Telegram
  /// long polling): with several replicas only the elected one starts it.
  bool exclusive_session = false;
  /// How long the platform may deliver a message again (a webhook retried
  /// after a timeout or an error): the bot remembers inbound message ids
  /// this long to drop redeliveries (`bot_options::retry_window` overrides).
  std::chrono::milliseconds retry_window{std::chrono::hours(24)};
};

/// The state of a provider's transport.
enum class provider_state { connecting, open, closed };

std::string_view to_string(provider_state s) noexcept;

/// How the turn of a delivered message ended (see `delivery_callbacks`).
enum class turn_outcome : std::uint8_t {
  /// Its handlers (or its conversation) ran and returned.
  handled,
  /// It ran but a handler threw, or it got no turn (coordination
  /// unavailable, lease lost): an `events::error` says which.
  failed,
  /// It was accepted but refused before running: its chat's queue was full
  /// (`errc::overloaded`) or the bot stopped first (`errc::stopped`).
  refused,
  /// The host does not follow turns (the default `provider_host`): the
  /// notice came right after acceptance and says nothing about the turn.
  untracked,
  /// A redelivery of a platform message the bot already took (same
  /// provider, chat and id within the retry window): dropped without a
  /// turn. The platform should be told it was received.
  duplicate,
};

std::string_view to_string(turn_outcome o) noexcept;

/// Notices about one delivered message, for transports that answer the
/// platform's request only once the bot took the message (a webhook's 200)
/// or once its turn ended (Telegram's reply in the webhook response).
///
/// Both are optional. Each is called at most once, from any thread (the
/// caller of `deliver`, a CAF worker or a handler thread), and must return
/// quickly without blocking or throwing. `accepted` is always called;
/// `turn_ended` only after `accepted(errc::none)`, never before it.
struct delivery_callbacks {
  /// `errc::none` once the bot has accepted the message: validated and
  /// counted now; with durability only once the inbound journal write
  /// landed, so this may come after `deliver` returned, from a store
  /// thread — a webhook answers the platform then. A redelivery the bot
  /// already took is accepted too (then `turn_ended(duplicate)`).
  /// Otherwise why it was refused: `errc::invalid_argument` (a field over
  /// the limits; an `events::error` names it), `errc::stopped` (the bot is
  /// stopping: the platform should retry later) or, with durability,
  /// `errc::store_error` / `errc::timeout` (the journal write failed: the
  /// platform should retry later).
  std::function<void(errc)> accepted;
  /// The message's turn finished. A handler's sends of this turn all
  /// happened before this call. A message the bot lets go without a turn
  /// (it was still on its way to its chat when the bot stopped) reports
  /// `refused` from the thread that lets it go: the delivering thread
  /// itself, or a CAF thread as the bot's actors exit, which may be after
  /// `bot::stop()` returned. So the callback must not refer to what the
  /// caller destroys once the bot stopped (capture shared state by value).
  std::function<void(turn_outcome)> turn_ended;
};

/// True when a refusal in `delivery_callbacks::accepted` means "deliver it
/// again later" (answer the platform with a retryable status, keep a poll
/// offset): `errc::stopped`; `errc::provider_not_leader` (an exclusive
/// transport whose replica's leadership lapsed, e.g. after a freeze: the
/// replica that leads now gets it); and with durability `errc::store_error`
/// and `errc::timeout` (the journal write failed). Other refusals would fail
/// again.
bool retry_later(errc code) noexcept;

/// The bot side of a provider: where a started provider delivers what it
/// receives. Every method is thread-safe and returns quickly (it never waits
/// for a handler), so a provider may call it from its own I/O threads.
class provider_host {
 public:
  virtual ~provider_host();

  /// Hands an inbound message to the bot. Invalid messages are refused with
  /// an `error` event naming the field; none is dropped silently.
  virtual void deliver(inbound_message msg) = 0;

  /// Same, with notices about what became of the message (see
  /// `delivery_callbacks`). The default delivers, reports acceptance at
  /// once and then `turn_outcome::untracked`; the bot follows the turn.
  /// Cost in the bot: one map entry per message between intake and the end
  /// of its turn, only when `turn_ended` is set.
  virtual void deliver(inbound_message msg, delivery_callbacks callbacks);

  /// Reports a change of the transport's state. A provider reports `open`
  /// once it can send: until then `bot::ready()` waits and, with
  /// durability, the bot takes over no record of a dead replica.
  virtual void state_changed(provider_state state) = 0;

  /// The provider will deliver nothing more (its input ended, e.g. stdin
  /// closed). A bot waiting in `run()` then drains and returns.
  virtual void input_closed() = 0;

  /// For an exclusive transport (`exclusive_session`): the platform says
  /// another connection is live (Telegram's 409 Conflict on getUpdates), so
  /// this replica should not fight for it. Returns true when the host takes
  /// it as a fencing signal: it yields the leadership (`events::follower`
  /// with `reason`), stops the transport from another thread (so the caller
  /// must not wait for anything but `stop()`), waits at least a lease and
  /// presents itself again. Returns false when there is no election (no
  /// coordination, or a shared session; the default): the provider backs
  /// off and retries by itself. Never blocks.
  virtual bool yield_leadership(std::string_view reason);

  /// For an exclusive transport: false while this replica does not hold
  /// the transport's leadership (it lapsed in a freeze, and the host has
  /// not stopped the transport yet). A poller then asks the platform
  /// nothing: another getUpdates ends the leader's long poll with a 409,
  /// and the leader yields. True by default and without an election.
  /// Cheap and thread-safe.
  virtual bool leads() const {
    return true;
  }

  /// Fires when the host gives up on the handlers still running (its stop
  /// passed its bound): a send waiting in the provider (flood control, a
  /// 429's retry_after) should give up then with `errc::stopped` instead of
  /// holding the stop up. The default never fires.
  virtual std::stop_token stopping() const {
    return {};
  }
};

/// A transport to a chat platform.
///
/// Lifecycle: `start(host)` once, then `send` any number of times from any
/// thread, then `stop()`. `send` may block on I/O; the runtime calls it from
/// handler threads only.
class provider {
 public:
  virtual ~provider();

  /// A stable id, used in chat keys ("console", "telegram").
  virtual std::string id() const = 0;

  /// The platform account this transport speaks for: Telegram, the bot's
  /// numeric id (the token before ':'); WhatsApp, `phone_number_id`; empty
  /// when a provider has a single connection. Part of the namespace of
  /// durable task ids (see `task_namespace`), so it must be stable.
  virtual std::string connection_id() const {
    return {};
  }

  virtual provider_capabilities capabilities() const {
    return {};
  }

  virtual provider_state state() const = 0;

  /// Connects the transport and starts delivering to `host`, which stays
  /// valid until `stop()` returns.
  virtual void start(provider_host& host) = 0;

  /// Disconnects; after it returns nothing more is delivered.
  virtual void stop() = 0;

  /// Sends a message. Throws `botmesh::error` with `errc::provider_error`
  /// when the transport is closed or the platform refuses it.
  virtual void send(const outgoing_message& msg) = 0;

  /// The same for a turn's send (the runtime's call): a wait inside the
  /// provider (flood control, a 429's retry_after) also gives up, with
  /// `errc::stopped`, once `cancel` fires: the turn ended (settle, a lost
  /// lease), and a reply sent after another replica took the chat would
  /// arrive out of order. The default ignores `cancel` (a provider that
  /// never waits).
  virtual void send(const outgoing_message& msg, std::stop_token cancel) {
    (void) cancel;
    send(msg);
  }
};

} // namespace botmesh
