#pragma once

// Internal: the id a delivery of an inbound message is known by.

#include <string>
#include <string_view>

#include <botmesh/runtime/core/message.hpp>

namespace botmesh::internal {

/// The platform's message id, and for an edit with an `edit_id`
/// `<id>~<edit id>`: an edit shares its original's id, and would be taken
/// for its redelivery. The duplicate checks (the bot's, a webhook's) and the
/// inbound journal (`journal_id(key, delivery_id(msg))`) key on it.
///
/// When the id or the edit id holds a '~' or a backslash (a custom
/// provider's), each of these in both is preceded by a backslash: message
/// "a~b" and message "a" edited as "b" stay two deliveries (one would be
/// dropped as the other's duplicate). Such a form holds a backslash, which
/// a plain one never does, so the two forms never meet either; the built-in
/// providers' ids keep the plain form.
inline std::string delivery_id(const inbound_message& msg) {
  bool edit = msg.edited && !msg.edit_id.empty();
  auto plain = [](std::string_view v) {
    return v.find_first_of("~\\") == std::string_view::npos;
  };
  if (plain(msg.id) && (!edit || plain(msg.edit_id))) {
    if (!edit)
      return msg.id;
    std::string out;
    out.reserve(msg.id.size() + 1 + msg.edit_id.size());
    out += msg.id;
    out += '~';
    out += msg.edit_id;
    return out;
  }
  std::string out;
  out.reserve(msg.id.size() + msg.edit_id.size() + 8);
  auto put = [&](std::string_view v) {
    for (char c : v) {
      if (c == '~' || c == '\\')
        out += '\\';
      out += c;
    }
  };
  put(msg.id);
  if (edit) {
    out += '~';
    put(msg.edit_id);
  }
  return out;
}

} // namespace botmesh::internal
