#include <botmesh/stores/redis/redis_coordinator.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <iterator>
#include <mutex>
#include <optional>
#include <utility>
#include <variant>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/store.hpp>
#include <botmesh/stores/redis/internal/keyspace.hpp>
#include <botmesh/stores/redis/internal/protocol.hpp>
#include <botmesh/stores/redis/internal/scripts.hpp>

namespace botmesh {

namespace {

using kind = redis_reply::kind;

std::int64_t int_at(const redis_reply& r, std::size_t i, std::string_view what) {
  if (r.type != kind::array || i >= r.elements.size()
      || r.elements[i].type != kind::integer)
    throw coordination_unavailable_error(
      fmt::format("{}: malformed reply (element {} is not an integer)", what,
                  i));
  return r.elements[i].integer;
}

std::string str_at(const redis_reply& r, std::size_t i, std::string_view what) {
  if (r.type != kind::array || i >= r.elements.size()
      || (r.elements[i].type != kind::string
          && r.elements[i].type != kind::status))
    throw coordination_unavailable_error(
      fmt::format("{}: malformed reply (element {} is not a string)", what, i));
  return r.elements[i].str;
}

// Element i of an array reply as a decimal integer string ("0" to
// INT64_MAX): a malformed one is named, not a bare "stoll" exception.
std::int64_t decimal_at(const redis_reply& r, std::size_t i,
                        std::string_view what) {
  auto text = str_at(r, i, what);
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size() || v < 0)
    throw coordination_unavailable_error(
      fmt::format("{}: malformed reply (element {} is \"{}\", not a "
                  "non-negative integer)",
                  what, i, text));
  return v;
}

// Parses a grant published by co_common.lua:
//   ["h<#handed> <handed>"]
//   "<req> <ticket> <fence> <deadline> <now> <#prev> <prev><chat key>"
std::optional<turn_state> parse_grant(std::string_view p) {
  std::int64_t v[6];
  const char* at = p.data();
  const char* end = p.data() + p.size();
  std::string_view handed;
  if (at != end && *at == 'h') {
    std::size_t n = 0;
    auto [next, ec] = std::from_chars(at + 1, end, n);
    if (ec != std::errc{} || next == end || *next != ' '
        || static_cast<std::size_t>(end - next - 1) < n)
      return std::nullopt;
    handed = std::string_view{next + 1, n};
    at = next + 1 + n;
  }
  for (auto& x : v) {
    auto [next, ec] = std::from_chars(at, end, x);
    if (ec != std::errc{} || next == end || *next != ' ' || x < 0)
      return std::nullopt;
    at = next + 1;
  }
  auto prev_len = static_cast<std::size_t>(v[5]);
  if (static_cast<std::size_t>(end - at) < prev_len)
    return std::nullopt;
  turn_state s;
  s.state = turn_state::status::granted;
  s.req = static_cast<std::uint64_t>(v[0]);
  s.ticket = static_cast<std::uint64_t>(v[1]);
  s.fence = static_cast<std::uint64_t>(v[2]);
  s.deadline_ms = v[3];
  s.now_ms = v[4];
  if (prev_len > 0)
    s.previous_holder = std::string{at, prev_len};
  s.key = std::string{at + prev_len, end};
  if (s.key.empty())
    return std::nullopt;
  s.handed = std::string{handed};
  return s;
}

// A granted reply {1, ticket, fence, prev, deadline, now} from `first`.
turn_state granted_from(const redis_reply& r, std::string_view key,
                        std::uint64_t req, std::size_t first,
                        std::string_view what) {
  turn_state s;
  s.state = turn_state::status::granted;
  s.key = std::string{key};
  s.req = req;
  s.ticket = static_cast<std::uint64_t>(int_at(r, first, what));
  s.fence = static_cast<std::uint64_t>(int_at(r, first + 1, what));
  auto prev = str_at(r, first + 2, what);
  if (!prev.empty())
    s.previous_holder = std::move(prev);
  s.deadline_ms = int_at(r, first + 3, what);
  s.now_ms = int_at(r, first + 4, what);
  return s;
}

// An enter or poll reply: {1, ...} granted, {0, ticket, now, blocker}
// waiting, {-1, now} gone.
turn_state state_from(const redis_reply& r, std::string_view key,
                      std::uint64_t req, std::string_view what) {
  auto status = int_at(r, 0, what);
  if (status == 1)
    return granted_from(r, key, req, 1, what);
  turn_state s;
  s.key = std::string{key};
  s.req = req;
  if (status == 0) {
    s.state = turn_state::status::waiting;
    s.ticket = static_cast<std::uint64_t>(int_at(r, 1, what));
    s.now_ms = int_at(r, 2, what);
    s.blocker = str_at(r, 3, what);
    // A poll's: the other incarnations queued ahead.
    for (std::size_t i = 4; i < r.elements.size()
                            && s.queued_ahead.size() < turn_state::max_queued_ahead;
         ++i)
      s.queued_ahead.push_back(str_at(r, i, what));
  } else {
    s.now_ms = int_at(r, 1, what);
  }
  return s;
}

// A co_release reply: {released, now} and, when the next grant is ours,
// {.., req, ticket, fence, prev, deadline}.
release_result release_from(const redis_reply& r, const std::string& key) {
  release_result out;
  out.released = int_at(r, 0, "co_release") == 1;
  out.now_ms = int_at(r, 1, "co_release");
  if (r.elements.size() > 2) {
    turn_state g;
    g.state = turn_state::status::granted;
    g.key = key;
    g.req = static_cast<std::uint64_t>(decimal_at(r, 2, "co_release"));
    g.ticket = static_cast<std::uint64_t>(int_at(r, 3, "co_release"));
    g.fence = static_cast<std::uint64_t>(int_at(r, 4, "co_release"));
    auto prev = str_at(r, 5, "co_release");
    if (!prev.empty())
      g.previous_holder = std::move(prev);
    g.deadline_ms = int_at(r, 6, "co_release");
    g.now_ms = out.now_ms;
    out.next = std::move(g);
  }
  return out;
}

// A script's reply `r`, turned by `parse` (which may throw) into `done`'s
// value: an error reply fails `done` naming the script, as does a throw.
template <class T, class Parse>
void deliver(const redis_reply& r, std::string_view replica,
             std::string_view script, Parse&& parse,
             const coordinator::completion<T>& done) {
  if (r.type == kind::error)
    return done(T{}, std::make_exception_ptr(coordination_unavailable_error(
                       fmt::format("coordinator {}: script {}: {}", replica,
                                   script, r.str))));
  T value;
  try {
    value = parse(r);
  } catch (...) {
    return done(T{}, std::current_exception());
  }
  done(std::move(value), nullptr);
}

// An operation of a batch, as the coordinator's calls take it.
const std::string& key_of(const coordinator::enter_op& op) {
  return op.key;
}
const std::string& key_of(const coordinator::release_op& op) {
  return op.turn.key;
}
const std::string& key_of(const coordinator::turn_op& op) {
  return std::visit([](auto& x) -> const std::string& { return key_of(x); },
                    op);
}
turn_state parse_op(const coordinator::enter_op& op, const redis_reply& r) {
  return state_from(r, op.key, op.req, "co_enter");
}
release_result parse_op(const coordinator::release_op& op,
                        const redis_reply& r) {
  return release_from(r, op.turn.key);
}

// Most operations in one co_batch call. A call blocks the server while it
// runs (about 10 us an operation), and everything else on its connection
// waits behind it: with 32, a durable bot's journal and outbox calls
// waited long enough that its turns/s fell by a sixth (bench_durability),
// while contended turns gained nothing over 8. A burst of thousands goes
// as several calls, pipelined.
constexpr std::size_t max_batch = 8;

} // namespace

