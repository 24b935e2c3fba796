// The Redis Cluster router of `redis_client` (internal/cluster.hpp).
//
// A command's life:
//
//   send ──▶ dispatch ──▶ node client (pipelined) ──▶ on_reply ──▶ finish
//              ▲  ▲                                      │
//              │  └──── MOVED (slot updated) / ASK ──────┤ (at once)
//              │        NOSCRIPT (EVAL, not counted)     │
//              └─ retry thread ◀── TRYAGAIN, CLUSTERDOWN, LOADING, a slot
//                 (after base*k)   without master, an unfollowed redirect,
//                                  a node unreachable (command not sent)
//
// A command whose reply was lost (timeout, connection dropped after the
// write) is never resent: it may have run. The caller gets errc::timeout.

#include <botmesh/runtime/core/internal/in_flight.hpp>
#include <botmesh/stores/redis/internal/cluster.hpp>
#include <botmesh/stores/redis/internal/keyspace.hpp>

#include <algorithm>
#include <charconv>
#include <future>
#include <set>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/log.hpp>
#include <botmesh/stores/redis/internal/protocol.hpp>

namespace botmesh {

namespace internal {

namespace {

constexpr std::array<std::uint16_t, 256> make_crc16_table() {
  std::array<std::uint16_t, 256> t{};
  for (unsigned i = 0; i < 256; ++i) {
    std::uint16_t crc = static_cast<std::uint16_t>(i << 8);
    for (int bit = 0; bit < 8; ++bit)
      crc = static_cast<std::uint16_t>((crc & 0x8000) ? (crc << 1) ^ 0x1021
                                                      : crc << 1);
    t[i] = crc;
  }
  return t;
}

constexpr auto crc16_table = make_crc16_table();

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size()
         && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
              return (x | 0x20) == (y | 0x20);
            });
}

bool parse_int(std::string_view s, long long& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return !s.empty() && ec == std::errc{} && p == s.data() + s.size();
}

} // namespace

std::uint16_t crc16(std::string_view data) noexcept {
  std::uint16_t crc = 0;
  for (unsigned char c : data)
    crc = static_cast<std::uint16_t>((crc << 8)
                                     ^ crc16_table[((crc >> 8) ^ c) & 0xff]);
  return crc;
}

std::optional<std::string_view> first_key(const redis_client::command& cmd) {
  using namespace std::string_view_literals;
  // On every command: string_views of literals (no strlen), and a verb
  // whose length no listed name has is skipped at once.
  static constexpr std::array scripts{"EVAL"sv,  "EVALSHA"sv,    "EVAL_RO"sv,
                                      "EVALSHA_RO"sv, "FCALL"sv, "FCALL_RO"sv};
  static constexpr std::array keyless{
    "PING"sv,    "ECHO"sv,     "TIME"sv,      "INFO"sv,   "SCRIPT"sv,
    "CLUSTER"sv, "ASKING"sv,   "READONLY"sv,  "READWRITE"sv, "CONFIG"sv,
    "DBSIZE"sv,  "FLUSHALL"sv, "FLUSHDB"sv,   "CLIENT"sv, "COMMAND"sv,
    "DEBUG"sv,   "AUTH"sv,     "HELLO"sv,     "KEYS"sv,   "SCAN"sv,
    "RANDOMKEY"sv, "WAIT"sv,   "PUBLISH"sv,   "FUNCTION"sv, "LASTSAVE"sv,
    "ROLE"sv};
  if (cmd.empty())
    return std::nullopt;
  std::string_view verb = cmd[0];
  for (auto v : scripts)
    if (iequals(verb, v)) {
      long long n = 0;
      if (cmd.size() < 4 || !parse_int(cmd[2], n) || n < 1)
        return std::nullopt;
      return std::string_view{cmd[3]};
    }
  for (auto v : keyless)
    if (iequals(verb, v))
      return std::nullopt;
  if (cmd.size() < 2)
    return std::nullopt;
  return std::string_view{cmd[1]};
}

