#include <botmesh/runtime/internal/flow_engine.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <condition_variable>
#include <thread>

#include <fmt/format.h>

#include <botmesh/runtime/core/internal/delivery_id.hpp>
#include <botmesh/runtime/core/internal/text.hpp>
#include <botmesh/runtime/core/json.hpp>
#include <botmesh/runtime/internal/durable_intake.hpp>
#include <botmesh/runtime/texts.hpp>

namespace botmesh {

using internal::ascii_iequals;
using internal::trim;

// -- flow ---------------------------------------------------------------------

std::optional<std::size_t>
flow::definition::index_of(std::string_view step) const {
  for (std::size_t i = 0; i < steps.size(); ++i)
    if (steps[i].name == step)
      return i;
  return std::nullopt;
}

bool flow::definition::triggered_by(std::string_view text) const {
  auto t = trim(text);
  for (auto& k : keywords)
    if (ascii_iequals(t, k))
      return true;
  for (auto& p : patterns)
    if (p.search(text))
      return true;
  return false;
}

flow::flow(std::string name) : def_(std::make_shared<definition>()) {
  if (name.empty())
    throw invalid_argument_error("name", "a flow needs a name");
  def_->name = std::move(name);
}

flow& flow::hears(std::vector<std::string> keywords) {
  for (auto& k : keywords) {
    auto t = trim(k);
    if (t.empty())
      throw invalid_argument_error("keywords", "flow " + def_->name
                                                 + ": empty keyword");
    def_->keywords.emplace_back(t);
  }
  return *this;
}

flow& flow::hears(std::initializer_list<const char*> keywords) {
  return hears(std::vector<std::string>(keywords.begin(), keywords.end()));
}

flow& flow::hears(botmesh::pattern p) {
  def_->patterns.push_back(std::move(p));
  return *this;
}

namespace {

// A message's platform identity in a checkpoint's `answer_ref` (empty for
// a message without an id: never taken for another). Keyed as the
// duplicate checks are (delivery_id): an edit shares its original's id but
// is a message of its own, which answers what it finds.
std::string message_ref(const inbound_message& m) {
  if (m.id.empty())
    return {};
  return m.provider + "#" + internal::delivery_id(m);
}

// Whether `a` and `b` are one delivery of one message (an edit shares its
// original's id, and is a message of its own; one without an id is never
// taken for another).
bool same_delivery(const inbound_message& a, const inbound_message& b) {
  auto ref = message_ref(a);
  return !ref.empty() && ref == message_ref(b);
}

void check_step_name(const flow::definition& d, const std::string& step) {
  if (step.empty())
    throw invalid_argument_error("step", "flow " + d.name
                                           + ": a step needs a name");
  if (d.index_of(step))
    throw invalid_argument_error("step", fmt::format("flow {}: step \"{}\" "
                                                     "exists already",
                                                     d.name, step));
}

// When `cp` expires in the store (an ephemeral checkpoint), if it does.
std::optional<time_point> lapses_of(const flow_checkpoint& cp) {
  return cp.ephemeral ? std::optional<time_point>{cp.expires_at} : std::nullopt;
}

} // namespace

flow& flow::ask(std::string step, std::string question, answer_handler on_answer,
                ask_options opts) {
  check_step_name(*def_, step);
  definition::step_def sd;
  sd.name = std::move(step);
  sd.k = definition::kind::ask;
  sd.question = std::move(question);
  sd.on_answer = std::move(on_answer);
  sd.opts = std::move(opts);
  def_->steps.push_back(std::move(sd));
  return *this;
}

flow& flow::step(std::string step, step_fn fn) {
  check_step_name(*def_, step);
  if (!fn)
    throw invalid_argument_error("step", "flow " + def_->name
                                           + ": a step needs a function");
  definition::step_def sd;
  sd.name = std::move(step);
  sd.k = definition::kind::code;
  sd.fn = std::move(fn);
  def_->steps.push_back(std::move(sd));
  return *this;
}

flow& flow::persistent(bool on) {
  def_->persistent = on;
  return *this;
}

const std::string& flow::name() const noexcept {
  return def_->name;
}

std::string flow::fingerprint() const {
  return internal::fingerprint_of(*def_);
}

std::string internal::fingerprint_of(const flow::definition& d) {
  // FNV-1a over the name and each step's name and kind.
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::string_view s) {
    for (unsigned char ch : s) {
      h ^= ch;
      h *= 1099511628211ull;
    }
    h ^= 0xff;
    h *= 1099511628211ull;
  };
  mix(d.name);
  for (auto& s : d.steps) {
    mix(s.name);
    mix(s.k == flow::definition::kind::ask ? "ask" : "do");
  }
  return fmt::format("{:016x}", h);
}

// -- flow_context ---------------------------------------------------------------

nlohmann::json& flow_context::state() {
  return conv_.state;
}

const inbound_message& flow_context::message() const {
  return conv_.current;
}

const std::string& flow_context::key() const {
  return conv_.key;
}

done_awaiter flow_context::send(std::string_view text) {
  conv_.engine.send(conv_, text);
  return {};
}