struct redis_coordinator::impl : std::enable_shared_from_this<impl> {
  std::shared_ptr<redis_client> client;
  std::shared_ptr<const redis_layout> layout;
  std::string replica;
  std::string incarnation;
  std::chrono::milliseconds lease{};
  std::string lease_arg;
  std::string ttl_arg;
  std::string channel_prefix;
  std::atomic<bool> crashed{false};

  // The push: the subscriber's callbacks own only this, never the
  // coordinator, so they cannot end up destroying the client on its own
  // thread.
  struct push_state {
    std::mutex mtx;
    std::shared_ptr<grant_listener> listener;
    std::atomic<std::uint64_t> epoch{0};
  };
  std::shared_ptr<push_state> push = std::make_shared<push_state>();
  // Ended with the coordinator: a client shared with others (a store's)
  // outlives it, and would keep the thread and connection.
  std::uint64_t subscription = 0;

  bool failed_crashed(std::exception_ptr& e) const {
    if (!crashed)
      return false;
    e = std::make_exception_ptr(coordination_unavailable_error(
      fmt::format("replica {} crashed (simulated)", replica)));
    return true;
  }

  // Turns a client failure into the coordinator's error (a timeout stays a
  // timeout: the request may have run).
  std::exception_ptr wrap(std::exception_ptr e, std::string_view what) const {
    try {
      std::rethrow_exception(e);
    } catch (const error& x) {
      if (x.code() == errc::timeout)
        return e;
      return std::make_exception_ptr(coordination_unavailable_error(
        fmt::format("coordinator {}: {}: {}", replica, what, x.what())));
    } catch (const std::exception& x) {
      return std::make_exception_ptr(coordination_unavailable_error(
        fmt::format("coordinator {}: {}: {}", replica, what, x.what())));
    }
  }

