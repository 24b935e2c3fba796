#include <botmesh/stores/memory_coordinator.hpp>

#include <condition_variable>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/store.hpp>

namespace botmesh {



namespace {

struct holder {
  std::string incarnation;
  std::string replica;
  std::uint64_t ticket = 0;
  std::uint64_t fence = 0;
  time_point deadline{};
};

struct chat_state {
  std::uint64_t seq = 0;     // last ticket handed out
  std::uint64_t serving = 1; // next ticket to serve
  std::map<std::uint64_t, std::string> pending; // ticket -> incarnation
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

} // namespace

struct memory_coordination_hub::impl {
  explicit impl(memory_hub_options o)
    : opts(o), clk(o.clock ? o.clock : &botmesh::clock::system()) {
    // nop
  }

  bool alive(const std::string& incarnation, time_point now) const {
    auto i = heartbeats.find(incarnation);
    return i != heartbeats.end() && i->second > now;
  }

  // Drops an expired or dead holder and skips tickets that will never be
  // served (given up, or of a replica whose heartbeat is gone).
  void normalize(chat_state& c, time_point now) {
    if (c.owner && (c.owner->deadline <= now || !alive(c.owner->incarnation, now))) {
      c.last = c.owner->replica;
      c.serving = std::max(c.serving, c.owner->ticket + 1);
      c.owner.reset();
      cv.notify_all();
    }
    while (!c.owner && c.serving <= c.seq) {
      auto it = c.pending.find(c.serving);
      if (it != c.pending.end() && alive(it->second, now))
        break;
      if (it != c.pending.end())
        c.pending.erase(it);
      ++c.serving;
    }
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
    if (c.owner || !c.pending.empty() || c.idle_listed)
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
  std::condition_variable cv;
  std::unordered_map<std::string, chat_state> chats;
  std::list<std::string> idle; // front: least recently used
  std::unordered_map<std::string, time_point> heartbeats; // by incarnation
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
  hub_->heartbeats[incarnation_] = hub_->clk->now() + lease_;
}

memory_coordinator::~memory_coordinator() = default;

void memory_coordinator::crash() {
  crashed_ = true;
}

void memory_coordinator::check_alive() const {
  if (crashed_)
    throw coordination_unavailable_error(
      fmt::format("replica {} crashed (simulated)", replica_id_));
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

std::uint64_t memory_coordinator::take_ticket(std::string_view key) {
  check_alive();
  detail::check_key(key);
  std::lock_guard guard{hub_->mtx};
  auto k = std::string{key};
  hub_->heartbeats[incarnation_] = hub_->clk->now() + lease_;
  auto& c = hub_->chat(k);
  auto ticket = ++c.seq;
  c.pending[ticket] = incarnation_;
  return ticket;
}

std::optional<turn> memory_coordinator::try_acquire(std::string_view key,
                                                    std::uint64_t ticket) {
  check_alive();
  std::lock_guard guard{hub_->mtx};
  auto now = hub_->clk->now();
  auto k = std::string{key};
  hub_->heartbeats[incarnation_] = now + lease_;
  auto& c = hub_->chat(k);
  hub_->normalize(c, now);
  auto mine = c.pending.find(ticket);
  if (mine == c.pending.end() || mine->second != incarnation_) {
    hub_->settle(k, c);
    throw coordination_unavailable_error(
      fmt::format("chat {}: ticket {} is no longer in the queue (skipped as "
                  "dead or given up)",
                  key, ticket));
  }
  if (c.owner || c.serving != ticket)
    return std::nullopt;
  c.pending.erase(mine);
  c.owner = holder{incarnation_, replica_id_, ticket, ++hub_->fences,
                   now + lease_};
  return turn{k, ticket, c.owner->fence, c.last, c.owner->deadline};
}

std::vector<std::string>
memory_coordinator::renew(const std::vector<turn>& held) {
  check_alive();
  std::lock_guard guard{hub_->mtx};
  auto now = hub_->clk->now();
  hub_->heartbeats[incarnation_] = now + lease_;
  std::vector<std::string> lost;
  for (auto& t : held) {
    auto i = hub_->chats.find(t.key);
    if (i == hub_->chats.end()) {
      lost.push_back(t.key);
      continue;
    }
    auto& c = i->second;
    if (c.owner && c.owner->deadline <= now) // expired before this renewal
      hub_->normalize(c, now);
    if (!c.owner || c.owner->incarnation != incarnation_
        || c.owner->fence != t.fence) {
      lost.push_back(t.key);
      continue;
    }
    c.owner->deadline = now + lease_;
  }
  return lost;
}

bool memory_coordinator::release(const turn& t) {
  check_alive();
  std::lock_guard guard{hub_->mtx};
  auto i = hub_->chats.find(t.key);
  if (i == hub_->chats.end())
    return false;
  auto& c = i->second;
  if (!c.owner || c.owner->incarnation != incarnation_
      || c.owner->fence != t.fence)
    return false;
  c.last = replica_id_;
  c.serving = std::max(c.serving, c.owner->ticket + 1);
  c.owner.reset();
  hub_->normalize(c, hub_->clk->now());
  hub_->settle(t.key, c);
  hub_->cv.notify_all();
  return true;
}

void memory_coordinator::cancel_ticket(std::string_view key,
                                       std::uint64_t ticket) {
  check_alive();
  std::lock_guard guard{hub_->mtx};
  auto i = hub_->chats.find(std::string{key});
  if (i == hub_->chats.end())
    return;
  auto& c = i->second;
  auto p = c.pending.find(ticket);
  if (p == c.pending.end() || p->second != incarnation_)
    return;
  c.pending.erase(p);
  hub_->normalize(c, hub_->clk->now());
  hub_->settle(i->first, c);
  hub_->cv.notify_all();
}

std::optional<leadership> memory_coordinator::try_lead(std::string_view name) {
  check_alive();
  detail::check_key(name, "name");
  std::lock_guard guard{hub_->mtx};
  auto now = hub_->clk->now();
  hub_->heartbeats[incarnation_] = std::max(hub_->heartbeats[incarnation_],
                                            now + lease_);
  auto& l = hub_->leads[std::string{name}];
  bool mine = l.incarnation == incarnation_ && l.deadline > now;
  if (!mine) {
    bool free = l.incarnation.empty() || l.deadline <= now
                || !hub_->alive(l.incarnation, now);
    if (!free)
      return std::nullopt;
    l.incarnation = incarnation_;
    ++l.term;
  }
  l.deadline = now + lease_;
  return leadership{std::string{name}, l.term, l.deadline};
}

void memory_coordinator::release_lead(const leadership& lead) {
  check_alive();
  std::lock_guard guard{hub_->mtx};
  auto i = hub_->leads.find(lead.name);
  if (i != hub_->leads.end() && i->second.incarnation == incarnation_
      && i->second.term == lead.fence) {
    i->second.incarnation.clear();
    hub_->cv.notify_all();
  }
}

void memory_coordinator::wait_change(std::string_view,
                                     std::chrono::milliseconds timeout) {
  check_alive();
  std::unique_lock guard{hub_->mtx};
  hub_->cv.wait_for(guard, timeout);
}

} // namespace botmesh
