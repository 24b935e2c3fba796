#include <botmesh/providers/meta/internal/payload.hpp>

#include <algorithm>
#include <charconv>

#include <fmt/format.h>
#include <simdjson.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/internal/platform_time.hpp>
#include <botmesh/runtime/core/json.hpp>

namespace botmesh::meta::internal {

namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

std::string_view str(object o, std::string_view key) {
  std::string_view v;
  if (o[key].get(v) != simdjson::SUCCESS)
    return {};
  return v;
}

// One of a webhook's `errors[]`: its code, title or message, and details
// (Meta asks integrations to rely on the code and details, not the title).
std::string error_text(object e) {
  std::string out;
  std::int64_t code = 0;
  if (e["code"].get(code) == simdjson::SUCCESS)
    out = std::to_string(code);
  auto title = str(e, "title");
  if (title.empty())
    title = str(e, "message");
  if (!title.empty())
    out += (out.empty() ? "" : " ") + std::string{title};
  object data;
  if (e["error_data"].get(data) == simdjson::SUCCESS)
    if (auto details = str(data, "details"); !details.empty())
      out += (out.empty() ? "" : ": ") + std::string{details};
  return out.empty() ? std::string{"an error without code or title"} : out;
}

std::string id_text(element e) {
  std::string_view s;
  if (e.get(s) == simdjson::SUCCESS)
    return std::string{s};
  std::uint64_t u;
  if (e.get(u) == simdjson::SUCCESS)
    return std::to_string(u);
  return {};
}

time_point seconds_text(std::string_view s) {
  std::int64_t v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return botmesh::internal::from_unix_seconds(v);
}

// One WhatsApp messages[] item; false when its type is not handled.
bool read_whatsapp_message(object m, inbound_message& out) {
  out.sender = std::string{str(m, "from")};
  out.chat = out.sender;
  out.id = std::string{str(m, "id")};
  out.timestamp = seconds_text(str(m, "timestamp"));
  auto type = str(m, "type");
  object o;
  auto media = [&](message_type t) {
    if (m[type].get(o) != simdjson::SUCCESS)
      return false;
    out.type = t;
    out.media_id = std::string{str(o, "id")};
    out.mime_type = std::string{str(o, "mime_type")};
    out.text = std::string{str(o, "caption")};
    return true;
  };
  if (type == "text") {
    if (m["text"].get(o) != simdjson::SUCCESS)
      return false;
    out.type = message_type::text;
    out.text = std::string{str(o, "body")};
    return true;
  }
  if (type == "interactive") {
    if (m["interactive"].get(o) != simdjson::SUCCESS)
      return false;
    auto kind = str(o, "type");
    object reply;
    if (o[kind].get(reply) != simdjson::SUCCESS
        || (kind != "button_reply" && kind != "list_reply"))
      return false;
    out.type = message_type::button;
    out.data = std::string{str(reply, "id")};
    out.text = std::string{str(reply, "title")};
    return true;
  }
  if (type == "button") { // a template's quick-reply button
    if (m["button"].get(o) != simdjson::SUCCESS)
      return false;
    out.type = message_type::button;
    out.data = std::string{str(o, "payload")};
    out.text = std::string{str(o, "text")};
    return true;
  }
  if (type == "image")
    return media(message_type::image);
  if (type == "audio" || type == "voice")
    return media(message_type::audio);
  if (type == "video")
    return media(message_type::video);
  if (type == "document")
    return media(message_type::document);
  if (type == "sticker")
    return media(message_type::sticker);
  if (type == "location") {
    if (m["location"].get(o) != simdjson::SUCCESS)
      return false;
    out.type = message_type::location;
    double v;
    if (o["latitude"].get(v) == simdjson::SUCCESS)
      out.latitude = v;
    if (o["longitude"].get(v) == simdjson::SUCCESS)
      out.longitude = v;
    out.text = std::string{str(o, "name")};
    return true;
  }
  if (type == "reaction") {
    if (m["reaction"].get(o) != simdjson::SUCCESS)
      return false;
    out.type = message_type::reaction;
    out.text = std::string{str(o, "emoji")};
    out.data = std::string{str(o, "message_id")};
    return true;
  }
  return false; // contacts, order, system, unsupported...
}

// The array field `key` of `o` into `items`: false when it is absent, and
// when it holds anything else (counted unknown: a change of shape on Meta's
// side must show in the stats, not pass as an empty delivery).
bool array_field(object o, const char* key, array& items, parsed_payload& out) {
  element e;
  if (o[key].get(e) != simdjson::SUCCESS)
    return false;
  if (e.get(items) == simdjson::SUCCESS)
    return true;
  ++out.unknown;
  return false;
}

void read_whatsapp(object entry, parsed_payload& out, std::string_view provider) {
  array changes;
  if (entry["changes"].get(changes) != simdjson::SUCCESS) {
    ++out.unknown;
    return;
  }
  for (element ce : changes) {
    object change, value;
    if (ce.get(change) != simdjson::SUCCESS || str(change, "field") != "messages"
        || change["value"].get(value) != simdjson::SUCCESS) {
      ++out.unknown;
      continue;
    }
    std::string phone_id;
    object meta;
    if (value["metadata"].get(meta) == simdjson::SUCCESS)
      phone_id = std::string{str(meta, "phone_number_id")};
    // The phone number id goes into a Graph API path, and the chat id is
    // `<wa_id>@<phone_number_id>`: an id of anything but letters and
    // digits ('/', '?', '@'...), or a sender with an '@', would send the
    // reply elsewhere.
    bool usable_phone =
      std::all_of(phone_id.begin(), phone_id.end(), [](unsigned char c) {
        return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z')
               || (c >= 'a' && c <= 'z');
      });
    array items;
    // Errors not tied to a message (an app or account problem).
    if (array_field(value, "errors", items, out))
      for (element ee : items) {
        object e;
        if (ee.get(e) == simdjson::SUCCESS)
          out.errors.push_back(error_text(e));
        else
          ++out.unknown;
      }
    if (array_field(value, "messages", items, out)) {
      for (element me : items) {
        object m;
        inbound_message msg;
        msg.provider = std::string{provider};
        if (!usable_phone || me.get(m) != simdjson::SUCCESS
            || !read_whatsapp_message(m, msg) || msg.chat.empty()
            || msg.chat.find('@') != std::string::npos) {
          ++out.unknown;
          continue;
        }
        msg.raw = simdjson::minify(me);
        out.messages.push_back(std::move(msg));
        out.phone_number_ids.push_back(phone_id);
      }
    }
    if (array_field(value, "statuses", items, out)) {
      for (element se : items) {
        object s;
        if (se.get(s) != simdjson::SUCCESS) {
          ++out.unknown;
          continue;
        }
        status_event ev;
        ev.message_id = std::string{str(s, "id")};
        ev.recipient = std::string{str(s, "recipient_id")};
        ev.status = std::string{str(s, "status")};
        ev.at = seconds_text(str(s, "timestamp"));
        array errors;
        if (s["errors"].get(errors) == simdjson::SUCCESS)
          for (element ee : errors) {
            object e;
            if (ee.get(e) == simdjson::SUCCESS) {
              ev.error = error_text(e);
              break;
            }
          }
        out.statuses.push_back(std::move(ev));
      }
    }
  }
}

void read_messaging(object entry, parsed_payload& out, std::string_view provider) {
  array events;
  if (entry["messaging"].get(events) != simdjson::SUCCESS) {
    ++out.unknown;
    return;
  }
  for (element ee : events) {
    object ev, sender, m;
    if (ee.get(ev) != simdjson::SUCCESS
        || ev["sender"].get(sender) != simdjson::SUCCESS) {
      ++out.unknown;
      continue;
    }
    inbound_message msg;
    msg.provider = std::string{provider};
    element sid;
    if (sender["id"].get(sid) == simdjson::SUCCESS)
      msg.sender = id_text(sid);
    msg.chat = msg.sender;
    std::int64_t ts = 0;
    if (ev["timestamp"].get(ts) == simdjson::SUCCESS && ts > 0)
      msg.timestamp = from_unix_ms(ts);
    if (ev["message"].get(m) == simdjson::SUCCESS) {
      bool flag = false;
      if (m["is_echo"].get(flag) == simdjson::SUCCESS && flag) {
        ++out.unknown; // our own message echoed back
        continue;
      }
      if (m["is_deleted"].get(flag) == simdjson::SUCCESS && flag) {
        // Instagram's unsend: it carries the original's mid, so as a
        // message it would be taken for the original's redelivery (or run
        // as an empty text). Counted with the kinds not handled.
        ++out.unknown;
        continue;
      }
      msg.id = std::string{str(m, "mid")};
      msg.text = std::string{str(m, "text")};
      msg.type = message_type::text;
      object qr;
      if (m["quick_reply"].get(qr) == simdjson::SUCCESS) {
        msg.type = message_type::button;
        msg.data = std::string{str(qr, "payload")};
      }
      array atts;
      if (m["attachments"].get(atts) == simdjson::SUCCESS)
        for (element ae : atts) {
          object a, payload;
          if (ae.get(a) != simdjson::SUCCESS)
            continue;
          auto t = str(a, "type");
          msg.type = t == "image"   ? message_type::image
                     : t == "audio" ? message_type::audio
                     : t == "video" ? message_type::video
                     : t == "file"  ? message_type::document
                                    : message_type::other;
          if (a["payload"].get(payload) == simdjson::SUCCESS) {
            msg.media_url = std::string{str(payload, "url")};
            object coords;
            if (payload["coordinates"].get(coords) == simdjson::SUCCESS) {
              msg.type = message_type::location;
              double v;
              if (coords["lat"].get(v) == simdjson::SUCCESS)
                msg.latitude = v;
              if (coords["long"].get(v) == simdjson::SUCCESS)
                msg.longitude = v;
            }
          }
          break;
        }
    } else if (ev["message_edit"].get(m) == simdjson::SUCCESS) {
      // A user's edit (the message_edits field): the original's mid with
      // the new text. The edit count tells the versions apart, so the
      // duplicate check takes each edit for a message of its own.
      msg.id = std::string{str(m, "mid")};
      msg.text = std::string{str(m, "text")};
      msg.edited = true;
      element n;
      if (m["num_edit"].get(n) == simdjson::SUCCESS)
        msg.edit_id = id_text(n);
      if (msg.edit_id.empty() && ts > 0)
        msg.edit_id = std::to_string(ts);
      if (msg.id.empty() || msg.edit_id.empty()) {
        ++out.unknown;
        continue;
      }
    } else if (ev["postback"].get(m) == simdjson::SUCCESS) {
      msg.id = std::string{str(m, "mid")};
      msg.type = message_type::button;
      msg.data = std::string{str(m, "payload")};
      msg.text = std::string{str(m, "title")};
      // Older Get Started buttons send no mid. An id made of what the
      // platform sends again on a redelivery keeps a retried POST from
      // running the postback twice (the bot would give each delivery an
      // id of its own).
      if (msg.id.empty() && ts > 0)
        msg.id = fmt::format("postback:{}:{}:{}", msg.sender, ts, msg.data);
    } else if (object d; ev["delivery"].get(d) == simdjson::SUCCESS
                         || ev["read"].get(d) == simdjson::SUCCESS) {
      status_event st;
      st.recipient = msg.sender;
      st.status = ev["delivery"].error() == simdjson::SUCCESS ? "delivered" : "read";
      st.at = msg.timestamp;
      // One event per message: a delivery receipt lists every message it
      // covers, Instagram's read names one ("mid"), Messenger's read none
      // (it reads up to a watermark): then one event without an id.
      std::vector<std::string_view> ids;
      array mids;
      std::string_view mid;
      if (d["mids"].get(mids) == simdjson::SUCCESS) {
        for (element me : mids)
          if (me.get(mid) == simdjson::SUCCESS)
            ids.push_back(mid);
      } else if (d["mid"].get(mid) == simdjson::SUCCESS) {
        ids.push_back(mid);
      }
      if (ids.empty())
        out.statuses.push_back(std::move(st));
      for (auto id : ids) {
        st.message_id = std::string{id};
        out.statuses.push_back(st);
      }
      continue;
    } else {
      ++out.unknown;
      continue;
    }
    if (msg.chat.empty()) {
      ++out.unknown;
      continue;
    }
    msg.raw = simdjson::minify(ee);
    out.messages.push_back(std::move(msg));
    out.phone_number_ids.emplace_back();
  }
}

void field(std::string& out, std::string_view name, std::string_view value) {
  if (out.size() > 1 && out.back() != '{' && out.back() != '[')
    out.push_back(',');
  append_json_string(out, name);
  out.push_back(':');
  append_json_string(out, value);
}

std::size_t utf8_length(std::string_view s) {
  std::size_t n = 0;
  for (unsigned char c : s)
    n += (c & 0xC0) != 0x80;
  return n;
}

std::string_view media_key(message_type t) {
  switch (t) {
    case message_type::image:
      return "image";
    case message_type::audio:
      return "audio";
    case message_type::video:
      return "video";
    case message_type::sticker:
      return "sticker";
    default:
      return "document";
  }
}

} // namespace

