#include <botmesh/providers/http/flood_control.hpp>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <string>
#include <unordered_map>

#include <fmt/format.h>

#include <botmesh/providers/internal/joined_stop.hpp>
#include <botmesh/runtime/core/error.hpp>

namespace botmesh::http {

using steady = std::chrono::steady_clock;

namespace {

struct bucket {
  double tokens = 0;
  steady::time_point at{};
  steady::time_point paused_until{}; // pause_chat

  // Refills at `rate` per second up to `cap`; the wait for one token.
  steady::duration refill(double rate, double cap, steady::time_point now) {
    if (rate <= 0)
      return steady::duration::zero();
    if (at == steady::time_point{}) {
      tokens = cap;
      at = now;
    }
    auto secs = std::chrono::duration<double>(now - at).count();
    tokens = std::min(cap, tokens + secs * rate);
    at = now;
    if (tokens >= 1)
      return steady::duration::zero();
    return std::chrono::duration_cast<steady::duration>(
      std::chrono::duration<double>((1 - tokens) / rate));
  }

  bool full(double rate, double cap, steady::time_point now) const {
    if (paused_until > now)
      return false; // the pause is state to keep
    auto secs = std::chrono::duration<double>(now - at).count();
    return rate <= 0 || tokens + secs * rate >= cap;
  }
};

} // namespace

struct flood_control::impl {
  flood_limits lim;
  std::mutex mtx;
  std::condition_variable cv;
  bucket global;
  std::unordered_map<std::string, bucket> chats;
  steady::time_point paused_until{};

  double chat_rate(bool group) const {
    return group ? lim.per_group_per_minute / 60.0 : lim.per_chat_per_second;
  }

  double chat_cap(bool group) const {
    return std::max(1.0, group ? lim.per_group_burst : lim.per_chat_burst);
  }

  // Under mtx: how long until a message may go; zero when it may now.
  steady::duration wait_locked(bucket& b, bool group, steady::time_point now) {
    auto w = std::max(global.refill(lim.per_bot_per_second,
                                    std::max(1.0, lim.per_bot_burst), now),
                      b.refill(chat_rate(group), chat_cap(group), now));
    if (paused_until > now)
      w = std::max(w, paused_until - now);
    if (b.paused_until > now)
      w = std::max(w, b.paused_until - now);
    return w;
  }

  // Under mtx: takes one message's tokens if it may go now; otherwise
  // takes nothing and returns how long until it may.
  steady::duration take_locked(std::string_view chat, bool group,
                               steady::time_point now) {
    auto& b = chats[std::string{chat}];
    auto w = wait_locked(b, group, now);
    if (w != steady::duration::zero())
      return w;
    if (lim.per_bot_per_second > 0)
      global.tokens -= 1;
    if (chat_rate(group) > 0)
      b.tokens -= 1;
    prune(now);
    return w;
  }

  // Amortized: a sweep runs once the map doubled since the last one left
  // it, so with many chats still refilling each send does not walk them all.
  void prune(steady::time_point now) {
    // Also once a minute: after a burst the map would keep its stale
    // buckets until it doubled again.
    if (chats.size() <= 10000
        || (chats.size() <= prune_at && now - pruned < std::chrono::minutes(1)))
      return;
    pruned = now;
    for (auto i = chats.begin(); i != chats.end();) {
      // Groups and chats share the map; a full bucket holds no state.
      if (i->second.full(lim.per_chat_per_second, chat_cap(false), now)
          && i->second.full(lim.per_group_per_minute / 60.0, chat_cap(true), now))
        i = chats.erase(i);
      else
        ++i;
    }
    prune_at = std::max<std::size_t>(10000, 2 * chats.size());
  }
  std::size_t prune_at = 10000;
  steady::time_point pruned{};
};

flood_control::flood_control(flood_limits limits)
  : impl_(std::make_unique<impl>()) {
  impl_->lim = limits;
}

flood_control::~flood_control() {
  // nop
}

bool flood_control::acquire(std::string_view chat, bool group,
                            std::stop_token stop) {
  auto& i = *impl_;
  std::stop_callback wake{stop, [&i] {
                            std::lock_guard g{i.mtx};
                            i.cv.notify_all();
                          }};
  std::unique_lock guard{i.mtx};
  for (;;) {
    if (stop.stop_requested())
      return false;
    auto w = i.take_locked(chat, group, steady::now());
    if (w == steady::duration::zero())
      return true;
    i.cv.wait_for(guard, w);
  }
}

bool flood_control::try_acquire(std::string_view chat, bool group) {
  auto& i = *impl_;
  std::lock_guard guard{i.mtx};
  return i.take_locked(chat, group, steady::now()) == steady::duration::zero();
}

std::chrono::milliseconds flood_control::wait_time(std::string_view chat,
                                                   bool group) {
  auto& i = *impl_;
  std::lock_guard guard{i.mtx};
  auto& b = i.chats[std::string{chat}];
  auto w = i.wait_locked(b, group, steady::now());
  return std::chrono::ceil<std::chrono::milliseconds>(w);
}

namespace {

// At most a day, and a negative wait is none: no sum with now can overflow.
std::chrono::milliseconds bounded_pause(std::chrono::milliseconds d) {
  return std::clamp<std::chrono::milliseconds>(d, std::chrono::milliseconds{0},
                                               std::chrono::hours{24});
}

} // namespace

void flood_control::pause(std::chrono::milliseconds d) {
  auto& i = *impl_;
  d = bounded_pause(d);
  std::lock_guard guard{i.mtx};
  i.paused_until = std::max(i.paused_until, steady::now() + d);
}

void flood_control::pause_chat(std::string_view chat,
                               std::chrono::milliseconds d) {
  auto& i = *impl_;
  d = bounded_pause(d);
  std::lock_guard guard{i.mtx};
  auto& b = i.chats[std::string{chat}];
  b.paused_until = std::max(b.paused_until, steady::now() + d);
}

void send_with_retry(flood_control& flood, std::string_view chat, bool group,
                     const std::function<void(std::stop_token)>& send,
                     std::stop_token stop, std::stop_token cancel,
                     int max_attempts) {
  // One token for the waits: either stop ends them.
  botmesh::internal::joined_stop either{stop, cancel};
  for (int attempt = 1;; ++attempt) {
    if (!flood.acquire(chat, group, either.token()))
      throw error(errc::stopped,
                  fmt::format("send to {}: {} while waiting for the flood "
                              "control",
                              chat,
                              cancel.stop_requested() ? "its turn ended"
                                                      : "stopped"));
    try {
      send(either.token());
      return;
    } catch (const platform_error& e) {
      if (e.code() != errc::retry_after)
        throw;
      // The platform's wait holds for every later send, the last attempt's
      // too: ignored, the next send would go at once (and a platform may
      // lengthen the wait of a client that ignores it).
      if (e.wait_scope() == platform_error::scope::chat)
        flood.pause_chat(chat, e.retry_after());
      else
        flood.pause(e.retry_after());
      if (attempt >= max_attempts)
        throw;
    }
  }
}

} // namespace botmesh::http
