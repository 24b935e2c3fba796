#pragma once

// Flood control for platform APIs: token buckets per bot, per chat and per
// group, with the platforms' documented limits as defaults.

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <stop_token>
#include <string_view>

namespace botmesh::http {

/// Token-bucket limits. A rate of 0 disables that bucket.
struct flood_limits {
  /// All messages of the bot (Telegram: about 30 per second).
  double per_bot_per_second = 30;
  double per_bot_burst = 30;
  /// One chat (Telegram: one message per second, short bursts allowed).
  double per_chat_per_second = 1;
  double per_chat_burst = 3;
  /// One group chat (Telegram: 20 messages per minute).
  double per_group_per_minute = 20;
  double per_group_burst = 20;

  /// Telegram Bot API defaults (the values above).
  static flood_limits telegram() {
    return {};
  }

  /// WhatsApp Cloud API defaults: 80 messages per second per business
  /// phone number; to one user, about one message every 6 seconds with
  /// bursts up to 45 (Meta's "pair rate limit"). No groups.
  static flood_limits whatsapp() {
    return {80, 80, 1.0 / 6.0, 45, 0, 0};
  }

  /// No limits at all.
  static flood_limits none() {
    return {0, 0, 0, 0, 0, 0};
  }
};

/// Blocks senders until the buckets allow their message. Thread-safe.
///
/// Cost: one mutex and a hash lookup per message; a chat's bucket is kept
/// while it is not full again (idle buckets are dropped once more than
/// 10 000 chats are tracked), so memory follows the active chats.
class flood_control {
 public:
  explicit flood_control(flood_limits limits = {});
  ~flood_control();

  /// Waits until one message to `chat` may go (taking its tokens), or
  /// `stop` fires (then returns false without taking any). Returns at once
  /// when the buckets have tokens.
  bool acquire(std::string_view chat, bool group, std::stop_token stop = {});

  /// Takes one message's tokens if the buckets have them now; false (and
  /// nothing taken) when `acquire` would wait.
  bool try_acquire(std::string_view chat, bool group);

  /// How long `acquire` would wait now (for tests and metrics).
  std::chrono::milliseconds wait_time(std::string_view chat, bool group);

  /// The platform said to wait (a 429's retry_after): nothing goes to any
  /// chat before `d` from now. `d` is taken as at most a day (and a
  /// negative one as none), so no wait or clock sum can overflow.
  void pause(std::chrono::milliseconds d);

  /// The platform said to wait before sending to `chat` again (a limit per
  /// recipient, as WhatsApp's pair rate): nothing goes to that chat before
  /// `d` from now; other chats go on. `d` is bounded as for `pause`.
  void pause_chat(std::string_view chat, std::chrono::milliseconds d);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Sends through the flood control: waits for the buckets, runs `send`,
/// and when it throws a `platform_error` with `errc::retry_after` (a 429)
/// pauses every send (or, for an error of `scope::chat`, the sends to this
/// chat only) for the platform's retry_after and tries again, up to
/// `max_attempts` times in all (then the last error is thrown). Any other
/// exception goes through at once. It blocks the calling thread, which is
/// how a chat's order is kept: its next message waits for this one. A
/// wait for the buckets gives up when `stop` (the host's) or `cancel` (the
/// sending turn's end) fires, with `errc::stopped`. `send` gets a token
/// that fires then too: a request it makes with it as
/// `client_request::cancel_before_write` gives up until it is written.
void send_with_retry(flood_control& flood, std::string_view chat, bool group,
                     const std::function<void(std::stop_token)>& send,
                     std::stop_token stop = {}, std::stop_token cancel = {},
                     int max_attempts = 5);

} // namespace botmesh::http