namespace {

bool usable_host(std::string_view host) noexcept {
  // A name or an address, IPv6 included: nothing a URL would read as a
  // user ('@'), a database ('/') or more.
  return !host.empty()
         && std::all_of(host.begin(), host.end(), [](unsigned char c) {
              return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')
                     || (c >= 'A' && c <= 'Z') || c == '.' || c == '-'
                     || c == '_' || c == ':' || c == '[' || c == ']';
            });
}

} // namespace

std::optional<redirection> parse_redirection(std::string_view error,
                                             std::string_view asked_host) {
  redirection r;
  if (error.starts_with("MOVED "))
    error.remove_prefix(6);
  else if (error.starts_with("ASK "))
    error.remove_prefix(4), r.ask = true;
  else
    return std::nullopt;
  auto space = error.find(' ');
  long long slot = 0;
  if (space == std::string_view::npos || !parse_int(error.substr(0, space), slot)
      || slot < 0 || slot >= static_cast<long long>(cluster_slots))
    return std::nullopt;
  r.slot = static_cast<std::uint16_t>(slot);
  r.address = std::string{error.substr(space + 1)};
  auto colon = r.address.rfind(':');
  if (colon != std::string::npos
      && (colon == 0 || std::string_view{r.address}.substr(0, colon) == "?")
      && !asked_host.empty()) {
    r.address = std::string{asked_host} + r.address.substr(colon);
    colon = asked_host.size();
  }
  long long port = 0;
  if (colon == std::string::npos || colon == 0
      || !usable_host(std::string_view{r.address}.substr(0, colon))
      || !parse_int(std::string_view{r.address}.substr(colon + 1), port)
      || port < 1 || port > 65535)
    return std::nullopt;
  return r;
}

std::pair<std::string, int> split_address(std::string_view address) {
  auto colon = address.rfind(':');
  long long port = 0;
  if (colon == std::string_view::npos || colon == 0
      || !parse_int(address.substr(colon + 1), port) || port < 1
      || port > 65535)
    throw invalid_argument_error(
      "address", fmt::format("\"{}\" is not host:port", address));
  return {std::string{address.substr(0, colon)}, static_cast<int>(port)};
}

std::vector<slot_range> parse_cluster_slots(const redis_reply& reply,
                                            std::string_view asked_host) {
  using kind = redis_reply::kind;
  auto bad = [](std::string_view why) {
    return error(errc::store_error,
                 fmt::format("redis CLUSTER SLOTS: malformed reply: {}", why));
  };
  if (reply.type == kind::error)
    throw error(errc::store_error,
                fmt::format("redis CLUSTER SLOTS: server error: {}", reply.str));
  if (reply.type != kind::array)
    throw bad("not an array");
  auto address = [&](const redis_reply& n) {
    // A nil host (unknown-endpoint) is the host asked, as "" and "?" are.
    if (n.type != kind::array || n.elements.size() < 2
        || (n.elements[0].type != kind::string
            && n.elements[0].type != kind::status
            && n.elements[0].type != kind::nil)
        || n.elements[1].type != kind::integer || n.elements[1].integer < 1
        || n.elements[1].integer > 65535)
      throw bad("a node is not [host, port, ...]");
    auto host = n.elements[0].str;
    if (host.empty() || host == "?")
      host = std::string{asked_host};
    if (!usable_host(host))
      throw bad(fmt::format("a node's host \"{}\" is not a host name or "
                            "address",
                            host));
    return fmt::format("{}:{}", host, n.elements[1].integer);
  };
  std::vector<slot_range> out;
  for (auto& e : reply.elements) {
    if (e.type != kind::array || e.elements.size() < 3
        || e.elements[0].type != kind::integer
        || e.elements[1].type != kind::integer)
      throw bad("a range is not [first, last, master, replicas...]");
    auto first = e.elements[0].integer;
    auto last = e.elements[1].integer;
    if (first < 0 || last < first
        || last >= static_cast<long long>(cluster_slots))
      throw bad(fmt::format("slot range {}-{}", first, last));
    slot_range r;
    r.first = static_cast<std::uint16_t>(first);
    r.last = static_cast<std::uint16_t>(last);
    r.master = address(e.elements[2]);
    for (std::size_t i = 3; i < e.elements.size(); ++i)
      r.replicas.push_back(address(e.elements[i]));
    out.push_back(std::move(r));
  }
  return out;
}

} // namespace internal

