#pragma once

// Internal: runs flows and conversations for the bot, one chat turn at a
// time. Every method for a chat key is called from that chat's turn, so a
// conversation is never touched by two threads at once.

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include <botmesh/actors/turn_token.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/flow.hpp>
#include <botmesh/stores/store.hpp>

namespace botmesh {

struct flow::definition {
  enum class kind { ask, code };

  struct step_def {
    std::string name;
    kind k = kind::code;
    std::string question;
    flow::answer_handler on_answer;
    ask_options opts;
    flow::step_fn fn;
  };

  std::string name;
  std::vector<std::string> keywords;
  std::vector<botmesh::pattern> patterns;
  std::vector<step_def> steps;
  bool persistent = false;
  /// A `bot::conversation`: one coroutine whose stack cannot be saved, so
  /// it is never checkpointed (only its waiting marker).
  bool coroutine = false;

  std::optional<std::size_t> index_of(std::string_view step) const;
  bool triggered_by(std::string_view text) const;
};

namespace internal {

/// FNV-1a of a flow's name and its steps' names and kinds, as 16 hex digits.
std::string fingerprint_of(const flow::definition& d);

/// True when `j` survives a JSON round trip unchanged: no binary values and
/// no NaN or infinite numbers (which a dump turns into null).
bool is_plain_json(const nlohmann::json& j);

/// When an ephemeral checkpoint written at `now` expires: `ttl` after it,
/// but never before the timeout of the wait it records (`wait`, 0 = none)
/// and 10 s more: the timer's turn, armed just before the write, reads it
/// (a turn whose last holder is unknown checks its copy against it).
time_point ephemeral_expiry(time_point now, std::chrono::milliseconds ttl,
                            std::chrono::milliseconds wait);

/// The engine's handover settings (from `coordination_options::handover`).
struct handover_config {
  enum class fallback_kind { drop, notify, restart, custom };
  /// With coordination: another replica may have written this chat's
  /// checkpoint, of any kind, so the store is read on activation even
  /// without persistent flows; markers are written only then.
  bool coordinated = false;
  bool forward = false;
  /// Without coordination (no markers) only a changed persistent flow
  /// falls back: the user is told, as before handover settings existed.
  fallback_kind fallback = fallback_kind::notify;
  std::chrono::milliseconds ttl{std::chrono::minutes{5}};
  std::string notify_message{}; // empty: the localized default
  std::size_t max_answer_bytes = default_max_answer_bytes;
  /// Hand the chat's checkpoint to the next holder with the release (see
  /// `flow_engine::hand`).
  bool hand_over = true;
};

/// What the engine needs from the bot. `turn` is the chat's current turn
/// with coordination (null without): every visible effect checks it first.
class flow_host {
 public:
  virtual ~flow_host() = default;
  virtual void send_to_chat(const std::string& key, const inbound_message& to,
                            std::string_view text, const turn_token* turn)
    = 0;
  virtual botmesh::store& flow_store() = 0;
  virtual void arm_timer(const std::string& key, std::chrono::milliseconds after,
                         std::uint64_t id) = 0;
  virtual void raise_error(errc code, std::string what, const std::string& key,
                           const inbound_message* msg) = 0;
  virtual std::stop_token flow_stop_token(const turn_token* turn) = 0;
  virtual const std::string& lang() const = 0;
  /// Raises `events::handover`.
  virtual void handover_event(const std::string& key, const std::string& name,
                              std::string_view outcome,
                              std::string_view reason)
    = 0;
  /// Runs the user's fallback function; true when it consumed `msg`.
  virtual bool handover_custom(const handover_info& info,
                               const inbound_message& msg,
                               const turn_token* turn)
    = 0;
};

struct conversation {
  conversation(flow_engine& e, std::string k) : engine(e), key(std::move(k)) {
    // nop
  }

  struct idle_watch {
    std::chrono::milliseconds after{};
    std::function<void(flow_context&)> fn;
    std::uint64_t timer = 0;
  };

  enum class next { none, go_to, end };

