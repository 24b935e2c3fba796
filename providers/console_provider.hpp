#pragma once

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
class console_provider final : public provider {
 public:
  struct options {
    /// File descriptor to read from; not closed by the provider.
    int input_fd = 0;
    /// Stream to write to; must outlive the provider. std::cout when null.
    std::ostream* out = nullptr;
    std::string chat = "console";
    std::string sender = "user";
  };

  console_provider();
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