using steady = std::chrono::steady_clock;

std::uint16_t redis_client::key_slot(std::string_view key) noexcept {
  if (auto open = key.find('{'); open != std::string_view::npos) {
    auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close != open + 1)
      key = key.substr(open + 1, close - open - 1);
  }
  return static_cast<std::uint16_t>(internal::crc16(key)
                                    & (internal::cluster_slots - 1));
}

struct redis_client::cluster::op {
  cluster* router = nullptr;
  node* via = nullptr; // where the command was sent last
  command cmd;
  std::optional<std::string> affinity;
  callback done;
  const redis_script* script = nullptr;
  int slot = -1;
  /// Set for the next dispatch: ASKING + the command on this node.
  std::string ask_to;
  std::size_t redirections = 0;
  std::size_t attempts = 1;
  steady::time_point started = steady::now();
};

redis_client::cluster::cluster(redis_cluster_options o) : opts(std::move(o)) {
  if (opts.root_nodes.empty())
    throw invalid_argument_error("cluster.root_nodes",
                                 "a Redis Cluster client needs at least one "
                                 "root node (redis://host:port or host:port)");
  for (auto& root : opts.root_nodes) {
    std::string address;
    if (root.starts_with("redis://")) {
      auto ep = internal::parse_url(root);
      if (opts.password.empty() && !ep.password.empty()) {
        opts.user = ep.user;
        opts.password = ep.password;
      }
      address = fmt::format("{}:{}", ep.host, ep.port);
    } else {
      try {
        internal::split_address(root);
      } catch (const invalid_argument_error&) {
        throw invalid_argument_error(
          "cluster.root_nodes",
          fmt::format("root node \"{}\" is neither redis://host:port nor "
                      "host:port",
                      root));
      }
      address = root;
    }
    seeds_.push_back(std::move(address));
  }
  if (opts.retry_attempts < 1)
    opts.retry_attempts = 1;
  endpoint = "cluster " + fmt::format("{}", fmt::join(seeds_, ","));
  for (auto& s : slots_)
    s.store(nullptr, std::memory_order_relaxed);
  discover();
  timer_thread_ = std::thread{[this] { timer_loop(); }};
}

redis_client::cluster::~cluster() {
  shutdown();
}

std::string redis_client::cluster::mapped(std::string_view address) const {
  if (opts.node_address_map)
    return opts.node_address_map(address);
  return std::string{address};
}

redis_client::cluster::node*
redis_client::cluster::node_at(const std::string& address) {
  std::lock_guard guard{nodes_mtx_};
  auto& n = nodes_[address];
  if (!n) {
    // Made whole before it is in the map: a throw (an address the URL
    // refuses, no descriptor left) leaves no empty entry behind.
    try {
      auto [host, port] = internal::split_address(address);
      auto o = opts.node;
      o.url = internal::node_url(opts.user, opts.password, host, port);
      auto made = std::make_unique<node>();
      made->address = address;
      made->client = std::make_unique<redis_client>(std::move(o));
      for (auto* s : scripts_)
        made->client->preload(*s);
      n = std::move(made);
    } catch (...) {
      nodes_.erase(address);
      throw;
    }
  }
  return n.get();
}

void redis_client::cluster::for_each_master(
  const std::function<void(redis_client&)>& fn) {
  auto* asked = any_master();
  if (!asked)
    throw error(errc::store_error,
                fmt::format("redis cluster {}: no master known", endpoint));
  auto text = asked->client->call({"CLUSTER", "NODES"}).str;
  for (auto& addr : internal::cluster_masters(text)) {
    // A node that never met another does not know its own host: its line
    // says ":port", and it is the node asked.
    if (addr.starts_with(':'))
      fn(*asked->client);
    else
      fn(*node_at(mapped(addr))->client);
  }
}

void redis_client::for_each_master(
  const std::function<void(redis_client&)>& fn) {
  if (!cluster_) {
    fn(*this);
    return;
  }
  cluster_->for_each_master(fn);
}

