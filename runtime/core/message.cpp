#include <botmesh/runtime/core/message.hpp>

#include <array>
#include <cmath>

#include <fmt/format.h>
#include <simdjson.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/json.hpp>
#include <botmesh/runtime/core/internal/json_reader.hpp>

namespace botmesh {

namespace {

constexpr std::array<std::string_view, 11> type_names{
  "text",     "image",   "audio",   "video",  "document", "location",
  "contact",  "sticker", "reaction", "button", "other"};

void append_segment(std::string& out, std::string_view s) {
  for (char c : s) {
    if (c == '%')
      out += "%25";
    else if (c == ':')
      out += "%3A";
    else
      out.push_back(c);
  }
}

} // namespace

std::string_view to_string(message_type t) noexcept {
  auto i = static_cast<size_t>(t);
  return i < type_names.size() ? type_names[i] : "other";
}

message_type parse_message_type(std::string_view name) {
  for (size_t i = 0; i < type_names.size(); ++i)
    if (type_names[i] == name)
      return static_cast<message_type>(i);
  throw invalid_argument_error(
    "type", fmt::format("unknown message type \"{}\"", name));
}

std::string chat_key(std::string_view provider, std::string_view chat,
                     std::string_view participant) {
  std::string key;
  key.reserve(provider.size() + chat.size() + participant.size() + 2);
  append_segment(key, provider);
  key.push_back(':');
  append_segment(key, chat);
  if (!participant.empty()) {
    key.push_back(':');
    append_segment(key, participant);
  }
  return key;
}

std::string chat_key(const inbound_message& msg) {
  return chat_key(msg.provider, msg.chat, msg.participant);
}

std::string command_in(std::string_view text) {
  if (text.size() < 2 || text[0] != '/')
    return {};
  std::size_t n = 1;
  auto word = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
           || (c >= '0' && c <= '9') || c == '_';
  };
  while (n < text.size() && word(text[n]))
    ++n;
  if (n == 1 || n > 33)
    return {};
  if (n < text.size() && text[n] != '@' && text[n] != ' ' && text[n] != '\t'
      && text[n] != '\n' && text[n] != '\r')
    return {};
  return std::string{text.substr(1, n - 1)};
}

namespace {

// A location's numbers: finite and on the globe. NaN or infinity would be
// written as `nan`/`inf`, which no JSON reader takes back: a journal record
// or a checkpoint holding the message would be lost when read.
void check_coordinates(const inbound_message& msg) {
  auto check = [&](std::string_view name, double v, double bound) {
    if (!std::isfinite(v) || v < -bound || v > bound)
      throw invalid_argument_error(
        std::string{name},
        fmt::format("inbound message {} is {}, not a number from {} to {} "
                    "(chat {})",
                    name, v, -bound, bound, msg.chat));
  };
  check("latitude", msg.latitude, 90);
  check("longitude", msg.longitude, 180);
}

} // namespace

void validate(const inbound_message& msg, const message_limits& limits) {
  // Every field travels through JSON (message log, saved answers): bytes
  // that are not UTF-8 would come back rewritten, so they are refused here.
  auto utf8_field = [&](std::string_view name, const std::string& value) {
    if (!is_valid_utf8(value))
      throw invalid_argument_error(
        std::string{name},
        fmt::format("inbound message field \"{}\" is not valid UTF-8", name));
  };
  auto id_field = [&](std::string_view name, const std::string& value) {
    if (value.size() > limits.max_id_bytes)
      throw invalid_argument_error(
        std::string{name},
        fmt::format("inbound message field \"{}\" is {} bytes, over the limit "
                    "of {} bytes",
                    name, value.size(), limits.max_id_bytes));
    utf8_field(name, value);
  };
  if (msg.chat.empty())
    throw invalid_argument_error(
      "chat", "inbound message has an empty \"chat\": every message needs the "
              "id of its chat");
  if (msg.provider.empty())
    throw invalid_argument_error("provider",
                                 "inbound message has an empty \"provider\"");
  id_field("provider", msg.provider);
  id_field("chat", msg.chat);
  id_field("participant", msg.participant);
  id_field("sender", msg.sender);
  id_field("id", msg.id);
  id_field("edit_id", msg.edit_id);
  id_field("data", msg.data);
  id_field("command", msg.command);
  id_field("media_id", msg.media_id);
  id_field("mime_type", msg.mime_type);
  id_field("language", msg.language);
  if (msg.media_url.size() > limits.max_text_bytes)
    throw invalid_argument_error(
      "media_url", fmt::format("inbound message media_url is {} bytes, over "
                               "the limit of {} bytes (chat {})",
                               msg.media_url.size(), limits.max_text_bytes,
                               msg.chat));
  utf8_field("media_url", msg.media_url);
  utf8_field("raw", msg.raw);
  check_coordinates(msg);
  if (msg.text.size() > limits.max_text_bytes)
    throw invalid_argument_error(
      "text", fmt::format("inbound message text is {} bytes, over the limit of "
                          "{} bytes (chat {})",
                          msg.text.size(), limits.max_text_bytes, msg.chat));
  if (!is_valid_utf8(msg.text))
    throw invalid_argument_error(
      "text", fmt::format("inbound message text is not valid UTF-8 (chat {})",
                          msg.chat));
}