  flow_engine& engine;
  std::string key;
  /// The turn the conversation runs in now (valid during a turn only).
  const turn_token* turn = nullptr;
  const flow::definition* def = nullptr;
  std::size_t step = 0;
  nlohmann::json state = nlohmann::json::object();
  inbound_message current;
  flow_task task;
  std::coroutine_handle<> resume_point;
  answer* answer_slot = nullptr;
  bool waiting = false;
  std::string question;            // the question being waited for
  ask_options ask_opts;            // its validator and timeout
  std::uint32_t answers_in_step = 0;
  std::uint32_t waiting_question = 0;
  std::optional<inbound_message> preloaded; // resume rule: answers question 0
  /// The message that woke a conversation whose cut step had its answer
  /// saved: it answers the next question.
  std::optional<inbound_message> kept;
  bool* kept_used = nullptr;    // set while restore() runs
  bool* answer_saved = nullptr; // set while a message is offered
  /// The live checkpoint at `revision` is a waiting marker.
  bool marker = false;
  std::uint64_t revision = 0;
  /// When the checkpoint at `revision` expires (an ephemeral one): past
  /// it the store has forgotten it, and refuses a write or clear against
  /// `revision` although nobody else wrote.
  std::optional<time_point> lapses_at;
  /// The checkpoint at `revision` as written or read (what a handover
  /// message carries); meaningful while `revision != 0`.
  flow_checkpoint stored;
  time_point created{};
  std::uint64_t wait_timer = 0;
  std::vector<idle_watch> idles;
  next pending = next::none;
  std::string goto_flow;
  std::string goto_step;
  bool superseded = false;
  flow_context ctx{*this};
};

class flow_engine {
 public:
  explicit flow_engine(flow_host& host);

  /// Before any message: the handover settings.
  void configure(handover_config cfg);

  /// Registers a flow; names are unique (field "name"). `coroutine` marks a
  /// `bot::conversation`.
  void add(flow f, bool coroutine = false);

  /// Offers a message: true when a conversation consumed it. The store is
  /// asked for a checkpoint only when one may exist that this process does
  /// not hold in memory: on the first message of the chat actor's
  /// activation (`first`), or after `drop(key)`. Otherwise every message
  /// of a chat without a conversation would cost a store read.
  ///
  /// `answer_saved` (optional) is set when a checkpoint write that landed
  /// keeps `msg` as a saved answer: its effect survives a cut of the step.
  bool on_message(const std::string& key, const inbound_message& msg,
                  bool first, const turn_token* turn = nullptr,
                  bool* answer_saved = nullptr);

  /// False when timer `id` can no longer do anything: its wait was
  /// answered, its watcher re-armed or fired, its conversation gone. Its
  /// chat then takes no turn for it: with coordination a stale timer's turn
  /// moved the chat to this replica and back, and the replica holding the
  /// live conversation dropped it as a copy another replica may have moved
  /// on. Thread-safe (the router asks).
  bool timer_live(std::uint64_t id) const;

  /// A timer of `key` fired; stale ones are discarded. True when it ran
  /// something (a wait's timeout, an idle watcher), false for a stale one.
  bool on_timer(const std::string& key, std::uint64_t id,
                const turn_token* turn = nullptr);

  /// Discards the chat's in-memory conversation (its checkpoint stays), so
  /// its next message reads the checkpoint. Called from the chat's turn.
  void drop(const std::string& key);

  /// The activation's first message did not reach the flows (a middleware
  /// answered it, its record failed): the next message looks at the store
  /// instead. A conversation in memory is kept (it is what the store holds,
  /// or newer).
  void look_later(const std::string& key);

  /// A turn whose previous holder is unknown (the coordinator forgot the
  /// idle chat: its key expired, an eviction): the conversation in memory
  /// is kept only while the store's checkpoint is still the one it wrote
  /// last (another replica's turn would have moved or cleared it), so a
  /// long wait's timer still fires on the replica where it waits. Otherwise
  /// as `drop`. Costs one store read when a conversation is in memory; a
  /// read that fails drops it and raises an error naming the chat.
  void check_unknown_holder(const std::string& key);

  /// As `drop`, but the previous holder handed the chat's checkpoint over
  /// with the release that granted this turn (`turn_token::handed`, made by
  /// `on_message` / `on_timer` there): the next message resumes from it
  /// without reading the store. A payload that cannot be decoded, an
  /// ephemeral checkpoint about to expire, or a chat this replica had
  /// marked for a store read is ignored (the store is read).
  void hand(const std::string& key, std::string_view handed);

  /// The chat's coordinated turn is over: what was handed to it and not
  /// used is forgotten (the next message reads the store).
  void end_turn(const std::string& key);

