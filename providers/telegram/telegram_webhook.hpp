#pragma once

// The Telegram provider in webhook mode: Telegram POSTs updates to an HTTP
// route; replies go out through the Bot API (or, optionally, in the
// webhook's own response).

#include <cstdint>
#include <memory>
#include <string>

#include <botmesh/providers/http/flood_control.hpp>
#include <botmesh/providers/http/http_client.hpp>
#include <botmesh/providers/http/http_server.hpp>
#include <botmesh/providers/provider.hpp>
#include <botmesh/runtime/core/duration.hpp>

namespace botmesh::telegram {

struct webhook_options {
  /// The provider id (chat keys "telegram:<chat>").
  std::string id = "telegram";
  /// The bot's token. Required.
  std::string token{};
  /// The Bot API's base URL (tests: a local fake over plain HTTP).
  std::string api_url = "https://api.telegram.org";
  /// The bot's username without '@' (from getMe). When set, a command
  /// addressed to another bot in a group ("/start@other_bot") is routed as
  /// text, not as a command; when empty, any "@name" is accepted.
  std::string username{};
  /// Expected in X-Telegram-Bot-Api-Secret-Token (the `secret_token` given
  /// to setWebhook); compared in constant time, wrong or missing -> 401.
  /// Required unless `allow_unauthenticated`, which only excuses its
  /// absence: a secret that is set is always checked.
  std::string secret_token{};
  bool allow_unauthenticated = false;
  /// The route's path.
  std::string path = "/telegram";
  /// A server shared with other providers; when null the provider runs its
  /// own from `listen` (started and stopped with the provider).
  std::shared_ptr<http::server> server{};
  http::server_options listen{};
  /// Telegram's "reply in webhook": a turn's reply goes back as the
  /// webhook's response (one API round trip less). The response is held
  /// until the turn ends, for at most `reply_wait`, and carries the turn's
  /// first reply when it is the only send of the chat in that time: a
  /// second send of the chat first sends the kept reply through the API
  /// (Telegram runs a response's method after it reads the response, so a
  /// send through the API could overtake it). Telegram gives no result for
  /// a response's method, so only a plain text of 1 to 4096 UTF-16 units
  /// that is not all white space, without media, goes there; any other
  /// reply goes through the API, whose errors reach the handler. A reply in a response cannot fail the
  /// handler (a chat that blocked the bot drops it unseen). Past
  /// `reply_wait` the response goes with the kept reply, or empty; a send
  /// of the chat at that very moment can still overtake that reply.
  bool reply_in_webhook = false;
  duration reply_wait = "5s";
  /// Update ids remembered to drop duplicates (Telegram resends an update
  /// it got no 200 for). Per process.
  std::size_t dedup_window = 4096;
  /// Answer a pressed button's callback query (stops its spinner): with
  /// the handler's first reply, else once its turn ran (with
  /// `reply_in_webhook`: in the webhook response when it sends nothing,
  /// through the API when that response carries its reply).
  bool answer_callback_queries = true;
  http::flood_limits flood = http::flood_limits::telegram();
  http::client_options http{};
};

/// Counters since construction.
struct webhook_stats {
  std::uint64_t updates = 0;       ///< authenticated POSTs with valid JSON
  std::uint64_t accepted = 0;      ///< delivered and accepted by the bot
  std::uint64_t unauthorized = 0;  ///< 401: secret wrong or missing
  std::uint64_t malformed = 0;     ///< 400: not an update
  std::uint64_t unknown = 0;       ///< 200, ignored: kinds the bot does not handle
  /// Ignored: an update id seen recently. Answered 200, or, while the
  /// original's acceptance is not known (its journal write is on its way),
  /// with the original's answer once it is (503 when it failed).
  std::uint64_t duplicates = 0;
  std::uint64_t refused = 0;       ///< refused by the bot (503 when stopping)
  std::uint64_t replies_in_webhook = 0;
  std::uint64_t reply_wait_expired = 0; ///< held answers released by reply_wait
  std::uint64_t sent = 0;          ///< API calls that sent a message
  std::uint64_t retried = 0;       ///< 429s waited out
  /// 200, not handled: an update of a known kind missing what it needs (a
  /// message without its chat), logged as a warning. Refused, Telegram
  /// would send it again and hold the updates after it back.
  std::uint64_t skipped = 0;
};

/// Shared session (every replica receives): a webhook is stateless.
///
/// Answers: 401 (secret), 400 (malformed JSON, no update_id), 200 for an
/// accepted, duplicate, unknown-kind, skipped (a known kind missing what
/// it needs) or over-the-limits update (the bot
/// raises an error event for the latter: retrying would not help), 503
/// while the bot is stopping (Telegram retries later, maybe elsewhere).
/// `send` blocks: flood control, then the Bot API; a 429 is waited out and
/// retried (the chat's order is kept); other failures throw `platform_error`.
class webhook_provider final : public provider {
 public:
  /// Throws `invalid_argument_error` for an empty token ("token"), a bad
  /// api_url ("api_url"), a missing secret ("secret_token") or a path not
  /// starting with '/' ("path").
  explicit webhook_provider(webhook_options opts);
  ~webhook_provider() override;

  std::string id() const override;
  /// The bot's numeric id: the token up to ':'.
  std::string connection_id() const override;
  provider_state state() const override;
  void start(provider_host& host) override;
  void stop() override;
  void send(const outgoing_message& msg) override {
    send(msg, {});
  }
  void send(const outgoing_message& msg, std::stop_token cancel) override;

  /// The server the route lives on (valid after construction).
  http::server& server() noexcept;

  webhook_stats stats() const;

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

} // namespace botmesh::telegram