  // One batch: TIME, the heartbeat, every held turn and every leadership,
  // pipelined on one connection. EVALSHA: the client loads the scripts on
  // every connection it opens. A server may still lack them (the client
  // reconnected while a restarted server was LOADING its data and refused
  // SCRIPT LOAD, or SCRIPT FLUSH): then the batch runs once more with EVAL,
  // which caches them again. Running it twice is harmless: each renewal
  // and leadership script only extends what this incarnation holds or
  // takes what is free, and a NOSCRIPT reply ran nothing.
  void renew_batch(renewal r, bool eval,
                   coordinator::completion<renewal_result> done) {
    auto& s = internal::lua();
    // The verb and what follows it: the body (EVAL) or its SHA (EVALSHA).
    auto script = [eval](const redis_script& x) {
      return eval ? std::pair{std::string{"EVAL"}, x.body()}
                  : std::pair{std::string{"EVALSHA"}, x.sha()};
    };
    std::vector<redis_client::command> cmds;
    cmds.push_back({"TIME"});
    cmds.push_back({"SET", layout->heartbeat(incarnation), replica, "PX",
                    lease_arg});
    auto [renew_verb, renew_code] = script(s.co_renew);
    for (auto& t : r.turns)
      cmds.push_back({renew_verb, renew_code, "2", layout->turn(t.key, "h"),
                      layout->turn(t.key, "q"), incarnation,
                      std::to_string(t.fence), lease_arg, ttl_arg});
    auto [lead_verb, lead_code] = script(s.co_lead);
    for (std::size_t n = 0; n < r.leads.size(); ++n) {
      auto& name = r.leads[n];
      auto known = n < r.known_terms.size() ? r.known_terms[n] : 0;
      cmds.push_back({lead_verb, lead_code, "2", layout->lead(name),
                      layout->lead_term(name), incarnation, lease_arg,
                      std::to_string(known)});
    }
    auto self = shared_from_this();
    client->async_batch(
      std::move(cmds),
      [self, eval, r = std::move(r), done = std::move(done)](
        std::vector<redis_reply> replies, std::exception_ptr e) mutable {
        if (e)
          return done({}, self->wrap(e, "renewal"));
        if (!eval)
          for (auto& reply : replies)
            if (reply.type == kind::error && reply.str.starts_with("NOSCRIPT"))
              return self->renew_batch(std::move(r), true, std::move(done));
        renewal_result out;
        try {
          out = self->parse_renewal(r, replies);
        } catch (...) {
          return done({}, std::current_exception());
        }
        done(std::move(out), nullptr);
      });
  }

  // A renewal's replies: TIME, the heartbeat, then one per turn and one
  // per leadership (see renew_batch).
  static constexpr std::size_t first_part = 2;

