#include <botmesh/stores/redis/redis_coordinator.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/store.hpp>
#include <botmesh/stores/redis/internal/scripts.hpp>

namespace botmesh {

namespace {

using kind = redis_reply::kind;

time_point server_ms(std::int64_t ms) {
  return from_unix_ms(ms);
}

} // namespace

struct redis_coordinator::impl : std::enable_shared_from_this<impl> {
  std::shared_ptr<redis_client> client;
  std::shared_ptr<const redis_layout> layout;
  std::string replica;
  std::string incarnation;
  std::chrono::milliseconds lease;
  std::atomic<bool> crashed{false};

  // Wake-ups: a generation per chat key, bumped by the subscriber. The
  // subscriber's callback owns only this, never the coordinator: otherwise
  // it could end up destroying the client (and joining itself) on its own
  // thread.
  struct wake_state {
    std::mutex mtx;
    std::condition_variable cv;
    std::unordered_map<std::string, std::uint64_t> generations;
  };
  std::shared_ptr<wake_state> wake = std::make_shared<wake_state>();

  void check_alive() const {
    if (crashed)
      throw coordination_unavailable_error(
        fmt::format("replica {} crashed (simulated)", replica));
  }

  // Runs a script; Redis failures become coordination_unavailable.
  redis_reply eval(const redis_script& s, const std::vector<std::string>& keys,
                   const std::vector<std::string>& args) {
    check_alive();
    try {
      return client->eval(s, keys, args);
    } catch (const error& e) {
      throw coordination_unavailable_error(
        fmt::format("coordinator {}: {}", replica, e.what()));
    }
  }

  // Synchronous, so no other replica can see a ticket of ours before our
  // heartbeat (and skip it as dead). Skipped while the last one is fresh.
  void heartbeat(bool force = false) {
    auto now = std::chrono::steady_clock::now();
    if (!force && now - last_heartbeat.load() < lease / 3)
      return;
    try {
      client->call({"SET", layout->heartbeat(incarnation), replica, "PX",
                    std::to_string(lease.count())});
      last_heartbeat = now;
    } catch (const error& e) {
      throw coordination_unavailable_error(
        fmt::format("coordinator {}: heartbeat failed: {}", replica, e.what()));
    }
  }

  std::atomic<std::chrono::steady_clock::time_point> last_heartbeat{};

  bool alive(const std::string& other) {
    try {
      auto r = client->call({"EXISTS", layout->heartbeat(other)});
      return r.integer == 1;
    } catch (const error& e) {
      throw coordination_unavailable_error(
        fmt::format("coordinator {}: checking a heartbeat: {}", replica,
                    e.what()));
    }
  }