whatsapp_address split_whatsapp_chat(std::string_view chat) noexcept {
  auto at = chat.rfind('@');
  if (at == std::string_view::npos)
    return {chat, {}};
  return {chat.substr(0, at), chat.substr(at + 1)};
}

namespace {

// `"type":"image","image":{"link":"..."` (or "id"), the object left open
// for what follows (a caption).
void open_media(std::string& out, const outgoing_message& msg) {
  auto key = media_key(msg.media);
  field(out, "type", key);
  out += ",";
  append_json_string(out, key);
  out += ":{";
  if (!msg.media_id.empty())
    field(out, "id", msg.media_id);
  else
    field(out, "link", msg.media_url);
}

std::string whatsapp_body(const outgoing_message& msg) {
  std::vector<const button*> buttons;
  for (auto& row : msg.buttons)
    for (auto& b : row)
      buttons.push_back(&b);
  std::string out = "{";
  field(out, "messaging_product", "whatsapp");
  field(out, "recipient_type", "individual");
  field(out, "to", split_whatsapp_chat(msg.chat).to);
  if (msg.quote && !msg.reply_to.empty()) {
    out += ",\"context\":{";
    field(out, "message_id", msg.reply_to);
    out += "}";
  }
  if (!buttons.empty()) {
    bool list = buttons.size() > 3;
    if (buttons.size() > 10)
      throw invalid_argument_error(
        "buttons", fmt::format("WhatsApp lists hold at most 10 rows, got {}",
                               buttons.size()));
    for (auto* b : buttons) {
      if (b->data.empty())
        throw invalid_argument_error(
          "buttons", fmt::format("WhatsApp button \"{}\" needs data (link "
                                 "buttons are Telegram only)",
                                 b->text));
      if (utf8_length(b->text) > (list ? 24u : 20u))
        throw invalid_argument_error(
          "buttons", fmt::format("WhatsApp button title \"{}\" is over {} "
                                 "characters",
                                 b->text, list ? 24 : 20));
    }
    if (msg.has_media()) {
      // Reply buttons carry an image, video or document as their header;
      // a list carries none, and neither carries audio or a sticker.
      if (list)
        throw invalid_argument_error(
          "media", fmt::format("WhatsApp lists (more than 3 buttons, got {}) "
                               "cannot carry media: send the media on its own "
                               "or use at most 3 buttons",
                               buttons.size()));
      if (msg.media == message_type::audio || msg.media == message_type::sticker)
        throw invalid_argument_error(
          "media", fmt::format("WhatsApp buttons take an image, video or "
                               "document, not {}",
                               media_key(msg.media)));
    }
    field(out, "type", "interactive");
    out += ",\"interactive\":{";
    field(out, "type", list ? "list" : "button");
    if (msg.has_media()) {
      out += ",\"header\":{";
      open_media(out, msg);
      out += "}}";
    }
    out += ",\"body\":{";
    field(out, "text", msg.text.empty() ? std::string_view{"\xE2\x80\x8B"} : std::string_view{msg.text});
    out += "},\"action\":{";
    if (list) {
      field(out, "button", msg.menu_label.empty() ? "Options" : msg.menu_label);
      out += ",\"sections\":[{\"rows\":[";
      for (std::size_t i = 0; i < buttons.size(); ++i) {
        if (i)
          out.push_back(',');
        out += "{";
        field(out, "id", buttons[i]->data);
        field(out, "title", buttons[i]->text);
        out += "}";
      }
      out += "]}]";
    } else {
      out += "\"buttons\":[";
      for (std::size_t i = 0; i < buttons.size(); ++i) {
        if (i)
          out.push_back(',');
        out += "{\"type\":\"reply\",\"reply\":{";
        field(out, "id", buttons[i]->data);
        field(out, "title", buttons[i]->text);
        out += "}}";
      }
      out += "]";
    }
    out += "}}}";
    return out;
  }
  if (msg.has_media()) {
    open_media(out, msg);
    if (!msg.text.empty() && msg.media != message_type::audio
        && msg.media != message_type::sticker)
      field(out, "caption", msg.text);
    out += "}}";
    return out;
  }
  field(out, "type", "text");
  out += ",\"text\":{";
  field(out, "body", msg.text);
  out += "}}";
  return out;
}

std::string messaging_body(const outgoing_message& msg) {
  std::string out = "{\"recipient\":{";
  field(out, "id", msg.chat);
  out += "}";
  field(out, "messaging_type", "RESPONSE");
  out += ",\"message\":{";
  if (msg.has_media()) {
    out += "\"attachment\":{";
    field(out, "type", msg.media == message_type::document ? "file"
                                                           : media_key(msg.media));
    out += ",\"payload\":{";
    if (!msg.media_id.empty())
      field(out, "attachment_id", msg.media_id);
    else
      field(out, "url", msg.media_url);
    out += "}}";
  } else {
    field(out, "text", msg.text);
  }
  std::size_t n = 0;
  for (auto& row : msg.buttons)
    n += row.size();
  if (n > 13)
    throw invalid_argument_error(
      "buttons", fmt::format("Messenger quick replies are at most 13, got {}", n));
  if (n > 0) {
    out += ",\"quick_replies\":[";
    bool first = true;
    for (auto& row : msg.buttons)
      for (auto& b : row) {
        if (b.data.empty())
          throw invalid_argument_error(
            "buttons", fmt::format("quick reply \"{}\" needs data", b.text));
        if (!first)
          out.push_back(',');
        first = false;
        out += "{";
        field(out, "content_type", "text");
        field(out, "title", b.text);
        field(out, "payload", b.data);
        out += "}";
      }
    out += "]";
  }
  out += "}}";
  return out;
}

} // namespace

