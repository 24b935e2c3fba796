#include <botmesh/stores/memory_coordinator.hpp>

#include <algorithm>
#include <deque>
#include <list>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/store.hpp>

namespace botmesh {

namespace {

struct ticket_entry {
  std::uint64_t ticket = 0;
  std::string incarnation;
  std::uint64_t req = 0;
};

struct holder {
  std::string incarnation;
  std::uint64_t req = 0;
  std::uint64_t ticket = 0;
  std::uint64_t fence = 0;
  std::optional<std::string> previous;
  time_point deadline{};
};

struct chat_state {
  std::uint64_t seq = 0; // last ticket handed out
  std::deque<ticket_entry> queue;
  std::optional<holder> owner;
  std::optional<std::string> last; // replica of the previous holder
  bool idle_listed = false;
  std::list<std::string>::iterator idle_pos;
};

struct lead_state {
  std::string incarnation;
  time_point deadline{};
  std::uint64_t term = 0;
};

struct member {
  std::string replica;
  std::chrono::milliseconds lease{};
  time_point heartbeat{};
  std::shared_ptr<coordinator::grant_listener> listener;
};

// A grant to hand to a listener once the hub's lock is released.
struct push {
  std::shared_ptr<coordinator::grant_listener> listener;
  turn_state grant;
};

using pushes = std::vector<push>;

void deliver(pushes& ps) {
  for (auto& p : ps)
    if (p.listener && *p.listener)
      (*p.listener)(std::move(p.grant));
}

std::int64_t ms(time_point t) {
  return to_unix_ms(t);
}

} // namespace

struct memory_coordination_hub::impl {
  explicit impl(memory_hub_options o)
    : opts(o), clk(o.clock ? o.clock : &botmesh::clock::system()) {
    // nop
  }

  bool alive(const std::string& incarnation, time_point now) const {
    auto i = members.find(incarnation);
    return i != members.end() && i->second.heartbeat > now;
  }

  turn_state granted(const std::string& key, const holder& h,
                     time_point now) const {
    turn_state s;
    s.state = turn_state::status::granted;
    s.key = key;
    s.req = h.req;
    s.ticket = h.ticket;
    s.fence = h.fence;
    s.previous_holder = h.previous;
    s.deadline_ms = ms(h.deadline);
    s.now_ms = ms(now);
    return s;
  }