  // The earliest clock reading of the renewal's answered scripts (co_renew
  // and co_lead reply with theirs), if any.
  static std::optional<std::int64_t>
  script_clock(const renewal& r, const std::vector<redis_reply>& replies) {
    std::optional<std::int64_t> out;
    auto take = [&](std::size_t at, std::size_t index) {
      auto& reply = replies.at(at);
      if (reply.type != kind::array || reply.elements.size() <= index
          || reply.elements[index].type != kind::integer)
        return;
      auto t = reply.elements[index].integer;
      out = out ? std::min(*out, t) : t;
    };
    auto at = first_part;
    for (std::size_t n = 0; n < r.turns.size(); ++n)
      take(at++, 1);
    for (std::size_t n = 0; n < r.leads.size(); ++n)
      take(at++, 2);
    return out;
  }

  renewal_result parse_renewal(const renewal& r,
                               const std::vector<redis_reply>& replies) const {
    renewal_result out;
    auto& time = replies.at(0);
    if (time.type == kind::error) {
      // On a cluster TIME runs on some master, which may be the one that is
      // down: a script's own clock reading stands in. Any reading taken
      // after the batch left will do (see lease_actor's observe()): the
      // deadlines below are lengths from it, and a later reading only
      // makes the backend clock's bound more cautious.
      auto stand_in = script_clock(r, replies);
      if (!stand_in)
        throw coordination_unavailable_error(
          fmt::format("coordinator {}: renewal: TIME failed and no part of "
                      "the batch was answered: {}",
                      replica, time.str));
      out.now_ms = *stand_in;
      out.errors.push_back(fmt::format(
        "coordinator {}: renewal: TIME failed, a script's clock stands in: {}",
        replica, time.str));
    } else if (auto ms = internal::time_reply_ms(time)) {
      out.now_ms = *ms;
    } else {
      throw coordination_unavailable_error("renewal: malformed TIME reply");
    }
    // Each part fails alone: one slot's master down (or one damaged key)
    // must not cost every other turn and leadership its renewal.
    if (replies.at(1).type == kind::error)
      out.errors.push_back(fmt::format("coordinator {}: heartbeat failed: {}",
                                       replica, replies[1].str));
    auto at = first_part;
    for (std::size_t n = 0; n < r.turns.size(); ++n, ++at) {
      auto& reply = replies.at(at);
      if (reply.type == kind::error) {
        out.errors.push_back(fmt::format("coordinator {}: renewing {}: {}",
                                         replica, r.turns[n].key, reply.str));
        out.turns.push_back(renewal_result::failed);
        continue;
      }
      // The deadline as a length from the script's own clock reading, put
      // on TIME's: the lease actor counts from the TIME reading, and the
      // writes may run well after it (a CLIENT PAUSE WRITE, a failover's
      // pause, another node of a cluster), so the script's deadline read
      // against TIME would stretch the turn by that gap.
      // A reply that cannot be read fails its own part only, as an error
      // reply does.
      try {
        auto dl = int_at(reply, 0, "co_renew");
        out.turns.push_back(dl == 0 ? 0
                                    : out.now_ms
                                        + (dl - int_at(reply, 1, "co_renew")));
      } catch (const error& e) {
        out.errors.push_back(fmt::format("coordinator {}: renewing {}: {}",
                                         replica, r.turns[n].key, e.what()));
        out.turns.push_back(renewal_result::failed);
      }
    }
    for (std::size_t n = 0; n < r.leads.size(); ++n, ++at) {
      auto& reply = replies.at(at);
      auto lead_failed = [&](std::string_view why) {
        out.errors.push_back(fmt::format("coordinator {}: leading {}: {}",
                                         replica, r.leads[n], why));
        out.leads.emplace_back();
        out.leads_failed.resize(r.leads.size());
        out.leads_failed[n] = true;
      };
      if (reply.type == kind::error) {
        lead_failed(reply.str);
        continue;
      }
      try {
        auto term = int_at(reply, 0, "co_lead");
        if (term == 0) {
          out.leads.emplace_back();
          continue;
        }
        out.leads.push_back(leadership{r.leads[n],
                                       static_cast<std::uint64_t>(term),
                                       int_at(reply, 1, "co_lead"),
                                       int_at(reply, 2, "co_lead")});
      } catch (const error& e) {
        lead_failed(e.what());
      }
    }
    return out;
  }