redis_client::cluster::node* redis_client::cluster::any_master() {
  // Rare (commands without a key): a scan of the map is fine.
  auto start = next_master_.fetch_add(997, std::memory_order_relaxed);
  for (std::size_t i = 0; i < internal::cluster_slots; i += 97)
    if (auto* n = slots_[(start + i) % internal::cluster_slots].load(
          std::memory_order_acquire))
      return n;
  for (auto& s : slots_)
    if (auto* n = s.load(std::memory_order_acquire))
      return n;
  return nullptr;
}

std::vector<std::string> redis_client::cluster::known_nodes(std::size_t* masters) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  auto add = [&](const std::string& a) {
    if (seen.insert(a).second)
      out.push_back(a);
  };
  for (auto& s : slots_)
    if (auto* n = s.load(std::memory_order_acquire))
      add(n->address);
  if (masters)
    *masters = out.size();
  std::lock_guard guard{nodes_mtx_};
  for (auto& s : seeds_)
    add(s);
  for (auto& [a, n] : nodes_)
    add(a);
  return out;
}

bool redis_client::cluster::refresh_once(std::string* why) {
  // The masters of the map are asked first, all at once, and the first
  // useful answer is taken; the other nodes are asked too when no master
  // answered within a short wait (all of them down, or hanging). Asked one
  // after the other, a master that hangs (paused, swapping, DEBUG SLEEP)
  // would hold every refresh for a whole command timeout, and with it the
  // news of its own failover.
  constexpr auto masters_first = std::chrono::milliseconds{100};
  std::size_t masters = 0;
  auto candidates = known_nodes(&masters);
  struct gather {
    std::mutex mtx;
    std::condition_variable cv;
    std::optional<std::vector<internal::slot_range>> best;
    std::vector<std::string> failures;
    std::size_t asked = 0;
    std::size_t settled = 0;
  };
  auto g = std::make_shared<gather>();
  auto settle = [g](std::optional<std::vector<internal::slot_range>> ranges,
                    std::string failure) {
    {
      std::lock_guard guard{g->mtx};
      if (ranges && !g->best)
        g->best = std::move(ranges);
      else if (!ranges)
        g->failures.push_back(std::move(failure));
      ++g->settled;
    }
    g->cv.notify_all();
  };
  auto ask = [&](std::size_t from, std::size_t to) {
    {
      std::lock_guard guard{g->mtx};
      g->asked += to - from;
    }
    for (auto at = from; at < to; ++at) {
      auto& address = candidates[at];
      node* n = nullptr;
      try {
        if (closed_)
          throw error(errc::store_error, "the client is closed");
        n = node_at(address);
      } catch (const std::exception& e) {
        settle(std::nullopt, fmt::format("{}: {}", address, e.what()));
        continue;
      }
      n->client->async({"CLUSTER", "SLOTS"},
                       [settle, address](redis_reply reply, std::exception_ptr e) {
                         try {
                           if (e)
                             std::rethrow_exception(e);
                           auto ranges = internal::parse_cluster_slots(
                             reply, internal::split_address(address).first);
                           if (ranges.empty())
                             throw error(errc::store_error,
                                         "CLUSTER SLOTS: no slot is served");
                           settle(std::move(ranges), {});
                         } catch (const std::exception& x) {
                           settle(std::nullopt,
                                  fmt::format("{}: {}", address, x.what()));
                         }
                       });
    }
  };
  std::optional<std::vector<internal::slot_range>> got;
  {
    ask(0, masters);
    std::unique_lock guard{g->mtx};
    g->cv.wait_for(guard, masters_first,
                   [&] { return g->best || g->settled == g->asked; });
    if (!g->best && masters < candidates.size()) {
      guard.unlock();
      ask(masters, candidates.size());
      guard.lock();
    }
    // Every request ends (answered, failed or timed out), so this does too.
    g->cv.wait(guard, [&] { return g->best || g->settled == g->asked; });
    got = std::move(g->best);
    g->best.reset();
    if (!got && why)
      *why = fmt::format("{}", fmt::join(g->failures, "; "));
  }
  if (!got || closed_)
    return false;
  try {
    std::vector<node*> fresh(internal::cluster_slots, nullptr);
    std::vector<std::string> skipped;
    for (auto& r : *got) {
      auto master = mapped(r.master);
      auto* m = node_at(master);
      for (std::size_t s = r.first; s <= r.last; ++s)
        fresh[s] = m;
      // Replicas only seed later refreshes: one the map refuses (or maps
      // to no host:port) is left out, not the whole answer, which would
      // keep every later refresh from applying.
      std::vector<std::string> reps;
      for (auto& rep : r.replicas) {
        try {
          auto a = mapped(rep);
          internal::split_address(a);
          reps.push_back(std::move(a));
        } catch (const std::exception& x) {
          skipped.push_back(fmt::format("{} ({})", rep, x.what()));
        }
      }
      std::lock_guard guard{nodes_mtx_};
      for (auto& a : reps)
        if (std::find(seeds_.begin(), seeds_.end(), a) == seeds_.end())
          seeds_.push_back(std::move(a));
      if (std::find(seeds_.begin(), seeds_.end(), master) == seeds_.end())
        seeds_.push_back(std::move(master));
    }
    auto said = fmt::format("{}", fmt::join(skipped, "; "));
    if (!skipped.empty() && said != skipped_said_)
      log::warn("redis", fmt::format("redis {}: CLUSTER SLOTS: replica(s) left "
                                     "out of the seeds: {}",
                                     endpoint, said));
    skipped_said_ = std::move(said);
    for (std::size_t s = 0; s < internal::cluster_slots; ++s)
      slots_[s].store(fresh[s], std::memory_order_release);
  } catch (const std::exception& e) {
    // A node of the answer could not be set up (no descriptor left, an
    // address map that throws): the map stays as it was.
    if (why)
      *why = fmt::format("applying CLUSTER SLOTS failed: {}", e.what());
    return false;
  }
  return true;
}