  // Grants the turn to the first queued ticket (not of `skip`), pushing the
  // grant to the replica that owns it.
  // `handed` goes with that grant (see coordinator::release).
  void grant_next(const std::string& key, chat_state& c, time_point now,
                  const std::string& skip, pushes& out,
                  std::string_view handed = {}) {
    while (!c.owner && !c.queue.empty()) {
      auto e = std::move(c.queue.front());
      c.queue.pop_front();
      if (!skip.empty() && e.incarnation == skip)
        continue;
      auto m = members.find(e.incarnation);
      auto lease = m != members.end() ? m->second.lease
                                      : std::chrono::milliseconds{15'000};
      c.owner = holder{e.incarnation, e.req, e.ticket, ++fences, c.last,
                       now + lease};
      if (m != members.end()) {
        out.push_back(push{m->second.listener, granted(key, *c.owner, now)});
        out.back().grant.handed = handed;
      }
    }
  }

  // An owner past its deadline loses the turn; its incarnation's tickets
  // queued behind it go with it (it stopped renewing: it is dead or frozen).
  void expire(const std::string& key, chat_state& c, time_point now,
              pushes& out) {
    if (!c.owner || c.owner->deadline > now)
      return;
    auto gone = c.owner->incarnation;
    // Whether it ran its turn is unknown (a grant it never heard of expires
    // the same way): the next holder reads the store.
    c.last.reset();
    c.owner.reset();
    // All of them, not only those right behind it (as the Redis scripts'
    // co_drop): one behind another replica's would be granted to the dead
    // replica later and block the chat for a lease more.
    std::erase_if(c.queue, [&](const auto& e) { return e.incarnation == gone; });
    grant_next(key, c, now, gone, out);
  }

  std::optional<std::string> replica_of(const std::string& incarnation) const {
    auto i = members.find(incarnation);
    if (i == members.end())
      return std::nullopt;
    return i->second.replica;
  }

  chat_state& chat(const std::string& key) {
    auto& c = chats[key];
    if (c.idle_listed) {
      idle.erase(c.idle_pos);
      c.idle_listed = false;
    }
    return c;
  }

  // Lists the chat as idle when it is, and evicts the least recently used
  // idle chats beyond the bound. Fences come from one hub-wide counter, so
  // they stay monotonic for a recreated chat.
  void settle(const std::string& key, chat_state& c) {
    if (c.owner || !c.queue.empty() || c.idle_listed)
      return;
    idle.push_back(key);
    c.idle_listed = true;
    c.idle_pos = std::prev(idle.end());
    while (idle.size() > opts.max_idle_keys) {
      chats.erase(idle.front());
      idle.pop_front();
    }
  }

  memory_hub_options opts;
  const botmesh::clock* clk;
  mutable std::mutex mtx;
  std::unordered_map<std::string, chat_state> chats;
  std::list<std::string> idle; // front: least recently used
  std::unordered_map<std::string, member> members; // by incarnation
  std::unordered_map<std::string, lead_state> leads;
  std::uint64_t fences = 0;
};

memory_coordination_hub::memory_coordination_hub(memory_hub_options opts)
  : impl_(std::make_shared<impl>(opts)) {
  // nop
}

memory_coordination_hub::~memory_coordination_hub() = default;

std::size_t memory_coordination_hub::keys() const {
  std::lock_guard guard{impl_->mtx};
  return impl_->chats.size();
}

memory_coordinator::memory_coordinator(memory_coordination_hub& hub,
                                       memory_coordinator_options opts)
  : hub_(hub.impl_),
    replica_id_(opts.replica_id.empty() ? detail::random_uuid() : opts.replica_id),
    incarnation_(detail::random_uuid()),
    lease_(opts.lease.ms()) {
  if (lease_.count() <= 0)
    throw invalid_argument_error("lease", "the coordinator lease must be "
                                          "positive");
  std::lock_guard guard{hub_->mtx};
  auto& m = hub_->members[incarnation_];
  m.replica = replica_id_;
  m.lease = lease_;
  m.heartbeat = hub_->clk->now() + lease_;
}

memory_coordinator::~memory_coordinator() {
  std::lock_guard guard{hub_->mtx};
  if (auto i = hub_->members.find(incarnation_); i != hub_->members.end())
    i->second.listener.reset();
}

void memory_coordinator::crash() {
  crashed_ = true;
  std::lock_guard guard{hub_->mtx};
  if (auto i = hub_->members.find(incarnation_); i != hub_->members.end())
    i->second.listener.reset();
}

bool memory_coordinator::crashed(std::exception_ptr& err) const {
  if (!crashed_)
    return false;
  err = std::make_exception_ptr(coordination_unavailable_error(
    fmt::format("replica {} crashed (simulated)", replica_id_)));
  return true;
}

const std::string& memory_coordinator::replica_id() const noexcept {
  return replica_id_;
}

const std::string& memory_coordinator::incarnation() const noexcept {
  return incarnation_;
}

std::chrono::milliseconds memory_coordinator::lease() const noexcept {
  return lease_;
}

void memory_coordinator::on_grant(grant_listener fn) {
  std::lock_guard guard{hub_->mtx};
  hub_->members[incarnation_].listener
    = std::make_shared<grant_listener>(std::move(fn));
}

std::uint64_t memory_coordinator::push_epoch() const noexcept {
  return 1;
}

namespace {

turn_state waiting(const std::string& key, const chat_state& c,
                   const ticket_entry& e, time_point now) {
  turn_state s;
  s.state = turn_state::status::waiting;
  s.key = key;
  s.req = e.req;
  s.ticket = e.ticket;
  s.now_ms = ms(now);
  if (c.owner)
    s.blocker = c.owner->incarnation;
  else if (!c.queue.empty())
    s.blocker = c.queue.front().incarnation;
  return s;
}

// What poll says of the tickets ahead of `mine` (see turn_state).
void queued_ahead(const chat_state& c, std::deque<ticket_entry>::const_iterator mine,
                  turn_state& s) {
  for (auto q = c.queue.begin(); q != mine; ++q) {
    if (s.queued_ahead.size() == turn_state::max_queued_ahead)
      return;
    if (q->incarnation == mine->incarnation
        || (c.owner && q->incarnation == c.owner->incarnation)
        || std::find(s.queued_ahead.begin(), s.queued_ahead.end(),
                     q->incarnation) != s.queued_ahead.end())
      continue;
    s.queued_ahead.push_back(q->incarnation);
  }
}

turn_state gone(const std::string& key, std::uint64_t req, time_point now) {
  turn_state s;
  s.key = key;
  s.req = req;
  s.now_ms = ms(now);
  return s;
}

} // namespace

void memory_coordinator::enter(std::string_view key, std::uint64_t req,
                               bool, completion<turn_state> done) {
  std::exception_ptr err;
  if (crashed(err))
    return done({}, err);
  detail::check_key(key);
  turn_state out;
  pushes ps;
  {
    std::lock_guard guard{hub_->mtx};
    auto& h = *hub_;
    auto now = h.clk->now();
    auto k = std::string{key};
    h.members[incarnation_].heartbeat = now + lease_;
    auto& c = h.chat(k);
    h.expire(k, c, now, ps);
    auto mine = [&](const auto& x) {
      return x.incarnation == incarnation_ && x.req == req;
    };
    if (c.owner && mine(*c.owner)) {
      out = h.granted(k, *c.owner, now); // a retry: the same grant
    } else if (auto i = std::find_if(c.queue.begin(), c.queue.end(), mine);
               i != c.queue.end()) {
      out = waiting(k, c, *i, now); // a retry: the same ticket
    } else if (!c.owner && c.queue.empty()) {
      c.owner = holder{incarnation_, req, ++c.seq, ++h.fences, c.last,
                       now + lease_};
      out = h.granted(k, *c.owner, now);
    } else {
      h.grant_next(k, c, now, {}, ps);
      c.queue.push_back(ticket_entry{++c.seq, incarnation_, req});
      out = waiting(k, c, c.queue.back(), now);
    }
  }
  deliver(ps);
  done(std::move(out), nullptr);
}

void memory_coordinator::poll(std::string_view key, std::uint64_t req,
                              completion<turn_state> done) {
  std::exception_ptr err;
  if (crashed(err))
    return done({}, err);
  turn_state out;
  pushes ps;
  {
    std::lock_guard guard{hub_->mtx};
    auto& h = *hub_;
    auto now = h.clk->now();
    auto k = std::string{key};
    h.members[incarnation_].heartbeat = now + lease_;
    out = gone(k, req, now);
    if (auto i = h.chats.find(k); i != h.chats.end()) {
      auto& c = i->second;
      h.expire(k, c, now, ps);
      auto mine = [&](const auto& x) {
        return x.incarnation == incarnation_ && x.req == req;
      };
      if (c.owner && mine(*c.owner))
        out = h.granted(k, *c.owner, now);
      else if (auto q = std::find_if(c.queue.begin(), c.queue.end(), mine);
               q != c.queue.end()) {
        out = waiting(k, c, *q, now);
        queued_ahead(c, q, out);
      }
      h.settle(k, c);
    }
  }
  deliver(ps);
  done(std::move(out), nullptr);
}

void memory_coordinator::release(turn_ref t, std::string_view handoff,
                                 completion<release_result> done) {
  std::exception_ptr err;
  if (crashed(err))
    return done({}, err);
  release_result out;
  pushes ps;
  {
    std::lock_guard guard{hub_->mtx};
    auto& h = *hub_;
    auto now = h.clk->now();
    out.now_ms = ms(now);
    if (auto i = h.chats.find(t.key); i != h.chats.end()) {
      auto& c = i->second;
      if (c.owner && c.owner->incarnation == incarnation_
          && c.owner->fence == t.fence && c.owner->deadline > now) {
        c.last = replica_id_;
        c.owner.reset();
        out.released = true;
        h.grant_next(t.key, c, now, {}, ps, handoff);
      }
      h.expire(t.key, c, now, ps);
      h.grant_next(t.key, c, now, {}, ps);
      // The next grant, when it is ours, travels in the reply too.
      if (c.owner && c.owner->incarnation == incarnation_)
        out.next = h.granted(t.key, *c.owner, now);
      h.settle(t.key, c);
    }
  }
  deliver(ps);
  done(std::move(out), nullptr);
}

void memory_coordinator::leave(std::string_view key, std::uint64_t req,
                               completion<bool> done) {
  std::exception_ptr err;
  if (crashed(err))
    return done({}, err);
  bool left = false;
  pushes ps;
  {
    std::lock_guard guard{hub_->mtx};
    auto& h = *hub_;
    auto now = h.clk->now();
    auto k = std::string{key};
    if (auto i = h.chats.find(k); i != h.chats.end()) {
      auto& c = i->second;
      if (c.owner && c.owner->incarnation == incarnation_
          && c.owner->req == req) {
        // A granted request that leaves never ran its step: the last
        // holder is still the one before this grant.
        c.last = c.owner->previous;
        c.owner.reset();
        left = true;
      } else {
        auto q = std::find_if(c.queue.begin(), c.queue.end(), [&](auto& e) {
          return e.incarnation == incarnation_ && e.req == req;
        });
        if (q != c.queue.end()) {
          c.queue.erase(q);
          left = true;
        }
      }
      h.expire(k, c, now, ps);
      h.grant_next(k, c, now, {}, ps);
      h.settle(k, c);
    }
  }
  deliver(ps);
  done(std::move(left), nullptr);
}

void memory_coordinator::skip_if_dead(std::string_view key,
                                      std::string_view incarnation,
                                      completion<bool> done) {
  std::exception_ptr err;
  if (crashed(err))
    return done({}, err);
  bool skipped = false;
  pushes ps;
  {
    std::lock_guard guard{hub_->mtx};
    auto& h = *hub_;
    auto now = h.clk->now();
    auto k = std::string{key};
    auto dead = std::string{incarnation};
    auto i = h.chats.find(k);
    if (i != h.chats.end() && !h.alive(dead, now)) {
      auto& c = i->second;
      // Its turn keeps its lease: a frozen (not dead) replica may use a turn
      // granted while it was frozen until that turn's deadline.
      if (c.owner && c.owner->incarnation == dead
          && c.owner->deadline <= now) {
        c.last.reset(); // unknown whether it ran: see expire()
        c.owner.reset();
        skipped = true;
      }
      auto before = c.queue.size();
      std::erase_if(c.queue,
                    [&](const ticket_entry& e) { return e.incarnation == dead; });
      skipped = skipped || c.queue.size() != before;
      h.grant_next(k, c, now, {}, ps);
      h.settle(k, c);
    }
  }
  deliver(ps);
  done(std::move(skipped), nullptr);
}

void memory_coordinator::renew(renewal r, completion<renewal_result> done) {
  std::exception_ptr err;
  if (crashed(err))
    return done({}, err);
  renewal_result out;
  pushes ps;
  {
    std::lock_guard guard{hub_->mtx};
    auto& h = *hub_;
    auto now = h.clk->now();
    out.now_ms = ms(now);
    h.members[incarnation_].heartbeat = now + lease_;
    for (auto& t : r.turns) {
      std::int64_t deadline = 0;
      if (auto i = h.chats.find(t.key); i != h.chats.end()) {
        auto& c = i->second;
        h.expire(t.key, c, now, ps);
        if (c.owner && c.owner->incarnation == incarnation_
            && c.owner->fence == t.fence) {
          c.owner->deadline = now + lease_;
          deadline = ms(c.owner->deadline);
        }
      }
      out.turns.push_back(deadline);
    }
    for (auto& name : r.leads) {
      auto& l = h.leads[name];
      bool mine = l.incarnation == incarnation_ && l.deadline > now;
      if (!mine) {
        bool free = l.incarnation.empty() || l.deadline <= now
                    || !h.alive(l.incarnation, now);
        if (!free) {
          out.leads.emplace_back();
          continue;
        }
        l.incarnation = incarnation_;
        ++l.term;
      }
      l.deadline = now + lease_;
      out.leads.push_back(leadership{name, l.term, ms(l.deadline), ms(now)});
    }
  }
  deliver(ps);
  done(std::move(out), nullptr);
}

void memory_coordinator::unlead(std::string_view name, std::uint64_t fence,
                                completion<bool> done) {
  std::exception_ptr err;
  if (crashed(err))
    return done({}, err);
  bool released = false;
  {
    std::lock_guard guard{hub_->mtx};
    auto i = hub_->leads.find(std::string{name});
    if (i != hub_->leads.end() && i->second.incarnation == incarnation_
        && i->second.term == fence) {
      i->second.incarnation.clear();
      released = true;
    }
  }
  done(std::move(released), nullptr);
}

} // namespace botmesh
