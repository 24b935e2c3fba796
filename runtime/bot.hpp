#pragma once

#include <cstddef>
#include <cstdint>
#include <chrono>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include <caf/fwd.hpp>

#include <botmesh/providers/provider.hpp>
#include <botmesh/runtime/core/duration.hpp>
#include <botmesh/runtime/core/message.hpp>
#include <botmesh/runtime/core/pattern.hpp>
#include <botmesh/runtime/events.hpp>
#include <botmesh/runtime/flow.hpp>
#include <botmesh/actors/scheduler.hpp>
#include <botmesh/stores/coordinator.hpp>
#include <botmesh/stores/store.hpp>

namespace botmesh {

class bot;
class turn_token;

/// What a handler gets for one message. Valid only during the handler call.
class context {
 public:
  const inbound_message& message() const noexcept {
    return msg_;
  }

  const std::string& text() const noexcept {
    return msg_.text;
  }

  /// The chat key (`provider:chat[:participant]`).
  const std::string& key() const noexcept {
    return key_;
  }

  /// For pattern handlers: the whole match and its groups; empty otherwise.
  const std::vector<std::string>& matches() const noexcept {
    return matches_;
  }

  /// Sends `text` to this message's chat. Throws `botmesh::error`
  /// (`errc::provider_error`) when the provider fails, and
  /// `lease_lost_error` when, with coordination, this turn no longer holds
  /// (lost, or past `settle`): nothing is sent then.
  void reply(std::string_view text);

  botmesh::store& store() noexcept;

  botmesh::bot& bot() noexcept {
    return bot_;
  }

  /// Fires when the bot's stop bound runs out while this turn still runs,
  /// and, with coordination, when the turn is lost or held past `settle`:
  /// a long handler should give up then.
  std::stop_token stop_token() const noexcept;

  /// With coordination, the fence of this message's turn: it grows with
  /// every grant of the chat, whichever replica gets it, so a system outside
  /// the bot can refuse a write from a stale holder by remembering the
  /// highest fence it saw. 0 without coordination.
  std::uint64_t fence() const noexcept;

 private:
  friend class bot;

  context(botmesh::bot& b, const std::string& key, const inbound_message& msg,
          const turn_token* turn)
    : bot_(b), key_(key), msg_(msg), turn_(turn) {
    // nop
  }