  /// Conversations in memory (for statistics and tests).
  std::size_t active() const;

  // -- used by flow_context and ask_awaiter ----------------------------------

  void send(conversation& c, std::string_view text);
  /// Writes the conversation's checkpoint in its mode (see `cp_mode`);
  /// `saved` is an answer to keep in it (question 0 of the step).
  void checkpoint(conversation& c, bool waiting, std::uint32_t question,
                  const inbound_message* saved = nullptr);
  /// Arms a timer of `c` in `timer` for `after` from now (none, 0, when
  /// `after` is empty); the timer it held before can do nothing more (see
  /// `timer_live`).
  void rearm(conversation& c, std::uint64_t& timer,
             std::optional<std::chrono::milliseconds> after);
  flow_host& host() noexcept {
    return host_;
  }

 private:
  conversation* find(const std::string& key);
  conversation& create(const std::string& key);
  void erase(const std::string& key);
  bool offer(const std::string& key, const inbound_message& msg, bool first,
             const turn_token* turn, bool* answer_saved);
  /// `handed`: the live checkpoint handed over (see `hand`); read from the
  /// store when empty.
  bool restore(const std::string& key, const inbound_message& msg,
               const turn_token* turn, bool* answer_saved,
               std::optional<flow_checkpoint> handed = {});
  /// Leaves on `turn` what the engine knows the store holds for `key` now,
  /// for the next holder (see `hand`); nothing when it does not know.
  void note_handoff(const std::string& key, const turn_token* turn) noexcept;
  /// What the store holds for `key` may differ from memory (a write that
  /// failed or was refused): nothing is handed over and the next message
  /// without a conversation reads the store.
  void uncertain(const std::string& key);
  // This conversation's ephemeral checkpoint has expired by now.
  bool lapsed(const conversation& c) const;
  /// A write refused because the store moved past `revision`: the turn is
  /// lost (an error event) and the chat uncertain.
  void superseded(const std::string& key, std::string_view flow,
                  std::uint64_t revision, const inbound_message& msg);
  /// Handover messages are made and used (coordinated, not turned off).
  bool hands_over() const noexcept {
    return cfg_.coordinated && cfg_.hand_over;
  }
  bool fire(const std::string& key, std::uint64_t id, const turn_token* turn);
  void fence(const conversation& c) const;
  void start(const flow::definition& def, const std::string& key,
             const inbound_message& msg, const turn_token* turn);
  void begin_step(conversation& c);
  void drive(conversation& c);
  void finish(conversation& c, bool clear);
  void deliver(conversation& c, answer a);
  const flow::definition* flow_named(std::string_view name) const;

  static flow_task run_ask_step(flow_context& c,
                                const flow::definition::step_def& sd);

  /// How a conversation is checkpointed now: `full` (persistent), an
  /// `ephemeral` checkpoint (forwarded), a waiting `marker` (cannot be
  /// serialized, a fallback wants it), or `none`.
  enum class cp_mode { none, full, ephemeral, marker };
  cp_mode mode_of(const conversation& c) const;
  bool looks_for_checkpoints() const;
  bool fallback(const std::string& key, const inbound_message& msg,
                const turn_token* turn, handover_info info);

  flow_host& host_;
  std::vector<std::shared_ptr<const flow::definition>> flows_;
  bool any_persistent_ = false;
  handover_config cfg_;
  mutable std::mutex mtx_;
  std::unordered_map<std::string, std::unique_ptr<conversation>> convs_;
  std::unordered_set<std::string> dropped_; // see on_message
  /// Handed checkpoints not yet used by a message.
  std::unordered_map<std::string, flow_checkpoint> handed_;
  std::atomic<std::uint64_t> next_timer_{1};
  /// Timers armed and not yet fired, re-armed or gone with their
  /// conversation (see `timer_live`), under their own mutex: the router
  /// asks for every timer, and must not wait behind mtx_, which a handler
  /// thread holds while it encodes a checkpoint.
  mutable std::mutex timers_mtx_;
  std::unordered_set<std::uint64_t> live_timers_;

  // Timer `id` can do nothing more (0: none); every timer of `c`.
  void disarm(std::uint64_t id);
  void disarm_all(const conversation& c);
};

} // namespace internal
} // namespace botmesh
