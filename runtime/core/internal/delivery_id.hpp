#pragma once

// Internal: the id a delivery of an inbound message is known by.

#include <string>

#include <botmesh/runtime/core/internal/text.hpp>
#include <botmesh/runtime/core/message.hpp>

namespace botmesh::internal {

/// The platform's message id, and for an edit with an `edit_id`
/// `<id>~<edit id>`: an edit shares its original's id, and would be taken
/// for its redelivery. The duplicate checks (the bot's, a webhook's) and the
/// inbound journal (`journal_id(key, delivery_id(msg))`) key on it.
///
/// Joined by `join_escaped`: message "a~b" and message "a" edited as "b"
/// stay two deliveries (one would be dropped as the other's duplicate).
inline std::string delivery_id(const inbound_message& msg) {
  if (!msg.edited || msg.edit_id.empty())
    return join_escaped('~', {msg.id});
  return join_escaped('~', {msg.id, msg.edit_id});
}

} // namespace botmesh::internal