  botmesh::bot& bot_;
  const std::string& key_;
  const inbound_message& msg_;
  const turn_token* turn_; // with coordination: this message's turn
  std::vector<std::string> matches_;
};

/// A message handler. It may block (I/O): it runs on the bot's handler
/// threads, never on a CAF worker. An exception it throws becomes an
/// `events::error` with `errc::handler_failed`; the chat goes on.
using handler = std::function<void(context&)>;

/// Which replicas start the provider's transport.
enum class provider_session {
  /// One replica (the one elected for `provider:<id>`) when the provider's
  /// capabilities say `exclusive_session`; every replica otherwise.
  automatic,
  /// Only the elected replica, whatever the provider says.
  leader,
  /// Every replica.
  shared,
};

/// Several replicas of one bot coordinating through a shared backend.
struct coordination_options {
  /// The shared coordinator (a memory_coordinator on a hub, or a
  /// redis_coordinator). Required.
  std::shared_ptr<botmesh::coordinator> coordinator{};
  /// The longest a message waits for its chat's turn; past it (or with the
  /// backend down) it gets an `errc::coordination_unavailable` error event.
  duration turn_wait = "2m";
  /// The longest a turn is held by a running step; then the step's stop
  /// token fires, it can no longer send or write its checkpoint, and the
  /// turn is released.
  duration settle = "1m";
  /// Polling while waiting for a turn goes from 5 ms up to this; a push
  /// from the releasing replica usually ends the wait first.
  duration max_poll = "100ms";
  botmesh::provider_session session = botmesh::provider_session::automatic;
  /// A leader whose transport stays closed this long yields, waits a few
  /// seconds and presents itself again.
  duration provider_down = "1m";
};

struct bot_options {
  /// The transport. Required.
  std::shared_ptr<botmesh::provider> provider{};
  /// Persistent state; a fresh `memory_store` when null. The bot starts it
  /// but never stops it (a store may be shared by several bots).
  std::shared_ptr<botmesh::store> store{};
  /// A chat with no message for this long gives its actor back; the next
  /// message spawns a new one transparently.
  duration passivate_after = "1m";
  /// Messages one chat may hold waiting for its turn; more are refused with
  /// an `events::error` (`errc::overloaded`).
  std::size_t max_pending_per_chat = 1000;
  /// Limits checked on every inbound message (refused with `errc::invalid_argument`).
  message_limits limits{};
  /// Most threads that run handlers: the most turns of different chats that
  /// can block at once. The pool starts with one thread per two cores and
  /// adds threads only while every running handler is stuck (blocking I/O),
  /// so short handlers do not pay for contention between idle threads.
  std::size_t handler_threads = 64;
  /// How long `stop()` waits for queued and running turns.
  duration stop_timeout = "10s";
  /// Record chats and every inbound/outbound message in the store.
  bool log_messages = true;
  /// Only when the bot owns its actor system: CAF worker threads (0 = one
  /// per core) and messages an actor may handle before yielding its worker
  /// (finite, so one busy chat cannot starve the others).
  std::size_t scheduler_threads = 0;
  std::size_t max_throughput = 32;
  /// Coordination with other replicas; without it nothing of it runs.
  std::optional<coordination_options> coordination{};
  /// Language of runtime texts ("es", "en"; see texts.hpp).
  std::string lang = "en";
  /// The task scheduler (`every`, `schedule`, `delay`): schedule store,
  /// leader lease, default time zone... Its `ns` defaults to
  /// `task_namespace(bot_id, provider->id(), provider->connection_id())`,
  /// so bots sharing a schedule store collide neither on task ids nor on
  /// the scheduler's leader lease.
  scheduler_options scheduler{};
  /// Names this bot among the bots sharing a backend (first part of the
  /// durable task namespace). Changing it, the provider id or the
  /// provider's connection id leaves the rows stored under the old
  /// namespace as orphans: kept, never run, removable with `forget_task`
  /// only from a bot with the old namespace.
  std::string bot_id{};
};

/// Counters since construction.
struct bot_stats {
  std::uint64_t received = 0;         ///< accepted by intake
  std::uint64_t handled = 0;          ///< turns completed
  std::uint64_t refused_invalid = 0;  ///< failed validation
  std::uint64_t refused_overload = 0; ///< over max_pending_per_chat
  std::uint64_t refused_stopped = 0;  ///< arrived while stopping
  std::uint64_t handler_errors = 0;
  std::uint64_t sent = 0;
  std::uint64_t send_errors = 0;
  std::uint64_t activations = 0;  ///< chat actors spawned
  std::uint64_t passivations = 0; ///< chat actors passivated
  std::uint64_t live_chats = 0;   ///< activations - passivations
  std::uint64_t turn_failures = 0; ///< messages that got no turn
  std::uint64_t conversations = 0; ///< flows and conversations in memory now
};

/// A chat bot: a provider, a store, handlers, and the actors that order
/// each chat's messages.
///
/// Guarantees: the messages of one chat run their handlers one at a time,
/// in the order they reached the bot; different chats run in parallel (up
/// to `handler_threads` at once). No message is dropped silently: every
/// refused message raises an `events::error` and a counter.
///
/// Handlers and event listeners are registered before `start()`; after it,
/// registering throws `invalid_argument_error` (field "handler").
class bot {
 public:
  /// A bot that owns its `caf::actor_system`. Throws `invalid_argument_error`
  /// (field "provider") without a provider.
  explicit bot(bot_options opts);

  /// A bot inside an application's actor system (which must outlive it).
  bot(caf::actor_system& sys, bot_options opts);

  /// Stops (see `stop`).
  ~bot();

  bot(const bot&) = delete;
  bot& operator=(const bot&) = delete;

  /// Handles every message no earlier-registered handler matched.
  bot& on_message(handler h);

  /// Handles a message whose trimmed text equals `keyword`, ignoring ASCII case.
  bot& hears(std::string keyword, handler h);

  /// Same, for any of several keywords.
  bot& hears(std::vector<std::string> keywords, handler h);