namespace {

parsed_payload parse_one(const char* data, std::size_t size, bool copy,
                         platform kind, std::string_view provider) {
  thread_local simdjson::dom::parser parser;
  element doc;
  if (auto err = parser.parse(data, size, copy).get(doc))
    throw invalid_argument_error(
      "body", fmt::format("webhook payload is not valid JSON: {}",
                          simdjson::error_message(err)));
  object root;
  array entries;
  if (doc.get(root) != simdjson::SUCCESS
      || root["entry"].get(entries) != simdjson::SUCCESS)
    throw invalid_argument_error("body", "webhook payload has no entry array");
  parsed_payload out;
  for (element ee : entries) {
    object entry;
    if (ee.get(entry) != simdjson::SUCCESS) {
      ++out.unknown;
      continue;
    }
    if (kind == platform::whatsapp)
      read_whatsapp(entry, out, provider);
    else
      read_messaging(entry, out, provider);
  }
  return out;
}

} // namespace

parsed_payload parse_payload(std::string_view json, platform kind,
                             std::string_view provider) {
  return parse_one(json.data(), json.size(), true, kind, provider);
}

parsed_payload parse_payload_in_place(const std::string& json, platform kind,
                                      std::string_view provider) {
  bool copy = json.capacity() - json.size() < simdjson::SIMDJSON_PADDING;
  return parse_one(json.data(), json.size(), copy, kind, provider);
}

