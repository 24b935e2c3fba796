#include <botmesh/runtime/bot.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include <caf/all.hpp>
#include <fmt/format.h>

#include <botmesh/actors/internal/caf_logger.hpp>
#include <botmesh/actors/internal/end_actors.hpp>
#include <botmesh/actors/journal_actor.hpp>
#include <botmesh/actors/lease_actor.hpp>
#include <botmesh/actors/messages.hpp>
#include <botmesh/actors/router.hpp>
#include <botmesh/actors/session_actor.hpp>
#include <botmesh/actors/turn_token.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/internal/deferred_stop.hpp>
#include <botmesh/runtime/core/internal/delivery_id.hpp>
#include <botmesh/runtime/core/internal/text.hpp>
#include <botmesh/runtime/core/internal/worker_pool.hpp>
#include <botmesh/runtime/core/json.hpp>
#include <botmesh/runtime/core/log.hpp>
#include <botmesh/runtime/core/metrics.hpp>
#include <botmesh/runtime/internal/bot_actor_link.hpp>
#include <botmesh/runtime/internal/dedupe_set.hpp>
#include <botmesh/runtime/internal/durable_intake.hpp>
#include <botmesh/runtime/internal/flow_engine.hpp>
#include <botmesh/stores/memory_store.hpp>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::event_ptr)

namespace botmesh {

using internal::ascii_iequals;
using internal::trim;

namespace {

// The bot whose deliver() runs on this thread (a provider's thread): a
// stop() from a listener it runs there must not run there (see stop()).
class delivering {
 public:
  explicit delivering(const void* bot) : previous_(current_) {
    current_ = bot;
  }
  ~delivering() {
    current_ = previous_;
  }
  delivering(const delivering&) = delete;
  delivering& operator=(const delivering&) = delete;

  static bool in(const void* bot) {
    return current_ == bot;
  }

 private:
  static thread_local const void* current_;
  const void* previous_;
};

thread_local const void* delivering::current_ = nullptr;

// How long a flow timer that got no turn waits before it tries again,
// after `retries` earlier failures: 1 s, doubling, at most 30 s.
std::chrono::seconds timer_retry_delay(std::uint32_t retries) {
  return std::chrono::seconds{retries >= 5 ? 30 : 1 << retries};
}

// While a bot reports an acceptance to its provider on this thread: the
// events it accepts meanwhile (handed over from that report) wait here, to
// be sent after the one being reported.
class accepting_scope {
 public:
  accepting_scope(const void* bot, std::vector<event_ptr>& after)
    : previous_bot_(bot_), previous_(after_) {
    bot_ = bot;
    after_ = &after;
  }
  ~accepting_scope() {
    bot_ = previous_bot_;
    after_ = previous_;
  }
  accepting_scope(const accepting_scope&) = delete;
  accepting_scope& operator=(const accepting_scope&) = delete;

  static std::vector<event_ptr>* of(const void* bot) {
    return bot_ == bot ? after_ : nullptr;
  }

 private:
  static thread_local const void* bot_;
  static thread_local std::vector<event_ptr>* after_;
  const void* previous_bot_;
  std::vector<event_ptr>* previous_;
};

thread_local const void* accepting_scope::bot_ = nullptr;
thread_local std::vector<event_ptr>* accepting_scope::after_ = nullptr;

struct route {
  enum kind_t { any, keywords, regex, command, filtered } kind;
  std::vector<std::string> words; // the keywords, or the command's name
  std::optional<botmesh::pattern> re;
  filter pred;
  handler fn;

