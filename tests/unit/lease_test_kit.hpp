#pragma once

// A deterministic harness for the lease actor (see lease_actor_test.cpp):
//
// - CAF's test coordinator drives every actor on the test thread; virtual
//   time moves only when the test says so (`advance`, `freeze`), and the
//   lease actor's `self->clock()` is that test clock.
// - `scripted_coordinator` records every call the lease actor makes and lets
//   the test answer it later, fail it (a lost reply is `errc::timeout`), or
//   never answer it. Its backend clock is the test clock plus a fixed offset.
// - `chat_probe` stands in for a chat actor or a session and records what
//   the lease actor tells it.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <doctest/doctest.h>

#include <botmesh/actors/lease_actor.hpp>
#include <botmesh/actors/messages.hpp>
#include <botmesh/runtime/core/clock.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/coordinator.hpp>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::turn_token>)

namespace lease_kit {

using namespace std::chrono_literals;
using ms = std::chrono::milliseconds;
using local_clock = std::chrono::steady_clock;

// -- a coordinator answered by the test ---------------------------------------

enum class op { enter, poll, release, leave, skip, renew, unlead };

inline const char* to_string(op k) {
  switch (k) {
    case op::enter: return "enter";
    case op::poll: return "poll";
    case op::release: return "release";
    case op::leave: return "leave";
    case op::skip: return "skip_if_dead";
    case op::renew: return "renew";
    case op::unlead: return "unlead";
  }
  return "?";
}

/// One call the lease actor made, with its completion.
struct call {
  op kind = op::enter;
  std::string key;           // chat key, or leadership name for unlead
  std::uint64_t req = 0;     // enter, poll, leave
  bool retry = false;        // enter
  std::uint64_t fence = 0;   // release, unlead
  std::string handoff{};     // release
  std::string incarnation;   // skip_if_dead
  botmesh::renewal renewal;  // renew
  std::int64_t sent_ms = 0;  // backend clock when the call was made
  bool answered = false;
  botmesh::coordinator::completion<botmesh::turn_state> on_state;
  botmesh::coordinator::completion<botmesh::release_result> on_release;
  botmesh::coordinator::completion<bool> on_bool;
  botmesh::coordinator::completion<botmesh::renewal_result> on_renewal;
};

class scripted_coordinator final : public botmesh::coordinator {
 public:
  using backend_clock = std::function<std::int64_t()>;
  /// Called for each new call of a kind; may answer it at once.
  using policy = std::function<void(call&)>;

  scripted_coordinator(ms lease, backend_clock now)
    : lease_(lease), now_(std::move(now)) {
    // nop
  }

  // -- botmesh::coordinator --------------------------------------------------

  const std::string& replica_id() const noexcept override {
    return replica_;
  }

  const std::string& incarnation() const noexcept override {
    return incarnation_;
  }

  std::chrono::milliseconds lease() const noexcept override {
    return lease_;
  }

  void enter(std::string_view key, std::uint64_t req, bool retry,
             completion<botmesh::turn_state> done) override {
    auto& c = add(op::enter, key);
    c.req = req;
    c.retry = retry;
    c.on_state = std::move(done);
    apply(c);
  }

  void poll(std::string_view key, std::uint64_t req,
            completion<botmesh::turn_state> done) override {
    auto& c = add(op::poll, key);
    c.req = req;
    c.on_state = std::move(done);
    apply(c);
  }

  void release(botmesh::turn_ref t, std::string_view handoff,
               completion<botmesh::release_result> done) override {
    auto& c = add(op::release, t.key);
    c.fence = t.fence;
    c.handoff = std::string{handoff};
    c.on_release = std::move(done);
    apply(c);
  }

  void submit(std::vector<turn_op> ops) override {
    submits.push_back(ops.size());
    coordinator::submit(std::move(ops)); // records each as its own call
  }

  void leave(std::string_view key, std::uint64_t req,
             completion<bool> done) override {
    auto& c = add(op::leave, key);
    c.req = req;
    c.on_bool = std::move(done);
    apply(c);
  }

