#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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
  /// For `message_type::button`: the pressed button's data (Telegram
  /// callback data, WhatsApp button or list row id, Messenger postback
  /// payload); `text` then holds the button's title when the platform sends it.
  std::string data{};
  /// A bot command without its slash and bot name ("start" for
  /// "/start@my_bot abc"); `text` keeps the whole text. Empty otherwise.
  std::string command{};
  /// Media (image, audio, video, document, sticker): the platform's id of
  /// the file, a URL when the platform gives one, and its MIME type. `text`
  /// holds the caption.
  std::string media_id{};
  std::string media_url{};
  std::string mime_type{};
  /// For `message_type::location`: degrees (WGS 84).
  double latitude = 0;
  double longitude = 0;
  /// True when this is an edit of an earlier message (same `id`).
  bool edited = false;
  /// For an edit: what tells this version from the original and from the
  /// other edits (Telegram: the update's id). The duplicate check and the
  /// inbound journal key on `id` plus this, so an edit is a message of its
  /// own and a redelivery of the same edit is still a duplicate. Empty for
  /// an original.
  std::string edit_id{};
  /// The language of the text as a BCP 47 tag ("es", "pt-BR"), empty when
  /// unknown. Telegram fills it from the sender's app language; middleware
  /// may set it (a detector, a voice transcript).
  std::string language{};

  bool is_group() const noexcept {
    return !participant.empty();
  }

  friend bool operator==(const inbound_message&,
                         const inbound_message&) = default;
};

/// A button under an outgoing message. Pressing it comes back as an
/// inbound message of type `button` whose `data` is this button's `data`.
struct button {
  /// The label shown. Required.
  std::string text{};
  /// What comes back when pressed (Telegram: at most 64 bytes; WhatsApp:
  /// the reply or row id, at most 256). Empty for a link button.
  std::string data{};
  /// A link button (Telegram only): opens this URL instead of calling back.
  std::string url{};

  friend bool operator==(const button&, const button&) = default;
};

/// How `outgoing_message::text` is to be read by the platform.
enum class text_format : std::uint8_t {
  plain,
  /// Telegram MarkdownV2 / WhatsApp's *bold* _italic_ (sent as is).
  markdown,
  /// Telegram HTML (WhatsApp has none: sent as plain text).
  html,
};

/// A message the bot sends.
struct outgoing_message {
  std::string provider{};
  std::string chat{};
  /// The text, or the caption of the media.
  std::string text{};
  /// Id of the inbound message this answers, when it answers one.
  std::string reply_to{};
  /// Buttons in rows. Telegram: an inline keyboard. WhatsApp: up to 3
  /// buttons become reply buttons, more become a list (at most 10 rows)
  /// opened by `menu_label`. Messenger: up to 3 postback buttons.
  std::vector<std::vector<button>> buttons{};
  /// The label of the button that opens a WhatsApp list; "Options" when empty.
  std::string menu_label{};
  /// Media to send: `media` says which kind (image, audio, video, document,
  /// sticker; `text` is then the caption), `media_url` a public URL or
  /// `media_id` a platform file id (one of them).
  message_type media = message_type::text;
  std::string media_url{};
  std::string media_id{};
  text_format format = text_format::plain;
  /// When true and `reply_to` is set, the platform shows the answered
  /// message quoted (Telegram `reply_parameters`, WhatsApp `context`).
  bool quote = false;

  bool has_media() const noexcept {
    return media != message_type::text;
  }

  friend bool operator==(const outgoing_message&,
                         const outgoing_message&) = default;
};

/// Checks an outgoing message before it reaches a provider; throws
/// `invalid_argument_error` naming the field: "chat" (empty), "text" (empty
/// with no media and no buttons, or not UTF-8), "buttons" (a button without
/// text, or with neither data nor url), "media" (not a media type, or with
/// neither `media_url` nor `media_id`).
void validate(const outgoing_message& msg);

/// The bot command `text` starts with, without '/' and "@botname":
/// "start" for "/start", "/start ref-42" or "/start@my_bot ref-42"; empty
/// when it starts with none (a name is 1-32 of A-Z, a-z, 0-9 and '_',
/// followed by the end, a blank or '@'). Providers without command
/// entities (console, testing) fill `inbound_message::command` with it.
std::string command_in(std::string_view text);

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
/// "provider"/"chat"/"participant"/"sender"/"id"/"data"/"command"/
/// "media_id"/"mime_type"/"language" (over `max_id_bytes`), "media_url" (over
/// `max_text_bytes`), and any of those, "text" or "raw" when it is not
/// valid UTF-8 (every field round-trips through JSON, which would rewrite
/// bad bytes).
void validate(const inbound_message& msg, const message_limits& limits);

/// JSON encoding of an inbound message (used by the message log and by a
/// checkpoint's saved answer): an object with fields id, provider, chat,
/// participant, sender, text, type, ts (Unix ms) and raw; then, only when
/// they are not empty/zero/false, data, command, media_id, media_url,
/// mime_type, lat, lon, edited and lang (the language).
std::string to_json(const inbound_message& msg);

/// Decodes `to_json` output (the optional fields may be absent, as in
/// records written before they existed). Throws `botmesh::error` with
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
    x.participant, x.sender, x.text, type, ts, x.raw, x.data, x.command,
    x.media_id, x.media_url, x.mime_type, x.latitude, x.longitude, x.edited,
    x.edit_id, x.language);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, button& x) {
  return f(caf::meta::type_name("botmesh.button"), x.text, x.data, x.url);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, outgoing_message& x) {
  auto media = static_cast<std::uint8_t>(x.media);
  auto format = static_cast<std::uint8_t>(x.format);
  return detail::inspect_then(
    f,
    [&] {
      x.media = static_cast<message_type>(media);
      x.format = static_cast<text_format>(format);
    },
    caf::meta::type_name("botmesh.outgoing_message"), x.provider, x.chat,
    x.text, x.reply_to, x.buttons, x.menu_label, media, x.media_url,
    x.media_id, format, x.quote);
}

} // namespace botmesh
