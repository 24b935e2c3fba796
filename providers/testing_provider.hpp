#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <botmesh/providers/provider.hpp>

namespace botmesh {

/// A provider for tests: inject inbound messages from any thread, capture
/// what the bot sends, and simulate a closed transport or failing sends.
class testing_provider final : public provider {
 public:
  struct options {
    std::string id = "test";
    /// What `connection_id()` returns.
    std::string connection_id{};
    provider_capabilities capabilities{};
    /// Called first in every `start` / `stop` (on its thread): a test can
    /// slow them down or record when they run.
    std::function<void()> on_start{};
    std::function<void()> on_stop{};
    /// Sends succeed while the transport is closed, as on a platform whose
    /// send is a plain API call (Telegram's Bot API while getUpdates is
    /// stopped).
    bool sends_while_closed = false;
  };

  testing_provider();
  explicit testing_provider(options opts);
  ~testing_provider() override;

  std::string id() const override;
  std::string connection_id() const override;
  provider_capabilities capabilities() const override;
  provider_state state() const override;
  void start(provider_host& host) override;
  void stop() override;
  /// Records the message; throws `errc::provider_error` when the transport
  /// is closed (unless `sends_while_closed`) or `fail_sends(true)` was
  /// called.
  void send(const outgoing_message& msg) override;

  /// Delivers `msg` to the bot as if the platform had sent it; fills
  /// `provider` when empty. Throws `errc::provider_error` when not started.
  void inject(inbound_message msg);

  /// Same, with delivery notices (see `delivery_callbacks`).
  void inject(inbound_message msg, delivery_callbacks callbacks);

  /// Asks the host to yield the leadership as a transport that saw another
  /// live connection would; returns the host's answer.
  bool ask_to_yield(std::string_view reason);

  /// Shorthand: a text message in a one-to-one chat.
  void inject(std::string chat, std::string text);

  /// Simulates the transport closing (or reopening).
  void set_state(provider_state s);

  /// Makes every later `send` fail with `code` (or succeed again): a
  /// `provider_error`, or a `timeout` as an HTTP client's.
  void fail_sends(bool on, errc code = errc::provider_error);

  /// Simulates the end of input (like stdin closing).
  void close_input();

  /// Everything sent so far, in send order.
  std::vector<outgoing_message> sent() const;

  /// Messages sent to one chat, in send order.
  std::vector<outgoing_message> sent_to(const std::string& chat) const;

  /// Waits until at least `n` messages were sent; false on timeout.
  bool wait_for_sent(std::size_t n, std::chrono::milliseconds timeout) const;

  /// Number of `start` calls so far.
  std::size_t starts() const;

 private:
  void hand_over(inbound_message& msg, delivery_callbacks& callbacks);

  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace botmesh
