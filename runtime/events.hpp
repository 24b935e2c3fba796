#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/message.hpp>

/// Events a bot raises; subscribe with `bot::on<botmesh::events::X>(fn)`.
/// Listeners run synchronously on the thread that raises the event (a handler
/// thread or a CAF worker): keep them short, thread-safe and non-blocking.
/// An exception thrown by a listener is caught and written to stderr.
namespace botmesh::events {

/// Something went wrong with a message or the runtime ("error").
struct error {
  errc code = errc::none;
  /// Full text, naming what was wrong.
  std::string what;
  /// The chat key, when the error concerns one chat.
  std::string key;
  /// The message concerned, when there is one (refused, failed handler...).
  std::optional<inbound_message> message;
};

/// A message starts its turn ("message:in"), in chat order.
struct message_in {
  const std::string& key;
  const inbound_message& message;
};

/// This replica lost a chat's turn ("coordination:lease-lost"): reason
/// "expired" (taken over or not renewed), "frozen" (renewals failed for
/// almost a lease) or "settle" (a step ran past `settle`). Later sends and
/// checkpoint writes of that turn fail with `lease_lost`; the chat's
/// in-memory conversation is discarded (its checkpoint stays).
struct lease_lost {
  std::string key;
  std::string reason;
};

/// This replica leads an exclusive transport and started it
/// ("coordination:leader").
struct leader {
  std::string name;
  std::uint64_t fence = 0;
};

/// This replica stands by for an exclusive transport
/// ("coordination:follower"): reason "standby" (another replica leads),
/// "lost" (the leadership was lost), "provider_down" (it yielded after its
/// transport stayed closed), or the reason the transport gave when it asked
/// to yield because another connection is live (Telegram long polling:
/// "conflict", its 409).
struct follower {
  std::string name;
  std::string reason;
};

/// A conversation met the replica that took its chat
/// ("coordination:handover"). `name` is the flow (or conversation) name.
/// `outcome`: "resumed" (from its checkpoint), "notified", "restarted",
/// "handled" (the fallback function consumed the message) or "dropped"
/// (the message is routed as usual). `reason` is empty when resumed, else
/// "conversation" (a coroutine conversation, which is never migrated),
/// "state" (its state was not plain JSON) or "changed" (the flow differs
/// from the one that wrote the checkpoint).
struct handover {
  std::string key;
  std::string name;
  std::string outcome;
  std::string reason;
};

/// A message was sent by the provider ("message:out").
struct message_out {
  const outgoing_message& message;
};

} // namespace botmesh::events