void redis_client::cluster::discover() {
  std::string why;
  for (std::size_t attempt = 1;; ++attempt) {
    if (refresh_once(&why))
      return;
    if (attempt >= opts.retry_attempts)
      break;
    std::this_thread::sleep_for(opts.retry_base.ms() * attempt);
  }
  // The node clients made so far are freed with this half-built router.
  throw error(errc::store_error,
              fmt::format("redis cluster: no root node answered CLUSTER SLOTS "
                          "after {} attempts: {}",
                          opts.retry_attempts, why));
}

void redis_client::cluster::request_refresh() {
  {
    std::lock_guard guard{timer_mtx_};
    refresh_wanted_ = true;
  }
  timer_cv_.notify_one();
}

void redis_client::cluster::at(steady::time_point when,
                               std::function<void(bool)> fn) {
  {
    std::unique_lock guard{timer_mtx_};
    if (!stopping_) {
      timers_.emplace(when, std::move(fn));
      guard.unlock();
      timer_cv_.notify_one();
      return;
    }
  }
  fn(true);
}

void redis_client::cluster::timer_loop() {
  // Refreshes are coalesced: at most one per 100 ms, whatever asked.
  constexpr auto refresh_gap = std::chrono::milliseconds{100};
  std::unique_lock guard{timer_mtx_};
  while (!stopping_) {
    auto now = steady::now();
    // Due retries go first: commands that keep failing ask for a refresh
    // all the time, and refreshes first would leave the retries waiting
    // well past their bound.
    if (!timers_.empty() && timers_.begin()->first <= now) {
      auto fn = std::move(timers_.begin()->second);
      timers_.erase(timers_.begin());
      guard.unlock();
      fn(false);
      guard.lock();
      continue;
    }
    if (refresh_wanted_ && now - last_refresh_ >= refresh_gap) {
      refresh_wanted_ = false;
      last_refresh_ = now;
      guard.unlock();
      // Said when it changes: an address map that refuses a master, or
      // every node failing, would otherwise leave slots on a dead node
      // with nothing saying why.
      std::string why;
      if (refresh_once(&why)) {
        refresh_said_.clear();
      } else if (!why.empty() && why != refresh_said_) {
        log::warn("redis", fmt::format("redis {}: refreshing the slot map "
                                       "failed: {}",
                                       endpoint, why));
        refresh_said_ = std::move(why);
      }
      guard.lock();
      continue;
    }
    auto wake = steady::time_point::max();
    if (!timers_.empty())
      wake = timers_.begin()->first;
    if (refresh_wanted_)
      wake = std::min(wake, last_refresh_ + refresh_gap);
    if (wake == steady::time_point::max())
      timer_cv_.wait(guard);
    else
      timer_cv_.wait_until(guard, wake);
  }
  auto rest = std::move(timers_);
  timers_.clear();
  guard.unlock();
  for (auto& [when, fn] : rest)
    fn(true);
}