  std::vector<std::string> turn_keys(std::string_view key,
                                     std::initializer_list<const char*> parts) {
    std::vector<std::string> out;
    for (auto p : parts)
      out.push_back(layout->turn(key, p));
    return out;
  }
};

redis_coordinator::redis_coordinator(redis_coordinator_options opts)
  : impl_(std::make_shared<impl>()) {
  if (opts.lease.count() <= 0)
    throw invalid_argument_error("lease", "the coordinator lease must be "
                                          "positive");
  impl_->layout = make_legacy_layout(opts.prefix);
  impl_->client = opts.client ? opts.client
                              : std::make_shared<redis_client>(
                                  redis_options{.url = opts.url});
  impl_->replica = opts.replica_id.empty() ? detail::random_uuid() : opts.replica_id;
  impl_->incarnation = detail::random_uuid();
  impl_->lease = opts.lease.ms();
  impl_->client->subscribe(impl_->layout->wake_channel(),
                           [w = impl_->wake](std::string_view key) {
                             std::lock_guard guard{w->mtx};
                             ++w->generations[std::string{key}];
                             w->cv.notify_all();
                           });
  impl_->heartbeat(true);
}

redis_coordinator::~redis_coordinator() = default;

void redis_coordinator::crash() {
  impl_->crashed = true;
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

std::uint64_t redis_coordinator::take_ticket(std::string_view key) {
  impl_->check_alive();
  impl_->heartbeat();
  auto r = impl_->eval(internal::lua().co_ticket,
                       impl_->turn_keys(key, {"seq", "tix"}),
                       {impl_->incarnation});
  expect_reply("script co_ticket", r, kind::integer);
  return static_cast<std::uint64_t>(r.integer);
}

std::optional<turn> redis_coordinator::try_acquire(std::string_view key,
                                                   std::uint64_t ticket) {
  impl_->check_alive();
  impl_->heartbeat();
  auto& s = internal::lua();
  // At most one skip per call: a dead blocker found, skipped, then one retry.
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto r = impl_->eval(s.co_acquire,
                         impl_->turn_keys(key, {"seq", "tix", "serving",
                                                "owner", "last"}),
                         {impl_->incarnation, impl_->replica,
                          std::to_string(ticket),
                          std::to_string(impl_->lease.count())});
    expect_reply("script co_acquire", r, kind::array);
    if (r.elements.empty() || r.elements[0].type != kind::integer)
      throw coordination_unavailable_error("script co_acquire: malformed reply");
    auto status = r.elements[0].integer;
    if (status == -1)
      throw coordination_unavailable_error(
        fmt::format("chat {}: ticket {} is no longer in the queue (skipped as "
                    "dead or given up)",
                    key, ticket));
    if (status == 1) {
      turn t;
      t.key = std::string{key};
      t.ticket = ticket;
      t.fence = static_cast<std::uint64_t>(r.elements.at(1).integer);
      if (!r.elements.at(2).str.empty())
        t.previous_holder = r.elements[2].str;
      t.deadline = server_ms(r.elements.at(3).integer);
      return t;
    }
    // Blocked. The script cannot read another replica's heartbeat (another
    // slot in a cluster): look it up here and skip a dead blocker.
    auto blocker = r.elements.size() > 1 ? r.elements[1].str : std::string{};
    if (blocker.empty() || blocker == impl_->incarnation || impl_->alive(blocker))
      return std::nullopt;
    impl_->eval(s.co_skip,
                impl_->turn_keys(key, {"tix", "serving", "owner", "last"}),
                {blocker, impl_->layout->wake_channel(), std::string{key}});
  }
  return std::nullopt;
}

std::vector<std::string>
redis_coordinator::renew(const std::vector<turn>& held) {
  impl_->check_alive();
  // One batch: the heartbeat and every held turn, pipelined on one
  // connection (EVALSHA; a NOSCRIPT reply is retried with EVAL).
  auto& script = internal::lua().co_renew;
  std::vector<redis_client::command> cmds;
  cmds.push_back({"SET", impl_->layout->heartbeat(impl_->incarnation),
                  impl_->replica, "PX", std::to_string(impl_->lease.count())});
  auto renew_cmd = [&](const turn& t, const std::string& verb,
                       const std::string& code) {
    return redis_client::command{verb,
                                 code,
                                 "1",
                                 impl_->layout->turn(t.key, "owner"),
                                 impl_->incarnation,
                                 std::to_string(t.fence),
                                 std::to_string(impl_->lease.count())};
  };
  for (auto& t : held)
    cmds.push_back(renew_cmd(t, "EVALSHA", script.sha()));
  std::vector<redis_reply> replies;
  try {
    replies = impl_->client->pipeline(std::move(cmds));
  } catch (const error& e) {
    throw coordination_unavailable_error(
      fmt::format("coordinator {}: renewal failed: {}", impl_->replica,
                  e.what()));
  }
  if (replies[0].type == kind::error)
    throw coordination_unavailable_error(
      fmt::format("coordinator {}: heartbeat failed: {}", impl_->replica,
                  replies[0].str));
  impl_->last_heartbeat = std::chrono::steady_clock::now();
  std::vector<std::string> lost;
  for (size_t i = 0; i < held.size(); ++i) {
    auto r = replies[i + 1];
    if (r.type == kind::error && r.str.starts_with("NOSCRIPT"))
      r = impl_->client->call_raw(renew_cmd(held[i], "EVAL", script.body()));
    expect_reply("script co_renew", r, kind::integer);
    if (r.integer == 0)
      lost.push_back(held[i].key);
  }
  return lost;
}

bool redis_coordinator::release(const turn& t) {
  auto r = impl_->eval(internal::lua().co_release,
                       impl_->turn_keys(t.key, {"owner", "serving", "last"}),
                       {impl_->incarnation, std::to_string(t.fence),
                        impl_->layout->wake_channel(), t.key});
  expect_reply("script co_release", r, kind::integer);
  return r.integer == 1;
}

void redis_coordinator::cancel_ticket(std::string_view key,
                                      std::uint64_t ticket) {
  impl_->eval(internal::lua().co_cancel, impl_->turn_keys(key, {"tix"}),
              {impl_->incarnation, std::to_string(ticket),
               impl_->layout->wake_channel(), std::string{key}});
}

std::optional<leadership> redis_coordinator::try_lead(std::string_view name) {
  impl_->check_alive();
  impl_->heartbeat();
  auto r = impl_->eval(internal::lua().co_lead,
                       {impl_->layout->lead(name), impl_->layout->lead_term(name)},
                       {impl_->incarnation, std::to_string(impl_->lease.count())});
  if (r.is_nil())
    return std::nullopt;
  expect_reply("script co_lead", r, kind::array);
  leadership l;
  l.name = std::string{name};
  l.fence = static_cast<std::uint64_t>(r.elements.at(0).integer);
  l.deadline = clock::system().now() + impl_->lease;
  return l;
}

void redis_coordinator::release_lead(const leadership& l) {
  impl_->eval(internal::lua().co_unlead,
              {impl_->layout->lead(l.name), impl_->layout->lead_term(l.name)},
              {impl_->incarnation, std::to_string(l.fence)});
}

void redis_coordinator::wait_change(std::string_view key,
                                    std::chrono::milliseconds timeout) {
  impl_->check_alive();
  auto& w = *impl_->wake;
  std::unique_lock guard{w.mtx};
  auto k = std::string{key};
  auto seen = w.generations[k];
  w.cv.wait_for(guard, timeout, [&] { return w.generations[k] != seen; });
}

} // namespace botmesh