std::string to_graph_body(const outgoing_message& msg, platform kind) {
  validate(msg);
  return kind == platform::whatsapp ? whatsapp_body(msg) : messaging_body(msg);
}

std::string check_graph_answer(int status, std::string_view body) {
  thread_local simdjson::dom::parser parser;
  element doc;
  auto parsed = parser.parse(body.data(), body.size(), true).get(doc);
  object err;
  if (status >= 200 && status < 300) {
    // The Graph API answers a send with a JSON object. Anything else (a
    // captive proxy's page, a body cut short) says nothing was delivered
    // to it: a send taken for done there would be lost without a word.
    object answer;
    if (parsed != simdjson::SUCCESS || doc.get(answer) != simdjson::SUCCESS)
      throw platform_error(
        errc::provider_error, status, {}, std::chrono::milliseconds{0},
        fmt::format("graph api: {} answer is not a JSON object ({}): {:?}",
                    status,
                    parsed != simdjson::SUCCESS
                      ? simdjson::error_message(parsed)
                      : "another JSON value",
                    body.substr(0, 80)));
    if (answer["error"].get(err) != simdjson::SUCCESS)
      return std::string{body};
  }
  std::string_view message;
  std::int64_t code = 0;
  if (parsed == simdjson::SUCCESS && doc["error"].get(err) == simdjson::SUCCESS) {
    if (err["message"].get(message) != simdjson::SUCCESS)
      message = {};
    if (err["code"].get(code) != simdjson::SUCCESS)
      code = 0;
  }
  errc kind = errc::provider_error;
  auto scope = platform_error::scope::bot;
  std::chrono::milliseconds wait{0};
  // Graph rate limits: 4 (app), 17 (user), 32 (page), 613 (the Send API's
  // "calls to this API have exceeded the rate limit"), 80001-80014
  // (business use cases, 80007 WhatsApp's WABA), 130429 (a number's
  // throughput): every send waits. 131056 is WhatsApp's pair rate, about
  // one message every 6 seconds to one user: only that chat waits, those
  // 6 seconds.
  if (code == 131056) {
    kind = errc::retry_after;
    scope = platform_error::scope::chat;
    wait = std::chrono::seconds(6);
  } else if (status == 429 || code == 4 || code == 17 || code == 32
             || code == 613 || (code >= 80001 && code <= 80014)
             || code == 130429) {
    kind = errc::retry_after;
    wait = std::chrono::seconds(1);
  } else if (status == 401 || status == 403 || code == 10 || code == 200
           || code == 190) {
    kind = errc::forbidden;
  } else if (status == 400 || status == 404) {
    kind = errc::bad_request;
  }
  throw platform_error(kind, status, std::string{message}, wait,
                       fmt::format("graph api: {} (code {}): {}", status, code,
                                   message.empty() ? "failed" : message),
                       scope);
}

} // namespace botmesh::meta::internal
