#pragma once

#include <cstddef>
#include <iosfwd>
#include <memory>
#include <string>

#include <botmesh/providers/provider.hpp>

namespace botmesh {

/// A provider for one conversation on a terminal: each line read from a file
/// descriptor (stdin by default) is an inbound message of chat `chat`, and
/// what the bot sends is written to `out`, one message per line.
///
/// When the input ends (EOF), it reports `input_closed()`, so `bot::run()`
/// finishes what is in flight and returns: `printf 'hola\n' | demo` works.
/// Blank lines are ignored; a trailing '\r' is stripped.
///
/// Backpressure: at most `max_in_flight` lines are delivered whose turns have
/// not ended yet; the reader thread waits for turn-end notices (see
/// `delivery_callbacks`) before reading more, so a pipe of any length is
/// answered line by line instead of overflowing the chat's queue
/// (`errc::overloaded`). Once the bot refuses a line because it is stopping
/// (`errc::stopped`), the reader reads nothing more. `stop()` interrupts the
/// reader at once, whether it waits for input or for turns to end.
class console_provider final : public provider {
 public:
  struct options {
    /// File descriptor to read from; not closed by the provider.
    int input_fd = 0;
    /// Stream to write to; must outlive the provider. std::cout when null.
    std::ostream* out = nullptr;
    std::string chat = "console";
    std::string sender = "user";
    /// Most lines delivered and not yet finished (their turn handled, failed
    /// or refused). Keep it below the bot's `max_pending_per_chat` (1000 by
    /// default), or a fast pipe can still fill the chat's queue.
    std::size_t max_in_flight = 256;
  };

  console_provider();
  /// Throws `invalid_argument_error` ("max_in_flight") when it is 0 and
  /// ("input_fd") when it is negative.
  explicit console_provider(options opts);
  ~console_provider() override;

  std::string id() const override;
  provider_state state() const override;
  void start(provider_host& host) override;
  void stop() override;
  void send(const outgoing_message& msg) override;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace botmesh
