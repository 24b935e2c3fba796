#include <botmesh/actors/lease_actor.hpp>
#include <botmesh/actors/internal/caf_logger.hpp>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <queue>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <caf/all.hpp>
#include <fmt/format.h>

#include <botmesh/actors/messages.hpp>
#include <botmesh/runtime/core/log.hpp>
#include <botmesh/runtime/core/internal/text.hpp>

namespace botmesh {

lease_listener::~lease_listener() {
  // nop
}

namespace {

using internal::what_of;
using clk = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

using tick_atom = caf::atom_constant<caf::atom("bm_ltick")>;
using wake_atom = caf::atom_constant<caf::atom("bm_lwake")>;
using give_up_atom = caf::atom_constant<caf::atom("bm_lgiveup")>;
using flush_atom = caf::atom_constant<caf::atom("bm_lflush")>;

// Completions of coordinator calls, as messages to the lease actor.
struct enter_done {
  std::uint64_t req = 0;
  clk::time_point sent{};
  turn_state st{};
  std::string error{}; // empty: ok
};

struct poll_done {
  std::uint64_t req = 0;
  clk::time_point sent{};
  turn_state st{};
  std::string error{};
};

struct release_done {
  turn_ref ref{};
  clk::time_point sent{};
  release_result res{};
  std::string error{};
};

struct leave_done {
  std::string key{};
  std::uint64_t req = 0;
  std::string error{};
};

struct renew_done {
  clk::time_point sent{};
  std::uint64_t seq = 0; // the lease actor's count of renewals sent
  renewal asked{};
  renewal_result res{};
  std::string error{};
};

struct skip_done {
  std::uint64_t req = 0;
  std::string error{};
};

struct unlead_done {
  std::string name{};
  std::uint64_t fence = 0;
  std::string error{};
};

struct pushed_grant {
  turn_state st{};
};

} // namespace
} // namespace botmesh

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::enter_done)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::poll_done)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::release_done)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::leave_done)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::renew_done)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::skip_done)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::unlead_done)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::pushed_grant)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::turn_token>)

namespace botmesh {

namespace {

// Completions arrive on backend threads. They reach the actor through this
// gate, which the actor closes when it exits: nothing is sent to it (or to
// its actor system) afterwards.
struct gate {
  std::mutex mtx;
  caf::actor target;

  template <class... Ts>
  void send(Ts&&... xs) {
    std::lock_guard guard{mtx};
    if (target)
      caf::anon_send(target, std::forward<Ts>(xs)...);
  }

  void close() {
    std::lock_guard guard{mtx};
    target = nullptr;
  }
};

struct waiting {
  std::string key;
  caf::actor chat;
  bool in_flight = false; // an enter or poll is outstanding
  bool entered = false;   // an enter was answered: the ticket exists
  bool retry = false;     // an earlier enter may have run unanswered
  bool cancelled = false; // the chat gave it up while in flight
  bool settled = false;   // granted (or dropped) while in flight: the
                          // outstanding answer is stale and ignored
  std::uint64_t epoch = 0;
  clk::time_point next{clk::time_point::max()};
  milliseconds backoff{5};
  std::string blocker;
  clk::time_point blocked_since{};
  // When the tickets queued ahead were last looked at (or the wait began).
  clk::time_point ahead_checked{};
  int skipping = 0; // skip_if_dead calls outstanding
};

struct held {
  std::uint64_t req = 0;
  caf::actor chat;
  std::shared_ptr<turn_token> token;
  clk::time_point valid_until{};
  clk::time_point settle_at{clk::time_point::max()}; // set when it starts

  bool started() const noexcept {
    return settle_at != clk::time_point::max();
  }
};

struct leading {
  caf::actor session;
  std::optional<std::uint64_t> fence;
  clk::time_point valid_until{};
  bool told = false;
  // Renewals may be answered out of order (on different connections): an
  // older answer ("another replica leads", from before this one won) must
  // not undo a newer one. Renewals are numbered as they leave; answers of
  // those numbered below this are not acted on: it is the newest one
  // applied, or for a presenter afresh the first sent after it came (see
  // lead_atom).
  std::uint64_t answered_from = 0;
};

struct repair {
  // probe: a leadership given up while a renewal naming it was on its way,
  // whose answer was lost: it may have been won. Renewed alone to learn
  // (and then give back) its fence, while nobody here leads it again (a
  // name free by then is taken and given back at once: one round trip).
  enum kind_t { release, leave, unlead, probe } kind = release;
  std::string key;
  std::uint64_t id = 0; // fence or request
  clk::time_point give_up{};
  clk::time_point next{};
};

struct lease_state {
  lease_config cfg;
  std::shared_ptr<gate> g = std::make_shared<gate>();
  milliseconds lease{};
  milliseconds margin{};
  std::unordered_map<std::uint64_t, waiting> waits;
  std::unordered_map<std::string, held> holds; // by chat key
  std::unordered_map<std::string, leading> leads;
  // Unleads on their way, per name. An unlead is keyed by (incarnation,
  // term) and a renewal from this incarnation keeps the term, so one that
  // ran first (renewals go on another connection) would be undone by the
  // unlead behind it: the name freed while its new presenter is told it
  // leads. A name led here again is not renewed while it is listed.
  std::unordered_map<std::string, int> unleading;
  std::vector<repair> repairs;
  // Repairs sent again and not answered yet, with the deadline of the
  // first failure: a resend that fails too keeps it, so a backend that
  // stays down is asked for a lease, not forever. Entries past their
  // deadline are dropped by wake().
  std::map<std::tuple<int, std::string, std::uint64_t>, clk::time_point>
    resent;
  // Chats whose last grant here was given up before its step started,
  // while another (or an unknown) replica had held the chat before it. The
  // backend now names this replica as the chat's last holder, yet the
  // conversation may have moved on elsewhere: the next grant here says the
  // previous holder is unknown, so the bot reads the store rather than
  // resume what it has in memory. With when it was noted. Kept until the
  // chat's next grant here, not for a time: the backend may name this
  // replica for as long as it remembers the chat (Redis keeps an idle
  // chat's keys 10 minutes or more, the memory hub until it evicts it),
  // and one entry too many costs only a store read. Bounded in count
  // (max_passed; past it the oldest quarter goes): such grants are rare
  // (a freeze, a turn_wait that ran out).
  std::unordered_map<std::string, clk::time_point> passed;
  static constexpr std::size_t max_passed = 65'536;
  // When waiting requests are due, earliest first (stale entries skipped).
  std::priority_queue<std::pair<clk::time_point, std::uint64_t>,
                      std::vector<std::pair<clk::time_point, std::uint64_t>>,
                      std::greater<>>
    due;
  // The backend clock as seen from this process: a grant pushed with a
  // backend deadline D holds locally until at least D + base. Each reply
  // gives a bound (its send time minus its backend time); the largest of the
  // last half lease or so is kept, refreshed so a clock drift or jump ages
  // out.
  std::optional<std::int64_t> base_cur;
  std::optional<std::int64_t> base_prev;
  clk::time_point base_since{};
  clk::time_point armed{clk::time_point::max()};
  std::size_t in_flight = 0; // backend calls not answered yet
  std::uint64_t renewals_sent = 0; // numbers renew_done (answered_from)
  // Enters and releases not issued yet: they go together, as one
  // `coordinator::submit`, once the mailbox has nothing more before the
  // flush this actor sent itself with the first of them (see hold()).
  std::vector<coordinator::turn_op> batch;
  bool shutting_down = false;
  caf::response_promise shutdown_rp;