  void skip_if_dead(std::string_view key, std::string_view incarnation,
                    completion<bool> done) override {
    auto& c = add(op::skip, key);
    c.incarnation = std::string{incarnation};
    c.on_bool = std::move(done);
    apply(c);
  }

  void renew(botmesh::renewal r,
             completion<botmesh::renewal_result> done) override {
    auto& c = add(op::renew, "");
    c.renewal = std::move(r);
    c.on_renewal = std::move(done);
    apply(c);
  }

  void unlead(std::string_view name, std::uint64_t fence,
              completion<bool> done) override {
    auto& c = add(op::unlead, name);
    c.fence = fence;
    c.on_bool = std::move(done);
    apply(c);
  }

  void on_grant(grant_listener fn) override {
    push_ = std::move(fn);
  }

  std::uint64_t push_epoch() const noexcept override {
    return 1;
  }

  // -- the test's side ---------------------------------------------------------

  /// The size of every `submit`, oldest first.
  std::vector<std::size_t> submits;

  std::int64_t backend_ms() const {
    return now_();
  }

  /// How new calls of `k` are answered (nothing: they wait for the test).
  void set_policy(op k, policy p) {
    policies_[k] = std::move(p);
  }

  /// Every call of kind `k`, oldest first.
  std::vector<call*> all(op k) {
    std::vector<call*> out;
    for (auto& c : calls_)
      if (c->kind == k)
        out.push_back(c.get());
    return out;
  }

  std::vector<call*> pending(op k) {
    std::vector<call*> out;
    for (auto& c : calls_)
      if (c->kind == k && !c->answered)
        out.push_back(c.get());
    return out;
  }

  std::size_t count(op k) {
    return all(k).size();
  }

  /// Calls of kind `k` about (key, fence) for release/unlead, (key, req)
  /// for enter/poll/leave.
  std::size_t count(op k, const std::string& key, std::uint64_t id) {
    std::size_t n = 0;
    for (auto* c : all(k))
      if (c->key == key && (c->fence == id || c->req == id))
        ++n;
    return n;
  }

  /// The newest call of kind `k`; fails the test when there is none.
  call& last(op k) {
    auto xs = all(k);
    REQUIRE_MESSAGE(!xs.empty(), "no " << to_string(k) << " call");
    return *xs.back();
  }

  /// The oldest unanswered call of kind `k`; fails the test when none.
  call& next(op k) {
    auto xs = pending(k);
    REQUIRE_MESSAGE(!xs.empty(), "no pending " << to_string(k) << " call");
    return *xs.front();
  }

  /// Pushes a grant to the lease actor, as a release elsewhere would.
  void push(botmesh::turn_state s) {
    REQUIRE(push_);
    push_(std::move(s));
  }

  // Answers (each answers a call once).

  static void answer(call& c, botmesh::turn_state s) {
    REQUIRE(!c.answered);
    c.answered = true;
    c.on_state(std::move(s), nullptr);
  }

  static void answer(call& c, botmesh::release_result r) {
    REQUIRE(!c.answered);
    c.answered = true;
    c.on_release(std::move(r), nullptr);
  }

  static void answer(call& c, bool b) {
    REQUIRE(!c.answered);
    c.answered = true;
    c.on_bool(b, nullptr);
  }

  static void answer(call& c, botmesh::renewal_result r) {
    REQUIRE(!c.answered);
    c.answered = true;
    c.on_renewal(std::move(r), nullptr);
  }

  /// The reply never came (the request may or may not have run).
  static void fail(call& c) {
    REQUIRE(!c.answered);
    c.answered = true;
    auto e = std::make_exception_ptr(
      botmesh::error(botmesh::errc::timeout, "no reply (scripted)"));
    switch (c.kind) {
      case op::enter:
      case op::poll:
        c.on_state({}, e);
        break;
      case op::release:
        c.on_release({}, e);
        break;
      case op::leave:
      case op::skip:
      case op::unlead:
        c.on_bool(false, e);
        break;
      case op::renew:
        c.on_renewal({}, e);
        break;
    }
  }

  // Backend answers.

