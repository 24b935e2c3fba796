#include <botmesh/runtime/internal/provider_session.hpp>

namespace botmesh::internal {

using steady = std::chrono::steady_clock;

provider_session::provider_session(coordinator& c, std::string name,
                                   std::chrono::milliseconds provider_down,
                                   hooks h)
  : coord_(c),
    name_(std::move(name)),
    provider_down_(provider_down),
    hooks_(std::move(h)) {
  thread_ = std::thread{[this] { loop(); }};
}

provider_session::~provider_session() {
  {
    std::lock_guard guard{mtx_};
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool provider_session::wait(std::chrono::milliseconds d) {
  std::unique_lock guard{mtx_};
  cv_.wait_for(guard, d, [this] { return stopping_ || !yield_reason_.empty(); });
  return !stopping_;
}

bool provider_session::wait_out(std::chrono::milliseconds d) {
  // Yields asked for while standing down change nothing.
  std::unique_lock guard{mtx_};
  auto stopped = cv_.wait_for(guard, d, [this] { return stopping_; });
  yield_reason_.clear();
  return !stopped;
}

void provider_session::yield(std::string reason) {
  if (reason.empty())
    reason = "yielded";
  {
    std::lock_guard guard{mtx_};
    yield_reason_ = std::move(reason);
  }
  cv_.notify_all();
}

void provider_session::loop() {
  auto period = coord_.lease() / 3;
  bool said_standby = false;
  std::optional<leadership> lead;
  steady::time_point valid_until{};
  auto step_down = [&](const char* reason) {
    leading_ = false;
    hooks_.stop_transport();
    lead.reset();
    hooks_.on_follower(name_, reason);
  };
  do {
    std::optional<leadership> now_lead;
    try {
      now_lead = coord_.try_lead(name_);
    } catch (const std::exception&) {
      // Backend down: a leader keeps running while its lease may still hold.
      if (lead && steady::now() < valid_until)
        now_lead = lead;
    }
    if (!now_lead) {
      {
        std::lock_guard guard{mtx_};
        yield_reason_.clear(); // a standby has nothing to yield
      }
      if (lead) {
        step_down("lost");
        said_standby = true;
      } else if (!said_standby) {
        hooks_.on_follower(name_, "standby");
        said_standby = true;
      }
      continue;
    }
    valid_until = steady::now() + coord_.lease() * 9 / 10;
    if (!lead) {
      lead = now_lead;
      // Elected first, then started: the transport's "open" notification
      // must find this replica leading, or bot::ready() would miss it.
      leading_ = true;
      hooks_.start_transport();
      said_standby = false;
      hooks_.on_leader(name_, lead->fence);
    }
    std::string yield_reason;
    {
      std::lock_guard guard{mtx_};
      yield_reason.swap(yield_reason_);
    }
    auto closed = hooks_.closed_for();
    if (!yield_reason.empty() || (closed && *closed >= provider_down_)) {
      // The transport stayed closed, or says another connection is live:
      // yield so a standby (or that other connection) can have it.
      auto l = *lead;
      step_down(yield_reason.empty() ? "provider_down" : yield_reason.c_str());
      try {
        coord_.release_lead(l);
      } catch (const std::exception&) {
        // nop: it expires
      }
      if (!wait_out(std::max(coord_.lease(), std::chrono::milliseconds{3000})))
        break;
    }
  } while (wait(period));
  if (lead) {
    leading_ = false;
    try {
      coord_.release_lead(*lead);
    } catch (const std::exception&) {
      // nop: it expires
    }
  }
}

} // namespace botmesh::internal
