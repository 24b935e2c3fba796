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
#include <variant>
#include <vector>

#include <caf/fwd.hpp>

#include <botmesh/providers/provider.hpp>
#include <botmesh/runtime/core/duration.hpp>
#include <botmesh/runtime/core/log.hpp>
#include <botmesh/runtime/core/message.hpp>
#include <botmesh/runtime/core/pattern.hpp>
#include <botmesh/runtime/bot_actor.hpp>
#include <botmesh/runtime/events.hpp>
#include <botmesh/runtime/flow.hpp>
#include <botmesh/actors/scheduler.hpp>
#include <botmesh/stores/coordinator.hpp>
#include <botmesh/stores/durable_backend.hpp>
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

  /// For a command: what follows it, trimmed ("ref-42" for
  /// "/start@my_bot ref-42"); empty for other messages.
  std::string_view payload() const noexcept;

  /// In middleware (see `bot::use`): the message, to change before the
  /// rest of the chain sees it. Throws `invalid_argument_error` (field
  /// "message") in handlers, where the message is read-only.
  inbound_message& edit_message();

  /// Sends `text` to this message's chat. Throws `botmesh::error`
  /// (`errc::provider_error`) when the provider fails, and
  /// `lease_lost_error` when, with coordination, this turn no longer holds
  /// (lost, or past `settle`): nothing is sent then. The turn, not the
  /// transport's leadership, fences a reply: a replica that yielded an
  /// exclusive transport still answers the turns it holds (a provider that
  /// cannot send while closed throws `errc::provider_error`).
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
          const turn_token* turn, inbound_message* editable = nullptr)
    : bot_(b), key_(key), msg_(msg), turn_(turn), editable_(editable) {
    // nop
  }

  botmesh::bot& bot_;
  const std::string& key_;
  const inbound_message& msg_;
  const turn_token* turn_; // with coordination: this message's turn
  inbound_message* editable_; // == &msg_ in middleware, else null
  std::vector<std::string> matches_;
};

/// A message handler. It may block (I/O): it runs on the bot's handler
/// threads, never on a CAF worker. An exception it throws becomes an
/// `events::error` with `errc::handler_failed`; the chat goes on.
using handler = std::function<void(context&)>;

/// Which messages a handler takes (see `bot::when`). It runs on the turn's
/// thread and should be cheap; an exception it throws fails the message
/// like a handler's (`errc::handler_failed`).
using filter = std::function<bool(const inbound_message&)>;

/// Ready-made filters.
namespace filters {
/// Messages of type `t` (text, button, image, location...).
filter type(message_type t);
/// Image, audio, video, document or sticker.
filter media();
/// A pressed button; with `data`, only a button whose data equals it.
filter button(std::string data = {});
/// A shared location.
filter location();
/// An edit of an earlier message.
filter edited();
/// Every filter holds.
filter all(std::vector<filter> fs);
/// Some filter holds.
filter any(std::vector<filter> fs);
} // namespace filters

/// Runs around what a message reaches: the conversation waiting in its
/// chat, the flow triggers and the handlers. Call `next()` to go on (at
/// most once: later calls do nothing); return without calling it to
/// consume the message. Before `next()` a middleware may change the message
/// through `ctx.edit_message()` (a voice note's transcript in `text`, a
/// detected `language`): the rest of the chain sees the change, and it
/// travels with an answer a cut step saved for handover (the replica that
/// resumes the step does not run middleware on that answer again). An
/// exception fails the message like a handler's.
using middleware = std::function<void(context& ctx,
                                      const std::function<void()>& next)>;

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

/// What happens to non-persistent flows when another replica takes a chat.
enum class handover_flows {
  /// They live in the memory of the replica that runs them: lost on a
  /// change of replica (the message is routed as a new one).
  keep,
  /// A checkpoint per step, marked ephemeral (it expires `ttl` after its
  /// last write), so the taker resumes them like persistent flows.
  forward,
};

/// What the replica that takes a chat does with a conversation it cannot
/// resume (see `handover_options::fallback`).
enum class handover_fallback {
  /// Nothing: the message is routed as usual (no marker is written).
  drop,
  /// Answers `notify_message` and consumes the message.
  notify,
  /// Enters the conversation again by name, from its beginning and with its
  /// initial state (what ran before its first wait runs again); the message
  /// starts it.
  restart,
};

