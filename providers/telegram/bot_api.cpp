#include <botmesh/providers/telegram/bot_api.hpp>

#include <fmt/format.h>

#include <botmesh/providers/telegram/internal/methods.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/json.hpp>

namespace botmesh::telegram {

struct bot_api::impl {
  bot_api_options opts;
  std::string base; // api_url + "/bot" + token + "/"
  http::client http;

  explicit impl(bot_api_options o)
    : opts(std::move(o)), http(opts.http) {
    // nop
  }
};

namespace {

// A-Z, a-z, 0-9, '_' and '-': what tokens and secret tokens are made of
// (spelled out, not std::isalnum, which follows the process's locale).
bool word_char(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z')
         || (c >= 'a' && c <= 'z') || c == '_' || c == '-';
}

} // namespace

bot_api::bot_api(bot_api_options opts) {
  if (opts.token.empty())
    throw invalid_argument_error("token", "telegram: the bot token is required");
  // A token is "<bot id>:<secret>" of letters, digits, '_' and '-'. It goes
  // into every request's path: anything else (a secret file's trailing
  // newline, a space) would break the request line or name another path.
  for (unsigned char c : opts.token)
    if (!word_char(c) && c != ':')
      throw invalid_argument_error(
        "token", fmt::format("telegram: the bot token holds a character a "
                             "token never has (byte {:#04x}{})",
                             c, c == '\n' || c == '\r'
                                  ? ": a trailing newline from a secret file?"
                                  : ""));
  http::parse_url(opts.api_url); // throws invalid_argument_error("url")
  impl_ = std::make_unique<impl>(std::move(opts));
  auto base = impl_->opts.api_url;
  while (!base.empty() && base.back() == '/')
    base.pop_back();
  impl_->base = fmt::format("{}/bot{}/", base, impl_->opts.token);
}

bot_api::~bot_api() {
  // nop
}

std::string bot_api::call(std::string_view method, std::string_view json_body,
                          std::chrono::milliseconds timeout,
                          std::stop_token stop,
                          std::stop_token cancel_before_write) {
  http::client_request req;
  req.url = impl_->base + std::string{method};
  req.body = std::string{json_body};
  req.timeout = timeout;
  req.stop = std::move(stop);
  req.cancel_before_write = std::move(cancel_before_write);
  // Reads and settings may be sent twice; a send may not.
  req.idempotent = method.starts_with("get") || method == "setWebhook"
                   || method == "deleteWebhook";
  auto res = impl_->http.request(req);
  return internal::check_answer(method, res.status, res.body);
}

std::string bot_api::send(const outgoing_message& msg, std::stop_token cancel) {
  auto c = internal::to_method_call(msg);
  auto result = call(c.method, c.body, {}, {}, std::move(cancel));
  // The sent Message's id, without a full parse.
  auto pos = result.find("\"message_id\":");
  if (pos == std::string::npos)
    return {};
  pos += 13;
  auto end = result.find_first_not_of("0123456789", pos);
  return result.substr(pos, end - pos);
}

void bot_api::answer_callback_query(std::string_view id) {
  std::string body = "{\"callback_query_id\":";
  append_json_string(body, id);
  body.push_back('}');
  call("answerCallbackQuery", body);
}

void validate(const webhook_settings& s) {
  if (s.url.empty())
    throw invalid_argument_error("url", "telegram set_webhook: url is required");
  http::parse_url(s.url); // throws invalid_argument_error("url")
  if (s.secret_token.size() > 256)
    throw invalid_argument_error(
      "secret_token",
      fmt::format("telegram set_webhook: secret_token has {} characters, at "
                  "most 256 are allowed",
                  s.secret_token.size()));
  for (unsigned char c : s.secret_token)
    if (!word_char(c))
      throw invalid_argument_error(
        "secret_token", "telegram set_webhook: secret_token may only contain "
                        "A-Z, a-z, 0-9, _ and -");
  if (s.max_connections < 1 || s.max_connections > 100)
    throw invalid_argument_error(
      "max_connections",
      fmt::format("telegram set_webhook: max_connections must be 1-100, got {}",
                  s.max_connections));
}

void bot_api::set_webhook(const webhook_settings& s) {
  validate(s);
  std::string body = "{\"url\":";
  append_json_string(body, s.url);
  if (!s.secret_token.empty()) {
    body += ",\"secret_token\":";
    append_json_string(body, s.secret_token);
  }
  body += fmt::format(",\"max_connections\":{}", s.max_connections);
  if (!s.allowed_updates.empty()) {
    body += ",\"allowed_updates\":[";
    for (std::size_t i = 0; i < s.allowed_updates.size(); ++i) {
      if (i)
        body.push_back(',');
      append_json_string(body, s.allowed_updates[i]);
    }
    body.push_back(']');
  }
  if (s.drop_pending_updates)
    body += ",\"drop_pending_updates\":true";
  body.push_back('}');
  call("setWebhook", body);
}

void bot_api::delete_webhook(bool drop_pending_updates) {
  call("deleteWebhook", drop_pending_updates ? "{\"drop_pending_updates\":true}"
                                             : "{}");
}

std::string bot_api::webhook_info() {
  return call("getWebhookInfo", "{}");
}

const http::client& bot_api::client() const noexcept {
  return impl_->http;
}

} // namespace botmesh::telegram