  // Runs a turn script of chat `key` and parses its reply with `parse`
  // (which may throw); `done` gets the result or the error.
  template <class T, class Parse>
  void run(std::string_view key, const redis_script& script,
           std::vector<std::string> args, Parse parse,
           coordinator::completion<T> done) {
    std::exception_ptr e;
    if (failed_crashed(e))
      return done(T{}, e);
    auto self = shared_from_this();
    client->eval_async(
      key, script, {layout->turn(key, "h"), layout->turn(key, "q")},
      std::move(args),
      [self, &script, parse = std::move(parse),
       done = std::move(done)](redis_reply r, std::exception_ptr e) {
        if (e)
          return done(T{}, self->wrap(e, "script " + script.name()));
        deliver(r, self->replica, script.name(), parse, done);
      });
  }

  // One co_batch call for `ops` (all of one connection lane, at least
  // two); each op's reply is delivered on its own, so an error or a
  // malformed reply of one fails only that op.
  void run_batch(std::vector<coordinator::turn_op> ops) {
    std::exception_ptr e;
    if (failed_crashed(e)) {
      for (auto& op : ops)
        std::visit([&](auto& x) { x.done({}, e); }, op);
      return;
    }
    std::vector<std::string> keys;
    std::vector<std::string> args{incarnation, lease_arg, ttl_arg, replica,
                                  channel_prefix};
    keys.reserve(2 * ops.size());
    args.reserve(args.size() + 4 * ops.size());
    for (auto& op : ops) {
      auto& key = key_of(op);
      keys.push_back(layout->turn(key, "h"));
      keys.push_back(layout->turn(key, "q"));
      if (auto* x = std::get_if<coordinator::enter_op>(&op)) {
        args.insert(args.end(), {"e", std::to_string(x->req), key,
                                 x->retry ? "1" : "0"});
      } else {
        auto& y = std::get<coordinator::release_op>(op);
        args.insert(args.end(), {"r", std::to_string(y.turn.fence), key,
                                 std::move(y.handoff)});
      }
    }
    auto affinity = key_of(ops.front());
    auto self = shared_from_this();
    client->eval_async(
      affinity, internal::lua().co_batch, std::move(keys), std::move(args),
      [self, ops = std::move(ops)](redis_reply r, std::exception_ptr e) mutable {
        if (e)
          e = self->wrap(e, "script co_batch");
        else if (r.type != kind::error
                 && (r.type != kind::array || r.elements.size() != ops.size()))
          e = std::make_exception_ptr(coordination_unavailable_error(
            fmt::format("coordinator {}: script co_batch: malformed reply "
                        "({} replies for {} operations)",
                        self->replica, r.elements.size(), ops.size())));
        for (std::size_t n = 0; n < ops.size(); ++n)
          std::visit(
            [&](auto& x) {
              if (e)
                return x.done({}, e);
              // An error reply fails every operation; an error element
              // (co_batch runs each one protected) fails its own alone.
              auto& one = r.type == kind::error ? r : r.elements[n];
              deliver(one, self->replica, "co_batch",
                      [&](const redis_reply& y) { return parse_op(x, y); },
                      x.done);
            },
            ops[n]);
      });
  }
};