void redis_client::cluster::send(command cmd,
                                 std::optional<std::string> affinity,
                                 callback done, const redis_script* script) {
  auto o = std::make_shared<op>();
  if (auto key = internal::first_key(cmd))
    o->slot = key_slot(*key);
  o->cmd = std::move(cmd);
  o->affinity = std::move(affinity);
  o->done = std::move(done);
  o->script = script;
  dispatch(o);
}

void redis_client::cluster::finish(const std::shared_ptr<op>& o, redis_reply r,
                                   std::exception_ptr e) {
  auto done = std::move(o->done);
  done(std::move(r), std::move(e));
}

// Counts a resend from a node's thread, so shutdown() waits for it before
// freeing the nodes. (Commands from the caller's threads need no count: a
// client is not used while it is destroyed; the retry thread is joined
// first.) Counting only the rare resends keeps every command's path free
// of a write shared by all threads.
void redis_client::cluster::resend(const std::shared_ptr<op>& o) {
  internal::in_flight guard{dispatching_};
  dispatch(o); // checks closed_ after the count is up
}

void redis_client::cluster::dispatch(const std::shared_ptr<op>& o) {
  if (closed_.load(std::memory_order_seq_cst)) {
    finish(o, {},
           std::make_exception_ptr(error(
             errc::store_error,
             fmt::format("redis {}: {} not sent: the client is closed",
                         endpoint, o->cmd.empty() ? "" : o->cmd[0]))));
    return;
  }
  node* n = nullptr;
  bool asking = !o->ask_to.empty();
  if (asking) {
    auto to = std::move(o->ask_to);
    o->ask_to.clear();
    if (!(n = redirected_node(o, to)))
      return;
  } else if (o->slot >= 0) {
    n = slots_[static_cast<std::size_t>(o->slot)].load(std::memory_order_acquire);
  } else {
    n = any_master();
  }
  if (!n) {
    request_refresh();
    retry_later(o,
                o->slot >= 0
                  ? fmt::format("slot {} has no master in the slot map", o->slot)
                  : std::string{"no master is known"},
                std::nullopt);
    return;
  }
  if (asking) {
    // On the affinity's lane, as any other command of it (a copy of the
    // command, kept for a resend).
    n->client->async_asking(o->affinity ? &*o->affinity : nullptr, o->cmd,
                            [this, o, n](redis_reply r, std::exception_ptr e) {
                              on_reply(o, n, std::move(r), std::move(e), true);
                            });
    return;
  }
  // The command travels to the node and comes back with the reply (no
  // copy); the callback holds only `o`, small enough for no allocation.
  o->router = this;
  o->via = n;
  auto cmd = std::move(o->cmd);
  n->client->async_keep(o->affinity ? &*o->affinity : nullptr, std::move(cmd),
                        [o](redis_reply r, std::exception_ptr e, command&& c) {
                          o->cmd = std::move(c);
                          o->router->on_reply(o, o->via, std::move(r),
                                              std::move(e), false);
                        });
}

redis_client::cluster::node*
redis_client::cluster::redirected_node(const std::shared_ptr<op>& o,
                                       const std::string& address) {
  try {
    return node_at(address);
  } catch (const std::exception& x) {
    // On a node's thread (a reply's callback): the error goes to the
    // command, never up that thread.
    finish(o, {},
           std::make_exception_ptr(error(
             errc::store_error,
             fmt::format("redis {} {}: redirected to \"{}\", which cannot be "
                         "used: {}",
                         endpoint, o->cmd.empty() ? "" : o->cmd[0], address,
                         x.what()))));
    return nullptr;
  }
}

