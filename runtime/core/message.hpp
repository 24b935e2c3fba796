#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <caf/meta/type_name.hpp>

#include <type_traits>

#include <botmesh/runtime/core/clock.hpp>

namespace botmesh {

/// What kind of content an inbound message carries.
enum class message_type : std::uint8_t {
  text,
  image,
  audio,
  video,
  document,
  location,
  contact,
  sticker,
  reaction,
  button,
  other,
};

/// Stable lower-case name of a type ("text", "image"...).
std::string_view to_string(message_type t) noexcept;

/// Parses a name written by `to_string`; throws `invalid_argument_error`
/// (field "type") for anything else.
message_type parse_message_type(std::string_view name);

/// A message received from a provider.
struct inbound_message {
  /// Provider-assigned id; the bot assigns one when a provider leaves it empty.
  std::string id{};
  /// Id of the provider that received it ("console", "telegram"...).
  std::string provider{};
  /// The chat (conversation) id in the provider. Required.
  std::string chat{};
  /// In group chats, the participant who wrote; empty in one-to-one chats.
  /// Group conversations are per participant, so it is part of the chat key.
  std::string participant{};
  /// Who sent it; in one-to-one chats usually equal to `chat`.
  std::string sender{};
  std::string text{};
  message_type type = message_type::text;
  /// When the provider says it was sent; the bot stamps arrival when zero.
  time_point timestamp{};
  /// The provider's payload as received (usually JSON), for handlers that
  /// need provider-specific fields. May be empty.
  std::string raw{};

  bool is_group() const noexcept {
    return !participant.empty();
  }

  friend bool operator==(const inbound_message&,
                         const inbound_message&) = default;
};

/// A message the bot sends.
struct outgoing_message {
  std::string provider{};
  std::string chat{};
  std::string text{};
  /// Id of the inbound message this answers, when it answers one.
  std::string reply_to{};

  friend bool operator==(const outgoing_message&,
                         const outgoing_message&) = default;
};

/// The key that orders a conversation: `provider:chat`, and
/// `provider:chat:participant` in groups (conversations are per participant).
/// `%` and `:` inside a segment are percent-encoded, so keys never collide.
std::string chat_key(std::string_view provider, std::string_view chat,
                     std::string_view participant = {});

/// The chat key of an inbound message.
std::string chat_key(const inbound_message& msg);

/// Limits applied to inbound messages before they enter the runtime.
struct message_limits {
  /// Largest accepted `text`, in bytes.
  std::size_t max_text_bytes = 64 * 1024;
  /// Largest accepted `chat`, `participant`, `sender` or `id`, in bytes.
  std::size_t max_id_bytes = 512;
};

/// Checks an inbound message; throws `invalid_argument_error` naming the
/// field: "chat" (empty), "provider" (empty), "text" (over `max_text_bytes`),
/// "provider"/"chat"/"participant"/"sender"/"id" (over `max_id_bytes`), and
/// any of those, "text" or "raw" when it is not valid UTF-8 (every field
/// round-trips through JSON, which would rewrite bad bytes).
void validate(const inbound_message& msg, const message_limits& limits);

/// JSON encoding of an inbound message (used by the message log and by a
/// checkpoint's saved answer): an object with fields id, provider, chat,
/// participant, sender, text, type, ts (Unix ms) and raw.
std::string to_json(const inbound_message& msg);

/// Decodes `to_json` output. Throws `botmesh::error` with
/// `errc::corrupted_record` naming the missing or mistyped field.
inbound_message inbound_message_from_json(std::string_view json);

namespace detail {

/// Runs inspector `f` over `fields`, then `after()` (which copies the
/// temporaries back into the object), whatever `f`'s result type.
template <class Inspector, class After, class... Ts>
typename Inspector::result_type inspect_then(Inspector& f, After after,
                                             Ts&&... fields) {
  if constexpr (std::is_void_v<typename Inspector::result_type>) {
    f(std::forward<Ts>(fields)...);
    after();
  } else {
    auto r = f(std::forward<Ts>(fields)...);
    after();
    return r;
  }
}

} // namespace detail

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, inbound_message& x) {
  auto type = static_cast<std::uint8_t>(x.type);
  auto ts = to_unix_ms(x.timestamp);
  return detail::inspect_then(
    f,
    [&] {
      x.type = static_cast<message_type>(type);
      x.timestamp = from_unix_ms(ts);
    },
    caf::meta::type_name("botmesh.inbound_message"), x.id, x.provider, x.chat,
    x.participant, x.sender, x.text, type, ts, x.raw);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, outgoing_message& x) {
  return f(caf::meta::type_name("botmesh.outgoing_message"), x.provider,
           x.chat, x.text, x.reply_to);
}

} // namespace botmesh
