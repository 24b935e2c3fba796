#include <botmesh/providers/telegram/internal/update_parser.hpp>

#include <charconv>
#include <limits>

#include <fmt/format.h>
#include <simdjson.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/providers/telegram/internal/methods.hpp>
#include <botmesh/runtime/core/internal/platform_time.hpp>
#include <botmesh/runtime/core/internal/text.hpp>

namespace botmesh::telegram::internal {

namespace {

using simdjson::dom::element;
using simdjson::dom::object;

// The largest update_id whose successor (the next offset) is an int64.
constexpr std::int64_t max_update_id = std::numeric_limits<std::int64_t>::max() - 1;

bool valid_update_id(std::int64_t id) {
  return id >= 0 && id <= max_update_id;
}

std::string number_text(element e) {
  std::int64_t i;
  if (e.get(i) == simdjson::SUCCESS)
    return std::to_string(i);
  std::uint64_t u;
  if (e.get(u) == simdjson::SUCCESS)
    return std::to_string(u);
  std::string_view s;
  if (e.get(s) == simdjson::SUCCESS)
    return std::string{s};
  return {};
}

std::string_view str(object o, std::string_view key) {
  std::string_view v;
  if (o[key].get(v) != simdjson::SUCCESS)
    return {};
  return v;
}

bool has(object o, std::string_view key) {
  element e;
  return o.at_key(key).get(e) == simdjson::SUCCESS;
}

// "/start@my_bot payload" -> "start" when a bot_command entity starts at 0.
// A command addressed to another bot ("/start@other_bot" in a group) is no
// command of this one when `username` (this bot's, without '@') is known.
std::string command_of(object msg, std::string_view text,
                       std::string_view username) {
  simdjson::dom::array entities;
  if (msg["entities"].get(entities) != simdjson::SUCCESS)
    return {};
  for (element ent : entities) {
    object e;
    if (ent.get(e) != simdjson::SUCCESS || str(e, "type") != "bot_command")
      continue;
    std::int64_t offset = -1, length = 0;
    if (e["offset"].get(offset) != simdjson::SUCCESS || offset != 0
        || e["length"].get(length) != simdjson::SUCCESS || length < 2
        || static_cast<std::size_t>(length) > text.size())
      continue;
    auto cmd = text.substr(1, static_cast<std::size_t>(length) - 1);
    if (auto at = cmd.find('@'); at != std::string_view::npos) {
      if (!username.empty()
          && !botmesh::internal::ascii_iequals(cmd.substr(at + 1), username))
        return {};
      cmd = cmd.substr(0, at);
    }
    for (char c : cmd)
      if (static_cast<unsigned char>(c) >= 0x80)
        return {};
    return std::string{cmd};
  }
  return {};
}

// The sender's app language (an IETF tag); ignored when it could not be one.
void read_language(object from, inbound_message& m) {
  auto lang = str(from, "language_code");
  if (lang.size() <= 35)
    m.language = std::string{lang};
}

// Fills `m` from a Telegram Message object.
void read_message(object msg, inbound_message& m, std::string_view username) {
  object chat;
  if (msg["chat"].get(chat) != simdjson::SUCCESS)
    throw invalid_argument_error("message.chat",
                                 "telegram update: message has no chat");
  element chat_id;
  if (chat["id"].get(chat_id) != simdjson::SUCCESS
      || (m.chat = number_text(chat_id)).empty())
    throw invalid_argument_error("message.chat.id",
                                 "telegram update: message chat has no id");
  // A forum topic is a conversation of its own, and a reply must name it or
  // it lands in the General topic: the chat id carries it (see
  // topic_chat()). Only topic messages: in other supergroups the field
  // names a reply thread, which sending cannot target.
  bool in_topic = false;
  element thread;
  if (msg["is_topic_message"].get(in_topic) == simdjson::SUCCESS && in_topic
      && msg["message_thread_id"].get(thread) == simdjson::SUCCESS) {
    auto t = number_text(thread);
    if (!t.empty())
      m.chat = topic_chat(m.chat, t);
  }
  element id;
  if (msg["message_id"].get(id) == simdjson::SUCCESS)
    m.id = number_text(id);
  object from;
  if (msg["from"].get(from) == simdjson::SUCCESS) {
    element fid;
    if (from["id"].get(fid) == simdjson::SUCCESS)
      m.sender = number_text(fid);
    read_language(from, m);
  }
  auto type = str(chat, "type");
  if ((type == "group" || type == "supergroup") && !m.sender.empty())
    m.participant = m.sender;
  std::int64_t date = 0;
  if (msg["date"].get(date) == simdjson::SUCCESS)
    m.timestamp = botmesh::internal::from_unix_seconds(date);
  m.type = message_type::text;
  if (has(msg, "text")) {
    m.text = std::string{str(msg, "text")};
    m.command = command_of(msg, m.text, username);
  } else {
    m.text = std::string{str(msg, "caption")};
  }
  auto media = [&](std::string_view key, message_type t) -> bool {
    object o;
    if (msg[key].get(o) != simdjson::SUCCESS)
      return false;
    m.type = t;
    m.media_id = std::string{str(o, "file_id")};
    m.mime_type = std::string{str(o, "mime_type")};
    return true;
  };
  simdjson::dom::array photos;
  if (msg["photo"].get(photos) == simdjson::SUCCESS) {
    m.type = message_type::image;
    m.mime_type = "image/jpeg";
    // The sizes come smallest first: keep the largest.
    for (element p : photos) {
      object o;
      if (p.get(o) == simdjson::SUCCESS)
        m.media_id = std::string{str(o, "file_id")};
    }
  } else if (media("voice", message_type::audio)
             || media("audio", message_type::audio)
             || media("video", message_type::video)
             || media("video_note", message_type::video)
             || media("animation", message_type::video)
             || media("sticker", message_type::sticker)
             || media("document", message_type::document)) {
    // nop
  } else if (object loc; msg["location"].get(loc) == simdjson::SUCCESS) {
    m.type = message_type::location;
    double lat = 0, lon = 0;
    if (loc["latitude"].get(lat) == simdjson::SUCCESS)
      m.latitude = lat;
    if (loc["longitude"].get(lon) == simdjson::SUCCESS)
      m.longitude = lon;
  } else if (object contact; msg["contact"].get(contact) == simdjson::SUCCESS) {
    m.type = message_type::contact;
    m.text = std::string{str(contact, "phone_number")};
  } else if (!has(msg, "text")) {
    m.type = message_type::other;
  }
}

parsed_update read_update(object u, std::string_view provider,
                          std::string_view raw, std::string_view username) {
  parsed_update out;
  if (u["update_id"].get(out.update_id) != simdjson::SUCCESS)
    throw invalid_argument_error("update_id",
                                 "telegram update has no integer update_id");
  // The next getUpdates offset is update_id + 1, and a negative offset
  // means "the last N updates" to the Bot API.
  if (!valid_update_id(out.update_id))
    throw invalid_argument_error(
      "update_id", fmt::format("telegram update_id {} is out of range (0 to {})",
                               out.update_id, max_update_id));
  auto& m = out.message;
  m.provider = std::string{provider};
  object msg;
  if (u["message"].get(msg) == simdjson::SUCCESS) {
    out.kind = update_kind::message;
    read_message(msg, m, username);
  } else if (u["edited_message"].get(msg) == simdjson::SUCCESS) {
    out.kind = update_kind::edited_message;
    read_message(msg, m, username);
    m.edited = true;
    m.edit_id = std::to_string(out.update_id);
    // When the edit was made, not when the original was sent.
    // An edit_date too large to be a time is taken as none (the send
    // date stays), not multiplied into an overflow.
    std::int64_t edited_at = 0;
    if (msg["edit_date"].get(edited_at) == simdjson::SUCCESS)
      if (auto t = botmesh::internal::from_unix_seconds(edited_at);
          t != time_point{})
        m.timestamp = t;
  } else if (object cq; u["callback_query"].get(cq) == simdjson::SUCCESS) {
    out.kind = update_kind::callback_query;
    out.callback_query_id = std::string{str(cq, "id")};
    if (out.callback_query_id.empty())
      throw invalid_argument_error("callback_query.id",
                                   "telegram callback_query has no id");
    object from;
    if (cq["from"].get(from) == simdjson::SUCCESS) {
      element fid;
      if (from["id"].get(fid) == simdjson::SUCCESS)
        m.sender = number_text(fid);
    }
    if (cq["message"].get(msg) == simdjson::SUCCESS) {
      read_message(msg, m, username);
      m.sender.clear();
      m.language.clear();
      if (cq["from"].get(from) == simdjson::SUCCESS) {
        element fid;
        if (from["id"].get(fid) == simdjson::SUCCESS)
          m.sender = number_text(fid);
        read_language(from, m);
      }
      if (!m.participant.empty())
        m.participant = m.sender;
    } else {
      m.chat = m.sender; // a button under an inline-mode message
    }
    if (m.chat.empty())
      throw invalid_argument_error("callback_query.from",
                                   "telegram callback_query has no chat");
    m.id = out.callback_query_id;
    m.type = message_type::button;
    m.data = std::string{str(cq, "data")};
    m.text.clear();
    m.command.clear();
    m.media_id.clear();
    m.mime_type.clear();
  } else {
    out.kind = update_kind::unknown;
    for (auto field : u)
      if (field.key != "update_id") {
        out.unknown_kind = std::string{field.key};
        break;
      }
  }
  if (!raw.empty())
    m.raw = std::string{raw};
  return out;
}

simdjson::dom::parser& parser() {
  thread_local simdjson::dom::parser p;
  return p;
}

} // namespace

namespace {

parsed_update parse_one(const char* data, std::size_t size, bool copy,
                        std::string_view provider, bool keep_raw,
                        std::string_view username) {
  element doc;
  if (auto err = parser().parse(data, size, copy).get(doc))
    throw invalid_argument_error(
      "body", fmt::format("telegram update is not valid JSON: {}",
                          simdjson::error_message(err)));
  object u;
  if (doc.get(u) != simdjson::SUCCESS)
    throw invalid_argument_error("body",
                                 "telegram update is not a JSON object");
  return read_update(u, provider,
                     keep_raw ? std::string_view{data, size} : std::string_view{},
                     username);
}

} // namespace

parsed_update parse_update(std::string_view json, std::string_view provider,
                           bool keep_raw, std::string_view username) {
  return parse_one(json.data(), json.size(), true, provider, keep_raw, username);
}

parsed_update parse_update_in_place(const std::string& json, std::string_view provider,
                           bool keep_raw, std::string_view username) {
  // simdjson reads up to SIMDJSON_PADDING bytes past the end: spare
  // capacity that large spares a padded copy of the document.
  bool copy = json.capacity() - json.size() < simdjson::SIMDJSON_PADDING;
  return parse_one(json.data(), json.size(), copy, provider, keep_raw, username);
}

std::vector<parsed_update> parse_updates(std::string_view result_json,
                                         std::string_view provider,
                                         std::string_view username) {
  element doc;
  if (auto err = parser().parse(result_json.data(), result_json.size(), true)
                   .get(doc))
    throw invalid_argument_error(
      "result", fmt::format("getUpdates result is not valid JSON: {}",
                            simdjson::error_message(err)));
  simdjson::dom::array arr;
  if (doc.get(arr) != simdjson::SUCCESS)
    throw invalid_argument_error("result", "getUpdates result is not an array");
  std::vector<parsed_update> out;
  for (element e : arr) {
    object u;
    try {
      if (e.get(u) != simdjson::SUCCESS)
        throw invalid_argument_error("result",
                                     "getUpdates result holds a non-object");
      out.push_back(read_update(u, provider, simdjson::minify(e), username));
    } catch (const invalid_argument_error& err) {
      parsed_update bad;
      bad.kind = update_kind::malformed;
      bad.unknown_kind = err.what();
      std::int64_t id = 0;
      if (e.is_object() && u["update_id"].get(id) == simdjson::SUCCESS
          && valid_update_id(id))
        bad.update_id = id;
      out.push_back(std::move(bad));
    }
  }
  return out;
}

std::optional<std::int64_t> first_update_id(std::string_view raw) {
  constexpr std::string_view name = "\"update_id\"";
  auto at = raw.find(name);
  if (at == std::string_view::npos)
    return std::nullopt;
  auto rest = botmesh::internal::trim(raw.substr(at + name.size()));
  if (rest.empty() || rest.front() != ':')
    return std::nullopt;
  rest = botmesh::internal::trim(rest.substr(1));
  std::int64_t id = -1;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), id);
  if (ec != std::errc{} || !valid_update_id(id))
    return std::nullopt;
  // A number that goes on ("7.5", "7e3") is no update id.
  if (end < rest.data() + rest.size()
      && (*end == '.' || *end == 'e' || *end == 'E'))
    return std::nullopt;
  return id;
}

} // namespace botmesh::telegram::internal