/// Your migration for a conversation that cannot be resumed: `ctx` is the
/// message that woke it (reply through it). Return true when you consumed
/// the message; false routes it as usual. An exception becomes an
/// `events::error` (`errc::handler_failed`) and the message is routed.
using handover_function = std::function<bool(const handover_info&, context&)>;

/// Handing conversations over between replicas (spec: "Relevo de
/// conversaciones"). Persistent flows always resume from their checkpoint.
///
/// Costs: `forward` writes a checkpoint at the start of each step and at
/// every wait of non-persistent flows (like `.persistent()`), plus one when
/// the first answer of a step arrives (see below); a fallback other than
/// `drop` makes each conversation that cannot be serialized write two small
/// records: a marker when it first waits and its removal when it ends
/// (and the marker again at a wait once half its `ttl` passed, so it does
/// not lapse while the conversation lives).
///
/// A cut step keeps its answer: when the first question of a step of a
/// checkpointed flow gets its answer, the answer is written into the
/// checkpoint before the step goes on, embedded if its encoding fits
/// `max_answer_bytes`. If the step is then cut (settle, a lost turn), the
/// taker gives it that answer instead of asking again, and keeps the
/// message that woke it for the next question.
struct handover_options {
  handover_flows flows = handover_flows::keep;
  /// For conversations that cannot be serialized (`bot::conversation`, a
  /// forwarded flow whose state holds binary data or a non-finite number)
  /// and for checkpoints of a flow that changed (a different fingerprint,
  /// a missing step: reason "changed").
  std::variant<handover_fallback, handover_function> fallback
    = handover_fallback::drop;
  /// Life of an ephemeral checkpoint (and of a marker) after its last
  /// write; never shorter than the timeout of the wait it records. 5 min
  /// when unset. Must be > 0 (field "handover.ttl").
  std::optional<duration> ttl{};
  /// The text of `notify`; the localized `core.conversation.interrupted`
  /// when empty.
  std::string notify_message{};
  /// Largest saved answer embedded in a checkpoint (its JSON encoding),
  /// 16 KiB; a larger one is not saved (the step asks again). Must be > 0
  /// (field "handover.max_answer_bytes").
  std::size_t max_answer_bytes = default_max_answer_bytes;
  /// Handover messages: a replica releasing a chat whose next turn is
  /// already waiting hands that next holder the checkpoint of the chat's
  /// conversation with the grant, so a conversation changing replica
  /// resumes without reading the store. Used only when it provably is the
  /// latest: it is written by the release that grants the turn, in the
  /// same atomic step, so nobody held the chat in between, and the taker's
  /// first write is a compare-and-set on its revision (a copy the store
  /// moved past is refused as `superseded` before anything is sent). A
  /// grant found otherwise (a poll, an expired holder, a lost
  /// push), a chat without a conversation ("none" is never handed: a
  /// holder's late write could not be told apart), or a checkpoint over
  /// 64 KiB reads the store, which stays the truth. Costs the checkpoint's
  /// JSON once more per such release. Off: every change of replica reads
  /// the store.
  bool message = true;
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
  /// turn is released. A step that still runs 1 s later (deaf to its stop
  /// token) keeps the chat's later messages on this replica waiting (at
  /// most `turn_wait`, then an `errc::coordination_unavailable` error
  /// event), but not the chat: their turns go back to the other replicas.
  duration settle = "1m";
  /// Polling while waiting for a turn goes from 5 ms up to this; a push
  /// from the releasing replica usually ends the wait first.
  duration max_poll = "100ms";
  botmesh::provider_session session = botmesh::provider_session::automatic;
  /// A leader whose transport stays closed this long yields, waits a few
  /// seconds and presents itself again.
  duration provider_down = "1m";
  /// Conversations moving between replicas (see `handover_options`).
  handover_options handover{};
};

