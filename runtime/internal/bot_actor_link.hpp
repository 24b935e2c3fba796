#pragma once

// Internal: the bot's side of its actor (see bot_actor.hpp). The bot makes
// one link when it is constructed, forwards its events to it, and closes it
// before it goes away. Included by bot.cpp and bot_actor.cpp only.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <caf/actor.hpp>

#include <botmesh/providers/provider.hpp>
#include <botmesh/runtime/bot_actor.hpp>
#include <botmesh/runtime/events.hpp>

namespace botmesh::internal {

/// What the bot tells the actor about a message it delivered, besides the
/// code `delivery_callbacks::accepted` carries. Written on the thread that
/// then calls `accepted`, before the call.
struct receipt_note {
  /// The message's id in the bot (the given one until the bot says).
  std::string id;
  bool duplicate = false;
  /// Why it was refused (the text of the error event), when it was.
  std::string why;
};

/// The note of a delivery the bot's actor made (its `accepted` callback is
/// the actor's), or null for any other delivery (a provider's). The bot
/// fills it in right before it calls `accepted`.
receipt_note* receipt_of(delivery_callbacks& cb) noexcept;

class bot_actor_link {
 public:
  /// Spawns the bot's actor in `sys`; it delivers to `host` until `close()`.
  bot_actor_link(caf::actor_system& sys, provider_host& host);

  /// Closes (see `close`).
  ~bot_actor_link();

  bot_actor_link(const bot_actor_link&) = delete;
  bot_actor_link& operator=(const bot_actor_link&) = delete;

  bot_actor handle() const;

  // Forwarders: from any thread, without blocking. One atomic load when no
  // subscriber wants the topic; else a copy of the event sent to the actor,
  // which fans it out.
  void outgoing(const outgoing_message& msg);
  void error(errc code, const std::string& what, const std::string& key,
             const std::optional<inbound_message>& msg);
  void message_in(const std::string& key, const inbound_message& msg);
  void lease_lost(const events::lease_lost& ev);
  void leader(const events::leader& ev);
  void follower(const events::follower& ev);
  void handover(const events::handover& ev);

  /// The actor lets go of the host and exits: answers still pending get
  /// `errc::stopped`. Waits until it did (a blocking request: called from
  /// the bot's destructor, never from a CAF worker of the bot). Idempotent.
  void close();

 private:
  bool wanted(std::uint32_t topic) const noexcept {
    return (wanted_->load(std::memory_order_acquire) & topic) != 0;
  }

  caf::actor_system& sys_;
  caf::actor actor_;
  /// The union of the subscribers' topics, kept by the actor.
  std::shared_ptr<std::atomic<std::uint32_t>> wanted_;
  bool closed_ = false;
};

} // namespace botmesh::internal
