#pragma once

// Internal: the id a delivery of an inbound message is known by.

#include <string>

#include <botmesh/runtime/core/message.hpp>

namespace botmesh::internal {

/// The platform's message id, and for an edit with an `edit_id`
/// `<id>~<edit id>`: an edit shares its original's id, and would be taken
/// for its redelivery. The duplicate checks (the bot's, a webhook's) and the
/// inbound journal (`journal_id(key, delivery_id(msg))`) key on it.
inline std::string delivery_id(const inbound_message& msg) {
  if (!msg.edited || msg.edit_id.empty())
    return msg.id;
  std::string out;
  out.reserve(msg.id.size() + 1 + msg.edit_id.size());
  out += msg.id;
  out += '~';
  out += msg.edit_id;
  return out;
}

} // namespace botmesh::internal
