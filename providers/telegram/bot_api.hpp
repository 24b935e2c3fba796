#pragma once

// A small Telegram Bot API client: method calls over the pooled HTTPS
// client, Bot API errors as typed `platform_error`s, and the webhook
// set-up helpers (also behind `botmesh telegram set-webhook`).

#include <chrono>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include <botmesh/providers/http/http_client.hpp>
#include <botmesh/runtime/core/message.hpp>

namespace botmesh::telegram {

// Chat ids. An inbound message's `chat` is Telegram's chat id ("42",
// "-1001234567890"), or `<chat id>/<message_thread_id>` for a message in a
// forum topic: each topic is a conversation of its own, and a reply to that
// chat lands in the same topic (sent with `message_thread_id`). Sends accept
// both forms, and "@channelusername".

struct bot_api_options {
  /// The bot's token from @BotFather. Required.
  std::string token{};
  /// The Bot API's base URL; tests point it at a local fake over plain HTTP.
  std::string api_url = "https://api.telegram.org";
  http::client_options http{};
};

struct webhook_settings {
  /// The public HTTPS URL Telegram posts to. Required.
  std::string url{};
  /// Sent back in X-Telegram-Bot-Api-Secret-Token (1-256 of A-Z a-z 0-9 _ -).
  std::string secret_token{};
  /// Parallel connections Telegram may open (1-100; the default is 40).
  int max_connections = 40;
  /// Update kinds to receive; empty: Telegram's default.
  std::vector<std::string> allowed_updates{};
  bool drop_pending_updates = false;
};

/// Throws `invalid_argument_error` naming the field: "url" (empty or not
/// http(s)://host...), "secret_token" (over 256 characters, or one outside
/// A-Z a-z 0-9 _ -), "max_connections" (outside 1-100). `set_webhook` calls
/// it first, so nothing is sent for settings Telegram would refuse.
void validate(const webhook_settings& s);

/// Thread-safe. Every call blocks on the network (bounded by the client's
/// timeouts) and throws `platform_error` for an answer with ok=false:
/// `errc::retry_after` (429, with retry_after), `errc::forbidden` (403),
/// `errc::bad_request` (400, 404), `errc::provider_error` (anything else,
/// 409 Conflict included: check `http_status()`); `botmesh::error` with
/// `errc::timeout` / `errc::provider_error` / `errc::stopped` for the
/// transport (see `http::client::request`).
class bot_api {
 public:
  /// Throws `invalid_argument_error` ("token") for an empty token and
  /// ("api_url") for a URL that is not http(s).
  explicit bot_api(bot_api_options opts);
  ~bot_api();

  /// Calls `method` with a JSON body; returns the raw JSON of `result`.
  /// `cancel_before_write` gives up only until the request is written
  /// (see `http::client_request`).
  std::string call(std::string_view method, std::string_view json_body,
                   std::chrono::milliseconds timeout = {},
                   std::stop_token stop = {},
                   std::stop_token cancel_before_write = {});

  /// Sends an outgoing message (sendMessage, sendPhoto...); returns the
  /// sent message's id. `cancel` gives it up (`errc::stopped`) until the
  /// request is written: the wait for a pooled connection, the connect.
  std::string send(const outgoing_message& msg, std::stop_token cancel = {});

  void answer_callback_query(std::string_view id);

  void set_webhook(const webhook_settings& s);
  void delete_webhook(bool drop_pending_updates = false);

  /// getWebhookInfo's raw JSON result.
  std::string webhook_info();

  const http::client& client() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace botmesh::telegram