  botmesh::turn_state granted(const std::string& key, std::uint64_t req,
                              std::uint64_t fence,
                              std::optional<std::int64_t> at_ms = {}) const {
    auto at = at_ms ? *at_ms : backend_ms();
    botmesh::turn_state s;
    s.state = botmesh::turn_state::status::granted;
    s.key = key;
    s.req = req;
    s.ticket = fence;
    s.fence = fence;
    s.deadline_ms = at + lease_.count();
    s.now_ms = at;
    return s;
  }

  botmesh::turn_state waiting(const std::string& key, std::uint64_t req,
                              std::string blocker = "someone-else",
                              std::optional<std::int64_t> at_ms = {}) const {
    botmesh::turn_state s;
    s.state = botmesh::turn_state::status::waiting;
    s.key = key;
    s.req = req;
    s.blocker = std::move(blocker);
    s.now_ms = at_ms ? *at_ms : backend_ms();
    return s;
  }

  botmesh::turn_state gone(const std::string& key, std::uint64_t req) const {
    botmesh::turn_state s;
    s.key = key;
    s.req = req;
    s.now_ms = backend_ms();
    return s;
  }

  /// The answer to renewal `c` when the backend ran it at `at_ms` (default:
  /// when it was sent): every turn kept, every name led at fence `lead_fence`.
  botmesh::renewal_result renewed(const call& c,
                                  std::optional<std::int64_t> at_ms = {},
                                  std::uint64_t lead_fence = 1) const {
    auto at = at_ms ? *at_ms : c.sent_ms;
    botmesh::renewal_result r;
    r.now_ms = at;
    for (std::size_t i = 0; i < c.renewal.turns.size(); ++i)
      r.turns.push_back(at + lease_.count());
    for (auto& name : c.renewal.leads)
      r.leads.push_back(
        botmesh::leadership{name, lead_fence, at + lease_.count(), at});
    return r;
  }

  botmesh::release_result released(const call& c) const {
    botmesh::release_result r;
    r.released = true;
    r.now_ms = backend_ms();
    return r;
  }

  // Ready-made policies.

  /// Renewals answered at once: everything kept.
  void keep_renewing() {
    set_policy(op::renew, [this](call& c) { answer(c, renewed(c)); });
  }

  /// Renewals answered at once with an error.
  void fail_renewals() {
    set_policy(op::renew, [](call& c) { fail(c); });
  }

  /// Renewals wait for the test.
  void hold_renewals() {
    set_policy(op::renew, nullptr);
  }

  /// The first `failures` calls of `k` (a release, leave or unlead) fail;
  /// later ones are answered at once, ok (nothing next).
  void fail_first(op k, int failures) {
    set_policy(k, [this, k, failures](call& c) mutable {
      if (failures-- > 0)
        fail(c);
      else if (k == op::release)
        answer(c, released(c));
      else
        answer(c, true);
    });
  }

  /// Releases, leaves and unleads answered at once (ok, nothing next).
  void answer_cleanups() {
    set_policy(op::release, [this](call& c) { answer(c, released(c)); });
    set_policy(op::leave, [](call& c) { answer(c, true); });
    set_policy(op::unlead, [](call& c) { answer(c, true); });
  }

 private:
  call& add(op k, std::string_view key) {
    calls_.push_back(std::make_unique<call>());
    auto& c = *calls_.back();
    c.kind = k;
    c.key = std::string{key};
    c.sent_ms = backend_ms();
    return c;
  }

  void apply(call& c) {
    if (auto i = policies_.find(c.kind); i != policies_.end() && i->second)
      i->second(c);
  }

  std::string replica_ = "replica-under-test";
  std::string incarnation_ = "incarnation-under-test";
  ms lease_;
  backend_clock now_;
  grant_listener push_;
  std::map<op, policy> policies_;
  std::deque<std::unique_ptr<call>> calls_;
};

// -- what the lease actor tells a chat or a session ----------------------------

struct probe_log {
  struct grant {
    std::uint64_t req = 0;
    std::shared_ptr<botmesh::turn_token> token;
  };
  struct loss {
    std::uint64_t req = 0;
    std::uint64_t fence = 0;
    std::string why;
  };
  std::vector<grant> grants;
  std::vector<loss> losses;
  std::vector<std::pair<std::string, std::uint64_t>> leaders;
  std::map<std::string, std::int64_t> valid_until; // the last lead_valid
  std::vector<std::pair<std::string, std::string>> followers;
  std::vector<bool> shutdown_replies;