redis_coordinator::redis_coordinator(redis_coordinator_options opts)
  : impl_(std::make_shared<impl>()) {
  if (opts.lease.count() <= 0)
    throw invalid_argument_error("lease", "the coordinator lease must be "
                                          "positive");
  auto& i = *impl_;
  i.layout = make_legacy_layout(opts.prefix);
  if (opts.cluster) {
    if (opts.client)
      throw invalid_argument_error("cluster", "the coordinator's cluster "
                                              "option cannot be combined "
                                              "with client");
    if (opts.url != redis_coordinator_options{}.url)
      throw invalid_argument_error("cluster", "the coordinator's cluster "
                                              "option cannot be combined "
                                              "with url");
    i.client = std::make_shared<redis_client>(std::move(*opts.cluster));
  } else {
    i.client = opts.client ? opts.client
                           : std::make_shared<redis_client>(
                               redis_options{.url = opts.url});
  }
  internal::resolve_layout(opts.layout, i.client->is_cluster(), opts.prefix,
                 "redis coordinator");
  i.replica = opts.replica_id.empty() ? detail::random_uuid() : opts.replica_id;
  i.incarnation = detail::random_uuid();
  i.lease = opts.lease.ms();
  i.lease_arg = std::to_string(i.lease.count());
  // Idle chats are forgotten far beyond any holder's lease: a holder that
  // may still be alive renews (or a waiter polls) long before, so its
  // chat's keys cannot expire under it; and fences are floored by the
  // server clock, so they never go back for a chat that was forgotten.
  i.ttl_arg = std::to_string(
    std::max<std::int64_t>(600'000, 40 * static_cast<std::int64_t>(i.lease.count())));
  i.channel_prefix = i.layout->grant_channel_prefix();
  auto& s = internal::lua();
  for (auto* script : {&s.co_enter, &s.co_poll, &s.co_release, &s.co_leave,
                       &s.co_skip, &s.co_renew, &s.co_lead, &s.co_unlead,
                       &s.co_batch})
    i.client->preload(*script);
  i.subscription = i.client->subscribe(
    i.channel_prefix + i.incarnation,
    [p = i.push](std::string_view payload) {
      auto g = parse_grant(payload);
      if (!g)
        return; // not ours to understand: polling finds the grant
      // Called under the lock: the destructor (which resets the listener
      // under it) then never returns while a call is still running.
      std::lock_guard guard{p->mtx};
      if (p->listener && *p->listener)
        (*p->listener)(std::move(*g));
    },
    [p = i.push] { p->epoch.fetch_add(1); });
  // The first heartbeat before any ticket: another replica must never see
  // a ticket of ours and find no heartbeat (it would skip us as dead).
  try {
    i.client->call({"SET", i.layout->heartbeat(i.incarnation), i.replica, "PX",
                    i.lease_arg});
  } catch (const error& e) {
    i.client->unsubscribe(i.subscription); // no destructor runs
    throw coordination_unavailable_error(
      fmt::format("coordinator {}: first heartbeat failed: {}", i.replica,
                  e.what()));
  }
}

redis_coordinator::~redis_coordinator() {
  {
    std::lock_guard guard{impl_->push->mtx};
    impl_->push->listener.reset();
  }
  impl_->client->unsubscribe(impl_->subscription);
}

void redis_coordinator::crash() {
  impl_->crashed = true;
  std::lock_guard guard{impl_->push->mtx};
  impl_->push->listener.reset();
}

const std::string& redis_coordinator::replica_id() const noexcept {
  return impl_->replica;
}

const std::string& redis_coordinator::incarnation() const noexcept {
  return impl_->incarnation;
}

std::chrono::milliseconds redis_coordinator::lease() const noexcept {
  return impl_->lease;
}

void redis_coordinator::on_grant(grant_listener fn) {
  std::lock_guard guard{impl_->push->mtx};
  impl_->push->listener = std::make_shared<grant_listener>(std::move(fn));
}

std::uint64_t redis_coordinator::push_epoch() const noexcept {
  return impl_->push->epoch.load();
}

void redis_coordinator::enter(std::string_view key, std::uint64_t req,
                              bool retry, completion<turn_state> done) {
  auto& i = *impl_;
  auto k = std::string{key};
  i.run<turn_state>(
    key, internal::lua().co_enter,
    {i.incarnation, std::to_string(req), i.lease_arg, i.ttl_arg, i.replica,
     i.channel_prefix, k, retry ? "1" : "0"},
    [k, req](const redis_reply& r) { return state_from(r, k, req, "co_enter"); },
    std::move(done));
}

void redis_coordinator::submit(std::vector<turn_op> ops) {
  auto& i = *impl_;
  if (i.client->is_cluster()) {
    // A script's keys must share a slot: chats rarely do.
    coordinator::submit(std::move(ops));
    return;
  }
  // One batch per connection lane, so each chat's operations stay on the
  // connection its other operations use, in order.
  std::vector<std::vector<turn_op>> lanes;
  for (auto& op : ops) {
    auto lane = i.client->lane(key_of(op));
    if (lanes.size() <= lane)
      lanes.resize(lane + 1);
    lanes[lane].push_back(std::move(op));
  }
  for (auto& lane : lanes) {
    for (std::size_t at = 0; at < lane.size(); at += max_batch) {
      auto end = std::min(lane.size(), at + max_batch);
      if (end - at == 1) {
        coordinator::submit({std::make_move_iterator(lane.begin() + at),
                             std::make_move_iterator(lane.begin() + end)});
        continue;
      }
      i.run_batch({std::make_move_iterator(lane.begin() + at),
                   std::make_move_iterator(lane.begin() + end)});
    }
  }
}

void redis_coordinator::poll(std::string_view key, std::uint64_t req,
                             completion<turn_state> done) {
  auto& i = *impl_;
  auto k = std::string{key};
  i.run<turn_state>(
    key, internal::lua().co_poll,
    {i.incarnation, std::to_string(req), i.ttl_arg, i.channel_prefix, k},
    [k, req](const redis_reply& r) { return state_from(r, k, req, "co_poll"); },
    std::move(done));
}

void redis_coordinator::release(turn_ref t, std::string_view handoff,
                                completion<release_result> done) {
  auto& i = *impl_;
  auto k = t.key;
  i.run<release_result>(
    k, internal::lua().co_release,
    {i.incarnation, std::to_string(t.fence), i.ttl_arg, i.channel_prefix, k,
     std::string{handoff}},
    [k](const redis_reply& r) { return release_from(r, k); }, std::move(done));
}

void redis_coordinator::leave(std::string_view key, std::uint64_t req,
                              completion<bool> done) {
  auto& i = *impl_;
  auto k = std::string{key};
  i.run<bool>(key, internal::lua().co_leave,
              {i.incarnation, std::to_string(req), i.ttl_arg, i.channel_prefix,
               k},
              [](const redis_reply& r) {
                if (r.type != kind::integer)
                  throw coordination_unavailable_error(
                    "co_leave: malformed reply");
                return r.integer == 1;
              },
              std::move(done));
}

void redis_coordinator::skip_if_dead(std::string_view key,
                                     std::string_view incarnation,
                                     completion<bool> done) {
  std::exception_ptr e;
  if (impl_->failed_crashed(e))
    return done(false, e);
  // The heartbeat lives in another slot than the chat: look it up first,
  // then skip with the chat's script.
  auto self = impl_;
  auto k = std::string{key};
  auto dead = std::string{incarnation};
  self->client->async(
    k, {"EXISTS", self->layout->heartbeat(dead)},
    [self, k, dead, done = std::move(done)](redis_reply r,
                                            std::exception_ptr e) mutable {
      if (e)
        return done(false, self->wrap(e, "heartbeat lookup"));
      // An error reply (LOADING, CLUSTERDOWN, NOAUTH) says nothing about
      // the blocker: reported, so the caller retries and it is seen.
      if (r.type == kind::error)
        return done(false, std::make_exception_ptr(
                             coordination_unavailable_error(fmt::format(
                               "heartbeat lookup of {}: {}", dead, r.str))));
      if (r.type != kind::integer || r.integer != 0)
        return done(false, nullptr); // alive
      self->run<bool>(k, internal::lua().co_skip,
                      {dead, self->ttl_arg, self->channel_prefix, k},
                      [](const redis_reply& r) {
                        if (r.type != kind::integer)
                          throw coordination_unavailable_error(
                            "co_skip: malformed reply");
                        return r.integer == 1;
                      },
                      std::move(done));
    });
}

void redis_coordinator::renew(renewal r, completion<renewal_result> done) {
  std::exception_ptr e;
  if (impl_->failed_crashed(e))
    return done({}, e);
  impl_->renew_batch(std::move(r), false, std::move(done));
}

void redis_coordinator::unlead(std::string_view name, std::uint64_t fence,
                               completion<bool> done) {
  std::exception_ptr e;
  if (impl_->failed_crashed(e))
    return done(false, e);
  auto self = impl_;
  auto& script = internal::lua().co_unlead;
  self->client->eval_async(
    name, script, {self->layout->lead(name), self->layout->lead_term(name)},
    {self->incarnation, std::to_string(fence)},
    [self, done = std::move(done)](redis_reply r, std::exception_ptr e) {
      if (e)
        return done(false, self->wrap(e, "script co_unlead"));
      if (r.type != kind::integer)
        return done(false, std::make_exception_ptr(coordination_unavailable_error(
                             fmt::format("coordinator {}: script co_unlead: {}",
                                         self->replica, r.str))));
      done(r.integer == 1, nullptr);
    });
}

} // namespace botmesh