ask_awaiter flow_context::ask(std::string question, ask_options opts) {
  return ask_awaiter{*this, std::move(question), std::move(opts)};
}

done_awaiter flow_context::sleep(duration d) {
  std::mutex m;
  std::condition_variable_any cv;
  std::unique_lock guard{m};
  auto token = stop_token();
  cv.wait_for(guard, token, d.ms(), [] { return false; });
  return {};
}

void flow_context::go_to(std::string flow, std::string step) {
  conv_.pending = internal::conversation::next::go_to;
  conv_.goto_flow = std::move(flow);
  conv_.goto_step = std::move(step);
}

void flow_context::go_to_step(std::string step) {
  go_to(conv_.def->name, std::move(step));
}

void flow_context::end() {
  conv_.pending = internal::conversation::next::end;
}

void flow_context::idle(duration after, std::function<void(flow_context&)> fn) {
  if (after.count() <= 0)
    throw invalid_argument_error("idle", "idle() needs a positive duration");
  // One watcher per duration: a step that loops (ask, then go_to_step
  // itself) registers again on every pass, and each pass added a watcher,
  // so silence fired the reminder once per pass and every message re-armed
  // them all. The earlier watcher's timer goes stale.
  for (auto& w : conv_.idles)
    if (w.after == after.ms()) {
      w.fn = std::move(fn);
      conv_.engine.rearm(conv_, w.timer, w.after);
      return;
    }
  auto& w = conv_.idles.emplace_back(
    internal::conversation::idle_watch{after.ms(), std::move(fn), 0});
  conv_.engine.rearm(conv_, w.timer, w.after);
}

std::stop_token flow_context::stop_token() const {
  return conv_.engine.host().flow_stop_token(conv_.turn);
}

// -- ask_awaiter ----------------------------------------------------------------

bool ask_awaiter::await_ready() {
  auto& conv = c_.conv_;
  if (conv.preloaded && conv.answers_in_step == 0) {
    // Resumed from a checkpoint that waited here: its saved answer, or else
    // the message that woke the conversation, answers this question; it is
    // not asked again.
    answer a{std::move(*conv.preloaded), false};
    conv.preloaded.reset();
    auto err = opts_.validate ? opts_.validate(a) : std::nullopt;
    if (!err) {
      result_ = std::move(a);
      return true;
    }
    c_.send(*err);
  }
  conv.preloaded.reset();
  if (conv.kept) {
    // The message that woke a conversation whose cut step had its answer
    // saved: it answers the next question, which is not asked.
    answer a{std::move(*conv.kept), false};
    conv.kept.reset();
    if (conv.kept_used)
      *conv.kept_used = true;
    auto err = opts_.validate ? opts_.validate(a) : std::nullopt;
    if (!err) {
      result_ = std::move(a);
      return true;
    }
    c_.send(*err);
  }
  c_.send(question_);
  return false;
}

void ask_awaiter::await_suspend(std::coroutine_handle<> h) {
  auto& conv = c_.conv_;
  conv.waiting = true;
  conv.resume_point = h;
  conv.answer_slot = &result_;
  conv.question = question_;
  conv.ask_opts = opts_;
  conv.waiting_question = conv.answers_in_step;
  conv.engine.rearm(conv, conv.wait_timer,
                    opts_.timeout ? std::optional{opts_.timeout->ms()}
                                  : std::nullopt);
  conv.engine.checkpoint(conv, true, conv.waiting_question);
}

answer ask_awaiter::await_resume() {
  ++c_.conv_.answers_in_step;
  return std::move(result_);
}

// -- flow_engine ----------------------------------------------------------------