  std::shared_ptr<botmesh::turn_token> token_of(std::uint64_t req) const {
    for (auto& g : grants)
      if (g.req == req)
        return g.token;
    return nullptr;
  }

  std::size_t losses_of(std::uint64_t req) const {
    std::size_t n = 0;
    for (auto& l : losses)
      n += l.req == req ? 1 : 0;
    return n;
  }
};

inline caf::behavior chat_probe(caf::event_based_actor*,
                                std::shared_ptr<probe_log> log) {
  return {
    [=](botmesh::granted_atom, std::uint64_t req,
        std::shared_ptr<botmesh::turn_token>& token) {
      log->grants.push_back({req, std::move(token)});
    },
    [=](botmesh::lost_atom, std::uint64_t req, std::uint64_t fence,
        const std::string& why) {
      log->losses.push_back({req, fence, why});
    },
    [=](botmesh::leader_atom, const std::string& name, std::uint64_t fence) {
      log->leaders.emplace_back(name, fence);
    },
    [=](botmesh::follower_atom, const std::string& name,
        const std::string& why) {
      log->followers.emplace_back(name, why);
    },
    [=](botmesh::lead_valid_atom, const std::string& name, std::int64_t until) {
      log->valid_until[name] = until;
    },
  };
}

/// Records the listener's `turn_lost` calls.
struct listener_log final : botmesh::lease_listener {
  struct entry {
    std::string key;
    std::uint64_t fence = 0;
    botmesh::turn_end why = botmesh::turn_end::holding;
  };
  std::vector<entry> lost;

  void turn_lost(const std::string& key, std::uint64_t fence,
                 botmesh::turn_end why) override {
    lost.push_back({key, fence, why});
  }
};

// -- the actor system on virtual time -----------------------------------------

struct test_config : caf::actor_system_config {
  test_config() {
    set("scheduler.policy", caf::atom("testing"));
    set("logger.file-verbosity", caf::atom("quiet"));
    set("logger.console-verbosity", caf::atom("quiet"));
  }
};

/// An actor system whose actors run only when the test runs them, and whose
/// clock moves only when the test moves it. A `manual_clock` (for a memory
/// hub) may be attached: it moves in lockstep.
class virtual_system {
 public:
  virtual_system()
    : sys_(cfg_),
      sched_(dynamic_cast<caf::scheduler::test_coordinator&>(sys_.scheduler())) {
    // A time that is not the clock's epoch.
    sched_.clock().current_time += std::chrono::hours(1);
    start_ = sched_.clock().current_time;
    sys_.await_actors_before_shutdown(false);
  }

  virtual_system(const virtual_system&) = delete;
  virtual_system& operator=(const virtual_system&) = delete;

  caf::actor_system& sys() {
    return sys_;
  }

  local_clock::time_point now() const {
    return sched_.clock().now();
  }

  /// Virtual milliseconds since the system started.
  std::int64_t elapsed_ms() const {
    return std::chrono::duration_cast<ms>(now() - start_).count();
  }

  /// The backend's clock: the same pace, another origin.
  std::int64_t backend_ms() const {
    return backend_at(elapsed_ms());
  }

  caf::scheduler::test_coordinator& sched() {
    return sched_;
  }

  /// The backend's clock at `elapsed` virtual ms since the start.
  static std::int64_t backend_at(std::int64_t elapsed) {
    return 1'700'000'000'000 + elapsed;
  }

  void attach(botmesh::manual_clock& c) {
    manual_ = &c;
  }

  /// Runs every actor until no message is left (timeouts not triggered).
  void run() {
    while (sched_.try_run_once())
      ; // nop
  }

  /// Lets `d` pass one millisecond at a time, delivering each delayed
  /// message when it is due and running what it causes.
  void advance(ms d) {
    run();
    for (ms i{0}; i < d; ++i) {
      sched_.advance_time(1ms);
      if (manual_)
        manual_->advance(1ms);
      run();
    }
  }

