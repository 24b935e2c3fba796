#include <botmesh/runtime/internal/turn_keeper.hpp>

#include <vector>

#include <botmesh/runtime/core/error.hpp>

namespace botmesh::internal {

using steady = std::chrono::steady_clock;

turn_keeper::turn_keeper(coordinator& c, std::chrono::milliseconds settle,
                         lost_fn on_lost)
  : coord_(c),
    settle_(settle),
    on_lost_(std::move(on_lost)),
    last_renewal_(steady::now()) {
  thread_ = std::thread{[this] { loop(); }};
}

turn_keeper::~turn_keeper() {
  {
    std::lock_guard guard{mtx_};
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<held_turn>
turn_keeper::acquire(const std::string& key, std::chrono::milliseconds turn_wait,
                     std::chrono::milliseconds max_poll,
                     const std::stop_token& stop) {
  auto deadline = steady::now() + turn_wait;
  auto ticket = coord_.take_ticket(key);
  auto poll = std::chrono::milliseconds{5};
  for (;;) {
    if (auto t = coord_.try_acquire(key, ticket))
      return hold(std::move(*t));
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - steady::now());
    if (left <= std::chrono::milliseconds{0} || stop.stop_requested())
      break;
    coord_.wait_change(key, std::min(poll, left));
    poll = std::min(poll * 2, max_poll);
  }
  coord_.cancel_ticket(key, ticket);
  return nullptr;
}

std::shared_ptr<held_turn> turn_keeper::hold(botmesh::turn t) {
  auto h = std::make_shared<held_turn>();
  h->turn = std::move(t);
  h->started = steady::now();
  std::lock_guard guard{mtx_};
  held_[h->turn.key] = h;
  return h;
}

void turn_keeper::release(const std::shared_ptr<held_turn>& h) {
  bool do_release = false;
  {
    std::lock_guard guard{mtx_};
    auto i = held_.find(h->turn.key);
    if (i != held_.end() && i->second == h)
      held_.erase(i);
    do_release = !h->released;
    h->released = true;
  }
  if (do_release) {
    try {
      coord_.release(h->turn);
    } catch (const std::exception&) {
      std::lock_guard guard{mtx_};
      failed_releases_.push_back(h->turn);
    }
  }
}

void turn_keeper::check(held_turn& h) {
  std::lock_guard guard{mtx_};
  if (h.lost_reason.empty() && h.released)
    h.lost_reason = "expired";
  if (h.lost_reason.empty()
      && steady::now() - last_renewal_ >= coord_.lease() * 9 / 10)
    fence_locked(h, "frozen"); // renewals stalled: the lease may be gone
  if (!h.lost_reason.empty())
    throw lease_lost_error(h.turn.key, h.lost_reason);
}

void turn_keeper::fence_locked(held_turn& h, const std::string& reason) {
  if (!h.lost_reason.empty())
    return;
  h.lost_reason = reason;
  h.stop.request_stop();
  if (on_lost_)
    on_lost_(h.turn.key, reason);
}

void turn_keeper::loop() {
  std::unique_lock guard{mtx_};
  while (!stopping_) {
    cv_.wait_for(guard, coord_.lease() / 3);
    if (stopping_)
      break;
    std::vector<botmesh::turn> turns;
    std::vector<std::shared_ptr<held_turn>> settled;
    auto now = steady::now();
    for (auto& [key, h] : held_) {
      if (!h->lost_reason.empty())
        continue;
      if (now - h->started >= settle_) {
        // A step past settle: stop it, fence it, let the chat go on.
        fence_locked(*h, "settle");
        settled.push_back(h);
        continue;
      }
      turns.push_back(h->turn);
    }
    auto retry = std::move(failed_releases_);
    failed_releases_.clear();
    guard.unlock();
    for (auto& h : settled)
      release(h);
    for (auto& t : retry) {
      try {
        coord_.release(t); // false (already expired or taken) is fine too
      } catch (const std::exception&) {
        std::lock_guard again{mtx_};
        failed_releases_.push_back(t);
      }
    }
    std::vector<std::string> lost;
    bool ok = true;
    try {
      lost = coord_.renew(turns);
    } catch (const std::exception&) {
      ok = false;
    }
    guard.lock();
    if (ok) {
      last_renewal_ = steady::now();
      for (auto& key : lost)
        if (auto i = held_.find(key); i != held_.end())
          fence_locked(*i->second, "expired");
    } else if (steady::now() - last_renewal_ >= coord_.lease() * 9 / 10) {
      // Renewals failed for almost a lease: drop everything before the
      // backend's leases run out, so no write happens out of order.
      for (auto& [key, h] : held_)
        fence_locked(*h, "frozen");
    }
  }
}

} // namespace botmesh::internal