void redis_client::cluster::retry_later(const std::shared_ptr<op>& o,
                                        std::string why,
                                        std::optional<redis_reply> last) {
  auto name = o->cmd.empty() ? std::string{} : o->cmd[0];
  if (o->attempts >= opts.retry_attempts || closed_) {
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      steady::now() - o->started);
    auto given_up = fmt::format("given up after {} attempts over {}",
                                o->attempts, format_duration(took));
    if (last) {
      // The reply's own text, and why it was not followed when that is
      // more than the text says (a redirection past the limit).
      last->str += why == last->str
                     ? fmt::format(" ({})", given_up)
                     : fmt::format(" ({}; {})", why, given_up);
      finish(o, std::move(*last), nullptr);
    } else {
      finish(o, {},
             std::make_exception_ptr(error(
               errc::store_error, fmt::format("redis {} {}: {} ({})", endpoint,
                                              name, why, given_up))));
    }
    return;
  }
  auto delay = opts.retry_base.ms() * o->attempts;
  ++o->attempts;
  at(steady::now() + delay, [this, o, name](bool cancelled) {
    if (cancelled)
      finish(o, {},
             std::make_exception_ptr(error(
               errc::store_error,
               fmt::format("redis {}: {} not sent: the client closed before "
                           "its retry",
                           endpoint, name))));
    else
      dispatch(o);
  });
}

void redis_client::cluster::on_reply(const std::shared_ptr<op>& o, node* via,
                                     redis_reply r, std::exception_ptr e,
                                     bool was_asking) {
  if (e) {
    try {
      std::rethrow_exception(e);
    } catch (const internal::unsent_error& x) {
      // Never written: the node is down or restarting (a failover).
      request_refresh();
      retry_later(o, x.what(), std::nullopt);
    } catch (const error& x) {
      // The node may be hung or gone (a failover on its way): the map is
      // read again, so the next commands find its successor.
      request_refresh();
      if (x.code() == errc::timeout)
        finish(o, {}, e);
      else
        finish(o, {},
               std::make_exception_ptr(error(
                 errc::timeout,
                 fmt::format("{}; the reply was lost, so the command is not "
                             "resent (it may have run)",
                             x.what()))));
    } catch (...) {
      finish(o, {}, e);
    }
    return;
  }
  if (r.type != redis_reply::kind::error || closed_) {
    finish(o, std::move(r), nullptr);
    return;
  }
  std::string_view text = r.str;
  if (text.starts_with("MOVED ") || text.starts_with("ASK ")) {
    // An empty or "?" host names the node this went to.
    auto red = internal::parse_redirection(
      text, via ? internal::split_address(via->address).first : std::string{});
    if (!red || ++o->redirections > opts.max_redirections) {
      // A redirection not followed: the map is refreshed meanwhile.
      o->redirections = 0;
      request_refresh();
      retry_later(o,
                  red ? fmt::format("more than {} redirections",
                                    opts.max_redirections)
                      : std::string{"a malformed redirection"},
                  std::move(r));
      return;
    }
    std::string address;
    try {
      address = mapped(red->address);
    } catch (const std::exception& x) {
      // On a node's thread (a reply's callback): the error goes to the
      // command, never up that thread.
      finish(o, {},
             std::make_exception_ptr(error(
               errc::store_error,
               fmt::format("redis {} {}: redirected to \"{}\", which "
                           "node_address_map refused: {}",
                           endpoint, o->cmd.empty() ? "" : o->cmd[0],
                           red->address, x.what()))));
      return;
    }
    if (red->ask) {
      o->ask_to = std::move(address);
    } else {
      auto* to = redirected_node(o, address);
      if (!to)
        return;
      slots_[red->slot].store(to, std::memory_order_release);
      // The slot the server named, not the one guessed from the command: a
      // command whose key is not its first argument (OBJECT ENCODING k)
      // would otherwise go back to the same node until given up.
      o->slot = red->slot;
      request_refresh();
    }
    resend(o);
    return;
  }
  if (text.starts_with("TRYAGAIN") || text.starts_with("CLUSTERDOWN")
      || text.starts_with("LOADING")) {
    if (text.starts_with("CLUSTERDOWN"))
      request_refresh();
    std::string why{text};
    retry_later(o, std::move(why), std::move(r));
    return;
  }
  if (text.starts_with("NOSCRIPT") && o->script
      && internal::to_eval(o->cmd, *o->script)) {
    // Not a retry: the same node, with the body.
    if (was_asking)
      o->ask_to = via->address;
    resend(o);
    return;
  }
  finish(o, std::move(r), nullptr);
}