  /// Same, for a braced list: `hears({"hola", "buenas"}, h)`.
  bot& hears(std::initializer_list<const char*> keywords, handler h);

  /// Handles a message whose text contains a match of `p` (linear time:
  /// see `botmesh::pattern`); `context::matches()` holds the whole match
  /// and its groups. `bot.hears(botmesh::pattern{R"(pedido (\d+))"}, h)`.
  bot& hears(botmesh::pattern p, handler h);

  /// Registers a conversation flow (see flow.hpp). A chat's message goes
  /// first to the conversation waiting in it, then to flow triggers, then to
  /// the handlers. Before `start()` only (field "handler").
  bot& add_flow(botmesh::flow f);

  /// A conversation that reads like a script, started by `keywords`:
  ///   bot.conversation("saludo", {"hola"}, [](flow_context& c) -> flow_task {
  ///     auto name = co_await c.ask("¿Cómo te llamas?");
  ///     c.send("Hola, " + name.text());
  ///   });
  /// It lives in memory only (a coroutine frame cannot be stored).
  bot& conversation(std::string name, std::vector<std::string> keywords,
                    botmesh::flow::step_fn fn);

  /// Scheduled tasks (see scheduler.hpp): they start with `start()` and
  /// pause with `stop()`; registering works before and after `start()`.
  scheduled_task every(duration interval, scheduler::job fn);
  scheduled_task every(duration interval, task_options opts,
                       scheduler::run_handler fn);
  scheduled_task schedule(std::string_view cron, scheduler::job fn);
  scheduled_task schedule(std::string_view cron, task_options opts,
                          scheduler::run_handler fn);
  scheduled_task delay(duration d, scheduler::job fn);
  scheduled_task delay(duration d, task_options opts,
                       scheduler::run_handler fn);

  /// Removes the stored row of a durable task (the bot's namespace applied).
  bool forget_task(std::string_view id);

  /// Subscribes to an event type: `events::error`, `events::message_in`,
  /// `events::message_out`.
  template <class Event>
  bot& on(std::function<void(const Event&)> listener);

  /// Starts the store, the actors and the provider. Idempotent.
  void start();

  /// Graceful stop: stops intake (later messages are refused as
  /// `errc::stopped`), waits up to `stop_timeout` for queued and running
  /// turns (the transport stays up so they can answer), then refuses what
  /// is still queued, fires the handlers' stop token, waits for running
  /// handlers to return and stops the provider. Idempotent.
  void stop();

  /// `start()`, then waits until the provider's input ends or `stop()` is
  /// called from elsewhere, then `stop()`. Returns 0.
  int run();

  /// Waits until the provider's transport is open; false on timeout. On a
  /// standby replica of an exclusive transport it stays false.
  bool ready(std::chrono::milliseconds timeout);

  /// Sends `text` to `chat` (a chat id of this bot's provider). Throws
  /// `botmesh::error` (`errc::provider_error`) when the provider fails,
  /// `provider_not_leader_error` on a standby replica of an exclusive
  /// transport, and `invalid_argument_error` for an empty chat.
  void send(std::string_view chat, std::string_view text);

  /// Sends a prepared message (its provider is set to this bot's).
  void send(outgoing_message msg);

  bot_stats stats() const;

  /// The actor system the bot runs in.
  caf::actor_system& system() noexcept;

  /// The router actor (see actors/router.hpp), for applications that talk
  /// to the bot through CAF. Valid after `start()`.
  caf::actor router() const;

  botmesh::store& store() noexcept;
  botmesh::provider& provider() noexcept;


 private:
  friend class context;
  struct impl;

  std::unique_ptr<impl> impl_;
};

template <>
bot& bot::on<events::error>(std::function<void(const events::error&)>);
template <>
bot& bot::on<events::message_in>(
  std::function<void(const events::message_in&)>);
template <>
bot& bot::on<events::message_out>(
  std::function<void(const events::message_out&)>);
template <>
bot& bot::on<events::lease_lost>(std::function<void(const events::lease_lost&)>);
template <>
bot& bot::on<events::leader>(std::function<void(const events::leader&)>);
template <>
bot& bot::on<events::follower>(std::function<void(const events::follower&)>);

} // namespace botmesh
