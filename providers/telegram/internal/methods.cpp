#include <botmesh/providers/telegram/internal/methods.hpp>

#include <algorithm>
#include <charconv>

#include <fmt/format.h>
#include <simdjson.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/json.hpp>

namespace botmesh::telegram::internal {

namespace {

bool is_integer(std::string_view s) {
  if (s.empty())
    return false;
  std::int64_t v;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  return r.ec == std::errc{} && r.ptr == s.data() + s.size();
}

void field_raw(std::string& out, std::string_view name, std::string_view raw) {
  if (out.size() > 1)
    out.push_back(',');
  append_json_string(out, name);
  out.push_back(':');
  out += raw;
}

void field_str(std::string& out, std::string_view name, std::string_view v) {
  if (out.size() > 1)
    out.push_back(',');
  append_json_string(out, name);
  out.push_back(':');
  append_json_string(out, v);
}

bool is_positive_integer(std::string_view s) {
  return !s.empty() && s.front() >= '1' && s.front() <= '9' && is_integer(s);
}

} // namespace

chat_address split_chat(std::string_view chat) noexcept {
  auto slash = chat.rfind('/');
  if (slash == std::string_view::npos || slash == 0
      || !is_positive_integer(chat.substr(slash + 1)))
    return {chat, {}};
  return {chat.substr(0, slash), chat.substr(slash + 1)};
}

std::string topic_chat(std::string_view chat_id, std::string_view thread_id) {
  std::string out;
  out.reserve(chat_id.size() + thread_id.size() + 1);
  out += chat_id;
  out.push_back('/');
  out += thread_id;
  return out;
}

method_call to_method_call(const outgoing_message& msg) {
  validate(msg);
  method_call call;
  std::string& b = call.body;
  b.reserve(64 + msg.text.size());
  b.push_back('{');
  auto to = split_chat(msg.chat);
  if (is_integer(to.chat_id))
    field_raw(b, "chat_id", to.chat_id);
  else
    field_str(b, "chat_id", to.chat_id);
  if (!to.thread_id.empty())
    field_raw(b, "message_thread_id", to.thread_id);
  std::string_view text_field = "text";
  if (msg.has_media()) {
    std::string_view key;
    switch (msg.media) {
      case message_type::image:
        call.method = "sendPhoto";
        key = "photo";
        break;
      case message_type::audio:
        call.method = "sendAudio";
        key = "audio";
        break;
      case message_type::video:
        call.method = "sendVideo";
        key = "video";
        break;
      case message_type::sticker:
        call.method = "sendSticker";
        key = "sticker";
        break;
      default:
        call.method = "sendDocument";
        key = "document";
        break;
    }
    field_str(b, key, msg.media_id.empty() ? msg.media_url : msg.media_id);
    text_field = "caption";
  } else {
    call.method = "sendMessage";
  }
  if (!msg.text.empty() && msg.media != message_type::sticker)
    field_str(b, text_field, msg.text);
  if (msg.format == text_format::markdown)
    field_str(b, "parse_mode", "MarkdownV2");
  else if (msg.format == text_format::html)
    field_str(b, "parse_mode", "HTML");
  if (msg.quote && is_integer(msg.reply_to))
    field_raw(b, "reply_parameters",
              fmt::format("{{\"message_id\":{},\"allow_sending_without_reply\":true}}",
                          msg.reply_to));
  if (!msg.buttons.empty()) {
    std::string kb = "{\"inline_keyboard\":[";
    bool first_row = true;
    for (auto& row : msg.buttons) {
      if (row.empty())
        continue;
      if (!first_row)
        kb.push_back(',');
      first_row = false;
      kb.push_back('[');
      bool first = true;
      for (auto& btn : row) {
        if (!first)
          kb.push_back(',');
        first = false;
        if (btn.data.size() > 64)
          throw invalid_argument_error(
            "buttons", fmt::format("button \"{}\": Telegram callback data is at "
                                   "most 64 bytes, got {}",
                                   btn.text, btn.data.size()));
        std::string o = "{";
        field_str(o, "text", btn.text);
        if (!btn.url.empty())
          field_str(o, "url", btn.url);
        else
          field_str(o, "callback_data", btn.data);
        o.push_back('}');
        kb += o;
      }
      kb.push_back(']');
    }
    kb += "]}";
    field_raw(b, "reply_markup", kb);
  }
  b.push_back('}');
  return call;
}

std::string to_webhook_answer(const method_call& call) {
  std::string out;
  out.reserve(call.body.size() + call.method.size() + 16);
  out += "{\"method\":";
  append_json_string(out, call.method);
  if (call.body.size() > 2) {
    out.push_back(',');
    out.append(call.body, 1, std::string::npos);
  } else {
    out.push_back('}');
  }
  return out;
}

std::string check_answer(std::string_view method, int status,
                         std::string_view body) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element doc;
  simdjson::dom::object o;
  auto err = parser.parse(body.data(), body.size(), true).get(doc);
  if (err == simdjson::SUCCESS && doc.get(o) != simdjson::SUCCESS)
    err = simdjson::INCORRECT_TYPE;
  if (err != simdjson::SUCCESS)
    throw unreadable_answer(
      status, std::string{body},
      fmt::format("telegram {}: HTTP {} with an unreadable answer ({})",
                  method, status,
                  err == simdjson::INCORRECT_TYPE
                    ? std::string_view{"not a JSON object"}
                    : std::string_view{simdjson::error_message(err)}));
  bool ok = false;
  if (o["ok"].get(ok) != simdjson::SUCCESS)
    ok = false;
  if (ok && status >= 200 && status < 300) {
    simdjson::dom::element result;
    if (o["result"].get(result) != simdjson::SUCCESS)
      return "null";
    return simdjson::minify(result);
  }
  std::int64_t code = status;
  // An error code that is no HTTP status is the answer's fault: cast to
  // int, 4294967725 would read as a 429 and be retried.
  if (o["error_code"].get(code) != simdjson::SUCCESS || code < 100 || code > 599)
    code = status;
  std::string_view description;
  if (o["description"].get(description) != simdjson::SUCCESS)
    description = {};
  std::int64_t retry = 0;
  std::int64_t migrated = 0;
  simdjson::dom::object params;
  if (o["parameters"].get(params) == simdjson::SUCCESS) {
    if (params["retry_after"].get(retry) != simdjson::SUCCESS)
      retry = 0;
    // A group that became a supergroup: its new id is what the caller
    // must send to from now on, so the error names it.
    if (params["migrate_to_chat_id"].get(migrated) != simdjson::SUCCESS)
      migrated = 0;
  }
  auto c = static_cast<int>(code);
  errc kind = errc::provider_error;
  if (c == 429)
    kind = errc::retry_after;
  else if (c == 403)
    kind = errc::forbidden;
  else if (c == 400 || c == 404)
    kind = errc::bad_request;
  // At least a second, at most a day: a wait beyond that is a broken
  // answer (every send of the bot would pause on it), and seconds that
  // large would overflow the milliseconds and the clock they are added to.
  std::chrono::milliseconds wait{
    kind == errc::retry_after
      ? std::clamp<std::int64_t>(retry, 1, max_retry_after_seconds) * 1000
      : 0};
  throw platform_error(kind, c, std::string{description}, wait,
                       fmt::format("telegram {}: {} {}{}", method, c,
                                   description.empty() ? "failed" : description,
                                   migrated != 0
                                     ? fmt::format(" (migrate_to_chat_id {})",
                                                   migrated)
                                     : std::string{}));
}

} // namespace botmesh::telegram::internal