  static inline const char* name = "botmesh.lease";
};

using lease_actor_t = caf::stateful_actor<lease_state>;

clk::time_point now(lease_actor_t* self) {
  return self->clock().now();
}

std::int64_t ticks(clk::time_point t) {
  return t.time_since_epoch().count();
}

void observe(lease_actor_t* self, clk::time_point sent, std::int64_t now_ms) {
  auto& st = self->state;
  auto bound = ticks(sent) - now_ms * 1'000'000;
  auto t = now(self);
  if (t - st.base_since > st.lease / 2) {
    st.base_prev = st.base_cur;
    st.base_cur.reset();
    st.base_since = t;
  }
  st.base_cur = st.base_cur ? std::max(*st.base_cur, bound) : bound;
}

// A lease the replica may assume for a grant or renewal answered at
// backend time `now_ms`, its request sent at `sent`. Never more than the
// lease it asks for from when the request left: a deadline read against
// another clock reading than the one that set it (a cluster's nodes, a
// coordinator's bug) must not stretch the turn past what the backend
// holds.
clk::time_point valid_from_reply(lease_actor_t* self, clk::time_point sent,
                                 std::int64_t deadline_ms, std::int64_t now_ms) {
  auto left = std::min(milliseconds{deadline_ms - now_ms},
                       std::chrono::duration_cast<milliseconds>(self->state.lease));
  return sent + left - self->state.margin;
}

// The same for a pushed grant, which carries no send time of ours.
std::optional<clk::time_point> valid_from_push(lease_actor_t* self,
                                               std::int64_t deadline_ms) {
  auto& st = self->state;
  std::optional<std::int64_t> base;
  for (auto& b : {st.base_cur, st.base_prev})
    if (b)
      base = base ? std::max(*base, *b) : *b;
  if (!base)
    return std::nullopt;
  auto mapped = clk::time_point{nanoseconds{deadline_ms * 1'000'000 + *base}};
  // The grant was made before it was read: never more than a lease from now.
  return std::min(mapped, now(self) + st.lease) - st.margin;
}

// One wake-up is armed at a time: the earliest instant anything is due. A
// wake-up armed earlier than the pending one supersedes it; the superseded
// one still arrives and is ignored (it carries the instant it was armed
// for), since the wake-up that ran meanwhile armed again for everything
// left. Handling it too would arm one more wake-up each time, and those
// would pile up for good.
void arm(lease_actor_t* self, clk::time_point at) {
  auto& st = self->state;
  if (at >= st.armed)
    return;
  st.armed = at;
  auto t = now(self);
  auto in = at > t ? at - t : clk::duration::zero();
  self->delayed_send(self, in, wake_atom::value, ticks(at));
}

void schedule(lease_actor_t* self, std::uint64_t req, waiting& w,
              clk::time_point at) {
  w.next = at;
  self->state.due.emplace(at, req);
  arm(self, at);
}

// Polling interval of a waiting request: fast while its push may have been
// missed, slow (a safety net) otherwise.
milliseconds poll_interval(lease_actor_t* self, waiting& w) {
  auto& st = self->state;
  auto epoch = st.cfg.coordinator->push_epoch();
  if (epoch == 0 || epoch != w.epoch) {
    auto d = w.backoff;
    w.backoff = std::min(w.backoff * 2, st.cfg.max_poll);
    return d;
  }
  return st.lease / 3;
}

// Issues the enters and releases held so far. Every other coordinator call
// flushes first: a chat's operations then reach the backend in the order
// this actor decided them (a leave must never overtake its enter).
void flush(lease_actor_t* self) {
  auto& st = self->state;
  if (st.batch.empty())
    return;
  auto ops = std::move(st.batch);
  st.batch.clear();
  st.cfg.coordinator->submit(std::move(ops));
}

// Holds an enter or release back until the messages already in the mailbox
// are handled: a burst (the grants of one batch reply, answered by their
// chats together) then costs the backend one call instead of one per
// operation. An idle actor flushes right after the message that held it:
// one self-message later, on its own thread. The time recorded as `sent`
// is taken here, before the request really leaves: a lease counted from it
// is shorter, never longer, than the truth.
void hold(lease_actor_t* self, coordinator::turn_op op) {
  auto& st = self->state;
  if (st.batch.empty())
    self->send(self, flush_atom::value);
  st.batch.push_back(std::move(op));
}

void send_enter(lease_actor_t* self, std::uint64_t req, waiting& w) {
  auto& st = self->state;
  w.in_flight = true;
  w.epoch = st.cfg.coordinator->push_epoch();
  auto sent = now(self);
  ++st.in_flight;
  hold(self, coordinator::enter_op{
               w.key, req, w.retry,
               [g = st.g, req, sent](turn_state s, std::exception_ptr e) {
                 g->send(enter_done{req, sent, std::move(s),
                                    e ? what_of(e) : std::string{}});
               }});
}

void send_poll(lease_actor_t* self, std::uint64_t req, waiting& w) {
  auto& st = self->state;
  flush(self);
  w.in_flight = true;
  auto sent = now(self);
  ++st.in_flight;
  st.cfg.coordinator->poll(w.key, req,
                           [g = st.g, req, sent](turn_state s,
                                                 std::exception_ptr e) {
                             g->send(poll_done{req, sent, std::move(s),
                                               e ? what_of(e) : std::string{}});
                           });
}

// `handoff`: what the chat hands to the next holder (see
// coordinator::release); a repeated release goes without it.
void send_release(lease_actor_t* self, turn_ref ref,
                  std::string_view handoff = {}) {
  auto& st = self->state;
  auto sent = now(self);
  ++st.in_flight;
  hold(self, coordinator::release_op{
               ref, std::string{handoff},
               [g = st.g, ref, sent](release_result r, std::exception_ptr e) {
                 g->send(release_done{ref, sent, std::move(r),
                                      e ? what_of(e) : std::string{}});
               }});
}

void send_leave(lease_actor_t* self, const std::string& key,
                std::uint64_t req) {
  auto& st = self->state;
  flush(self);
  ++st.in_flight;
  st.cfg.coordinator->leave(key, req,
                            [g = st.g, key, req](bool, std::exception_ptr e) {
                              g->send(leave_done{key, req,
                                                 e ? what_of(e) : std::string{}});
                            });
}

void send_unlead(lease_actor_t* self, const std::string& name,
                 std::uint64_t fence) {
  auto& st = self->state;
  flush(self);
  ++st.in_flight;
  ++st.unleading[name];
  st.cfg.coordinator->unlead(name, fence, [g = st.g, name, fence](
                                            bool, std::exception_ptr e) {
    g->send(unlead_done{name, fence, e ? what_of(e) : std::string{}});
  });
}

void send_renew(lease_actor_t* self, renewal r) {
  auto& st = self->state;
  flush(self);
  auto sent = now(self);
  auto seq = ++st.renewals_sent;
  ++st.in_flight;
  auto asked = r;
  st.cfg.coordinator->renew(std::move(r), [g = st.g, sent, seq,
                                           asked = std::move(asked)](
                                            renewal_result res,
                                            std::exception_ptr e) {
    g->send(renew_done{sent, seq, asked, std::move(res),
                       e ? what_of(e) : std::string{}});
  });
}

void add_repair(lease_actor_t* self, repair::kind_t kind, std::string key,
                std::uint64_t id) {
  auto& st = self->state;
  auto t = now(self);
  // A turn or a ticket left behind resolves itself within a lease at the
  // latest (it expires, or its grant is released on arrival); repairing
  // only makes it quicker.
  auto retry = std::max(milliseconds{50}, st.lease / 30);
  auto give_up = t + st.lease;
  if (auto i = st.resent.find({kind, key, id}); i != st.resent.end()) {
    give_up = i->second;
    st.resent.erase(i);
    if (give_up <= t)
      return; // its lease is over: what it left behind has resolved itself
  }
  st.repairs.push_back(repair{kind, std::move(key), id, give_up, t + retry});
  arm(self, t + retry);
}

// A grant of `key` this replica gives up before its step started.
void passed_over(lease_actor_t* self, const std::string& key,
                 const std::optional<std::string>& previous_holder) {
  auto& st = self->state;
  if (previous_holder && *previous_holder == st.cfg.coordinator->replica_id())
    return;
  st.passed[key] = now(self);
  if (st.passed.size() <= lease_state::max_passed)
    return;
  // The oldest quarter goes at once: one scan per max_passed / 4 entries,
  // not one per entry once the map is full.
  std::vector<clk::time_point> noted;
  noted.reserve(st.passed.size());
  for (auto& [k, at] : st.passed)
    noted.push_back(at);
  auto cut = noted.begin() + static_cast<std::ptrdiff_t>(noted.size() / 4);
  std::nth_element(noted.begin(), cut, noted.end());
  auto limit = *cut;
  std::erase_if(st.passed, [&](const auto& e) { return e.second <= limit; });
}

// A held turn that ends: noted when its step never started.
void passed_over(lease_actor_t* self, const std::string& key, const held& h) {
  if (!h.started())
    passed_over(self, key, h.token->previous_holder());
}

// Ends a held turn otherwise than by its release and passes it on.
void lose(lease_actor_t* self, const std::string& key, turn_end why) {
  auto& st = self->state;
  auto i = st.holds.find(key);
  if (i == st.holds.end())
    return;
  auto h = std::move(i->second);
  st.holds.erase(i);
  if (!h.token->end(why))
    return;
  passed_over(self, key, h);
  if (st.cfg.listener)
    st.cfg.listener->turn_lost(key, h.token->fence(), why);
  self->send(h.chat, lost_atom::value, h.req, h.token->fence(),
             std::string{to_string(why)});
  // Harmless when the backend expired it already; when it did not (a
  // renewal answered late), the chat goes on without waiting a lease.
  send_release(self, turn_ref{key, h.token->fence()});
}

void grant(lease_actor_t* self, const turn_state& s,
           std::optional<clk::time_point> valid_until) {
  auto& st = self->state;
  auto w = st.waits.find(s.req);
  auto release_it = [&] {
    auto h = st.holds.find(s.key);
    if (h != st.holds.end() && h->second.token->fence() == s.fence)
      return; // the same grant, heard twice (push and reply)
    passed_over(self, s.key, s.previous_holder);
    send_release(self, turn_ref{s.key, s.fence});
  };
  if (w == st.waits.end() || w->second.key != s.key || w->second.settled) {
    release_it(); // nobody waits for it (given up, or unknown): pass it on
    return;
  }
  if (w->second.cancelled) {
    if (!w->second.in_flight)
      st.waits.erase(w);
    release_it();
    return;
  }
  if (!valid_until) {
    // A push before any backend time was seen: ask for a reply whose send
    // time bounds the lease.
    if (!w->second.in_flight)
      send_poll(self, s.req, w->second);
    return;
  }
  auto t = now(self);
  if (*valid_until <= t) {
    // It travelled longer than its lease (this process was frozen): too late
    // to use. The chat enters again.
    auto chat = w->second.chat;
    if (!w->second.in_flight)
      st.waits.erase(w);
    else
      w->second.settled = true;
    passed_over(self, s.key, s.previous_holder);
    send_release(self, turn_ref{s.key, s.fence});
    self->send(chat, lost_atom::value, s.req, std::uint64_t{0},
               std::string{"frozen"});
    return;
  }
  if (auto old = st.holds.find(s.key); old != st.holds.end())
    lose(self, s.key, turn_end::expired); // a newer grant: the old one is gone
  auto chat = w->second.chat;
  if (w->second.in_flight)
    w->second.settled = true; // its answer, when it comes, is stale
  else
    st.waits.erase(w);
  auto previous = st.passed.erase(s.key) > 0 ? std::nullopt
                                              : s.previous_holder;
  auto token = std::make_shared<turn_token>(
    s.key, s.fence, s.req, previous, *valid_until,
    [&c = self->clock()] { return c.now(); });
  token->set_handed(s.handed);
  // A weak handle: the token may outlive this actor.
  token->on_step_start([addr = self->address(), key = s.key, fence = s.fence] {
    if (auto me = caf::actor_cast<caf::actor>(addr))
      caf::anon_send(me, start_atom::value, key, fence);
  });
  st.holds[s.key] = held{s.req, chat, token, *valid_until,
                         clk::time_point::max()};
  arm(self, *valid_until);
  self->send(chat, granted_atom::value, s.req, std::move(token));
}

// A chat's turn is over: release it, handing `handoff` to the next holder.
void end_turn(lease_actor_t* self, const std::string& key, std::uint64_t fence,
              std::string_view handoff) {
  auto& st = self->state;
  auto h = st.holds.find(key);
  if (h == st.holds.end() || h->second.token->fence() != fence)
    return; // lost and passed on already
  auto t = now(self);
  if (h->second.settle_at <= t || h->second.valid_until <= t) {
    // The step ended after its turn ran out, before the timer that
    // would have noticed (a freeze resumes both at once): its writes
    // since were refused, so the turn was lost, and says so.
    lose(self, key,
         h->second.settle_at <= t ? turn_end::settle : turn_end::frozen);
    return;
  }
  passed_over(self, key, h->second);
  h->second.token->end(turn_end::released);
  st.holds.erase(h);
  send_release(self, turn_ref{key, fence}, handoff);
}

// A chat's turn is over and changed nothing (turn_token::changed_nothing):
// given up as a grant that never ran, which leaves the chat's last holder
// as it was before this turn. Also past its validity (a freeze): it wrote
// nothing that could have been refused, and a release, which names this
// replica the last holder, is what must not happen. A lost reply repeats
// the leave (it names this request only, never a later turn).
void pass_turn(lease_actor_t* self, const std::string& key,
               std::uint64_t fence) {
  auto& st = self->state;
  auto h = st.holds.find(key);
  if (h == st.holds.end() || h->second.token->fence() != fence)
    return; // lost and passed on already
  auto req = h->second.req;
  passed_over(self, key, h->second);
  h->second.token->end(turn_end::released);
  st.holds.erase(h);
  send_leave(self, key, req);
}

void answer_waiting(lease_actor_t* self, std::uint64_t req, waiting& w,
                    const turn_state& s, clk::time_point sent) {
  auto& st = self->state;
  switch (s.state) {
    case turn_state::status::granted:
      grant(self, s, valid_from_reply(self, sent, s.deadline_ms, s.now_ms));
      return;
    case turn_state::status::waiting: {
      auto t = now(self);
      if (!w.entered)
        w.ahead_checked = t; // waiting from here
      w.entered = true;
      w.retry = false;
      auto skip = [&](const std::string& incarnation) {
        ++w.skipping;
        ++st.in_flight;
        st.cfg.coordinator->skip_if_dead(
          w.key, incarnation, [g = st.g, req](bool, std::exception_ptr e) {
            g->send(skip_done{req, e ? what_of(e) : std::string{}});
          });
      };
      if (s.blocker != w.blocker) {
        w.blocker = s.blocker;
        w.blocked_since = t;
      } else if (w.skipping == 0 && !s.blocker.empty()
                 && s.blocker != st.cfg.coordinator->incarnation()
                 && t - w.blocked_since >= st.lease / 2) {
        // The same blocker for half a lease: if its heartbeat is gone it is
        // dead, and skipping it drops its queued tickets (a turn it holds
        // still runs out its lease: it may be frozen, not dead).
        flush(self);
        skip(s.blocker);
      }
      if (w.skipping == 0 && !s.queued_ahead.empty()
          && t - w.ahead_checked >= st.lease / 2) {
        // Other replicas' tickets queued ahead (a poll names them), each
        // looked at every half lease of waiting: a dead one would be
        // granted the turn when it came first and keep it a whole lease
        // before anyone skipped it; skipped while queued, it costs nothing.
        w.ahead_checked = t;
        flush(self);
        for (auto& incarnation : s.queued_ahead)
          if (incarnation != s.blocker) // (the rule above looks at it)
            skip(incarnation);
      }
      schedule(self, req, w, t + poll_interval(self, w));
      return;
    }
    case turn_state::status::gone: {
      auto chat = w.chat;
      st.waits.erase(req);
      self->send(chat, lost_atom::value, req, std::uint64_t{0},
                 std::string{"gone"});
      return;
    }
  }
}

void leave_request(lease_actor_t* self, const std::string& key,
                   std::uint64_t req) {
  auto& st = self->state;
  if (auto h = st.holds.find(key); h != st.holds.end() && h->second.req == req) {
    auto fence = h->second.token->fence();
    passed_over(self, key, h->second);
    h->second.token->end(turn_end::released);
    st.holds.erase(h);
    send_release(self, turn_ref{key, fence});
    return;
  }
  auto w = st.waits.find(req);
  if (w == st.waits.end())
    return;
  if (w->second.in_flight) {
    w->second.cancelled = true; // settled when the answer comes
    return;
  }
  st.waits.erase(w);
  send_leave(self, key, req);
}

// One batch every lease/3, also while earlier ones are unanswered: a
// renewal whose reply is slow must not hold back the next one, or turns the
// backend keeps would lapse here (each reply only extends what its own send
// time allows; a reply for a released or replaced turn is ignored).
void renew_now(lease_actor_t* self) {
  auto& st = self->state;
  if (st.shutting_down)
    return;
  renewal r;
  for (auto& [key, h] : st.holds)
    r.turns.push_back(turn_ref{key, h.token->fence()});
  for (auto& [name, l] : st.leads)
    if (!st.unleading.contains(name)) {
      r.leads.push_back(name);
      r.known_terms.push_back(l.fence.value_or(0));
    }
  send_renew(self, std::move(r));
}

void on_renewed(lease_actor_t* self, renew_done& d) {
  auto& st = self->state;
  if (!d.error.empty()) {
    // Leases lapse on their own: each turn's validity runs out. A name
    // given up meanwhile may have been won by this very renewal, though,
    // and nothing here renews or releases it any more: probed.
    for (auto& name : d.asked.leads)
      if (!st.leads.contains(name))
        add_repair(self, repair::probe, name, 0);
    return;
  }
  if (!d.res.errors.empty())
    // Parts that failed alone lapse quietly otherwise (a heartbeat that
    // keeps failing gets this replica's tickets skipped by the others).
    log::warn("lease", fmt::format("renewal: {} part(s) failed, first: {}",
                                   d.res.errors.size(), d.res.errors.front()));
  observe(self, d.sent, d.res.now_ms);
  for (std::size_t i = 0; i < d.asked.turns.size() && i < d.res.turns.size();
       ++i) {
    auto& ref = d.asked.turns[i];
    auto h = st.holds.find(ref.key);
    if (h == st.holds.end() || h->second.token->fence() != ref.fence)
      continue; // released or replaced meanwhile: never touch the new turn
    if (d.res.turns[i] == 0) {
      lose(self, ref.key, turn_end::expired);
      continue;
    }
    if (d.res.turns[i] == renewal_result::failed)
      continue; // unknown: its validity runs on, and out, as it was
    auto v = valid_from_reply(self, d.sent, d.res.turns[i], d.res.now_ms);
    if (v > h->second.valid_until) {
      h->second.valid_until = v;
      h->second.token->extend(v);
    }
  }
  for (std::size_t i = 0; i < d.asked.leads.size() && i < d.res.leads.size();
       ++i) {
    auto l = st.leads.find(d.asked.leads[i]);
    auto& got = d.res.leads[i];
    if (l == st.leads.end()) {
      // Given up (unlead, shutdown) while this renewal was on its way: a
      // win is nobody's now; give it back instead of holding it a lease.
      if (got)
        send_unlead(self, d.asked.leads[i], got->fence);
      else if (d.res.lead_failed(i))
        add_repair(self, repair::probe, d.asked.leads[i], 0);
      continue;
    }
    auto& lead = l->second;
    if (d.res.lead_failed(i))
      continue; // unknown: its validity runs on, and out, as it was
    if (d.seq < lead.answered_from)
      continue; // a later renewal was answered already, or this one left
                // before an unlead of the name that may have undone it
    lead.answered_from = d.seq;
    if (got) {
      auto v = valid_from_reply(self, d.sent, got->deadline_ms, got->now_ms);
      if (v <= now(self))
        // Answered after the lease it reports ran out (a stalled reply, a
        // freeze): another replica may lead by now. Not a leadership to
        // act on; the next renewal asks again.
        continue;
      lead.valid_until = std::max(lead.valid_until, v);
      arm(self, lead.valid_until);
      self->send(lead.session, lead_valid_atom::value, l->first,
                 ticks(lead.valid_until));
      if (lead.fence != got->fence) {
        lead.fence = got->fence;
        lead.told = false;
        self->send(lead.session, leader_atom::value, l->first, got->fence);
      }
    } else if (lead.fence) {
      lead.fence.reset();
      lead.told = true; // (a follower now: "lost" says so, once)
      self->send(lead.session, follower_atom::value, l->first,
                 std::string{"lost"});
    } else if (!lead.told) {
      lead.told = true;
      self->send(lead.session, follower_atom::value, l->first,
                 std::string{"standby"});
    }
  }
}

void check_shutdown(lease_actor_t* self) {
  auto& st = self->state;
  if (st.shutting_down && st.in_flight == 0 && st.repairs.empty()) {
    st.shutdown_rp.deliver(true);
    st.g->close();
    self->quit();
  }
}

// Everything due: retries and polls, lapsed leases, settle bounds, repairs.
void wake(lease_actor_t* self) {
  auto& st = self->state;
  auto t = now(self);
  st.armed = clk::time_point::max();
  while (!st.due.empty() && st.due.top().first <= t) {
    auto [at, req] = st.due.top();
    st.due.pop();
    auto w = st.waits.find(req);
    if (w == st.waits.end() || w->second.next != at || w->second.in_flight)
      continue;
    w->second.next = clk::time_point::max();
    if (w->second.entered)
      send_poll(self, req, w->second);
    else
      send_enter(self, req, w->second);
  }
  if (!st.due.empty())
    arm(self, st.due.top().first);
  std::vector<std::pair<std::string, turn_end>> lapsed;
  for (auto& [key, h] : st.holds) {
    if (h.settle_at <= t)
      lapsed.emplace_back(key, turn_end::settle);
    else if (h.valid_until <= t)
      lapsed.emplace_back(key, turn_end::frozen);
    else
      arm(self, std::min(h.settle_at, h.valid_until));
  }
  for (auto& [key, why] : lapsed)
    lose(self, key, why);
  for (auto& [name, l] : st.leads) {
    if (!l.fence)
      continue;
    if (l.valid_until <= t) {
      l.fence.reset();
      l.told = true; // (a follower now: "lost" says so, once)
      self->send(l.session, follower_atom::value, name, std::string{"lost"});
    } else {
      // Renewals may fail from now on: nothing else would wake us then.
      arm(self, l.valid_until);
    }
  }
  std::erase_if(st.resent, [t](const auto& e) { return e.second <= t; });
  auto repairs = std::move(st.repairs);
  st.repairs.clear();
  for (auto& r : repairs) {
    if (r.give_up <= t)
      continue;
    if (r.next > t) {
      st.repairs.push_back(std::move(r));
      arm(self, st.repairs.back().next);
      continue;
    }
    st.resent[{r.kind, r.key, r.id}] = r.give_up;
    switch (r.kind) {
      case repair::release:
        send_release(self, turn_ref{r.key, r.id});
        break;
      case repair::leave:
        send_leave(self, r.key, r.id);
        break;
      case repair::unlead:
        send_unlead(self, r.key, r.id);
        break;
      case repair::probe:
        // Presented again meanwhile: its own renewals tell.
        if (!st.leads.contains(r.key)) {
          renewal probe;
          probe.leads.push_back(r.key);
          send_renew(self, std::move(probe));
        }
        break;
    }
  }
  check_shutdown(self);
}

// Ends every held turn (its token as stopped), gives up every waiting
// request and every leadership, and sends it all. When `exiting`, no answer
// will be read: a request whose enter is in flight is left at once rather
// than when its answer comes.
void give_back_everything(lease_actor_t* self, bool exiting) {
  auto& st = self->state;
  std::vector<std::string> keys;
  for (auto& [key, h] : st.holds)
    keys.push_back(key);
  for (auto& key : keys) {
    auto h = st.holds.find(key);
    auto fence = h->second.token->fence();
    h->second.token->end(turn_end::stopped);
    st.holds.erase(h);
    send_release(self, turn_ref{key, fence});
  }
  std::vector<std::pair<std::string, std::uint64_t>> reqs;
  // (A settled request's turn was dealt with; a cancelled one is left
  // when its answer comes, unless no answer will be read.)
  for (auto& [req, w] : st.waits)
    if (!w.settled && (exiting || !w.cancelled))
      reqs.emplace_back(w.key, req);
  for (auto& [key, req] : reqs) {
    if (exiting) {
      st.waits.erase(req);
      send_leave(self, key, req);
    } else {
      leave_request(self, key, req);
    }
  }
  for (auto& [name, l] : st.leads)
    if (l.fence)
      send_unlead(self, name, *l.fence);
  st.leads.clear();
  flush(self);
}

caf::behavior lease_actor(lease_actor_t* self, lease_config cfg) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.lease = st.cfg.coordinator->lease();
  st.margin = st.lease / 10;
  st.g->target = caf::actor_cast<caf::actor>(self);
  st.base_since = now(self);
  st.cfg.coordinator->on_grant([g = st.g](turn_state s) {
    g->send(pushed_grant{std::move(s)});
  });
  self->send(self, tick_atom::value);
  self->set_exit_handler([=](caf::exit_msg& msg) {
    // What was decided goes out, and every turn, ticket and leadership is
    // given back (answers are not awaited): a release held back, or a turn
    // nobody will release, must not keep a chat from every replica for a
    // lease.
    give_back_everything(self, true);
    self->state.g->close();
    self->quit(msg.reason);
  });
  return {
    [=](acquire_atom, const std::string& key, std::uint64_t req) {
      auto& st = self->state;
      if (st.shutting_down) {
        self->send(caf::actor_cast<caf::actor>(self->current_sender()),
                   lost_atom::value, req, std::uint64_t{0},
                   std::string{"stopped"});
        return;
      }
      auto& w = st.waits[req];
      w.key = key;
      w.chat = caf::actor_cast<caf::actor>(self->current_sender());
      send_enter(self, req, w);
    },
    [=](start_atom, const std::string& key, std::uint64_t fence) {
      auto& st = self->state;
      auto h = st.holds.find(key);
      if (h == st.holds.end() || h->second.token->fence() != fence)
        return;
      h->second.settle_at = now(self) + st.cfg.settle;
      h->second.token->start(h->second.settle_at);
      arm(self, h->second.settle_at);
    },
    [=](release_atom, const std::string& key, std::uint64_t fence) {
      end_turn(self, key, fence, {});
    },
    [=](release_atom, const std::string& key, std::uint64_t fence,
        const std::string& handoff) {
      end_turn(self, key, fence, handoff);
    },
    [=](pass_atom, const std::string& key, std::uint64_t fence) {
      pass_turn(self, key, fence);
    },
    [=](leave_atom, const std::string& key, std::uint64_t req) {
      leave_request(self, key, req);
    },
    [=](flush_atom) {
      flush(self);
    },
    [=](enter_done& d) {
      auto& st = self->state;
      --st.in_flight;
      auto i = st.waits.find(d.req);
      if (i == st.waits.end()) {
        check_shutdown(self);
        return;
      }
      auto& w = i->second;
      w.in_flight = false;
      if (w.settled) {
        st.waits.erase(i);
        check_shutdown(self);
        return;
      }
      if (!d.error.empty()) {
        w.retry = true; // it may have run: never take a second ticket
        if (w.cancelled) {
          auto key = w.key;
          st.waits.erase(i);
          send_leave(self, key, d.req);
        } else {
          auto t = now(self);
          auto delay = w.backoff;
          w.backoff = std::min(w.backoff * 2, st.lease / 3);
          schedule(self, d.req, w, t + delay);
        }
        check_shutdown(self);
        return;
      }
      observe(self, d.sent, d.st.now_ms);
      if (w.cancelled) {
        auto key = w.key;
        st.waits.erase(i);
        if (d.st.granted()) {
          passed_over(self, key, d.st.previous_holder);
          send_release(self, turn_ref{key, d.st.fence});
        }
        else if (d.st.state == turn_state::status::waiting)
          send_leave(self, key, d.req);
        check_shutdown(self);
        return;
      }
      answer_waiting(self, d.req, w, d.st, d.sent);
    },
    [=](poll_done& d) {
      auto& st = self->state;
      --st.in_flight;
      auto i = st.waits.find(d.req);
      if (i == st.waits.end()) {
        check_shutdown(self);
        return;
      }
      auto& w = i->second;
      w.in_flight = false;
      if (w.settled) {
        st.waits.erase(i);
        check_shutdown(self);
        return;
      }
      if (!d.error.empty()) {
        if (w.cancelled) {
          auto key = w.key;
          st.waits.erase(i);
          send_leave(self, key, d.req);
        } else {
          schedule(self, d.req, w, now(self) + poll_interval(self, w));
        }
        check_shutdown(self);
        return;
      }
      observe(self, d.sent, d.st.now_ms);
      if (w.cancelled) {
        auto key = w.key;
        st.waits.erase(i);
        if (d.st.granted()) {
          passed_over(self, key, d.st.previous_holder);
          send_release(self, turn_ref{key, d.st.fence});
        }
        else if (d.st.state == turn_state::status::waiting)
          send_leave(self, key, d.req);
        check_shutdown(self);
        return;
      }
      answer_waiting(self, d.req, w, d.st, d.sent);
    },
    [=](pushed_grant& p) {
      grant(self, p.st, valid_from_push(self, p.st.deadline_ms));
    },
    [=](release_done& d) {
      auto& st = self->state;
      --st.in_flight;
      if (!d.error.empty()) {
        add_repair(self, repair::release, d.ref.key, d.ref.fence);
      } else {
        observe(self, d.sent, d.res.now_ms);
        if (d.res.next)
          grant(self, *d.res.next,
                valid_from_reply(self, d.sent, d.res.next->deadline_ms,
                                 d.res.next->now_ms));
      }
      check_shutdown(self);
    },
    [=](leave_done& d) {
      --self->state.in_flight;
      if (!d.error.empty())
        add_repair(self, repair::leave, d.key, d.req);
      check_shutdown(self);
    },
    [=](unlead_done& d) {
      auto& st = self->state;
      --st.in_flight;
      if (auto u = st.unleading.find(d.name);
          u != st.unleading.end() && --u->second <= 0)
        st.unleading.erase(u);
      auto l = st.leads.find(d.name);
      if (l != st.leads.end()) {
        // Presented again meanwhile: a failed unlead is not repeated (the
        // name may still be this incarnation's, now wanted again), and
        // the election waits no more once no unlead is on its way.
        if (!st.unleading.contains(d.name)) {
          renewal r;
          r.leads.push_back(d.name);
          r.known_terms.push_back(l->second.fence.value_or(0));
          send_renew(self, std::move(r));
        }
      } else if (!d.error.empty()) {
        add_repair(self, repair::unlead, d.name, d.fence);
      }
      check_shutdown(self);
    },
    [=](skip_done& d) {
      auto& st = self->state;
      --st.in_flight;
      if (auto i = st.waits.find(d.req);
          i != st.waits.end() && --i->second.skipping == 0)
        i->second.blocked_since = now(self); // look again in half a lease
      check_shutdown(self);
    },
    [=](renew_done& d) {
      --self->state.in_flight;
      on_renewed(self, d);
      check_shutdown(self);
    },
    [=](tick_atom) {
      auto& st = self->state;
      if (st.shutting_down)
        return;
      renew_now(self);
      self->delayed_send(self, st.lease / 3, tick_atom::value);
    },
    [=](wake_atom, std::int64_t at) {
      if (at == ticks(self->state.armed))
        wake(self);
    },
    [=](lead_atom, const std::string& name) {
      auto& st = self->state;
      auto [it, fresh] = st.leads.try_emplace(name);
      auto& l = it->second;
      // A renewal sent before this presenter came may have run before an
      // unlead of the name (answered already, or still on its way: replies
      // come out of order), which then deleted what it kept: its answer is
      // not this presenter's to act on. Its own election follows at once.
      if (fresh)
        l.answered_from = st.renewals_sent + 1;
      l.session = caf::actor_cast<caf::actor>(self->current_sender());
      l.told = false;
      // A new presenter of a name still led (given up and taken again
      // before the unlead came): it leads at once, at the same fence.
      if (l.fence) {
        self->send(l.session, lead_valid_atom::value, name, ticks(l.valid_until));
        self->send(l.session, leader_atom::value, name, *l.fence);
      }
      // A failed unlead of the name waiting to be repeated is dropped (it
      // would free the name under its new presenter); one on its way is
      // waited for.
      std::erase_if(st.repairs, [&](const repair& r) {
        return r.kind == repair::unlead && r.key == name;
      });
      if (st.unleading.contains(name))
        return; // elected once no unlead of it is on its way
      renewal r;
      r.leads.push_back(name);
      r.known_terms.push_back(l.fence.value_or(0));
      send_renew(self, std::move(r)); // elect now, not at the next tick
    },
    [=](unlead_atom, const std::string& name) {
      auto& st = self->state;
      auto l = st.leads.find(name);
      // Only its presenter gives a name up: a late unlead of an earlier
      // one must not end the leadership a newer presenter holds.
      if (l == st.leads.end()
          || l->second.session
               != caf::actor_cast<caf::actor>(self->current_sender()))
        return;
      if (l->second.fence)
        send_unlead(self, name, *l->second.fence);
      st.leads.erase(l);
    },
    [=](shutdown_atom) -> caf::result<bool> {
      auto& st = self->state;
      st.shutting_down = true;
      st.shutdown_rp = self->make_response_promise();
      give_back_everything(self, false);
      // Repairs are best effort: whatever is left expires within a lease.
      self->delayed_send(self, st.lease, give_up_atom::value);
      auto rp = st.shutdown_rp;
      check_shutdown(self);
      return rp;
    },
    [=](give_up_atom) {
      auto& st = self->state;
      flush(self);
      st.repairs.clear();
      st.in_flight = 0;
      check_shutdown(self);
    },
  };
}

} // namespace