std::string to_json(const inbound_message& msg) {
  std::string out;
  out.reserve(96 + msg.text.size() + msg.raw.size());
  bool first = true;
  auto field = [&](std::string_view name, std::string_view value) {
    if (!first)
      out.push_back(',');
    first = false;
    append_json_string(out, name);
    out.push_back(':');
    append_json_string(out, value);
  };
  out.push_back('{');
  field("id", msg.id);
  field("provider", msg.provider);
  field("chat", msg.chat);
  field("participant", msg.participant);
  field("sender", msg.sender);
  field("text", msg.text);
  field("type", to_string(msg.type));
  out += fmt::format(",\"ts\":{}", to_unix_ms(msg.timestamp));
  field("raw", msg.raw);
  auto optional = [&](std::string_view name, const std::string& value) {
    if (!value.empty())
      field(name, value);
  };
  optional("data", msg.data);
  optional("command", msg.command);
  optional("media_id", msg.media_id);
  optional("media_url", msg.media_url);
  optional("mime_type", msg.mime_type);
  if (msg.latitude != 0 || msg.longitude != 0) {
    // (A middleware's edit is not validated again: checked where it would
    // become JSON that cannot be read back.)
    check_coordinates(msg);
    out += fmt::format(",\"lat\":{},\"lon\":{}", msg.latitude, msg.longitude);
  }
  if (msg.edited)
    out += ",\"edited\":true";
  optional("edit_id", msg.edit_id);
  optional("lang", msg.language);
  out.push_back('}');
  return out;
}

void validate(const outgoing_message& msg) {
  if (msg.chat.empty())
    throw invalid_argument_error("chat",
                                 "outgoing message has an empty \"chat\"");
  if (msg.has_media()) {
    switch (msg.media) {
      case message_type::image:
      case message_type::audio:
      case message_type::video:
      case message_type::document:
      case message_type::sticker:
        break;
      default:
        throw invalid_argument_error(
          "media", fmt::format("outgoing message media \"{}\" is not a "
                               "media type (image, audio, video, document, "
                               "sticker)",
                               to_string(msg.media)));
    }
    if (msg.media_url.empty() && msg.media_id.empty())
      throw invalid_argument_error(
        "media", "outgoing message media needs a media_url or a media_id");
  }
  bool any_button = false;
  for (auto& row : msg.buttons)
    for (auto& b : row) {
      any_button = true;
      if (b.text.empty())
        throw invalid_argument_error("buttons",
                                     "outgoing message has a button without "
                                     "text");
      if (b.data.empty() && b.url.empty())
        throw invalid_argument_error(
          "buttons", fmt::format("button \"{}\" has neither data nor url",
                                 b.text));
    }
  if (msg.text.empty() && !msg.has_media() && !any_button)
    throw invalid_argument_error(
      "text", fmt::format("outgoing message to {} has no text, media or "
                          "buttons",
                          msg.chat));
  if (!is_valid_utf8(msg.text))
    throw invalid_argument_error(
      "text", fmt::format("outgoing message text to {} is not valid UTF-8",
                          msg.chat));
  // Every field goes out as JSON, whose encoder replaces bytes that are not
  // UTF-8: button data would come back rewritten from a press and match no
  // route, and a platform's byte limit would be checked on other bytes.
  auto utf8_field = [&](std::string_view name, const std::string& value) {
    if (!is_valid_utf8(value))
      throw invalid_argument_error(
        std::string{name},
        fmt::format("outgoing message {} to {} is not valid UTF-8", name,
                    msg.chat));
  };
  utf8_field("chat", msg.chat);
  utf8_field("reply_to", msg.reply_to);
  utf8_field("menu_label", msg.menu_label);
  utf8_field("media_url", msg.media_url);
  utf8_field("media_id", msg.media_id);
  for (auto& row : msg.buttons)
    for (auto& b : row) {
      utf8_field("buttons", b.text);
      utf8_field("buttons", b.data);
      utf8_field("buttons", b.url);
    }
}

namespace internal {

inbound_message read_inbound_message(const json_reader& r) {
  inbound_message msg;
  msg.id = r.string("id");
  msg.provider = r.string("provider");
  msg.chat = r.string("chat");
  msg.participant = r.string("participant");
  msg.sender = r.string("sender");
  msg.text = r.string("text");
  msg.type = r.type("type");
  msg.timestamp = from_unix_ms(r.int64("ts"));
  msg.raw = r.string("raw");
  auto optional = [&](std::string_view name, std::string& out) {
    if (r.has(name))
      out = r.string(name);
  };
  optional("data", msg.data);
  optional("command", msg.command);
  optional("media_id", msg.media_id);
  optional("media_url", msg.media_url);
  optional("mime_type", msg.mime_type);
  if (r.has("lat"))
    msg.latitude = r.number("lat");
  if (r.has("lon"))
    msg.longitude = r.number("lon");
  if (r.has("edited"))
    msg.edited = r.boolean("edited");
  optional("edit_id", msg.edit_id);
  optional("lang", msg.language);
  return msg;
}

} // namespace internal

inbound_message inbound_message_from_json(std::string_view json) {
  auto reader = internal::json_reader::parse(json, "inbound message");
  return internal::read_inbound_message(reader);
}

} // namespace botmesh
