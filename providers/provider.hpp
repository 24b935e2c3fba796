#pragma once

#include <string>
#include <string_view>

#include <botmesh/runtime/core/message.hpp>

namespace botmesh {

/// What a provider's transport allows.
struct provider_capabilities {
  /// Only one connection may exist at a time (a WhatsApp Web session, Telegram
  /// long polling): with several replicas only the elected one starts it.
  bool exclusive_session = false;
};

/// The state of a provider's transport.
enum class provider_state { connecting, open, closed };

std::string_view to_string(provider_state s) noexcept;

/// The bot side of a provider: where a started provider delivers what it
/// receives. Every method is thread-safe and returns quickly (it never waits
/// for a handler), so a provider may call it from its own I/O threads.
class provider_host {
 public:
  virtual ~provider_host();

  /// Hands an inbound message to the bot. Invalid messages are refused with
  /// an `error` event naming the field; none is dropped silently.
  virtual void deliver(inbound_message msg) = 0;

  /// Reports a change of the transport's state.
  virtual void state_changed(provider_state state) = 0;

  /// The provider will deliver nothing more (its input ended, e.g. stdin
  /// closed). A bot waiting in `run()` then drains and returns.
  virtual void input_closed() = 0;
};

/// A transport to a chat platform.
///
/// Lifecycle: `start(host)` once, then `send` any number of times from any
/// thread, then `stop()`. `send` may block on I/O; the runtime calls it from
/// handler threads only.
class provider {
 public:
  virtual ~provider();

  /// A stable id, used in chat keys ("console", "telegram").
  virtual std::string id() const = 0;

  virtual provider_capabilities capabilities() const {
    return {};
  }

  virtual provider_state state() const = 0;

  /// Connects the transport and starts delivering to `host`, which stays
  /// valid until `stop()` returns.
  virtual void start(provider_host& host) = 0;

  /// Disconnects; after it returns nothing more is delivered.
  virtual void stop() = 0;

  /// Sends a message. Throws `botmesh::error` with `errc::provider_error`
  /// when the transport is closed or the platform refuses it.
  virtual void send(const outgoing_message& msg) = 0;
};

} // namespace botmesh