/// Durable processing: every inbound message is journaled on arrival and
/// handled to completion at least once, across restarts and replicas.
///
/// Guarantees, with a backend shared by the replicas (Redis; a SQLite file
/// shared by processes of one host):
/// - A message is recorded before it takes its turn (and before the
///   provider's `accepted` notice, so a webhook answers only then). A
///   platform message already recorded within the retry window is a
///   duplicate: dropped, counted in `bot_stats::duplicates`, whatever
///   replica got it first.
/// - Acks follow the checkpoint: a record is confirmed only once its
///   handler finished while the turn still held (its sends and checkpoint
///   writes landed). A turn lost or cut (settle, a lease lost, a refused
///   checkpoint or send, a store failure, no turn within `turn_wait`, the
///   bot stopping first) releases the record, which is handled again.
/// - A replica that dies (or freezes past `lease`) leaves its records
///   held: another replica claims them after `lease` and re-injects them in
///   arrival order. The messages waiting for their turn on a dead replica
///   are not lost. A released or re-injected message takes a new ticket:
///   messages of its chat that reached a live replica meanwhile may be
///   handled before it.
/// - A backend failure strands nothing: when a confirm or release fails,
///   or a claim's reply is lost, the replica journals and claims under a
///   new holder name from its next beat on, and retires the old one once
///   the messages it holds in process are settled; what the old one still
///   held is then claimed and handled again (a failed confirm: handled
///   twice, its sends skipped by the outbox).
/// - A journal write that fails may have landed (its reply lost): the
///   provider hears the error, and the chat's later messages are still
///   recorded and accepted but wait until that message is settled (its
///   retry recorded anew, its record taken over, or shown never to have
///   landed), or at most two `lease`s, then an `errc::store_error` event
///   names what they may overtake. So a chat keeps its order across a
///   journal outage without holding up a poller's other chats.
/// - Outbox: every send of a journaled turn has a deterministic id (the
///   record and the send's position in the turn) and the turn's fence; a
///   replayed step skips the sends it made before (`bot_stats::
///   outbox_skipped`), and a send under a fence lower than one the chat
///   already sent with is refused with `lease_lost_error` ("superseded").
///   The entry is written before the provider is called: a crash between
///   the two loses that send (at most once per id). On a record's first
///   attempt no earlier send of it can exist, so the entry is queued to
///   the backend without waiting for its verdict (the record is settled
///   only once its entries landed; one that failed is written again at
///   each beat until it does; the fence is checked
///   locally, as for every send, and a late `fenced` verdict is reported
///   as an `errc::lease_lost` error event); from the second attempt on
///   each send waits for the verdict, and so does a first attempt whose
///   replica's journal heartbeat may have lapsed since the record was
///   written (a freeze, a backend outage: another replica may have claimed
///   it and sent). A crash in the microseconds between
///   queuing that entry and the backend writing it can let a replay send
///   again. A send that failed, or whose verdict never came (a lost
///   reply), is taken back before its record is released, so the replay
///   makes it; the take-back removes only the entry that turn wrote, never
///   an earlier attempt's (which may have been sent). A replica cut off
///   from the backend past its journal lease before its take-back lands
///   can lose that send (another replica takes the record over and skips
///   it): at most once, never twice.
///
/// A handler whose effects are not sends may run more than once for one
/// message (after a crash): make them idempotent.
///
/// Costs per message: one backend write on arrival (async), one at the end
/// of the turn (async), one per send (async on the first attempt; the
/// handler thread waits for it on a replay); a beat per `lease`/3 per
/// replica, and one at `start()` (which waits for it).
struct durability_options {
  /// Where the journal and the outbox live (memory, SQLite, Redis).
  /// Required.
  std::shared_ptr<durable_backend> backend{};
  /// Names this replica in the backend (a pod or host name); a random id
  /// when empty. A nonce is added per process, so a restarted replica with
  /// the same id never passes for the dead one.
  std::string instance_id{};
  /// A replica whose heartbeat is older than this is dead and its records
  /// are claimed by others; it beats every lease/3. Defaults to the
  /// coordinator's lease, else 15s.
  std::optional<duration> lease{};
  /// A record handled (and released) this many times is given up with an
  /// `errc::handler_failed` error event, so a message that kills every
  /// replica does not circulate forever. The event comes at least once:
  /// the record is marked done only after a replica raised it.
  std::uint32_t max_attempts = 5;
  /// Most records claimed per beat.
  std::size_t claim_batch = 256;
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
  /// Record chats and every inbound/outbound message (with its text) in the
  /// store: the conversation history the store keeps. Turn it off when the
  /// store must hold no message content (see the README's privacy notes).
  bool log_messages = true;
  /// The process's log level (see log.hpp), applied when the bot is
  /// constructed; unset leaves it as it is (`warn` by default: errors and
  /// warnings to stderr).
  std::optional<log::level> log_level{};
  /// Lets user message text appear in log lines (error events logged with
  /// their message). Off by default: lines name the chat and the message id
  /// only. `true` turns it on for the whole process.
  bool log_message_text = false;
  /// Only when the bot owns its actor system: CAF worker threads (0 = one
  /// per core) and messages an actor may handle before yielding its worker
  /// (finite, so one busy chat cannot starve the others).
  std::size_t scheduler_threads = 0;
  std::size_t max_throughput = 32;
  /// Coordination with other replicas; without it nothing of it runs.
  std::optional<coordination_options> coordination{};
  /// Durable processing (see `durability_options`). Without it, inbound
  /// redeliveries are still dropped per process (`max_remembered_ids` ids
  /// for `retry_window`), and a message is lost if the process dies before
  /// its turn.
  std::optional<durability_options> durability{};
  /// How long an inbound message id is remembered to drop redeliveries:
  /// the platform's retry window (`provider_capabilities::retry_window`
  /// when unset). Only ids the provider gave are deduplicated.
  std::optional<duration> retry_window{};
  /// Without durability: most ids remembered in the process.
  std::size_t max_remembered_ids = 100'000;
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