caf::actor spawn_lease_actor(caf::actor_system& sys, lease_config cfg) {
  auto a = sys.spawn(lease_actor, std::move(cfg));
  internal::release_caf_logger();
  return a;
}

// -- lease_actor_leadership ---------------------------------------------------

struct lease_actor_leadership::impl {
  struct entry {
    caf::actor agent;
    std::uint64_t gen = 0; // which agent's answers count
    bool answered = false;
    std::uint64_t fence = 0; // 0: not leading
  };

  std::chrono::milliseconds first_answer;
  std::mutex mtx; // what follows; never held while waiting on an actor
  std::condition_variable cv;
  caf::actor_system* sys = nullptr;
  caf::actor lease;
  std::map<std::string, entry, std::less<>> names;
  std::uint64_t next_gen = 0;

  // An answer of agent `gen`: one of a name given up and taken again (a
  // newer agent) is not believed.
  void answer(const std::string& name, std::uint64_t gen, std::uint64_t fence) {
    {
      std::lock_guard guard{mtx};
      auto i = names.find(name);
      if (i == names.end() || i->second.gen != gen)
        return;
      i->second.answered = true;
      i->second.fence = fence;
    }
    cv.notify_all();
  }
};

namespace {

// Stands for one leadership towards the lease actor (which answers the
// sender of `lead`), and mirrors its answers into the shared entry.
using leadership_answer = std::function<void(const std::string&, std::uint64_t)>;

caf::behavior leadership_agent(caf::event_based_actor* self,
                               leadership_answer answer, caf::actor lease,
                               std::string name) {
  // A lease actor gone (its bot stopped) renews nothing: not leading.
  self->monitor(lease);
  self->set_down_handler([=](caf::down_msg&) {
    answer(name, 0);
    self->quit();
  });
  self->send(lease, lead_atom::value, name);
  return {
    [=](leader_atom, const std::string& n, std::uint64_t fence) {
      answer(n, fence);
    },
    [=](follower_atom, const std::string& n, const std::string&) {
      answer(n, 0);
    },
    [=](lead_valid_atom, const std::string&, std::int64_t) {
      // nop: the scheduler's leadership keeps its own bound
    },
    [=](unlead_atom) {
      self->send(lease, unlead_atom::value, name);
      self->quit();
    },
  };
}

} // namespace