namespace internal {

flow_engine::flow_engine(flow_host& host) : host_(host) {
  // nop
}

void flow_engine::configure(handover_config cfg) {
  cfg_ = std::move(cfg);
}

void flow_engine::add(flow f, bool coroutine) {
  auto copy = std::make_shared<flow::definition>(f.def());
  copy->coroutine = coroutine;
  auto def = std::shared_ptr<const flow::definition>(std::move(copy));
  if (flow_named(def->name))
    throw invalid_argument_error("name", fmt::format("a flow named \"{}\" "
                                                     "exists already",
                                                     def->name));
  if (def->steps.empty())
    throw invalid_argument_error("steps", fmt::format("flow \"{}\" has no "
                                                      "steps",
                                                      def->name));
  any_persistent_ = any_persistent_ || def->persistent;
  flows_.push_back(std::move(def));
}

std::size_t flow_engine::active() const {
  std::lock_guard guard{mtx_};
  return convs_.size();
}

const flow::definition* flow_engine::flow_named(std::string_view name) const {
  for (auto& f : flows_)
    if (f->name == name)
      return f.get();
  return nullptr;
}

conversation* flow_engine::find(const std::string& key) {
  std::lock_guard guard{mtx_};
  auto i = convs_.find(key);
  return i == convs_.end() ? nullptr : i->second.get();
}

conversation& flow_engine::create(const std::string& key) {
  std::unique_ptr<conversation> gone;
  std::lock_guard guard{mtx_};
  auto& slot = convs_[key];
  if (slot)
    disarm_all(*slot);
  gone = std::move(slot);
  slot = std::make_unique<conversation>(*this, key);
  return *slot;
}

void flow_engine::erase(const std::string& key) {
  std::unique_ptr<conversation> gone;
  {
    std::lock_guard guard{mtx_};
    auto i = convs_.find(key);
    if (i == convs_.end())
      return;
    disarm_all(*i->second);
    gone = std::move(i->second);
    convs_.erase(i);
  }
  // The coroutine frame is destroyed outside the lock.
}

bool flow_engine::timer_live(std::uint64_t id) const {
  std::lock_guard guard{timers_mtx_};
  return live_timers_.count(id) > 0;
}

void flow_engine::disarm(std::uint64_t id) {
  if (id == 0)
    return;
  std::lock_guard guard{timers_mtx_};
  live_timers_.erase(id);
}

void flow_engine::disarm_all(const conversation& c) {
  std::lock_guard guard{timers_mtx_};
  if (c.wait_timer != 0)
    live_timers_.erase(c.wait_timer);
  for (auto& w : c.idles)
    if (w.timer != 0)
      live_timers_.erase(w.timer);
}

void flow_engine::drop(const std::string& key) {
  if (flows_.empty())
    return;
  erase(key);
  if (looks_for_checkpoints()) {
    std::lock_guard guard{mtx_};
    handed_.erase(key);
    dropped_.insert(key);
  }
}

void flow_engine::look_later(const std::string& key) {
  if (!flows_.empty())
    uncertain(key);
}

void flow_engine::check_unknown_holder(const std::string& key) {
  if (flows_.empty())
    return;
  auto* c = find(key);
  // Nothing written (a flow that leaves no checkpoint) tells nothing: a
  // copy that another replica's turn may have moved past goes.
  if (!c || c->revision == 0 || c->superseded) {
    drop(key);
    return;
  }
  auto revision = c->revision;
  std::optional<flow_checkpoint> cp;
  try {
    cp = host_.flow_store().get_checkpoint(key);
  } catch (...) {
    // Anything a custom store throws: the turn's caller must go on to
    // handle (and settle) its message.
    drop(key);
    auto code = errc::store_error;
    try {
      throw;
    } catch (const error& err) {
      code = err.code();
    } catch (...) {
    }
    host_.raise_error(code,
                      fmt::format("chat {}: its last holder is unknown and its "
                                  "checkpoint could not be read to check its "
                                  "conversation in memory, which is dropped "
                                  "(the next message reads the store): {}",
                                  key, internal::what_of(std::current_exception())),
                      key, nullptr);
    return;
  }
  if (!cp || cp->revision != revision)
    drop(key);
}

// A handover message: "1" and the JSON of the conversation's live
// checkpoint (with its revision). "No checkpoint" is never handed: nothing
// on the taker's side could check it (a holder's write that landed late,
// after its turn was cut or its reply timed out, expects exactly "none"),
// while a handed revision is checked by the taker's first write (a
// compare-and-set that refuses a copy the store moved past).
namespace {

constexpr std::size_t max_handoff_bytes = 64 * 1024;

std::string encode_handoff(const conversation& c) {
  if (c.revision == 0 || c.superseded)
    return {};
  try {
    return "1" + to_json(c.stored, std::numeric_limits<std::size_t>::max());
  } catch (const std::exception&) {
    return {}; // it was written, so it encodes; if not, hand nothing over
  }
}

// An ephemeral checkpoint close to its expiry may be gone from the store
// by the time it is written again (the writer's clock set it): the store
// decides.
bool usable(const flow_checkpoint& cp) {
  return !cp.ephemeral
         || cp.expires_at > clock::system().now() + std::chrono::seconds{1};
}

// Nothing when the payload is not usable: the store is read instead.
std::optional<flow_checkpoint> decode_handoff(std::string_view p) {
  if (p.size() < 2 || p[0] != '1')
    return std::nullopt;
  try {
    auto cp = checkpoint_from_json(p.substr(1));
    if (cp.revision == 0 || !usable(cp))
      return std::nullopt;
    return cp;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

} // namespace

void flow_engine::hand(const std::string& key, std::string_view handed) {
  if (flows_.empty())
    return;
  erase(key);
  if (!looks_for_checkpoints())
    return;
  auto known = hands_over() ? decode_handoff(handed) : std::nullopt;
  std::lock_guard guard{mtx_};
  handed_.erase(key);
  // A chat marked before this turn (this replica's own write may still
  // land, or it never looked) reads the store, as after `drop`.
  if (known && dropped_.count(key) == 0)
    handed_.emplace(key, std::move(*known));
  else
    dropped_.insert(key);
}

void flow_engine::note_handoff(const std::string& key,
                               const turn_token* turn) noexcept {
  if (!turn || !hands_over())
    return;
  std::string out;
  try {
    std::lock_guard guard{mtx_};
    // Handed to this turn and not used (a timer turn): an ephemeral copy
    // may expire meanwhile, so the next holder reads the store.
    if (dropped_.count(key) == 0 && handed_.count(key) == 0) {
      if (auto c = convs_.find(key); c != convs_.end())
        out = encode_handoff(*c->second);
    }
  } catch (const std::exception&) {
    out.clear(); // hand nothing over: the next holder reads the store
  }
  // A large conversation state is read from the store rather than sent
  // through the coordinator once more on every release.
  if (out.size() > max_handoff_bytes)
    out.clear();
  turn->hand_over(std::move(out));
}

// Without coordination only persistent flows leave checkpoints; with it,
// another replica may have left any kind (ephemeral, marker), and a replica
// that does not forward still resumes and removes an ephemeral one.
bool flow_engine::looks_for_checkpoints() const {
  return any_persistent_ || cfg_.coordinated;
}

flow_engine::cp_mode flow_engine::mode_of(const conversation& c) const {
  if (c.def->persistent)
    return cp_mode::full;
  auto marker = cfg_.coordinated
                    && cfg_.fallback != handover_config::fallback_kind::drop
                  ? cp_mode::marker
                  : cp_mode::none;
  if (c.def->coroutine)
    return marker;
  if (cfg_.forward)
    return is_plain_json(c.state) ? cp_mode::ephemeral : marker;
  return cp_mode::none;
}

bool is_plain_json(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::binary:
    case nlohmann::json::value_t::discarded:
      return false;
    case nlohmann::json::value_t::number_float:
      return std::isfinite(j.get<double>());
    case nlohmann::json::value_t::object:
    case nlohmann::json::value_t::array:
      for (auto& v : j)
        if (!is_plain_json(v))
          return false;
      return true;
    default:
      return true;
  }
}

time_point ephemeral_expiry(time_point now, std::chrono::milliseconds ttl,
                            std::chrono::milliseconds wait) {
  using namespace std::chrono_literals;
  return now + std::max(ttl, wait > 0ms ? wait + 10s : wait);
}

void flow_engine::rearm(conversation& c, std::uint64_t& timer,
                        std::optional<std::chrono::milliseconds> after) {
  disarm(timer);
  timer = 0;
  if (!after)
    return;
  timer = next_timer_.fetch_add(1);
  {
    std::lock_guard guard{timers_mtx_};
    live_timers_.insert(timer);
  }
  host_.arm_timer(c.key, *after, timer);
}

void flow_engine::fence(const conversation& c) const {
  if (c.turn)
    c.turn->check();
}

void flow_engine::send(conversation& c, std::string_view text) {
  if (c.superseded)
    throw lease_lost_error(c.key, "superseded");
  // Numbered within the step in the outbox (see durable_turn::scope): a
  // replay that restarts at a checkpoint written mid-turn would otherwise
  // take its first send for the first attempt's first one, of a step
  // before, and skip it.
  std::optional<durable_send_scope> scope;
  if (current_durable_turn()) // (no name to format without durability)
    scope.emplace(fmt::format("{}\x1f{}", c.def->name,
                              c.def->steps[c.step].name));
  host_.send_to_chat(c.key, c.current, text, c.turn);
}

void flow_engine::checkpoint(conversation& c, bool waiting,
                             std::uint32_t question,
                             const inbound_message* saved) {
  if (c.superseded)
    return;
  auto mode = mode_of(c);
  if (mode == cp_mode::none) {
    // Nothing to keep any more (a go_to into a flow that is not
    // checkpointed, a forwarded state that stopped being plain JSON without
    // a fallback): what is stored would resume a stale position.
    if (c.revision != 0) {
      fence(c);
      bool cleared = false;
      try {
        cleared = host_.flow_store().clear_checkpoint_if(c.key, c.revision);
      } catch (...) {
        uncertain(c.key);
        throw;
      }
      if (!cleared && !lapsed(c)) {
        // The store moved past this copy (a handed or in-memory copy that
        // another holder went on from): it must not go on and send, as a
        // refused write would not let it either.
        c.superseded = true;
        superseded(c.key, c.def->name, c.revision, c.current);
        return;
      }
      if (!cleared)
        uncertain(c.key); // lapsed: a new conversation may have begun
      c.revision = 0;
      c.lapses_at.reset();
      c.marker = false;
    }
    return;
  }
  // A marker is written at the first wait (or when it replaces an
  // ephemeral checkpoint that would resume a stale position); it goes at
  // the end: two writes per conversation. Like an ephemeral checkpoint it
  // lapses, so a wait that finds it in the second half of its life writes
  // it again: a conversation that outlives the ttl keeps its marker.
  if (mode == cp_mode::marker && (c.marker || (!waiting && c.revision == 0))) {
    if (!c.marker || !waiting || !c.lapses_at)
      return;
    auto wait = c.ask_opts.timeout ? c.ask_opts.timeout->ms()
                                   : std::chrono::milliseconds{0};
    auto span = std::max(cfg_.ttl, wait);
    if (*c.lapses_at - clock::system().now() >= span / 2)
      return;
  }
  fence(c);
  flow_checkpoint cp;
  cp.key = c.key;
  cp.flow = c.def->name;
  cp.step = c.def->steps[c.step].name;
  cp.waiting = waiting;
  cp.question = question;
  cp.created_at = c.created;
  cp.fingerprint = fingerprint_of(*c.def);
  if (mode == cp_mode::marker) {
    cp.marker = true;
    cp.waiting = true;
    cp.question = 0;
  } else {
    cp.state = c.state.dump();
    if (saved) {
      // The step's first answer, kept before the step goes on. A larger
      // one is not embedded. With durability the checkpoint still waits at
      // the question: this message, released with the cut step and handled
      // again, answers it. Without, nothing brings it back: the step starts
      // over and asks again (waiting at it, the next message would be
      // taken for an answer to a question it never saw).
      cp.waiting = true;
      cp.question = 0;
      if (to_json(*saved).size() <= cfg_.max_answer_bytes)
        cp.saved_answer = *saved;
      else if (!current_durable_turn())
        cp.waiting = false;
    }
  }
  // The message whose turn writes it: handled again (a journal record
  // replayed after this write), it must not also answer what comes next.
  // Not when its answer is left out (too large): handled again, the
  // message answers the question this checkpoint waits at.
  if (!saved || cp.saved_answer)
    cp.answer_ref = message_ref(c.current);
  if (mode != cp_mode::full) {
    auto wait = waiting && c.ask_opts.timeout ? c.ask_opts.timeout->ms()
                                              : std::chrono::milliseconds{0};
    cp.ephemeral = true;
    cp.expires_at = ephemeral_expiry(clock::system().now(), cfg_.ttl, wait);
  }
  std::optional<std::uint64_t> rev;
  try {
    rev = host_.flow_store().set_checkpoint_if(cp, c.revision);
    // This conversation's own ephemeral checkpoint expired while it waited
    // (an answer after the ttl, a re-ask after a long wait): the store
    // forgot it, nobody wrote over it. Written as new; if another
    // conversation began meanwhile that write is refused too.
    if (!rev && c.revision != 0 && lapsed(c)) {
      // The turn is checked again: the first write's round trip may have
      // outlasted it, and another holder may have ended its own
      // conversation since (a write as new would revive this one).
      fence(c);
      rev = host_.flow_store().set_checkpoint_if(cp, 0);
    }
  } catch (...) {
    uncertain(c.key); // it may have landed
    throw;
  }
  if (!rev) {
    // The store moved past this conversation (also past a handed copy):
    // the turn is lost, as the spec says of a superseded write, rather than
    // going on from whatever the store holds now (after a failover that
    // lost writes, an older position: the step would repeat silently).
    c.superseded = true;
    superseded(c.key, c.def->name, c.revision, c.current);
    return;
  }
  c.revision = *rev;
  c.lapses_at = lapses_of(cp);
  c.marker = mode == cp_mode::marker;
  if (cp.saved_answer && c.answer_saved
      && same_delivery(*cp.saved_answer, c.current))
    *c.answer_saved = true;
  if (hands_over()) {
    cp.revision = *rev;
    c.stored = std::move(cp);
  }
}

flow_task flow_engine::run_ask_step(flow_context& c,
                                    const flow::definition::step_def& sd) {
  auto a = co_await c.ask(sd.question, sd.opts);
  if (a.timed_out) {
    c.send(text(c.conv_.engine.host_.lang(), "core.conversation.timeout"));
    c.end();
    co_return;
  }
  if (sd.on_answer)
    sd.on_answer(c, a);
}

void flow_engine::begin_step(conversation& c) {
  c.answers_in_step = 0;
  c.pending = conversation::next::none;
  c.waiting = false;
  // A step resumed with its first answer at hand writes it into the
  // checkpoint before it goes on (a cut step keeps its answer).
  auto* saved = c.preloaded ? &*c.preloaded : c.kept ? &*c.kept : nullptr;
  checkpoint(c, false, 0, saved);
  if (c.superseded)
    return;
  auto& sd = c.def->steps[c.step];
  c.task = sd.k == flow::definition::kind::ask ? run_ask_step(c.ctx, sd)
                                               : sd.fn(c.ctx);
}

void flow_engine::start(const flow::definition& def, const std::string& key,
                        const inbound_message& msg, const turn_token* turn) {
  auto& c = create(key);
  c.def = &def;
  c.current = msg;
  c.turn = turn;
  c.created = msg.timestamp;
  begin_step(c);
  drive(c);
}

// Runs steps until the conversation waits for an answer or ends.
void flow_engine::drive(conversation& c) {
  for (;;) {
    if (c.superseded) {
      finish(c, false); // the checkpoint belongs to whoever moved it on
      return;
    }
    if (!c.task.done())
      return; // waiting for an answer
    try {
      c.task.rethrow();
    } catch (const lease_lost_error& e) {
      // The turn ended under the step (settle, a lost lease): the step is
      // suspended, not failed. Its checkpoint stays for the next holder.
      host_.raise_error(errc::lease_lost,
                        fmt::format("chat {}: flow {} step {}: {}", c.key,
                                    c.def->name, c.def->steps[c.step].name,
                                    e.what()),
                        c.key, &c.current);
      finish(c, false);
      return;
    } catch (const std::exception& e) {
      // A store failure (a checkpoint write that did not land) keeps its
      // code: with durability the message is then handled again. It keeps
      // the checkpoint too: the last one that landed (with the answer it
      // saved) is where the conversation resumes, on the replay or on the
      // user's next message; clearing it would lose the conversation for
      // a write that merely failed.
      auto code = errc::handler_failed;
      if (auto* be = dynamic_cast<const error*>(&e);
          be && (be->code() == errc::store_error || be->code() == errc::timeout))
        code = be->code();
      host_.raise_error(code,
                        fmt::format("chat {}: flow {} step {} failed: {}",
                                    c.key, c.def->name,
                                    c.def->steps[c.step].name, e.what()),
                        c.key, &c.current);
      finish(c, code == errc::handler_failed);
      return;
    } catch (...) {
      host_.raise_error(errc::handler_failed,
                        fmt::format("chat {}: flow {} step {} failed",
                                    c.key, c.def->name,
                                    c.def->steps[c.step].name),
                        c.key, &c.current);
      finish(c, true);
      return;
    }
    switch (c.pending) {
      case conversation::next::end:
        finish(c, true);
        return;
      case conversation::next::go_to: {
        auto target = flow_named(c.goto_flow);
        if (!target) {
          host_.raise_error(errc::invalid_argument,
                            fmt::format("chat {}: go_to an unknown flow \"{}\"",
                                        c.key, c.goto_flow),
                            c.key, &c.current);
          finish(c, true);
          return;
        }
        auto step = c.goto_step.empty() ? std::optional<std::size_t>{0}
                                        : target->index_of(c.goto_step);
        if (!step) {
          host_.raise_error(errc::invalid_argument,
                            fmt::format("chat {}: go_to an unknown step \"{}\" "
                                        "of flow {}",
                                        c.key, c.goto_step, target->name),
                            c.key, &c.current);
          finish(c, true);
          return;
        }
        // The target's first checkpoint write replaces (or, when it is not
        // checkpointed, removes) the stored one.
        c.def = target;
        c.step = *step;
        break;
      }
      case conversation::next::none:
        if (c.step + 1 >= c.def->steps.size()) {
          finish(c, true);
          return;
        }
        ++c.step;
        break;
    }
    c.preloaded.reset(); // answered question 0 of the step that ended only
    begin_step(c);
  }
}

void flow_engine::finish(conversation& c, bool clear) {
  // Ended without clearing (superseded, its turn lost, a store failure):
  // the message that woke it is not routed as a new one either. Its
  // effect would be made visible by a stale copy, and with durability the
  // message is handled again anyway.
  if (!clear && c.kept_used)
    *c.kept_used = true;
  // A step whose turn ended (settle, lost lease) never clears: the
  // checkpoint belongs to whoever holds the chat now.
  bool left = looks_for_checkpoints() && (c.revision != 0 || c.superseded);
  if (clear && c.revision != 0 && !c.superseded
      && (!c.turn || c.turn->valid())) {
    try {
      left = !host_.flow_store().clear_checkpoint_if(c.key, c.revision);
    } catch (...) {
      uncertain(c.key); // it may have landed
      throw;
    }
  }
  auto key = c.key;
  erase(key);
  if (left)
    uncertain(key); // a checkpoint stays that no conversation in memory has
}

void flow_engine::superseded(const std::string& key, std::string_view flow,
                             std::uint64_t revision,
                             const inbound_message& msg) {
  uncertain(key); // the store holds someone else's checkpoint
  host_.raise_error(errc::lease_lost,
                    fmt::format("lease lost for {}: superseded (checkpoint of "
                                "flow {} moved on past revision {})",
                                key, flow, revision),
                    key, &msg);
}

bool flow_engine::lapsed(const conversation& c) const {
  return c.lapses_at && *c.lapses_at <= clock::system().now();
}

void flow_engine::uncertain(const std::string& key) {
  if (!looks_for_checkpoints())
    return;
  std::lock_guard guard{mtx_};
  dropped_.insert(key);
}

void flow_engine::end_turn(const std::string& key) {
  if (flows_.empty() || !looks_for_checkpoints())
    return;
  std::lock_guard guard{mtx_};
  if (handed_.erase(key) > 0)
    dropped_.insert(key); // handed to this turn and not used: read later
}

void flow_engine::deliver(conversation& c, answer a) {
  c.waiting = false;
  rearm(c, c.wait_timer, std::nullopt);
  *c.answer_slot = std::move(a);
  c.resume_point.resume();
  drive(c);
}

bool flow_engine::restore(const std::string& key, const inbound_message& msg,
                          const turn_token* turn, bool* answer_saved,
                          std::optional<flow_checkpoint> handed) {
  bool from_hand = handed.has_value();
  auto cp = std::move(handed);
  try {
    if (!from_hand)
      cp = host_.flow_store().get_checkpoint(key);
  } catch (const error& e) {
    if (e.code() != errc::corrupted_record)
      throw;
    // Unusable: say so, drop it, and let the message go on as a new one.
    host_.raise_error(errc::corrupted_record,
                      fmt::format("chat {}: its checkpoint cannot be read and "
                                  "is discarded: {}",
                                  key, e.what()),
                      key, &msg);
    if (turn)
      turn->check();
    // At the damaged record's revision when the store could read it, else
    // only while its revision still cannot be read: a replica that took
    // the chat while this turn stalled may have written a newer
    // checkpoint, and an unconditional clear would remove it (its next
    // write refused, its conversation lost as superseded).
    auto* damaged = dynamic_cast<const corrupted_checkpoint_error*>(&e);
    if (damaged && damaged->revision())
      host_.flow_store().clear_checkpoint_if(key, *damaged->revision());
    else
      host_.flow_store().clear_damaged_checkpoint(key);
    return false;
  }
  if (!cp)
    return false;
  auto def = flow_named(cp->flow);
  auto step = def ? def->index_of(cp->step) : std::nullopt;
  bool changed = !def || !step || cp->fingerprint != fingerprint_of(*def);
  if (cp->marker || changed) {
    // Nothing to resume: the marker (or the stale checkpoint) goes, and
    // the fallback decides what the message does.
    if (turn)
      turn->check();
    handover_info info;
    info.key = key;
    info.name = cp->flow;
    info.step = cp->step;
    info.reason = changed                ? "changed"
                  : def && def->coroutine ? "conversation"
                                          : "state";
    if (!cp->marker && is_valid_json(cp->state))
      info.state = cp->state;
    if (cfg_.fallback == handover_config::fallback_kind::notify) {
      // The notice goes before the marker does, so a turn lost on its way
      // (the send refused past settle, a lost lease) leaves the marker to
      // the next holder, which notifies, instead of a conversation dropped
      // unsaid. The stored copy moves on first (the same record, its next
      // revision): a compare-and-set that refuses a copy the store moved
      // past (a handed one too), and after which a replica whose own copy
      // is at the old revision never takes it for current
      // (check_unknown_holder) and resumes after the notice.
      auto moved = host_.flow_store().set_checkpoint_if(*cp, cp->revision);
      if (!moved) {
        superseded(key, cp->flow, cp->revision, msg);
        return true;
      }
      auto consumed = fallback(key, msg, turn, std::move(info));
      if (turn)
        turn->check();
      host_.flow_store().clear_checkpoint_if(key, *moved);
      return consumed;
    }
    if (!host_.flow_store().clear_checkpoint_if(key, cp->revision)
        && from_hand) {
      // A handed copy the store moved past: superseded, as a refused write
      // (nothing of the fallback is made visible).
      superseded(key, cp->flow, cp->revision, msg);
      return true;
    }
    return fallback(key, msg, turn, std::move(info));
  }
  auto& c = create(key);
  c.turn = turn;
  c.def = def;
  c.step = *step;
  c.current = msg;
  c.revision = cp->revision;
  c.lapses_at = lapses_of(*cp);
  if (hands_over())
    c.stored = *cp;
  c.created = cp->created_at;
  try {
    c.state = nlohmann::json::parse(cp->state);
  } catch (const std::exception&) {
    c.state = nlohmann::json::object(); // store encodings guarantee JSON
  }
  bool kept_used = true;
  // This checkpoint was written in the turn of this very message (handled
  // again: its record replayed after the write landed): the message is in
  // it already, and answers nothing more. The step starts over where it
  // waits (its question goes out again, unless the outbox knows it).
  bool replayed = !cp->answer_ref.empty() && cp->answer_ref == message_ref(msg);
  if (cp->saved_answer) {
    // A cut step: its answer was saved, so it is not asked again; the
    // message that woke the conversation answers the next question --
    // unless it is the saved answer itself (a journaled message handled
    // again after its first holder died), which must not answer twice.
    bool same = same_delivery(*cp->saved_answer, msg);
    c.preloaded = std::move(*cp->saved_answer);
    if (!same) {
      c.kept = msg;
      kept_used = false;
      c.kept_used = &kept_used;
    }
  } else if (cp->waiting && cp->question == 0 && !replayed) {
    // Waiting at the step's first question: this message is its answer.
    // Otherwise the step starts over and asks its first question.
    c.preloaded = msg;
  }
  host_.handover_event(key, def->name, "resumed", "");
  c.answer_saved = answer_saved;
  begin_step(c);
  drive(c);
  if (auto* still = find(key)) {
    still->kept_used = nullptr;
    still->answer_saved = nullptr;
  }
  // A conversation that ended before its next question leaves the waking
  // message unanswered: it is routed as a new one.
  return kept_used;
}

bool flow_engine::fallback(const std::string& key, const inbound_message& msg,
                           const turn_token* turn, handover_info info) {
  using fk = handover_config::fallback_kind;
  switch (cfg_.fallback) {
    case fk::drop:
      break;
    case fk::notify: {
      std::string_view notice =
        cfg_.notify_message.empty()
          ? text(host_.lang(), "core.conversation.interrupted")
          : std::string_view{cfg_.notify_message};
      host_.send_to_chat(key, msg, notice, turn);
      host_.handover_event(key, info.name, "notified", info.reason);
      return true;
    }
    case fk::restart:
      if (auto def = flow_named(info.name)) {
        host_.handover_event(key, info.name, "restarted", info.reason);
        start(*def, key, msg, turn);
        return true;
      }
      break; // removed from this bot: nothing to enter
    case fk::custom:
      if (host_.handover_custom(info, msg, turn)) {
        host_.handover_event(key, info.name, "handled", info.reason);
        return true;
      }
      break;
  }
  host_.handover_event(key, info.name, "dropped", info.reason);
  return false;
}

bool flow_engine::on_message(const std::string& key,
                             const inbound_message& msg, bool first,
                             const turn_token* turn, bool* answer_saved) {
  if (flows_.empty())
    return false; // a bot without flows pays nothing per message
  try {
    auto consumed = offer(key, msg, first, turn, answer_saved);
    note_handoff(key, turn);
    return consumed;
  } catch (...) {
    // A write that failed or was fenced left the conversation in memory at
    // an unknown point: it goes, and the next message reads the store.
    drop(key);
    throw;
  }
}

bool flow_engine::offer(const std::string& key, const inbound_message& msg,
                        bool first, const turn_token* turn,
                        bool* answer_saved) {
  auto c = find(key);
  if (!c && looks_for_checkpoints()) {
    bool look = first;
    std::optional<flow_checkpoint> known;
    {
      std::lock_guard guard{mtx_};
      look = dropped_.erase(key) > 0 || look;
      if (auto h = handed_.find(key); h != handed_.end()) {
        // Newer than anything read at `first`, unless about to expire in
        // the store (checked now, when it is used).
        if (usable(h->second))
          known = std::move(h->second);
        handed_.erase(h);
        look = true;
      }
    }
    if (look && restore(key, msg, turn, answer_saved, std::move(known)))
      return true;
  }
  if (c) {
    c->current = msg;
    c->turn = turn;
    for (auto& w : c->idles)
      rearm(*c, w.timer, w.after); // silence restarts with every message
    if (c->waiting) {
      if (c->waiting_question == 0) {
        // The step's first answer is saved before the step goes on (even
        // before a slow validator), so a cut step does not ask again.
        auto mode = mode_of(*c);
        if (mode == cp_mode::full || mode == cp_mode::ephemeral) {
          c->answer_saved = answer_saved;
          checkpoint(*c, true, 0, &msg);
          c->answer_saved = nullptr;
          if (c->superseded) {
            finish(*c, false); // the checkpoint belongs to whoever moved it on
            return true;
          }
        }
      }
      answer a{msg, false};
      if (c->ask_opts.validate) {
        if (auto err = c->ask_opts.validate(a)) {
          send(*c, *err);
          send(*c, c->question);
          // The refused answer saved above must not be given to a taker.
          if (c->waiting_question == 0 && c->revision != 0 && !c->marker) {
            checkpoint(*c, true, 0);
            if (c->superseded) {
              // Moved on by another writer between the two writes: ended
              // here, or it would take (and swallow) the next message.
              finish(*c, false);
            }
          }
          return true;
        }
      }
      deliver(*c, std::move(a));
      return true;
    }
  }
  for (auto& f : flows_) {
    if (f->triggered_by(msg.text)) {
      start(*f, key, msg, turn);
      return true;
    }
  }
  return false;
}

bool flow_engine::on_timer(const std::string& key, std::uint64_t id,
                           const turn_token* turn) {
  bool ran = false;
  try {
    ran = fire(key, id, turn);
  } catch (...) {
    // As in on_message: the conversation is at an unknown point.
    drop(key);
    throw;
  }
  // (A turn that ran nothing hands nothing over: it is given up, not
  // released.)
  if (ran)
    note_handoff(key, turn);
  return ran;
}

bool flow_engine::fire(const std::string& key, std::uint64_t id,
                       const turn_token* turn) {
  auto c = find(key);
  if (!c)
    return false; // the conversation ended (or moved on elsewhere): stale
  c->turn = turn;
  if (c->waiting && c->wait_timer == id) {
    deliver(*c, answer{c->current, true});
    return true;
  }
  for (auto& w : c->idles) {
    if (w.timer == id) {
      rearm(*c, w.timer, std::nullopt);
      auto fn = w.fn;
      // What the waiting step already set (go_to, end) is kept unless the
      // watcher sets its own: the step goes on after the wait as it said.
      auto set_by_step = c->pending;
      c->pending = conversation::next::none;
      try {
        fn(c->ctx);
      } catch (const lease_lost_error& e) {
        host_.raise_error(errc::lease_lost,
                          fmt::format("chat {}: idle watcher: {}", key,
                                      e.what()),
                          key, nullptr);
        finish(*c, false);
        return true;
      } catch (const std::exception& e) {
        host_.raise_error(errc::handler_failed,
                          fmt::format("chat {}: idle watcher failed: {}", key,
                                      e.what()),
                          key, nullptr);
      } catch (...) {
        // Whatever a watcher throws becomes an error event, never an
        // exception out of the handler thread.
        host_.raise_error(errc::handler_failed,
                          fmt::format("chat {}: idle watcher failed", key),
                          key, nullptr);
      }
      if (c->pending == conversation::next::end)
        finish(*c, true);
      else if (c->pending == conversation::next::none)
        c->pending = set_by_step;
      return true;
    }
  }
  // Neither the current wait nor a live watcher: stale, discarded.
  return false;
}

} // namespace internal
} // namespace botmesh
