#include <botmesh/actors/turn_token.hpp>

#include <limits>

#include <botmesh/runtime/core/error.hpp>

namespace botmesh {

std::string_view to_string(turn_end e) noexcept {
  switch (e) {
    case turn_end::holding:
      return "holding";
    case turn_end::expired:
      return "expired";
    case turn_end::frozen:
      return "frozen";
    case turn_end::settle:
      return "settle";
    case turn_end::released:
      return "released";
    case turn_end::stopped:
      return "stopped";
  }
  return "holding";
}

namespace {

std::int64_t ticks(turn_token::clock::time_point t) {
  return t.time_since_epoch().count();
}

} // namespace

turn_token::turn_token(std::string key, std::uint64_t fence, std::uint64_t req,
                       std::optional<std::string> previous_holder,
                       clock::time_point valid_until, time_source now)
  : key_(std::move(key)),
    fence_(fence),
    req_(req),
    previous_(std::move(previous_holder)),
    now_(std::move(now)),
    valid_until_(ticks(valid_until)),
    settle_at_(std::numeric_limits<std::int64_t>::max()) {
  // nop
}

void turn_token::step_started() const {
  if (on_step_start_)
    on_step_start_();
}

bool turn_token::valid() const noexcept {
  if (end_.load(std::memory_order_acquire) != 0)
    return false;
  auto t = ticks(now());
  return t < valid_until_.load(std::memory_order_acquire)
         && t < settle_at_.load(std::memory_order_acquire);
}

void turn_token::check() const {
  auto e = ended();
  if (e != turn_end::holding)
    throw lease_lost_error(key_, std::string{to_string(e)});
  auto t = ticks(now());
  if (t >= settle_at_.load(std::memory_order_acquire))
    throw lease_lost_error(key_, "settle");
  if (t >= valid_until_.load(std::memory_order_acquire))
    throw lease_lost_error(key_, "frozen");
}

void turn_token::extend(clock::time_point valid_until) noexcept {
  // Never backwards: a late reply to an older renewal must not shorten it.
  auto v = ticks(valid_until);
  auto cur = valid_until_.load(std::memory_order_relaxed);
  while (v > cur
         && !valid_until_.compare_exchange_weak(cur, v,
                                                std::memory_order_release))
    ; // retry
}

void turn_token::start(clock::time_point settle_at) noexcept {
  settle_at_.store(ticks(settle_at), std::memory_order_release);
}

bool turn_token::end(turn_end why) noexcept {
  std::uint8_t expected = 0;
  if (!end_.compare_exchange_strong(expected, static_cast<std::uint8_t>(why),
                                    std::memory_order_acq_rel))
    return false;
  stop_.request_stop();
  ended_.request_stop();
  return true;
}

} // namespace botmesh