  /// Advances to `elapsed` virtual ms since the start.
  void advance_to(std::int64_t elapsed) {
    REQUIRE(elapsed >= elapsed_ms());
    advance(ms{elapsed - elapsed_ms()});
  }

  /// The process stands still for `d` (SIGSTOP): the clock jumps, nothing
  /// runs meanwhile; what fell due is delivered afterwards, all at once.
  void freeze(ms d) {
    sched_.advance_time(d);
    if (manual_)
      manual_->advance(d);
  }

 private:
  test_config cfg_;
  caf::actor_system sys_;
  caf::scheduler::test_coordinator& sched_;
  local_clock::time_point start_;
  botmesh::manual_clock* manual_ = nullptr;
};

/// A lease actor on a scripted coordinator, with a chat probe.
struct lease_fixture {
  static constexpr ms lease{3000}; // lease/3 = 1000, margin = 300

  virtual_system vs;
  std::shared_ptr<scripted_coordinator> coord;
  listener_log listener;
  caf::actor lease_actor;
  std::shared_ptr<probe_log> chat_log = std::make_shared<probe_log>();
  caf::actor chat;

  explicit lease_fixture(ms settle = 60'000ms) {
    coord = std::make_shared<scripted_coordinator>(
      lease, [this] { return vs.backend_ms(); });
    coord->keep_renewing();
    coord->answer_cleanups();
    lease_actor = botmesh::spawn_lease_actor(
      vs.sys(), botmesh::lease_config{.coordinator = coord,
                                      .settle = settle,
                                      .listener = &listener});
    chat = vs.sys().spawn(chat_probe, chat_log);
    vs.run();
  }

  ~lease_fixture() {
    caf::anon_send_exit(lease_actor, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(chat, caf::exit_reason::user_shutdown);
    vs.run();
  }

  /// A second probe (another chat, or a session).
  std::pair<caf::actor, std::shared_ptr<probe_log>> another_probe() {
    auto log = std::make_shared<probe_log>();
    return {vs.sys().spawn(chat_probe, log), log};
  }

  /// Another probe, presented as a session for `name` and elected (its
  /// election renewal answered at once).
  std::pair<caf::actor, std::shared_ptr<probe_log>>
  elected_session(const std::string& name) {
    auto [session, log] = another_probe();
    tell(session, botmesh::lead_atom::value, name);
    REQUIRE(log->leaders.size() == 1);
    return {session, log};
  }

  template <class... Ts>
  void tell(const caf::actor& from, Ts&&... xs) {
    caf::send_as(from, lease_actor, std::forward<Ts>(xs)...);
    vs.run();
  }

  void acquire(const std::string& key, std::uint64_t req) {
    tell(chat, botmesh::acquire_atom::value, key, req);
  }

  void release(const std::string& key, std::uint64_t fence) {
    tell(chat, botmesh::release_atom::value, key, fence);
  }

  void leave(const std::string& key, std::uint64_t req) {
    tell(chat, botmesh::leave_atom::value, key, req);
  }

  void pass(const std::string& key, std::uint64_t fence) {
    tell(chat, botmesh::pass_atom::value, key, fence);
  }

  void start(const std::string& key, std::uint64_t fence) {
    tell(chat, botmesh::start_atom::value, key, fence);
  }

  /// Acquires and answers the enter with a grant at once; returns the token.
  std::shared_ptr<botmesh::turn_token>
  hold(const std::string& key, std::uint64_t req, std::uint64_t fence) {
    acquire(key, req);
    auto& c = coord->last(op::enter);
    REQUIRE(c.req == req);
    scripted_coordinator::answer(c, coord->granted(key, req, fence));
    vs.run();
    auto t = chat_log->token_of(req);
    REQUIRE(t);
    return t;
  }

  /// Releases asked for (key, fence).
  std::size_t releases(const std::string& key, std::uint64_t fence) {
    return coord->count(op::release, key, fence);
  }
};

} // namespace lease_kit