lease_actor_leadership::lease_actor_leadership(
  std::chrono::milliseconds first_answer)
  : impl_(std::make_shared<impl>()) {
  impl_->first_answer = first_answer;
}

lease_actor_leadership::~lease_actor_leadership() {
  close();
}

void lease_actor_leadership::bind(caf::actor_system& sys, caf::actor lease) {
  std::lock_guard guard{impl_->mtx};
  impl_->sys = &sys;
  impl_->lease = std::move(lease);
}

void lease_actor_leadership::close() {
  std::map<std::string, impl::entry, std::less<>> names;
  {
    std::lock_guard guard{impl_->mtx};
    names.swap(impl_->names);
    impl_->lease = nullptr;
    impl_->sys = nullptr;
  }
  impl_->cv.notify_all();
  for (auto& [name, e] : names)
    caf::anon_send(e.agent, unlead_atom::value);
}

std::optional<std::uint64_t>
lease_actor_leadership::try_acquire(std::string_view name, std::string_view,
                                    time_point, std::chrono::milliseconds) {
  std::unique_lock guard{impl_->mtx};
  if (!impl_->lease)
    return std::nullopt;
  auto i = impl_->names.find(name);
  if (i == impl_->names.end()) {
    i = impl_->names.emplace(std::string{name}, impl::entry{}).first;
    // Spawned with arguments: CAF 0.17 dereferences a null argument tuple
    // for a function actor spawned without any.
    i->second.gen = ++impl_->next_gen;
    leadership_answer answer = [im = impl_, gen = i->second.gen](
                                 const std::string& n, std::uint64_t fence) {
      im->answer(n, gen, fence);
    };
    i->second.agent = impl_->sys->spawn(leadership_agent, std::move(answer),
                                        impl_->lease, std::string{name});
    internal::release_caf_logger();
    impl_->cv.wait_for(guard, impl_->first_answer, [&] {
      auto j = impl_->names.find(name);
      return j == impl_->names.end() || j->second.answered;
    });
    i = impl_->names.find(name);
    if (i == impl_->names.end())
      return std::nullopt; // closed meanwhile
  }
  if (i->second.fence == 0)
    return std::nullopt;
  return i->second.fence;
}

void lease_actor_leadership::release(std::string_view name, std::string_view) {
  caf::actor agent;
  {
    std::lock_guard guard{impl_->mtx};
    auto i = impl_->names.find(name);
    if (i == impl_->names.end())
      return;
    agent = std::move(i->second.agent);
    impl_->names.erase(i);
  }
  caf::anon_send(agent, unlead_atom::value);
}

} // namespace botmesh
