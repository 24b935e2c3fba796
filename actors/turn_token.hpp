#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>

namespace botmesh {

/// Why a turn stopped holding.
enum class turn_end : std::uint8_t {
  holding = 0,
  /// The backend says the turn is gone (its lease ran out, or another
  /// replica took the chat over).
  expired,
  /// Renewals failed for almost the whole lease (a freeze, a network cut):
  /// dropped before the backend expires it.
  frozen,
  /// The step held the turn past `settle`.
  settle,
  /// The turn was released (the step is over).
  released,
  /// The bot stopped.
  stopped,
};

std::string_view to_string(turn_end e) noexcept;

/// A granted turn as the code running it sees it: the check before every
/// visible effect of a step (a send, a checkpoint write or clear, a user
/// data write), readable from any thread without a lock.
///
/// One writer, the replica's lease actor, moves it forward (`extend` after
/// each renewal, `end` once); handler threads only read. A turn is valid
/// while it has not ended, the clock is before `valid_until` (computed from
/// when the request that granted or renewed it *left*, minus a margin, so a
/// replica frozen past its lease finds its turn invalid the moment it
/// resumes, before any renewal could run), and before its settle bound once
/// the step started.
///
/// Cost: `check` is two atomic loads and a clock read.
class turn_token {
 public:
  using clock = std::chrono::steady_clock;
  using time_source = std::function<clock::time_point()>;

  turn_token(std::string key, std::uint64_t fence, std::uint64_t req,
             std::optional<std::string> previous_holder,
             clock::time_point valid_until, time_source now = {});

  const std::string& key() const noexcept {
    return key_;
  }

  /// Identifies the turn together with the key.
  std::uint64_t fence() const noexcept {
    return fence_;
  }

  /// The request (message or timer) it was granted for.
  std::uint64_t req() const noexcept {
    return req_;
  }

  /// The replica that held the chat before; nothing when unknown.
  const std::optional<std::string>& previous_holder() const noexcept {
    return previous_;
  }

  /// How the turn ended; `holding` while it has not (a time bound passed
  /// without the lease actor noticing yet still reads `holding`: use
  /// `valid`).
  turn_end ended() const noexcept {
    return static_cast<turn_end>(end_.load(std::memory_order_acquire));
  }

  /// True while every effect of the step may still be made visible.
  bool valid() const noexcept;

  /// Throws `lease_lost_error` (key, reason) unless `valid()`. The reason
  /// is the end's name; a lease that ran out unnoticed reads "frozen", a
  /// settle bound passed "settle".
  void check() const;

  /// What the previous holder handed over with the release that granted
  /// this turn (`turn_state::handed`), or empty.
  const std::string& handed() const noexcept {
    return handed_;
  }

  /// Called by whoever runs the step, on its thread, before the turn is
  /// reported done: what to hand to the next holder with the release
  /// (empty: nothing). The chat actor takes it once the step's thread told
  /// it the turn is done (that message orders the write before the read).
  void hand_over(std::string what) const {
    handoff_ = std::move(what);
  }

  /// The chat actor's side of `hand_over`.
  std::string take_handoff() const noexcept {
    return std::move(handoff_);
  }

  /// Called by whoever runs the step, on its thread, before the turn is
  /// reported done, when the turn changed nothing of the chat (a timer
  /// that found its conversation gone: this replica's copy was stale). The
  /// turn is then given up as a grant that never ran (coordinator::leave)
  /// instead of released: the chat's last holder stays the one before it,
  /// so the replica holding the live conversation, granted next, does not
  /// take itself for replaced and drop it. Nothing is handed over.
  void changed_nothing() const noexcept {
    untouched_ = true;
  }

  /// The chat actor's side of `changed_nothing`.
  bool untouched() const noexcept {
    return untouched_;
  }

  /// Fires when the turn ends (settle, loss, bot stop).
  std::stop_token stop_token() const noexcept {
    return stop_.get_token();
  }

  /// Fires only when the turn ends (settle, loss, release), not when the
  /// bot stops: what waits to send gives up on it, while a graceful stop
  /// lets a reply that waits for the flood control still go out.
  std::stop_token ended_token() const noexcept {
    return ended_.get_token();
  }

  /// Called by whoever runs the step, on its thread, when the step begins
  /// running (not when it is queued for a thread): `settle` counts from
  /// here, so a step that waited for a free handler thread is not cut
  /// before it ran. Call it once per turn.
  void step_started() const;

  // -- the lease actor's side ------------------------------------------------

  /// A renewal extended the lease.
  void extend(clock::time_point valid_until) noexcept;

  /// The step started: it must be over by `settle_at`.
  void start(clock::time_point settle_at) noexcept;

  /// What `step_started` does (tells the lease actor); set before the token
  /// is handed out.
  void on_step_start(std::function<void()> fn) {
    on_step_start_ = std::move(fn);
  }

  /// Sets `handed()`; before the token is handed out.
  void set_handed(std::string what) {
    handed_ = std::move(what);
  }

  /// Ends the turn once (later calls do nothing) and fires the stop token.
  /// Returns false when it had ended already.
  bool end(turn_end why) noexcept;

  /// Fires the stop token without ending the turn (the bot stops: the step
  /// should give up, but what it writes meanwhile still counts).
  void request_stop() noexcept {
    stop_.request_stop();
  }

 private:
  clock::time_point now() const {
    return now_ ? now_() : clock::now();
  }

  std::string key_;
  std::uint64_t fence_;
  std::uint64_t req_;
  std::optional<std::string> previous_;
  time_source now_;
  std::function<void()> on_step_start_;
  std::string handed_;
  mutable std::string handoff_;
  mutable bool untouched_ = false;
  std::atomic<std::int64_t> valid_until_;
  std::atomic<std::int64_t> settle_at_;
  std::atomic<std::uint8_t> end_{0};
  std::stop_source stop_;
  std::stop_source ended_;
};

} // namespace botmesh