  // How the registration reads, for the shadowing warning.
  std::string describe() const {
    switch (kind) {
      case any:
        return "on_message";
      case keywords:
        return fmt::format("hears(\"{}\")", fmt::join(words, "\", \""));
      case regex:
        return "hears(pattern)";
      case command:
        return fmt::format("command(\"{}\")", words.front());
      case filtered:
        return "when(filter)";
    }
    return {};
  }
};

// The warning of issue "a second handler with the same keyword is silently
// ignored": what of `r` the routes before it already take.
void warn_if_shadowed(const std::vector<route>& before, const route& r,
                      std::string_view bot_id) {
  log::fields f{.bot = bot_id};
  auto never = [&](const route& e) {
    log::warn("bot",
              fmt::format("handler {} (#{}) can never run: the earlier {} "
                          "takes every message it would match",
                          r.describe(), before.size() + 1, e.describe()),
              f);
  };
  std::vector<std::string> open = r.words; // keywords no earlier route takes
  for (auto& e : before) {
    if (e.kind == route::any) {
      never(e);
      return;
    }
    if (e.kind != r.kind || (r.kind != route::keywords && r.kind != route::command))
      continue;
    std::erase_if(open, [&](const std::string& w) {
      for (auto& x : e.words)
        if (ascii_iequals(x, w)) {
          if (r.words.size() > 1)
            log::warn("bot",
                      fmt::format("keyword \"{}\" of handler {} is taken "
                                  "by the earlier {}",
                                  w, r.describe(), e.describe()),
                      f);
          return true;
        }
      return false;
    });
    if (open.empty()) {
      never(e);
      return;
    }
  }
}

template <class Event>
using listeners = std::vector<std::function<void(const Event&)>>;

template <class Event>
void emit(const listeners<Event>& ls, const Event& ev) {
  for (auto& f : ls) {
    try {
      f(ev);
    } catch (const std::exception& e) {
      log::error("bot", fmt::format("an event listener threw: {}", e.what()));
    } catch (...) {
      log::error("bot", "an event listener threw");
    }
  }
}

} // namespace

struct bot::impl final : chat_services,
                         provider_host,
                         internal::flow_host,
                         lease_listener,
                         session_hooks,
                         internal::durable_host {
  impl(bot& owner, bot_options o) : self(owner), opts(std::move(o)) {
    if (!opts.provider)
      throw invalid_argument_error("provider",
                                   "bot_options.provider is required");
    if (!opts.store)
      opts.store = std::make_shared<memory_store>();
    if (opts.max_pending_per_chat == 0)
      throw invalid_argument_error(
        "max_pending_per_chat", "bot_options.max_pending_per_chat must be > 0");
    if (opts.passivate_after.count() <= 0)
      throw invalid_argument_error("passivate_after",
                                   "bot_options.passivate_after must be > 0");
    if (opts.log_level)
      log::set_level(*opts.log_level);
    if (opts.log_message_text)
      log::set_log_text(true);
    // It is a metrics label, a log field and part of the durable task
    // namespace: bytes that are not UTF-8 would make every /metrics scrape
    // of the process invalid.
    if (!is_valid_utf8(opts.bot_id))
      throw invalid_argument_error("bot_id",
                                   "bot_options.bot_id is not valid UTF-8");
    provider_id = opts.provider->id();
    retry_window = opts.retry_window ? opts.retry_window->ms()
                                     : opts.provider->capabilities().retry_window;
    if (retry_window.count() <= 0)
      throw invalid_argument_error("retry_window",
                                   "bot_options.retry_window must be > 0");
    // A provider's window is plain milliseconds (not a capped duration):
    // now + a larger one overflows, every record and remembered id would
    // be expired on arrival, and duplicates would be handled again.
    if (retry_window > std::chrono::hours{24 * 36'500})
      throw invalid_argument_error(
        "retry_window",
        fmt::format("the retry window of provider {} ({} ms) is over 100 "
                    "years",
                    provider_id, retry_window.count()));
    if (opts.durability) {
      auto& d = *opts.durability;
      if (!d.backend)
        throw invalid_argument_error("durability.backend",
                                     "durability needs a backend");
      if (d.max_attempts == 0)
        throw invalid_argument_error("durability.max_attempts",
                                     "durability.max_attempts must be > 0");
      if (d.claim_batch == 0)
        throw invalid_argument_error("durability.claim_batch",
                                     "durability.claim_batch must be > 0");
      auto lease = d.lease ? d.lease->ms()
                   : opts.coordination && opts.coordination->coordinator
                     ? opts.coordination->coordinator->lease()
                     : std::chrono::milliseconds{15'000};
      if (lease.count() < 3)
        throw invalid_argument_error("durability.lease",
                                     "durability.lease must be >= 3ms");
      durable = std::make_unique<internal::durable_intake>(
        d,
        fmt::format("{}/{}",
                    d.instance_id.empty() ? detail::random_uuid()
                                          : d.instance_id,
                    detail::random_token()),
        lease, retry_window, *this);
    } else {
      if (opts.max_remembered_ids == 0)
        throw invalid_argument_error("max_remembered_ids",
                                     "bot_options.max_remembered_ids must be > 0");
      dedupe = std::make_unique<internal::dedupe_set>(
        opts.max_remembered_ids, retry_window, clock::system());
    }
    auto sched_opts = opts.scheduler;
    if (sched_opts.ns.empty())
      sched_opts.ns = task_namespace(opts.bot_id, provider_id,
                                     opts.provider->connection_id());
    // With coordination, the scheduler's leadership uses the same
    // coordinator unless one was given (its TTL is the coordinator's lease):
    // held by the lease actor, so it is renewed in its batch.
    if (opts.coordination && opts.coordination->coordinator
        && !sched_opts.lease) {
      auto lease = opts.coordination->coordinator->lease();
      sched_leadership = std::make_shared<lease_actor_leadership>(lease);
      sched_opts.lease = sched_leadership;
      sched_opts.leader_ttl = duration{lease};
    }
    pending_sched_opts = std::move(sched_opts);
    if (opts.coordination) {
      check_coordination(*opts.coordination);
      flows.configure(handover_settings(opts.coordination->handover));
    }
  }

  // Checked when the bot is made, naming the field: a zero wait gives up
  // every queued message at once, a zero settle cuts every step as it
  // starts, a zero poll spins against the coordinator.
  static void check_coordination(const coordination_options& co) {
    auto positive = [](const duration& d, const char* field) {
      if (d.count() <= 0)
        throw invalid_argument_error(field, fmt::format("{} must be > 0", field));
    };
    positive(co.turn_wait, "coordination.turn_wait");
    positive(co.settle, "coordination.settle");
    positive(co.max_poll, "coordination.max_poll");
    positive(co.provider_down, "coordination.provider_down");
  }

  // Checked when the bot is made, naming the field.
  static internal::handover_config handover_settings(const handover_options& h) {
    using fk = internal::handover_config::fallback_kind;
    internal::handover_config cfg;
    cfg.coordinated = true;
    cfg.forward = h.flows == handover_flows::forward;
    if (auto* k = std::get_if<handover_fallback>(&h.fallback)) {
      cfg.fallback = *k == handover_fallback::notify    ? fk::notify
                     : *k == handover_fallback::restart ? fk::restart
                                                        : fk::drop;
    } else {
      if (!std::get<handover_function>(h.fallback))
        throw invalid_argument_error("handover.fallback",
                                     "handover.fallback: an empty function");
      cfg.fallback = fk::custom;
    }
    if (h.ttl) {
      if (h.ttl->count() <= 0)
        throw invalid_argument_error("handover.ttl", "handover.ttl must be > 0");
      cfg.ttl = h.ttl->ms();
    }
    if (h.max_answer_bytes == 0)
      throw invalid_argument_error("handover.max_answer_bytes",
                                   "handover.max_answer_bytes must be > 0");
    cfg.max_answer_bytes = h.max_answer_bytes;
    cfg.notify_message = h.notify_message;
    cfg.hand_over = h.message;
    return cfg;
  }

  // The scheduler's actors live in the bot's actor system: created once the
  // system is known (owned or the application's).
  void make_tasks() {
    pending_sched_opts.system = sys;
    tasks = std::make_unique<botmesh::scheduler>(std::move(pending_sched_opts));
  }

  // The bot's actor (bot_actor.hpp), made with the bot so an application
  // can subscribe before start(). It takes messages through deliver() and
  // gets the events from listeners registered here, before any of the
  // application's (they cost an atomic load while nobody subscribed).
  void make_actor() {
    actor_link = std::make_unique<internal::bot_actor_link>(*sys, *this);
    auto* l = actor_link.get();
    on_in.push_back(
      [l](const events::message_in& e) { l->message_in(e.key, e.message); });
    on_out.push_back(
      [l](const events::message_out& e) { l->outgoing(e.message); });
    on_lost.push_back([l](const events::lease_lost& e) { l->lease_lost(e); });
    on_leader.push_back([l](const events::leader& e) { l->leader(e); });
    on_follower.push_back([l](const events::follower& e) { l->follower(e); });
    on_handover.push_back([l](const events::handover& e) { l->handover(e); });
  }

  // -- flow_host -------------------------------------------------------------

  void send_to_chat(const std::string& key, const inbound_message& to,
                    std::string_view text, const turn_token* turn) override {
    outgoing_message out;
    out.chat = to.chat;
    out.text = std::string{text};
    out.reply_to = to.id;
    send(std::move(out), &key, turn);
  }

  botmesh::store& flow_store() override {
    return *opts.store;
  }

  void arm_timer(const std::string& key, std::chrono::milliseconds after,
                 std::uint64_t id) override {
    arm_timer(key, after, id, 0);
  }

  // `retries`: how many times the timer got no turn so far.
  void arm_timer(const std::string& key, std::chrono::milliseconds after,
                 std::uint64_t id, std::uint32_t retries) {
    caf::delayed_anon_send(router_handle, after, timer_atom::value, key, id,
                           retries);
  }

  void raise_error(errc code, std::string what, const std::string& key,
                   const inbound_message* msg) override {
    raise(code, std::move(what), key,
          msg ? std::optional<inbound_message>{*msg} : std::nullopt);
  }

  // The turn's stop token (settle, a lost lease, and the bot's stop are
  // forwarded to it), or the bot's own without coordination.
  std::stop_token flow_stop_token(const turn_token* turn) override {
    return turn ? turn->stop_token() : stop_source.get_token();
  }

  const std::string& lang() const override {
    return opts.lang;
  }

  void handover_event(const std::string& key, const std::string& name,
                      std::string_view outcome,
                      std::string_view reason) override {
    if (on_handover.empty())
      return;
    post_event([this, ev = events::handover{key, name, std::string{outcome},
                                            std::string{reason}}] {
      emit(on_handover, ev);
    });
  }

  // The user's migration runs in the chat's turn, like a handler.
  bool handover_custom(const handover_info& info, const inbound_message& msg,
                       const turn_token* turn) override {
    auto& fn = std::get<handover_function>(opts.coordination->handover.fallback);
    context ctx{self, info.key, msg, turn};
    try {
      return fn(info, ctx);
    } catch (const lease_lost_error&) {
      throw; // the turn ended: reported by the handler's caller
    } catch (const std::exception& e) {
      ++handler_errors;
      raise(errc::handler_failed,
            fmt::format("chat {}: the handover fallback of {} failed: {}",
                        info.key, info.name, e.what()),
            info.key, msg);
    } catch (...) {
      ++handler_errors;
      raise(errc::handler_failed,
            fmt::format("chat {}: the handover fallback of {} failed",
                        info.key, info.name),
            info.key, msg);
    }
    return false;
  }

  // -- lease_listener (on the lease actor's thread: never block) ------------

  void turn_lost(const std::string& key, std::uint64_t,
                 turn_end why) override {
    lease_losses.inc();
    post_event([this, key, reason = std::string{to_string(why)}] {
      emit(on_lost, events::lease_lost{key, reason});
    });
  }

  // -- session_hooks ---------------------------------------------------------

  // The last wish is applied by one job at a time on the transport's own
  // thread (starting and stopping block): behind a backlog of handlers on
  // the handler pool, a replica that lost the leadership would keep its
  // transport (a poller) running beside the new leader's. Posted as a job
  // each, a start and the stop after it could run at once on two threads,
  // or the stop first, leaving the transport running on a replica that no
  // longer leads.
  void set_transport(bool open, std::function<void()> applied) override {
    std::unique_lock guard{switch_.mtx};
    switch_.want = open;
    if (!switch_.applying && switch_.is == open) {
      guard.unlock();
      if (applied)
        applied();
      return;
    }
    if (applied)
      switch_.applied.push_back(std::move(applied));
    if (switch_.applying)
      return; // the running job sees the new wish
    switch_.applying = true;
    guard.unlock();
    transport_pool->post([this] { apply_transport(); });
  }

  void apply_transport() {
    bool start_failed = false;
    std::unique_lock guard{switch_.mtx};
    while (switch_.is != switch_.want) {
      bool open = switch_.want;
      guard.unlock();
      start_failed = false;
      try {
        if (open) {
          {
            std::lock_guard run_guard{run_mtx};
            closed_since = std::chrono::steady_clock::now();
          }
          opts.provider->start(*this);
        } else {
          opts.provider->stop();
        }
      } catch (const std::exception& e) {
        // Taken as done (a stop still runs, for what a failed start left
        // behind): a transport that did not start stays closed.
        log::error("bot", fmt::format("{} the transport failed: {}",
                                      open ? "starting" : "stopping",
                                      e.what()));
        start_failed = open;
      }
      guard.lock();
      switch_.is = open;
      if (open)
        switch_.start_failed = start_failed;
    }
    switch_.applying = false;
    auto applied = std::move(switch_.applied);
    switch_.applied.clear();
    guard.unlock();
    for (auto& f : applied)
      f();
    // The leadership goes at once rather than after provider_down: a
    // standby may start where this replica could not (it presents itself
    // again after the rest, and tries again when elected).
    if (start_failed)
      yield_leadership("start_failed");
  }

  std::optional<std::chrono::steady_clock::duration> closed_for() override {
    std::lock_guard guard{run_mtx};
    if (transport == provider_state::open)
      return std::nullopt;
    return std::chrono::steady_clock::now() - closed_since;
  }

  // On the transport's thread, behind the switch the session asked for
  // before: in the order the session raised them, one at a time, and a
  // leader event after its transport's start returned.
  void leader(const std::string& name, std::uint64_t fence) override {
    transport_pool->post([this, name, fence] {
      // "Leads and started it": not said for a start that failed (its
      // "start_failed" follower event comes next).
      {
        std::lock_guard guard{switch_.mtx};
        if (switch_.start_failed)
          return;
      }
      emit(on_leader, events::leader{name, fence});
    });
  }

  void follower(const std::string& name, const std::string& reason) override {
    transport_pool->post([this, name, reason] {
      emit(on_follower, events::follower{name, reason});
    });
  }

  // Listeners run on the handler pool: user code, which may block, never
  // runs on an actor's thread.
  void post_event(std::function<void()> fn) {
    if (pool)
      pool->post(std::move(fn));
  }

  // -- coordinated turns -----------------------------------------------------

  // One event holding its granted turn. A chat held elsewhere since this
  // replica's last turn drops its stale in-memory conversation first; a
  // turn that ended while the step ran drops it after (its checkpoint stays
  // for the next holder).
  void coordinated_turn(const std::string& key, chat_event& ev, bool first,
                        const std::shared_ptr<turn_token>& token) {
    if (held_elsewhere(*token)) {
      // What the previous holder handed over with its release spares the
      // store read of the chat's checkpoint.
      if (!token->handed().empty())
        flows.hand(key, token->handed());
      else if (!token->previous_holder())
        flows.check_unknown_holder(key);
      else
        flows.drop(key);
      if (token->previous_holder())
        handoffs.inc(); // the chat's last turn ran on another replica
    }
    // A bot stop stops the turn's step too.
    std::stop_callback forward{stop_source.get_token(),
                               [t = token] { t->request_stop(); }};
    if (ev.is_timer()) {
      try {
        // A timer that found nothing to run (its conversation went on
        // elsewhere, and this replica's copy was dropped above) changed
        // nothing: its turn leaves the chat's last holder as it was, or
        // the replica holding the live conversation would drop it.
        if (!flows.on_timer(key, ev.timer, token.get()))
          token->changed_nothing();
      } catch (...) {
        raise(errc::handler_failed,
              fmt::format("chat {}: a flow timer failed: {}", key,
                          internal::what_of(std::current_exception())),
              key, std::nullopt);
      }
    } else {
      dequeued(ev, true);
      internal::durable_turn dt{&ev.journal, &key, token->fence(), ev.attempt,
                                ev.heartbeat_epoch, ev.journal_gen};
      turn_outcome outcome = turn_outcome::failed;
      bool answer_saved = false;
      {
        internal::durable_turn_scope scope{ev.journal.empty() ? nullptr : &dt};
        outcome = handle_message(key, ev.message, first, token.get(),
                                 &answer_saved);
      }
      // Acks follow the checkpoint: a cut step whose answer (this message)
      // a landed checkpoint keeps has kept its effect.
      settle_record(key, ev, (!dt.lost && token->valid()) || answer_saved);
      ev.end(outcome);
    }
    flows.end_turn(key);
    if (!token->valid())
      flows.drop(key);
  }

  // True when another (or an unknown) replica held the chat last: what this
  // replica has in memory of its conversation may be stale.
  bool held_elsewhere(const turn_token& t) const {
    auto& prev = t.previous_holder();
    return !prev || *prev != opts.coordination->coordinator->replica_id();
  }

  // -- owned actor system ----------------------------------------------------

  void own_system() {
    cfg = std::make_unique<caf::actor_system_config>();
    configure_scheduler(*cfg, opts.scheduler_threads, opts.max_throughput);
    configure_actor_system(*cfg);
    owned_sys = std::make_unique<caf::actor_system>(*cfg);
    internal::release_caf_logger();
    sys = owned_sys.get();
  }

  // -- chat_services ---------------------------------------------------------

  void run_turn(const std::string& key, event_ptr ev, bool first,
                std::shared_ptr<turn_token> turn,
                std::function<void()> done) override {
    pool->post([this, key, ev = std::move(ev), first, turn = std::move(turn),
                done = std::move(done)]() mutable {
      turn->step_started(); // settle counts from here, not from the queue
      // Past the stop bound while it waited for a handler thread: refused
      // as an uncoordinated event is; the chat actor releases the turn.
      try {
        if (!refused_past_stop(key, ev->ev))
          coordinated_turn(key, ev->ev, first, turn);
        else
          turn->changed_nothing(); // (refused, or a timer skipped)
      } catch (...) {
        // Past every catch of its own (see the uncoordinated drain job):
        // logged, and the turn still ends, or the chat would wait for ever.
        log::error("chat", fmt::format("chat {}: a turn threw: {}", key,
                                       internal::what_of(std::current_exception())));
      }
      ev.reset(); // the last reference: freed before the chat goes on
      done();
    });
  }

  // Past the stop bound, what is left is refused like the messages still
  // queued in the chat actor (a timer is skipped). True when it was.
  bool refused_past_stop(const std::string& key, chat_event& ev) {
    if (!stop_source.stop_requested())
      return false;
    if (!ev.is_timer())
      refused(key, std::move(ev), errc::stopped,
              fmt::format("chat {}: the bot stopped before this message's "
                          "turn",
                          key));
    return true;
  }

  void run_event(const std::string& key, chat_event& ev, bool first) override {
    if (refused_past_stop(key, ev))
      return;
    if (ev.is_timer()) {
      timer_turn(key, ev.timer);
      return;
    }
    run_uncoordinated(key, ev, first);
  }

  void run_uncoordinated(const std::string& key, chat_event& ev, bool first) {
    dequeued(ev, true);
    internal::durable_turn dt{&ev.journal, &key, 0, ev.attempt,
                              ev.heartbeat_epoch, ev.journal_gen};
    turn_outcome outcome = turn_outcome::failed;
    {
      internal::durable_turn_scope scope{ev.journal.empty() ? nullptr : &dt};
      outcome = handle_message(key, ev.message, first, nullptr);
    }
    settle_record(key, ev, !dt.lost);
    ev.end(outcome);
  }

  // -- durable processing (durable_host) -------------------------------------

  // The end of a journaled event: confirmed when its effect was kept,
  // released (to be handled again) otherwise.
  void settle_record(const std::string& key, const chat_event& ev, bool keep) {
    if (durable && !ev.journal.empty())
      durable->settle(key, ev, keep);
  }

  // A journaled event refused before its handler ran because this replica
  // stops (or its chat ended): released with its attempt given back, so
  // rolling restarts alone never give a record up. (An overloaded chat's
  // refusals, and turns that never came, spend theirs: given back, they
  // would be claimed again at every beat for as long as the cause lasts,
  // ahead of every newer record, and end only at the journal's ttl,
  // unreported.)
  void give_back_record(const std::string& key, const chat_event& ev) {
    if (durable && !ev.journal.empty())
      durable->give_back(key, ev);
  }

  void acknowledge(delivery_callbacks& cb, const std::string& id) override {
    if (auto* note = internal::receipt_of(cb))
      note->id = id; // stamped when it came without one
    report_then_send(cb, nullptr);
  }

  void refuse_write(delivery_callbacks& cb, errc code) override {
    report_then_send(cb, nullptr, code);
  }

  void reinject(chat_event ev) override {
    enqueued(ev);
    auto box = make_event(std::move(ev));
    // Inside an acceptance report on this thread (a held chat's messages
    // routed from it, accepted ones waiting there): after those, in order.
    if (auto* outer = accepting_scope::of(this)) {
      outer->push_back(std::move(box));
      return;
    }
    to_router(std::move(box)); // (refused once the router ended)
  }

  void refuse_parked(const std::string& key, chat_event ev,
                     delivery_callbacks cb, bool taken_over) override {
    if (!taken_over)
      ++received; // (a claimed record counts as reprocessed)
    enqueued(ev);
    ev.on_end = std::move(cb.turn_ended);
    refused(key, std::move(ev), errc::stopped,
            fmt::format("chat {}: a message held behind a failed journal "
                        "write when the bot stopped",
                        key));
  }

  void report(errc code, std::string what, std::string key,
              std::function<void()> then) override {
    post_event([this, code, what = std::move(what), key = std::move(key),
                then = std::move(then)] {
      raise(code, what, key, std::nullopt);
      if (then)
        then();
    });
  }

  void post(std::function<void()> job) override {
    pool->post(std::move(job));
  }

  // Only a replica that can send takes records over (ready_now), and not
  // one that stops: a record it claimed would lengthen the drain, or, once
  // the drain ended, get no turn and be released with an attempt spent
  // (max_attempts of them and it is given up). The live replicas take it.
  bool may_claim() override {
    return !stopped.load() && ready_now();
  }

  void turn_failed(const std::string& key, chat_event ev,
                   std::string why) override {
    ++turn_failures;
    dequeued(ev, false);
    // Called on the chat actor: the error listeners (user code that may
    // block) run on the handler pool, or a burst of failed turns while
    // Redis is down would hold the CAF workers the lease actor needs.
    if (ev.is_timer()) {
      // Tried again later while its conversation still waits on it:
      // dropped, the wait would never end (until the user wrote). After 1 s,
      // doubling up to 30 s: while the coordination is down, every waiting
      // conversation's timer fails, each with an error event.
      bool again = !stopped.load() && flows.timer_live(ev.timer);
      auto delay = timer_retry_delay(ev.attempt);
      raise_later(errc::coordination_unavailable,
                  fmt::format("chat {}: a flow timer got no turn {}{}", key,
                              why,
                              again ? fmt::format(" (tried again in {}s)",
                                                  delay.count())
                                    : std::string{}),
                  key, std::nullopt);
      if (again)
        arm_timer(key, delay, ev.timer, ev.attempt + 1);
      return;
    }
    settle_record(key, ev, false);
    ev.end(turn_outcome::failed);
    auto id = ev.message.id;
    raise_later(errc::coordination_unavailable,
                fmt::format("chat {}: message {} got no turn {}", key, id, why),
                key, std::move(ev.message));
  }

  // raise() on the handler pool (on this thread once the pool is shut
  // down), for callers on an actor's thread. One job at a time drains them
  // in the order they were raised: refusals of one chat are reported in
  // the order its messages came, whatever the pool's size.
  void raise_later(errc code, std::string what, std::string key,
                   std::optional<inbound_message> msg) {
    auto job = [this, code, what = std::move(what), key = std::move(key),
                msg = std::move(msg)]() mutable {
      raise(code, std::move(what), std::move(key), std::move(msg));
    };
    if (!pool) {
      job();
      return;
    }
    {
      std::lock_guard guard{later_mtx};
      later.emplace_back(std::move(job));
      if (later_draining)
        return;
      later_draining = true;
    }
    post_event([this] {
      for (;;) {
        std::function<void()> next;
        {
          std::lock_guard guard{later_mtx};
          if (later.empty()) {
            later_draining = false;
            return;
          }
          next = std::move(later.front());
          later.pop_front();
        }
        try {
          next();
        } catch (...) {
          // A listener's exception must not stop the ones queued after it.
        }
      }
    });
  }

  // A refusal of what an application's actor delivered, made on the bot
  // actor's CAF worker, where listeners (user code, which may block) never
  // run. While the bot accepts, they run on the handler pool, as
  // raise_later's do. Before start() and once it stops there is no pool
  // to take them (and listeners may still be being registered before
  // start): the event goes to the subscribed actors and the log only; the
  // sender has the refusal as its answer.
  void raise_from_actor(errc code, std::string what, std::string key,
                        std::optional<inbound_message> msg) {
    if (accepting.load()) {
      raise_later(code, std::move(what), std::move(key), std::move(msg));
      return;
    }
    if (actor_link)
      actor_link->error(code, what, key, msg);
    log_error_event(code, what, key, msg ? &*msg : nullptr, 0);
  }

  std::mutex later_mtx;
  std::deque<std::function<void()>> later; // raise_later's, in order
  bool later_draining = false;

  void timer_turn(const std::string& key, std::uint64_t id) {
    try {
      flows.on_timer(key, id, nullptr);
    } catch (...) {
      raise(errc::handler_failed,
            fmt::format("chat {}: a flow timer failed: {}", key,
                        internal::what_of(std::current_exception())),
            key, std::nullopt);
    }
  }

  void refused(const std::string& key, chat_event ev, errc code,
               std::string why) override {
    if (code == errc::overloaded)
      ++refused_overload;
    else
      ++refused_stopped;
    dequeued(ev, false);
    // Journaled: released, so another replica (or this one, restarted)
    // handles it.
    if (code == errc::stopped)
      give_back_record(key, ev);
    else
      settle_record(key, ev, false);
    ev.end(turn_outcome::refused);
    raise_later(code, std::move(why), key, std::move(ev.message));
  }

  void chat_activated(const std::string&) override {
    ++activations;
  }

  void chat_passivated(const std::string&) override {
    ++passivations;
  }

  bool timer_live(std::uint64_t id) override {
    return flows.timer_live(id);
  }

  // -- provider_host ---------------------------------------------------------

  std::stop_token stopping() const override {
    return stop_source.get_token();
  }

  void deliver(inbound_message msg) override {
    delivery_callbacks none;
    delivering scope{this};
    intake(msg, none);
  }

  void deliver(inbound_message msg, delivery_callbacks cb) override {
    delivering scope{this};
    intake(msg, cb);
  }

  // Both deliver()s: by reference from here on, so the message is moved
  // once more only, into the event that carries it to its turn.
  void intake(inbound_message& msg, delivery_callbacks& cb) {
    // Raised as an error event, with the message, and answered.
    auto refuse = [&](errc code, const std::string& why, std::string key) {
      auto* note = internal::receipt_of(cb); // from the bot's actor
      if (note) {
        raise_from_actor(code, why, std::move(key), std::move(msg));
        note->why = why; // the bot's actor answers with it
      } else if (accepting_scope::of(this)) {
        // Handed over from an acceptance report, which runs on a journal
        // backend's thread: no listener (user code, which may block) runs
        // there.
        raise_later(code, why, std::move(key), std::move(msg));
      } else {
        raise(code, why, std::move(key), std::move(msg));
      }
      if (cb.accepted)
        cb.accepted(code);
    };
    if (msg.provider.empty())
      msg.provider = provider_id;
    // Only a platform's own ids identify redeliveries; ours are unique per
    // bot instance (a random prefix), so replicas never collide.
    bool platform_id = !msg.id.empty();
    if (msg.id.empty())
      msg.id = local_id();
    if (msg.timestamp == time_point{})
      msg.timestamp = clock::system().now();
    try {
      validate(msg, opts.limits);
    } catch (const invalid_argument_error& e) {
      ++refused_invalid;
      refuse(errc::invalid_argument, e.what(),
             msg.chat.empty() ? std::string{} : chat_key(msg));
      return;
    }
    auto key = chat_key(msg);
    if (!accepting.load()) {
      ++refused_stopped;
      refuse(errc::stopped,
             fmt::format("chat {}: message arrived while the bot is stopped", key),
             key);
      return;
    }
    if (exclusive() && !internal::receipt_of(cb) && !leads_now()) {
      // The transport's thread ran on after a freeze (or the leadership
      // went while it was handing a batch on): another replica may lead
      // and poll the same updates. Left to it, not handled twice: the
      // poller keeps its offset, a webhook answers with a retryable status.
      // (What the application's actors deliver, with a receipt, does not
      // come through the transport: it is taken on any replica.)
      ++refused_not_leader;
      refuse(errc::provider_not_leader,
             fmt::format("chat {}: message arrived through provider:{} while "
                         "this replica's leadership had lapsed",
                         key, provider_id),
             key);
      return;
    }
    if (opts.durability) {
      durable->journal(std::move(key), std::move(msg), std::move(cb));
      return;
    }
    if (platform_id
        && !dedupe->insert(journal_id(key, internal::delivery_id(msg)))) {
      duplicate(std::move(cb));
      return;
    }
    accept(make_event(std::move(key), std::move(msg)), cb);
  }

  // "<provider>-<prefix>-<n>": the id of a message that came without one.
  std::string local_id() {
    char digits[24];
    auto end = std::to_chars(digits, digits + sizeof digits, ++next_id).ptr;
    return internal::join('-', {provider_id, id_prefix,
                                std::string_view(digits, end - digits)});
  }

  void accept(chat_event ev, delivery_callbacks cb) override {
    accept(make_event(std::move(ev)), cb);
  }

  // Counts an accepted event and hands it to the router. The turn-end
  // notice travels with it, through the chat actor to the end of its turn.
  // The provider hears of the acceptance before the turn can start (a reply
  // in a webhook's answer is held from then on). A message the provider
  // hands over from that very report (a WhatsApp POST's next message of
  // the chat), and accepted at once on this thread, is sent after this
  // one: sent at its own acceptance, it would overtake it.
  void accept(event_ptr box, delivery_callbacks& cb) {
    ++received;
    auto& ev = box->ev;
    if (auto* note = internal::receipt_of(cb))
      note->id = ev.message.id; // stamped when it came without one
    enqueued(ev);
    ev.on_end = std::move(cb.turn_ended);
    // The whole event: its queue time travels with it too.
    report_then_send(cb, std::move(box));
  }

  // Reports an acceptance (or a duplicate's, with no `box`; or with
  // `code`, a refusal), then sends `box` and what was accepted during the
  // report, in that order. Inside another report on this thread, `box`
  // waits with that one's events.
  void report_then_send(delivery_callbacks& cb, event_ptr box,
                        errc code = errc::none) {
    if (auto* outer = accepting_scope::of(this)) {
      if (box)
        outer->push_back(std::move(box));
      report_acceptance(cb, code);
      return;
    }
    std::vector<event_ptr> after;
    if (cb.accepted) { // (nothing is handed over from no report)
      accepting_scope scope{this, after};
      report_acceptance(cb, code);
    }
    if (box)
      to_router(std::move(box));
    for (auto& b : after)
      to_router(std::move(b));
  }

  // Hands an accepted event to the router, or, once end_router closed it
  // (a delivery that passed the intake's check before stop() and reached
  // here after), refuses it as the draining router would have: sent to
  // the ended router, it would vanish unreported. The check and the send
  // are one step for end_router, which waits for those in flight.
  void to_router(event_ptr box) {
    sending.fetch_add(1);
    if (!router_closed.load()) {
      caf::anon_send(router_handle, std::move(box));
    } else {
      auto& key = box->key;
      refused(key, std::move(box->ev), errc::stopped,
              fmt::format("chat {}: a message accepted as the bot stopped "
                          "came after its chats had ended",
                          key));
    }
    sending.fetch_sub(1);
  }

  // Tells the provider. What it throws is logged: the caller (a journal
  // write's completion) must go on, and the event is accepted all the same.
  void report_acceptance(delivery_callbacks& cb, errc code) noexcept {
    if (!cb.accepted)
      return;
    try {
      cb.accepted(code);
    } catch (...) {
      log::error("bot", fmt::format("an acceptance report threw: {}",
                                    internal::what_of(std::current_exception())),
                 {.bot = opts.bot_id});
    }
  }

  void duplicate(delivery_callbacks cb) override {
    ++duplicates;
    if (auto* note = internal::receipt_of(cb))
      note->duplicate = true;
    report_then_send(cb, nullptr);
    if (cb.turn_ended)
      cb.turn_ended(turn_outcome::duplicate);
  }

  // Another connection is live (Telegram's 409): the session actor steps
  // down as on provider_down, and presents itself again later.
  bool yield_leadership(std::string_view reason) override {
    auto h = session_handle; // set once, before the transport starts
    if (!h)
      return false;
    caf::anon_send(h, yield_atom::value, std::string{reason});
    return true;
  }

  void state_changed(provider_state s) override {
    {
      std::lock_guard guard{run_mtx};
      // Not open since it left open: a poller that lost the platform says
      // "connecting" while it retries, and that counts as down too.
      if (s != provider_state::open && transport == provider_state::open)
        closed_since = std::chrono::steady_clock::now();
      transport = s;
      transport_open->store(s == provider_state::open);
      run_cv.notify_all();
    }
    // Records are taken over only while the transport is open: look for
    // them now rather than a period later.
    if (s == provider_state::open && journal_handle)
      caf::anon_send(journal_handle, beat_now_atom::value);
  }

  // -- exclusive transports ------------------------------------------------

  bool exclusive() const {
    if (!opts.coordination)
      return false;
    switch (opts.coordination->session) {
      case provider_session::leader:
        return true;
      case provider_session::shared:
        return false;
      case provider_session::automatic:
        return opts.provider->capabilities().exclusive_session;
    }
    return false;
  }

  // The replica runs the transport only while elected for provider:<id>:
  // the session actor asks the lease actor to present it.
  void start_session() {
    auto& co = *opts.coordination;
    session_config sc;
    sc.lease = lease_handle;
    sc.name = "provider:" + provider_id;
    sc.provider_down = co.provider_down.ms();
    sc.period = co.coordinator->lease() / 3;
    sc.rest = std::max(co.coordinator->lease(), std::chrono::milliseconds{3000});
    sc.hooks = this;
    sc.leading = leading_flag;
    sc.leading_until = leading_until;
    session_handle = spawn_session_actor(*sys, std::move(sc));
    // Presented only now: the transport it may start must find the handle
    // set (yield_leadership reads it from the transport's threads).
    caf::anon_send(session_handle, start_atom::value);
  }

  // Leading, and within the validity the lease actor last confirmed (the
  // flag alone may be stale after a freeze, until the lease actor runs).
  static bool lead_valid(const std::atomic<bool>& leading,
                         const std::atomic<std::int64_t>& until) {
    return leading.load()
           && std::chrono::steady_clock::now().time_since_epoch().count()
                < until.load();
  }

  bool leads_now() const {
    return lead_valid(*leading_flag, *leading_until);
  }

  bool leads() const override {
    return !exclusive() || leads_now();
  }

  void input_closed() override {
    std::lock_guard guard{run_mtx};
    input_done = true;
    run_cv.notify_all();
  }

  // -- turns -----------------------------------------------------------------

  // Writes the message into the chat's log. False when that failed: the
  // message is then not handled (an error event says so; with durability
  // its journal record is released and the message handled again), so the
  // log never misses a message the bot answered.
  bool record(const std::string& key, const inbound_message& msg, bool first,
              std::uint64_t fence) {
    if (!opts.log_messages)
      return true;
    try {
      if (first)
        record_chat(key, msg);
      opts.store->append_message(
        key, logged_message{0, direction::in, msg.id, msg.sender, msg.text,
                            msg.type, msg.timestamp});
      return true;
    } catch (...) {
      // Anything a store throws (a custom one need not throw std types): an
      // escape would end the process from the handler thread.
      raise(errc::store_error,
            fmt::format("chat {}: recording message {} failed, so it is not "
                        "handled: {}",
                        key, msg.id, internal::what_of(std::current_exception())),
            key, msg, fence);
      return false;
    }
  }

  // Records the message, then runs its handlers. The activation's first
  // message makes the flows look at the store; one that never reaches them
  // (the store failed to record it, a middleware answered it itself) leaves
  // that look to the next message.
  turn_outcome handle_message(const std::string& key,
                              const inbound_message& msg, bool first,
                              const turn_token* turn,
                              bool* answer_saved = nullptr) {
    bool routed = false;
    auto outcome = turn_outcome::failed;
    if (record(key, msg, first, turn ? turn->fence() : 0))
      outcome = run_handlers(key, msg, first, turn, answer_saved, &routed);
    if (first && !routed)
      flows.look_later(key);
    return outcome;
  }

  // Never throws: every failure of a handler is an error event.
  turn_outcome run_handlers(const std::string& key, const inbound_message& msg,
                            bool first, const turn_token* turn,
                            bool* answer_saved, bool* routed) {
    auto outcome = turn_outcome::failed;
    auto began = std::chrono::steady_clock::now();
    // Every way out of this function (handled, failed) is one observation.
    struct observe_latency {
      metrics::histogram& h;
      std::chrono::steady_clock::time_point t0;
      ~observe_latency() {
        h.observe(std::chrono::steady_clock::now() - t0);
      }
    } latency_guard{handler_latency, began};
    emit(on_in, events::message_in{key, msg});
    try {
      if (middlewares.empty()) {
        route_message(key, msg, first, turn, answer_saved, routed);
      } else {
        auto copy = msg;
        run_middleware(0, key, copy, first, turn, answer_saved, routed);
      }
      outcome = turn_outcome::handled;
    } catch (const lease_lost_error& e) {
      // The turn was lost while the handler ran: its write was refused.
      raise(errc::lease_lost,
            fmt::format("chat {}: message {}: {}", key, msg.id, e.what()), key,
            msg, turn ? turn->fence() : 0);
    } catch (const error& e) {
      // A store that failed under the handler keeps its code: with
      // durability the message is then handled again.
      auto code = e.code() == errc::store_error || e.code() == errc::timeout
                    ? e.code()
                    : errc::handler_failed;
      ++handler_errors;
      raise(code,
            fmt::format("chat {}: handler failed on message {}: {}", key,
                        msg.id, e.what()),
            key, msg, turn ? turn->fence() : 0);
    } catch (const std::exception& e) {
      ++handler_errors;
      raise(errc::handler_failed,
            fmt::format("chat {}: handler failed on message {}: {}", key,
                        msg.id, e.what()),
            key, msg, turn ? turn->fence() : 0);
    } catch (...) {
      ++handler_errors;
      raise(errc::handler_failed,
            fmt::format("chat {}: handler failed on message {}", key, msg.id),
            key, msg, turn ? turn->fence() : 0);
    }
    ++handled;
    return outcome;
  }

  void record_chat(const std::string& key, const inbound_message& msg) {
    chat_record rec;
    if (auto old = opts.store->get_chat(key))
      rec = std::move(*old);
    rec.key = key;
    rec.provider = msg.provider;
    rec.chat = msg.chat;
    rec.participant = msg.participant;
    rec.last_message_at = msg.timestamp;
    if (rec.created_at == time_point{})
      rec.created_at = msg.timestamp;
    opts.store->save_chat(rec);
  }

  void dispatch(const std::string& key, const inbound_message& msg,
                const turn_token* turn) {
    context ctx{self, key, msg, turn};
    auto text = trim(msg.text);
    for (auto& r : routes) {
      switch (r.kind) {
        case route::any:
          r.fn(ctx);
          return;
        case route::keywords:
          for (auto& w : r.words) {
            if (ascii_iequals(text, w)) {
              r.fn(ctx);
              return;
            }
          }
          break;
        case route::regex:
          if (r.re->search(msg.text, &ctx.matches_)) {
            r.fn(ctx);
            return;
          }
          break;
        case route::command:
          if (!msg.command.empty() && ascii_iequals(msg.command, r.words[0])) {
            r.fn(ctx);
            return;
          }
          break;
        case route::filtered:
          if (r.pred(msg)) {
            r.fn(ctx);
            return;
          }
          break;
      }
    }
  }

  void add_route(route r) {
    check_not_started();
    warn_if_shadowed(routes, r, opts.bot_id);
    routes.push_back(std::move(r));
  }

  // The conversation or flow waiting in the chat, the flow triggers, then
  // the handlers.
  void route_message(const std::string& key, const inbound_message& msg,
                     bool first, const turn_token* turn, bool* answer_saved,
                     bool* routed) {
    *routed = true;
    if (!flows.on_message(key, msg, first, turn, answer_saved))
      dispatch(key, msg, turn);
  }

  // Middleware `i` onwards, around route_message; `msg` is the turn's own
  // copy, which the middleware may change.
  void run_middleware(std::size_t i, const std::string& key,
                      inbound_message& msg, bool first,
                      const turn_token* turn, bool* answer_saved,
                      bool* routed) {
    if (i == middlewares.size()) {
      route_message(key, msg, first, turn, answer_saved, routed);
      return;
    }
    context ctx{self, key, msg, turn, &msg};
    bool called = false;
    std::function<void()> next = [&] {
      if (std::exchange(called, true))
        return;
      run_middleware(i + 1, key, msg, first, turn, answer_saved, routed);
    };
    middlewares[i](ctx, next);
  }

  void send(outgoing_message msg, const std::string* key,
            const turn_token* turn) {
    if (msg.chat.empty())
      throw invalid_argument_error("chat", "send: the chat must not be empty");
    msg.provider = provider_id;
    // Outside a turn only the leader of an exclusive transport sends. A
    // turn's reply is fenced by its chat's turn instead: a replica that
    // yielded the transport (a 409) still holds the chats it is answering,
    // and a platform whose send is a plain API call takes it.
    if (!turn && exclusive() && !leads_now())
      throw provider_not_leader_error(provider_id);
    // Fencing: a step whose turn was lost (or ran past settle) must not
    // answer out of order.
    if (turn)
      turn->check();
    if (key && durable && !durable->outbox_allows(*key))
      return; // a replayed step's send, made before
    try {
      // A wait in the provider gives up once the turn ended.
      opts.provider->send(msg, turn ? turn->ended_token() : std::stop_token{});
    } catch (const botmesh::error&) {
      ++send_errors;
      if (key && durable)
        durable->send_failed(); // a replay sends it, not skips it
      if (turn)
        turn->check(); // given up because the turn ended: say it was lost
      throw;
    } catch (const std::exception& e) {
      ++send_errors;
      if (key && durable)
        durable->send_failed();
      throw botmesh::error(errc::provider_error,
                           fmt::format("send to {} failed: {}", msg.chat,
                                       e.what()));
    }
    ++sent;
    if (opts.log_messages) {
      auto k = key ? *key : chat_key(msg.provider, msg.chat);
      try {
        opts.store->append_message(
          k, logged_message{0, direction::out, msg.reply_to, {}, msg.text,
                            message_type::text, clock::system().now()});
      } catch (...) {
        raise(errc::store_error,
              fmt::format("chat {}: recording an outgoing message failed: {}",
                          k, internal::what_of(std::current_exception())),
              k, std::nullopt);
      }
    }
    emit(on_out, events::message_out{msg});
  }

  // -- metrics ---------------------------------------------------------------

  // An accepted message waits for its turn from here: it counts in the
  // queue depth until its turn starts or it is refused.
  void enqueued(chat_event& ev) {
    if (ev.is_timer())
      return;
    ev.queued_at = std::chrono::steady_clock::now();
    queued.add();
  }

  // It left the queue: `ran` when its turn started (its wait is observed).
  void dequeued(chat_event& ev, bool ran) {
    if (ev.queued_at == std::chrono::steady_clock::time_point{})
      return;
    if (ran)
      turn_wait.observe(std::chrono::steady_clock::now() - ev.queued_at);
    ev.queued_at = {};
    queued.sub();
  }

  // Writes this bot's figures into a scrape (any thread).
  void collect(metrics::exposition& e) {
    std::string_view replica = replica_id();
    metrics::labels ls{{"bot", opts.bot_id}, {"replica", replica}};
    auto s = self.stats();
    e.counter("botmesh_messages_received_total",
              "Inbound messages accepted by intake.", ls, s.received);
    e.counter("botmesh_messages_handled_total",
              "Turns completed (handlers returned or threw).", ls, s.handled);
    e.counter("botmesh_messages_sent_total", "Messages sent by the provider.",
              ls, s.sent);
    auto refused = [&](std::string_view reason, std::uint64_t v) {
      metrics::labels r = ls;
      r.emplace_back("reason", reason);
      e.counter("botmesh_messages_refused_total",
                "Inbound messages refused, by reason.", r, v);
    };
    refused("invalid", s.refused_invalid);
    refused("overloaded", s.refused_overload);
    refused("stopped", s.refused_stopped);
    refused("not_leader", s.refused_not_leader);
    refused("no_turn", s.turn_failures);
    e.counter("botmesh_duplicates_total", "Redeliveries dropped at intake.",
              ls, s.duplicates);
    e.counter("botmesh_handler_errors_total", "Handlers that threw.", ls,
              s.handler_errors);
    e.counter("botmesh_send_errors_total", "Sends the provider failed.", ls,
              s.send_errors);
    e.histogram("botmesh_handler_seconds",
                "Time a message's handlers and flows ran.", ls,
                handler_latency.read());
    e.histogram("botmesh_turn_wait_seconds",
                "Time from intake until a message's turn started.", ls,
                turn_wait.read());
    e.counter("botmesh_lease_losses_total",
              "Chat turns this replica lost (expired, frozen, settle).", ls,
              lease_losses.value());
    e.counter("botmesh_handoffs_total",
              "Turns granted here whose chat last ran on another replica.", ls,
              handoffs.value());
    e.gauge("botmesh_queue_depth",
            "Messages of this replica waiting for their turn.", ls,
            static_cast<double>(std::max<std::int64_t>(0, queued.value())));
    e.gauge("botmesh_live_chats", "Chat actors alive now.", ls,
            static_cast<double>(s.live_chats));
    e.gauge("botmesh_conversations", "Flows and conversations in memory.", ls,
            static_cast<double>(s.conversations));
    e.counter("botmesh_reprocessed_total",
              "Journal records claimed and handled again.", ls, s.reprocessed);
    e.counter("botmesh_journal_errors_total", "Failed journal writes.", ls,
              s.journal_errors);
    if (tasks) {
      auto t = tasks->stats();
      e.counter("botmesh_scheduler_runs_total", "Scheduled task runs.", ls,
                t.runs);
      e.counter("botmesh_scheduler_missed_total",
                "Durable task claims that found their slot missed.", ls,
                t.missed);
      e.counter("botmesh_scheduler_failures_total",
                "Scheduled task runs that threw.", ls, t.failed);
      e.counter("botmesh_scheduler_store_errors_total",
                "Failed schedule store and leader lease calls.", ls,
                t.store_errors);
    }
    e.gauge("botmesh_transport_up", "1 while the provider's transport is open.",
            ls, transport_open->load() ? 1 : 0);
    e.gauge("botmesh_ready",
            "1 while this replica runs the open transport (what /readyz says).",
            ls, ready_now() ? 1 : 0);
  }

  // This replica runs the open transport: it leads an exclusive one, or
  // shares it. What /readyz, ready() and the journal's claims go by.
  // Leading counts while the leadership's validity runs (as for deliver()
  // and send()): a replica whose lease actor stalled past it is not ready.
  static bool ready_test(const std::atomic<bool>& open,
                         const std::atomic<bool>& leading,
                         const std::atomic<std::int64_t>& until,
                         bool exclusive) {
    return open.load() && (!exclusive || lead_valid(leading, until));
  }

  bool ready_now() const {
    return ready_test(*transport_open, *leading_flag, *leading_until,
                      exclusive());
  }

  // `fence`: the turn's, for the log line (0: none, or the journaled
  // turn's on this thread).
  void raise(errc code, std::string what, std::string key,
             std::optional<inbound_message> msg, std::uint64_t fence = 0) {
    // An effect of the journaled turn on this thread was not kept: its
    // record is released and handled again.
    if (auto* t = internal::current_durable_turn();
        t
        && (code == errc::lease_lost || code == errc::store_error
            || code == errc::timeout))
      t->lost = true;
    // Subscribed actors get it too; they do not take the logging over
    // (they are not listeners the application registered on the bot).
    if (actor_link)
      actor_link->error(code, what, key, msg);
    // Nobody listens: the event is logged (once, here), so no failure is
    // silent. A listener takes the event over, logging included.
    if (on_error.empty())
      log_error_event(code, what, key, msg ? &*msg : nullptr, fence);
    emit(on_error, events::error{code, std::move(what), std::move(key),
                                 std::move(msg)});
  }

  void log_error_event(errc code, const std::string& what,
                       const std::string& key, const inbound_message* msg,
                       std::uint64_t fence) {
    // Refusals are the bot protecting itself (or stopping): warnings.
    auto lvl = code == errc::stopped || code == errc::overloaded
                   || code == errc::invalid_argument
                 ? log::level::warn
                 : log::level::error;
    if (!log::enabled(lvl))
      return;
    log::fields f{.bot = opts.bot_id, .chat = key, .replica = replica_id()};
    f.code = to_string(code);
    if (msg)
      f.message_id = msg->id;
    f.fence = fence;
    if (auto* t = internal::current_durable_turn(); t)
      f.fence = t->fence;
    if (msg && log::log_text())
      log::write(lvl, "bot", fmt::format("{} text=\"{}\"", what, msg->text), f);
    else
      log::write(lvl, "bot", what, f);
  }

  // This replica's name in logs: the coordinator's replica id, else empty.
  std::string_view replica_id() const {
    if (opts.coordination && opts.coordination->coordinator)
      return opts.coordination->coordinator->replica_id();
    return {};
  }

  void check_not_started() const {
    if (started)
      throw invalid_argument_error(
        "handler", "handlers and listeners must be registered before start()");
  }

  bot& self;
  bot_options opts;
  std::string provider_id;

  std::unique_ptr<caf::actor_system_config> cfg;
  std::unique_ptr<caf::actor_system> owned_sys;
  caf::actor_system* sys = nullptr;
  caf::actor router_handle;
  std::unique_ptr<internal::worker_pool> pool;
  // An exclusive transport's start and stop and its leader/follower events,
  // one at a time and in order, on one thread of their own (see
  // set_transport).
  std::unique_ptr<internal::worker_pool> transport_pool;
  /// The scheduler's leader lease, held by the lease actor (coordination).
  std::shared_ptr<lease_actor_leadership> sched_leadership;
  internal::deferred_stop stopper; // a stop() from a handler (bot::stop)
  void stop_now(); // bot::stop's work, on the thread that runs it
  // start()'s actors (router, lease and journal actors) and the durable
  // backend's start; undo_start() gives back what a failed one made.
  void spawn_all();
  void undo_start();
  void end_router(); // ends the router and its chats, and waits for them
  void stop_provider() noexcept;
  scheduler_options pending_sched_opts;
  std::unique_ptr<botmesh::scheduler> tasks;
  std::stop_source stop_source;

  std::vector<route> routes;
  std::vector<middleware> middlewares;
  internal::flow_engine flows{*this};
  listeners<events::error> on_error;
  listeners<events::message_in> on_in;
  listeners<events::message_out> on_out;
  listeners<events::lease_lost> on_lost;
  listeners<events::leader> on_leader;
  listeners<events::follower> on_follower;
  listeners<events::handover> on_handover;
  provider_state transport = provider_state::closed; // guarded by run_mtx
  std::chrono::steady_clock::time_point closed_since{};
  caf::actor lease_handle;   // with coordination
  caf::actor session_handle; // with an exclusive transport
  // The exclusive transport's state as the session actor wants it and as
  // applied (see set_transport).
  struct {
    std::mutex mtx;
    bool want = false;
    bool is = false;
    bool applying = false;
    bool start_failed = false; // the last start threw
    std::vector<std::function<void()>> applied;
  } switch_;
  std::shared_ptr<std::atomic<bool>> leading_flag =
    std::make_shared<std::atomic<bool>>(false);
  // steady_clock ticks: see session_config::leading_until.
  std::shared_ptr<std::atomic<std::int64_t>> leading_until =
    std::make_shared<std::atomic<std::int64_t>>(0);

  std::mutex lifecycle_mtx;
  bool started = false;
  // Set when stop() begins. Atomic: may_claim reads it on the journal's
  // thread (nothing is claimed once it is set; before start, ready_now()
  // is false).
  std::atomic<bool> stopped{false};
  bool ran = false; // run() was called (it runs once)
  std::atomic<bool> accepting{false};
  // Closed by end_router before the router ends; `sending` counts the
  // to_router calls between their look at it and their send.
  std::atomic<bool> router_closed{false};
  std::atomic<int> sending{0};

  std::mutex run_mtx;
  std::condition_variable run_cv;
  bool input_done = false;
  bool stop_requested = false;

  std::atomic<std::uint64_t> next_id{0};
  // Ids this bot stamps on messages that came without one: a random prefix
  // per bot instance (from the kernel) and a counter, so ids of other
  // processes and of this one after a restart never repeat.
  std::string id_prefix = detail::random_token().substr(0, 16);

  // Durable processing.
  std::chrono::milliseconds retry_window{};
  std::unique_ptr<internal::durable_intake> durable; // with durability
  std::unique_ptr<internal::dedupe_set> dedupe;      // without durability
  /// Also read by the transport's threads (state_changed): set before the
  /// transport starts, cleared only once it stopped (a send to the actor
  /// once it exited is dropped).
  caf::actor journal_handle;
  std::atomic<std::uint64_t> duplicates{0};
  std::atomic<std::uint64_t> received{0}, handled{0}, refused_invalid{0},
    refused_overload{0}, refused_stopped{0}, refused_not_leader{0},
    handler_errors{0}, sent{0}, send_errors{0}, activations{0}, passivations{0}, turn_failures{0};

  // Metrics (owned here, updated with relaxed atomics; read by scrapes).
  metrics::histogram handler_latency;
  metrics::histogram turn_wait;
  metrics::counter lease_losses;
  metrics::counter handoffs;
  metrics::gauge queued;
  // Shared with readiness probes, which may outlive the bot.
  std::shared_ptr<std::atomic<bool>> transport_open =
    std::make_shared<std::atomic<bool>>(false);
  /// The bot's actor; closed by ~bot before an owned system goes (and,
  /// declared after it, destroyed before it in any case).
  std::unique_ptr<internal::bot_actor_link> actor_link;
  metrics::registry::registration metrics_reg; // last: removed first
};

// -- context ------------------------------------------------------------------

void context::reply(std::string_view text) {
  outgoing_message out;
  out.chat = msg_.chat;
  out.text = std::string{text};
  out.reply_to = msg_.id;
  bot_.impl_->send(std::move(out), &key_, turn_);
}

botmesh::store& context::store() noexcept {
  return *bot_.impl_->opts.store;
}

std::stop_token context::stop_token() const noexcept {
  return bot_.impl_->flow_stop_token(turn_);
}

std::uint64_t context::fence() const noexcept {
  return turn_ ? turn_->fence() : 0;
}

std::string_view context::payload() const noexcept {
  if (msg_.command.empty())
    return {};
  std::string_view t = msg_.text;
  auto blank = t.find_first_of(" \t\r\n");
  return blank == std::string_view::npos ? std::string_view{}
                                         : trim(t.substr(blank));
}

inbound_message& context::edit_message() {
  if (!editable_)
    throw invalid_argument_error(
      "message", "edit_message: only middleware may change the message");
  return *editable_;
}

namespace filters {

filter type(message_type t) {
  return [t](const inbound_message& m) { return m.type == t; };
}

filter media() {
  return [](const inbound_message& m) {
    switch (m.type) {
      case message_type::image:
      case message_type::audio:
      case message_type::video:
      case message_type::document:
      case message_type::sticker:
        return true;
      default:
        return false;
    }
  };
}

filter button(std::string data) {
  return [data = std::move(data)](const inbound_message& m) {
    return m.type == message_type::button && (data.empty() || m.data == data);
  };
}

filter location() {
  return type(message_type::location);
}

filter edited() {
  return [](const inbound_message& m) { return m.edited; };
}

filter all(std::vector<filter> fs) {
  return [fs = std::move(fs)](const inbound_message& m) {
    return std::all_of(fs.begin(), fs.end(),
                       [&](const filter& f) { return f && f(m); });
  };
}

filter any(std::vector<filter> fs) {
  return [fs = std::move(fs)](const inbound_message& m) {
    return std::any_of(fs.begin(), fs.end(),
                       [&](const filter& f) { return f && f(m); });
  };
}

} // namespace filters

// -- bot ----------------------------------------------------------------------

bot::bot(bot_options opts) : impl_(std::make_unique<impl>(*this, std::move(opts))) {
  impl_->own_system();
  impl_->make_tasks();
  impl_->make_actor();
  impl_->metrics_reg = metrics::global_registry().add(
    [i = impl_.get()](metrics::exposition& e) { i->collect(e); });
}

bot::bot(caf::actor_system& sys, bot_options opts)
  : impl_(std::make_unique<impl>(*this, std::move(opts))) {
  impl_->sys = &sys;
  impl_->make_tasks();
  impl_->make_actor();
  impl_->metrics_reg = metrics::global_registry().add(
    [i = impl_.get()](metrics::exposition& e) { i->collect(e); });
}

bot::~bot() {
  // Off the scrapes first: a scrape reads the scheduler and the counters.
  impl_->metrics_reg = {};
  stop();
  // The bot's actor lets go of the bot (later requests: receiver down).
  impl_->actor_link->close();
  impl_->tasks.reset(); // its actors leave before an owned system goes
  // An owned system waits for its actors in its destructor; the router exits
  // in stop(), taking its linked chat actors along.
  impl_->owned_sys.reset();
}

bot& bot::on_message(handler h) {
  impl_->add_route(route{route::any, {}, {}, {}, std::move(h)});
  return *this;
}

bot& bot::command(std::string name, handler h) {
  if (!name.empty() && name.front() == '/')
    name.erase(0, 1);
  if (name.empty() || command_in("/" + name) != name)
    throw invalid_argument_error(
      "command",
      fmt::format("command: \"{}\" is not a command name (1-32 of A-Z, a-z, "
                  "0-9 and '_')",
                  name));
  impl_->add_route(route{route::command, {std::move(name)}, {}, {}, std::move(h)});
  return *this;
}

bot& bot::when(filter f, handler h) {
  if (!f)
    throw invalid_argument_error("filter", "when: the filter is empty");
  impl_->add_route(route{route::filtered, {}, {}, std::move(f), std::move(h)});
  return *this;
}

bot& bot::use(middleware m) {
  impl_->check_not_started();
  if (!m)
    throw invalid_argument_error("middleware", "use: the middleware is empty");
  impl_->middlewares.push_back(std::move(m));
  return *this;
}

bot& bot::hears(std::string keyword, handler h) {
  return hears(std::vector<std::string>{std::move(keyword)}, std::move(h));
}

bot& bot::hears(std::vector<std::string> keywords, handler h) {
  if (keywords.empty())
    throw invalid_argument_error("keywords", "hears: no keyword given");
  for (auto& k : keywords) {
    auto t = trim(k);
    if (t.empty())
      throw invalid_argument_error("keywords", "hears: empty keyword");
    k = std::string{t};
  }
  impl_->add_route(
    route{route::keywords, std::move(keywords), {}, {}, std::move(h)});
  return *this;
}

bot& bot::hears(std::initializer_list<const char*> keywords, handler h) {
  return hears(std::vector<std::string>(keywords.begin(), keywords.end()),
               std::move(h));
}

bot& bot::hears(botmesh::pattern p, handler h) {
  impl_->add_route(route{route::regex, {}, std::move(p), {}, std::move(h)});
  return *this;
}

bot& bot::add_flow(botmesh::flow f) {
  impl_->check_not_started();
  impl_->flows.add(std::move(f));
  return *this;
}

bot& bot::conversation(std::string name, std::vector<std::string> keywords,
                       botmesh::flow::step_fn fn) {
  impl_->check_not_started();
  botmesh::flow f{std::move(name)};
  f.hears(std::move(keywords)).step("conversation", std::move(fn));
  impl_->flows.add(std::move(f), true);
  return *this;
}

scheduled_task bot::every(duration interval, scheduler::job fn) {
  return impl_->tasks->every(interval, std::move(fn));
}

scheduled_task bot::every(duration interval, task_options opts,
                          scheduler::run_handler fn) {
  return impl_->tasks->every(interval, std::move(opts), std::move(fn));
}

scheduled_task bot::schedule(std::string_view cron, scheduler::job fn) {
  return impl_->tasks->schedule(cron, std::move(fn));
}

scheduled_task bot::schedule(std::string_view cron, task_options opts,
                             scheduler::run_handler fn) {
  return impl_->tasks->schedule(cron, std::move(opts), std::move(fn));
}

scheduled_task bot::delay(duration d, scheduler::job fn) {
  return impl_->tasks->delay(d, std::move(fn));
}

scheduled_task bot::delay(duration d, task_options opts,
                          scheduler::run_handler fn) {
  return impl_->tasks->delay(d, std::move(opts), std::move(fn));
}

bool bot::forget_task(std::string_view id) {
  return impl_->tasks->forget_task(id);
}

template <>
bot& bot::on<events::error>(std::function<void(const events::error&)> f) {
  impl_->check_not_started();
  impl_->on_error.push_back(std::move(f));
  return *this;
}

template <>
bot& bot::on<events::message_in>(
  std::function<void(const events::message_in&)> f) {
  impl_->check_not_started();
  impl_->on_in.push_back(std::move(f));
  return *this;
}

template <>
bot& bot::on<events::lease_lost>(
  std::function<void(const events::lease_lost&)> f) {
  impl_->check_not_started();
  impl_->on_lost.push_back(std::move(f));
  return *this;
}

template <>
bot& bot::on<events::leader>(std::function<void(const events::leader&)> f) {
  impl_->check_not_started();
  impl_->on_leader.push_back(std::move(f));
  return *this;
}

template <>
bot& bot::on<events::follower>(std::function<void(const events::follower&)> f) {
  impl_->check_not_started();
  impl_->on_follower.push_back(std::move(f));
  return *this;
}

template <>
bot& bot::on<events::handover>(std::function<void(const events::handover&)> f) {
  impl_->check_not_started();
  impl_->on_handover.push_back(std::move(f));
  return *this;
}

template <>
bot& bot::on<events::message_out>(
  std::function<void(const events::message_out&)> f) {
  impl_->check_not_started();
  impl_->on_out.push_back(std::move(f));
  return *this;
}

void bot::start() {
  std::lock_guard guard{impl_->lifecycle_mtx};
  if (impl_->started)
    return;
  if (impl_->stopped)
    throw error(errc::stopped, "start() after stop(): the bot was stopped "
                               "before it started, and a bot runs once");
  impl_->opts.store->start();
  if (impl_->opts.coordination) {
    auto& co = *impl_->opts.coordination;
    if (!co.coordinator)
      throw invalid_argument_error("coordination.coordinator",
                                   "coordination needs a coordinator");
    if (!impl_->opts.store->supports_compare_and_set())
      log::warn("bot", "the store has no compare-and-set: checkpoints of "
                       "replicas are fenced only locally",
                {.bot = impl_->opts.bot_id});
  }
  // Half the cores: the CAF workers that route and order messages need the
  // rest. Blocking handlers still get more threads (the pool grows when all
  // of its threads are stuck).
  auto core = std::max(1u, std::thread::hardware_concurrency() / 2);
  impl_->pool = std::make_unique<internal::worker_pool>(
    core, std::max<std::size_t>(1, impl_->opts.handler_threads));
  impl_->pool->tag(impl_.get());
  if (impl_->exclusive()) {
    impl_->transport_pool = std::make_unique<internal::worker_pool>(1, 1);
    impl_->transport_pool->tag(impl_.get());
  }
  // What is made from here on is given back if start() fails before it
  // is done: a lease actor renewing its heartbeat for good (an owned actor
  // system waits for it in the bot's destructor), a router, pools.
  try {
    impl_->spawn_all();
  } catch (...) {
    impl_->undo_start();
    throw;
  }
  impl_->started = true;
  impl_->accepting = true;
  try {
    if (impl_->exclusive())
      impl_->start_session();
    else
      impl_->opts.provider->start(*impl_);
  } catch (...) {
    // A transport that cannot start (a webhook's port in use): the bot is
    // not started, so nothing it accepted meanwhile runs without it, and a
    // later start() tries again instead of returning at once.
    impl_->accepting = false;
    impl_->started = false;
    impl_->stop_provider(); // what the failed start left behind
    impl_->undo_start();
    throw;
  }
  impl_->tasks->start();
}

void bot::impl::stop_provider() noexcept {
  try {
    opts.provider->stop();
  } catch (const std::exception& e) {
    log::error("bot", fmt::format("stopping the transport failed: {}", e.what()),
               {.bot = opts.bot_id});
  } catch (...) {
    log::error("bot", "stopping the transport failed", {.bot = opts.bot_id});
  }
}

// The router ends after its chat actors, and both refer to this bot: in an
// application's actor system (which outlives the bot) the bot may go only
// once they ended, and a start() made again must not meet them. Without a
// bound, as the journal's last operations: what is left in their mailboxes
// is a few refusals and give-backs.
void bot::impl::end_router() {
  if (!router_handle)
    return;
  // Later accepted events are refused; one that looked before is sent
  // (a few instructions away) before the router ends, which refuses it.
  router_closed = true;
  while (sending.load() != 0)
    std::this_thread::yield();
  internal::end_and_wait(*sys, {router_handle}, [this](std::size_t, int seconds) {
    log::warn("bot",
              fmt::format("stopping: the chat actors have not ended for {} s "
                          "(the bot goes once they have)",
                          seconds),
              {.bot = opts.bot_id});
  });
}

void bot::impl::undo_start() {
  // (The leadership refers to the lease actor, whose detached thread ends
  // only once nothing does.)
  if (sched_leadership)
    sched_leadership->close();
  // The router first, while the pools its chats may refuse through still
  // run.
  end_router();
  router_handle = nullptr;
  for (auto* h : {&journal_handle, &lease_handle})
    if (*h) {
      caf::anon_send_exit(*h, caf::exit_reason::user_shutdown);
      *h = nullptr;
    }
  if (transport_pool)
    transport_pool->shutdown();
  if (pool)
    pool->shutdown();
}

void bot::impl::spawn_all() {
  router_config rc;
  rc.services = this;
  rc.max_pending_per_chat = opts.max_pending_per_chat;
  rc.passivate_after = opts.passivate_after.ms();
  if (opts.coordination) {
    auto& co = *opts.coordination;
    lease_config lc;
    lc.coordinator = co.coordinator;
    lc.settle = co.settle.ms();
    lc.max_poll = co.max_poll.ms();
    lc.listener = this;
    lease_handle = spawn_lease_actor(*sys, std::move(lc));
    if (sched_leadership)
      sched_leadership->bind(*sys, lease_handle);
    rc.lease = lease_handle;
    rc.turn_wait = co.turn_wait.ms();
  }
  router_handle = spawn_router(*sys, rc);
  router_closed = false;
  if (auto* d = durable.get()) {
    d->start(); // the backend, and a first beat before anything is recorded
    journal_config jc;
    jc.period = std::max(std::chrono::milliseconds{1}, d->lease() / 3);
    jc.beat = [d](std::function<void()> done) { d->beat(std::move(done)); };
    jc.retire = [d](std::function<void()> done) { d->retire(std::move(done)); };
    journal_handle = spawn_journal_actor(*sys, std::move(jc));
  }
}

void bot::stop() {
  auto& i = *impl_;
  // From one of this bot's handlers (a message handler, a scheduled task):
  // the stop waits for that very handler to return, so it runs on a thread
  // of its own; the next stop() from elsewhere (run(), the destructor)
  // waits for it. (The pools are made by start(), perhaps on another
  // thread right now: the caller's own pool tells, by its tag: this bot's,
  // or its scheduler's.)
  auto owner = internal::worker_pool::current_owner();
  // Or from a listener that a delivery ran on the provider's own thread (a
  // refusal's error event): the stop stops that provider, which joins the
  // thread (a poller joined itself, or waited for the transport thread
  // that waited for it).
  if ((owner && (owner == &i || owner == i.tasks.get()))
      || delivering::in(&i)) {
    {
      std::lock_guard run_guard{i.run_mtx};
      i.stop_requested = true;
      i.run_cv.notify_all();
    }
    i.stopper.begin_inside([&i] { i.stop_now(); });
    return;
  }
  // A bot stops once: no stop begins inside after this one.
  i.stopper.join(true);
  i.stop_now();
}

void bot::impl::stop_now() {
  std::lock_guard guard{lifecycle_mtx};
  if (stopped)
    return;
  stopped = true;
  if (!started) {
    // Before start() (a SIGTERM during start-up, a stop() racing run() on
    // another thread): the bot never starts. Dropped, the stop was lost:
    // the bot then ran, and a handler's stop() could no longer end it.
    std::lock_guard run_guard{run_mtx};
    stop_requested = true;
    run_cv.notify_all();
    return;
  }
  {
    std::lock_guard run_guard{run_mtx};
    stop_requested = true;
    run_cv.notify_all();
  }
  // The scheduler's leadership ends first: its stop() waits for a leader
  // acquire in flight, which waits for the election's first answer (up to
  // a lease) unless the leadership is closed.
  if (sched_leadership)
    sched_leadership->close();
  tasks->stop();
  // 1. No more intake: later deliveries are refused. The transport stays up
  //    while draining, so turns in flight can still answer.
  accepting = false;
  // 2. Let every chat finish its queue within the bound.
  auto bound = opts.stop_timeout.ms();
  bool drained = false;
  {
    caf::scoped_actor self{*sys};
    self->request(router_handle, bound + std::chrono::seconds(5),
                  drain_atom::value, bound)
      .receive([&](bool all) { drained = all; },
               [&](caf::error&) { drained = false; });
  }
  // 3. Past the bound, running handlers are asked to give up; then wait for them.
  if (!drained)
    stop_source.request_stop();
  // 4. The session stops the exclusive transport and then gives its
  //    leadership up; the lease actor releases what it still holds and
  //    gives up what it waits for (each bounded by a lease).
  if (session_handle || lease_handle) {
    caf::scoped_actor self{*sys};
    auto bound = opts.coordination->coordinator->lease()
                 + std::chrono::seconds(1);
    for (auto& h : {session_handle, lease_handle})
      if (h)
        self->request(h, bound, shutdown_atom::value)
          .receive([](bool) {}, [](caf::error&) {});
  }
  // A detached actor's thread ends only once nothing refers to it: the
  // actor system waits for that thread when it is destroyed. (The session's
  // handle goes once the transport stopped: its threads read it.)
  lease_handle = nullptr;
  // 5. Durable processing: the last beat ends, the heartbeat is retired
  //    (what this replica still holds is claimable at once), and every
  //    journal operation in flight completes before the bot can go away.
  //    Without a bound: the backend's callbacks and the journal actor
  //    refer to this bot, which must not go while one may still run (each
  //    backend call completes, at worst with its own timeout). A backend
  //    that keeps it waiting is named every 10 s.
  auto still_waiting = [this](int rounds, std::string_view what) {
    log::warn("bot",
              fmt::format("stopping: {} for {} s (the bot goes once it "
                          "answers)",
                          what, rounds * 10),
              {.bot = opts.bot_id});
  };
  if (journal_handle) {
    caf::scoped_actor self{*sys};
    for (int rounds = 1;; ++rounds) {
      bool timed_out = false;
      self->request(journal_handle, std::chrono::seconds(10),
                    shutdown_atom::value)
        .receive([](bool) {},
                 [&](caf::error& e) {
                   timed_out = e == caf::sec::request_timeout;
                 });
      if (!timed_out)
        break;
      still_waiting(rounds, "the durable backend's last beat and retire "
                            "have not completed");
    }
  }
  if (transport_pool)
    transport_pool->shutdown(); // (its stop ran, or the bound passed)
  auto journal_ops_done = [&] {
    if (durable)
      for (int rounds = 1; !durable->wait_idle(std::chrono::seconds(10));
           ++rounds)
        still_waiting(rounds, "journal operations are still in flight");
  };
  // Journal writes that land now go to the router, which refuses them (it
  // drains), releasing their records.
  journal_ops_done();
  // While the handler pool still runs: the refusals and give-backs of the
  // ending chats raise their events there (a listener that calls stop()
  // there is known as one of this bot's), and the journal operations they
  // start are waited for below.
  end_router();
  pool->shutdown();
  journal_ops_done();
  // Guarded: a throw here would leave the bot stopped for good with its
  // transport running.
  stop_provider();
  // A delivery that came through while the transport stopped, refused
  // after the router ended, gave its record back.
  journal_ops_done();
  session_handle = nullptr;
  journal_handle = nullptr; // the transport reports nothing more
  // (The scoped actors above: a stop on one thread, the bot destroyed on
  // another.)
  internal::release_caf_logger();
}

namespace {

// SIGTERM / SIGINT while some bot is in run(): the handler only stores the
// signal (all it may do); run() looks at it every 50 ms.
std::atomic<int> stop_signal{0};

extern "C" void on_stop_signal(int sig) {
  stop_signal.store(sig);
}

// Installs the handler for the first run() and restores the previous
// handlers when the last run() returns.
std::mutex signal_mtx;
int signal_users = 0;
struct sigaction old_term{};
struct sigaction old_int{};

class signal_scope {
 public:
  signal_scope() {
    std::lock_guard guard{signal_mtx};
    if (signal_users++ != 0)
      return;
    stop_signal.store(0);
    struct sigaction sa{};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGINT, &sa, &old_int);
  }

  ~signal_scope() {
    std::lock_guard guard{signal_mtx};
    if (--signal_users != 0)
      return;
    sigaction(SIGTERM, &old_term, nullptr);
    sigaction(SIGINT, &old_int, nullptr);
  }

  signal_scope(const signal_scope&) = delete;
  signal_scope& operator=(const signal_scope&) = delete;
};

} // namespace

int bot::run() {
  {
    std::lock_guard guard{impl_->lifecycle_mtx};
    if (impl_->ran || impl_->stopped)
      throw error(errc::stopped, impl_->ran
                                   ? "run() was called before: a bot runs once"
                                   : "run() after stop(): a bot runs once");
    impl_->ran = true;
  }
  start();
  {
    signal_scope signals;
    std::unique_lock guard{impl_->run_mtx};
    while (!impl_->input_done && !impl_->stop_requested) {
      if (auto sig = stop_signal.load()) {
        // A warning so the default level shows why the process stops.
        log::warn("bot",
                  fmt::format("{}: stopping (up to stop_timeout for the "
                              "turns in progress)",
                              sig == SIGTERM ? "SIGTERM" : "SIGINT"),
                  {.bot = impl_->opts.bot_id});
        break;
      }
      impl_->run_cv.wait_for(guard, std::chrono::milliseconds{50});
    }
  }
  stop();
  return 0;
}

std::function<bool()> bot::readiness() const {
  // Holds the flags, not the bot: valid after the bot is gone.
  return [open = impl_->transport_open, leading = impl_->leading_flag,
          until = impl_->leading_until, exclusive = impl_->exclusive()] {
    return impl::ready_test(*open, *leading, *until, exclusive);
  };
}

bool bot::ready(std::chrono::milliseconds timeout) {
  // transport_open is written under run_mtx, with the notify.
  std::unique_lock guard{impl_->run_mtx};
  return impl_->run_cv.wait_for(guard, timeout,
                                [this] { return impl_->ready_now(); });
}

void bot::send(std::string_view chat, std::string_view text) {
  outgoing_message msg;
  msg.chat = std::string{chat};
  msg.text = std::string{text};
  impl_->send(std::move(msg), nullptr, nullptr);
}

void bot::send(outgoing_message msg) {
  impl_->send(std::move(msg), nullptr, nullptr);
}

bot_stats bot::stats() const {
  bot_stats s;
  auto& i = *impl_;
  s.received = i.received;
  s.handled = i.handled;
  s.refused_invalid = i.refused_invalid;
  s.refused_overload = i.refused_overload;
  s.refused_stopped = i.refused_stopped;
  s.refused_not_leader = i.refused_not_leader;
  s.handler_errors = i.handler_errors;
  s.sent = i.sent;
  s.send_errors = i.send_errors;
  // Passivations first: a chat activated and passivated between the two
  // reads would otherwise count more passivations than activations (and
  // live_chats wrap around).
  s.passivations = i.passivations;
  s.activations = i.activations;
  s.live_chats = s.activations - s.passivations;
  s.turn_failures = i.turn_failures;
  s.conversations = i.flows.active();
  s.duplicates = i.duplicates;
  if (i.durable) {
    auto d = i.durable->stats();
    s.reprocessed = d.reprocessed;
    s.outbox_skipped = d.outbox_skipped;
    s.journal_errors = d.journal_errors;
  }
  return s;
}

caf::actor_system& bot::system() noexcept {
  return *impl_->sys;
}

bot_actor bot::actor() const {
  return impl_->actor_link->handle();
}

caf::actor bot::router() const {
  return impl_->router_handle;
}

botmesh::store& bot::store() noexcept {
  return *impl_->opts.store;
}

botmesh::provider& bot::provider() noexcept {
  return *impl_->opts.provider;
}

} // namespace botmesh