  /// `base` with every option set in the environment applied: the option
  /// `stop_timeout` is read from `BOTMESH_STOP_TIMEOUT`, `coordination.
  /// turn_wait` from `BOTMESH_COORDINATION_TURN_WAIT` (the README's table
  /// lists them all, with defaults and units). Variables not set leave
  /// `base` as it is. A `coordination.*` or `durability.*` variable creates
  /// that section when `base` has none (its coordinator or backend is still
  /// the application's to set). Throws `invalid_argument_error` whose
  /// `field()` is the option's name and whose text names the variable and
  /// the value, for a value that does not parse.
  static bot_options from_env(bot_options base);
  static bot_options from_env(); ///< from_env(bot_options{})

  /// `base` with the options of an INI file applied:
  ///
  ///   stop_timeout = 30s          ; top level, or under [bot]
  ///   [coordination]
  ///   turn_wait = 1m
  ///
  /// Keys as in the README's table; `;` and `#` start comments; values may
  /// be quoted. Throws `invalid_argument_error` naming the file, the line
  /// and the option for a malformed line, an unknown option, a bad value or
  /// an option set twice, and `botmesh::error` (`errc::invalid_argument`)
  /// when the file cannot be read (or is a directory).
  static bot_options from_file(const std::string& path, bot_options base);
  static bot_options from_file(const std::string& path); ///< with bot_options{}
};

/// One option `bot_options::from_env` and `from_file` read.
struct option_info {
  std::string_view key;     ///< "stop_timeout", "coordination.turn_wait"
  std::string_view env;     ///< "BOTMESH_STOP_TIMEOUT"
  std::string_view unit;    ///< "duration", "count", "bool", "text"...
  std::string_view fallback; ///< the default, as text
  std::string_view help;
};