void redis_client::cluster::check_script_keys(
  const redis_script& script, const std::vector<std::string>& keys) {
  if (keys.size() < 2)
    return;
  auto first = key_slot(keys[0]);
  for (auto& k : keys)
    if (key_slot(k) != first) {
      std::vector<std::string> listed;
      for (auto& x : keys)
        listed.push_back(fmt::format("\"{}\" (slot {})", x, key_slot(x)));
      throw invalid_argument_error(
        "keys",
        fmt::format("script {}: its keys must share one hash slot on a Redis "
                    "Cluster (use one hash tag), got {}",
                    script.name(), fmt::join(listed, ", ")));
    }
}

void redis_client::cluster::preload(const redis_script& script) {
  std::vector<node*> all;
  {
    std::lock_guard guard{nodes_mtx_};
    if (std::find(scripts_.begin(), scripts_.end(), &script) != scripts_.end())
      return;
    scripts_.push_back(&script);
    for (auto& [a, n] : nodes_)
      all.push_back(n.get());
  }
  for (auto* n : all)
    n->client->preload(script);
}

void redis_client::cluster::subscribe(
  std::uint64_t id, std::string channel,
  std::function<void(std::string_view)> on_message,
  std::function<void()> on_subscribed) {
  // PUBLISH reaches every node of a cluster: the channel's slot only
  // spreads subscriptions over the masters.
  auto* n = slots_[key_slot(channel)].load(std::memory_order_acquire);
  if (!n)
    n = any_master();
  if (!n)
    throw error(errc::store_error,
                fmt::format("redis {}: SUBSCRIBE {}: no master is known",
                            endpoint, channel));
  subscribe_on(id, *n, std::move(channel), std::move(on_message),
               std::move(on_subscribed));
}

std::optional<std::string>
redis_client::cluster::next_node(const std::string& failed) {
  // Called on a subscriber's thread: counted like a resend, so shutdown()
  // does not free the nodes read here meanwhile.
  internal::in_flight guard{dispatching_};
  if (closed_.load(std::memory_order_seq_cst))
    return std::nullopt;
  request_refresh();
  auto known = known_nodes();
  // The one after `failed`, cyclically: repeated failures visit every node
  // instead of going back and forth between two that are down.
  auto at = std::find(known.begin(), known.end(), failed);
  auto start = at == known.end() ? 0 : (at - known.begin()) + 1;
  for (std::size_t k = 0; k < known.size(); ++k) {
    auto& a = known[(start + k) % known.size()];
    if (a != failed)
      return a;
  }
  return std::nullopt;
}

bool redis_client::cluster::on_own_thread() const {
  if (std::this_thread::get_id() == timer_thread_.get_id())
    return true;
  auto* me = internal::calling_client();
  if (!me)
    return false;
  std::lock_guard guard{nodes_mtx_};
  for (auto& [a, n] : nodes_)
    if (n->client->impl_.get() == me)
      return true;
  return false;
}

void redis_client::cluster::shutdown() {
  if (closed_.exchange(true))
    return;
  {
    std::lock_guard guard{timer_mtx_};
    stopping_ = true;
  }
  timer_cv_.notify_all();
  if (timer_thread_.joinable())
    timer_thread_.join();
  // A dispatch that passed its check before closed_ was set may still be
  // handing a command to a node: wait for it before freeing the nodes.
  while (dispatching_.load() != 0)
    std::this_thread::yield();
  std::map<std::string, std::unique_ptr<node>> nodes;
  {
    std::lock_guard guard{nodes_mtx_};
    nodes.swap(nodes_);
  }
  for (auto& s : slots_)
    s.store(nullptr, std::memory_order_release);
  // Each node's loops finish what is queued (callbacks see closed_ and
  // complete at once) before its client is gone.
  nodes.clear();
}

} // namespace botmesh
