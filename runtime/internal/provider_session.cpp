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
  return !cv_.wait_for(guard, d, [this] { return stopping_; });
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
    auto closed = hooks_.closed_for();
    if (closed && *closed >= provider_down_) {
      // The transport stayed closed: yield so a standby can connect.
      auto l = *lead;
      step_down("provider_down");
      try {
        coord_.release_lead(l);
      } catch (const std::exception&) {
        // nop: it expires
      }
      if (!wait(std::max(coord_.lease(), std::chrono::milliseconds{3000})))
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