/// Every option of the configuration, in the README table's order.
const std::vector<option_info>& configuration_options();

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
  std::uint64_t duplicates = 0;     ///< redeliveries dropped at intake
  std::uint64_t reprocessed = 0;    ///< journal records claimed and run again
  std::uint64_t outbox_skipped = 0; ///< sends a replayed step had made already
  /// Failed journal writes, and records confirmed after they were no
  /// longer held here (also reported as `lease_lost`).
  std::uint64_t journal_errors = 0;
  /// From an exclusive transport whose leadership had lapsed (a transport
  /// thread that ran on after a freeze): left for the replica that leads.
  std::uint64_t refused_not_leader = 0;
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

  /// Handlers are tried in registration order; the first that matches a
  /// message takes it, so one registered after a handler that takes all its
  /// messages can never run: registering it logs a warning naming both.

  /// Handles every message no earlier-registered handler matched.
  bot& on_message(handler h);

  /// Handles the command `name` (without '/', ASCII case ignored): "/start",
  /// "/start ref-42", "/start@my_bot ref-42" in a group (see the provider's
  /// `username` to refuse commands for other bots). `context::payload()`
  /// holds what follows the command. Empty name: field "command".
  bot& command(std::string name, handler h);

  /// Handles a message `f` accepts: `bot.when(filters::media(), h)`. Null
  /// filter: field "filter".
  bot& when(filter f, handler h);

  /// Adds a middleware (see `middleware`); they run in registration order,
  /// the first outermost. Before `start()` only (field "handler").
  bot& use(middleware m);

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
  /// `events::message_out`, `events::lease_lost`, `events::leader`,
  /// `events::follower`, `events::handover`.
  template <class Event>
  bot& on(std::function<void(const Event&)> listener);

  /// Starts the store, the actors and the provider. Idempotent. After a
  /// `stop()` that came first (a bot runs once) it throws `botmesh::error`
  /// (`errc::stopped`). A start that throws (the provider's, a durable
  /// backend's) gives back what it made: the bot is not started, and
  /// start() may be called again.
  void start();

  /// Graceful stop: stops intake (later messages are refused as
  /// `errc::stopped`), waits up to `stop_timeout` for queued and running
  /// turns (the transport stays up so they can answer), then refuses what
  /// is still queued, fires the handlers' stop token, waits for running
  /// handlers to return and stops the provider. Idempotent. With
  /// durability it also waits, without a bound, for the journal operations
  /// in flight (each completes, at worst with its backend's timeout; a
  /// warning names a backend that keeps it waiting, every 10 s): their
  /// callbacks refer to the bot. It returns once the router and the chat
  /// actors (which refer to the bot) have ended, and the destructor once
  /// the scheduler's actors have too; the bot's other actors end as they
  /// give their last answer. So an application's actor system keeps none
  /// of them. These waits need a CAF worker: with a system of one worker,
  /// do not stop or destroy a bot from inside an actor.
  ///
  /// Called from one of this bot's own handlers (a message handler, a
  /// scheduled task: an admin command that shuts the bot down), it would
  /// wait for that handler: it then returns at once, the stop runs on a
  /// thread of its own (its handler's stop token fires as the others'),
  /// and `run()`, the next `stop()` from another thread and the destructor
  /// wait for it. The same from a listener that a provider's delivery runs
  /// on the provider's own thread (a refusal's error event): stopping the
  /// provider there would wait for that very thread. And from a listener
  /// that an event of the stop's own end runs on the thread reporting it
  /// (a journal operation that fails after the handler pool stopped): the
  /// stop waits for that operation. (Not from a task on
  /// `scheduler_options::executor`: those threads are not known, and such
  /// a task waits for itself.)
  void stop();

  /// `start()`, then waits until the provider's input ends, `stop()` is
  /// called from elsewhere, or the process gets SIGTERM or SIGINT, then
  /// `stop()` (which drains within `stop_timeout`). Returns 0.
  ///
  /// While it waits, run() handles SIGTERM and SIGINT itself (the previous
  /// handlers are restored when it returns); an application that handles
  /// signals its own way blocks them, or calls start()/stop() instead.
  /// A bot runs once: a second run(), or run() after stop(), throws
  /// `botmesh::error` (`errc::stopped`).
  int run();

  /// Waits until the provider's transport is open; false on timeout. On a
  /// standby replica of an exclusive transport it stays false.
  bool ready(std::chrono::milliseconds timeout);

  /// Without waiting, as a function: true while the provider's transport
  /// is open and this replica runs it (it leads an exclusive transport, or
  /// shares it). What `/readyz` answers. Stays valid (and false) after the
  /// bot is gone, for HTTP routes that may outlive it. Cost per call: two
  /// atomic loads.
  std::function<bool()> readiness() const;

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

  /// The bot as a typed actor (see bot_actor.hpp): how an application's
  /// actors deliver messages to the bot (validated, stamped and counted
  /// like a provider's, answered once accepted) and subscribe to what it
  /// sends and the events it raises. Valid from construction until the bot
  /// is destroyed; before `start()` and after `stop()` deliveries are
  /// refused with `errc::stopped`.
  bot_actor actor() const;

  /// Internal: the router actor, which takes only the runtime's own
  /// (already validated) chat events. Deliver through `actor()`.
  [[deprecated("internal: deliver messages through bot::actor()")]]
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
template <>
bot& bot::on<events::handover>(std::function<void(const events::handover&)>);

} // namespace botmesh
