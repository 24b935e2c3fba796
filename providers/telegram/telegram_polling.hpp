#pragma once

// The Telegram provider in long-polling mode (getUpdates): an exclusive
// session, so with several replicas only the elected one polls.

#include <cstdint>
#include <memory>
#include <string>

#include <botmesh/providers/http/flood_control.hpp>
#include <botmesh/providers/http/http_client.hpp>
#include <botmesh/providers/provider.hpp>
#include <botmesh/runtime/core/duration.hpp>
#include <botmesh/stores/store.hpp>

namespace botmesh::telegram {

struct polling_options {
  std::string id = "telegram";
  /// The bot's token. Required.
  std::string token{};
  std::string api_url = "https://api.telegram.org";
  /// The bot's username without '@' (from getMe). When set, a command
  /// addressed to another bot in a group ("/start@other_bot") is routed as
  /// text, not as a command; when empty, any "@name" is accepted.
  std::string username{};
  /// getUpdates' long-poll timeout (the request's own bound is 10 s more);
  /// at least 1 s, Telegram counting whole seconds.
  duration poll_timeout = "25s";
  /// Where the next offset is kept (user data "provider:<id>" / "botmesh" /
  /// "telegram_offset:<bot id>", the bot id being the token up to ':'; a
  /// value that is no update id is logged and ignored), so a new leader
  /// resumes without replaying handled
  /// updates. Usually the bot's store; null: kept in memory only.
  std::shared_ptr<botmesh::store> offset_store{};
  /// Waits after a failed poll grow from this (positive) up to 30 s; a
  /// 429's retry_after is waited when longer.
  duration retry_backoff = "1s";
  /// Answer a pressed button's callback query (stops its spinner): with
  /// the handler's first reply, else once its turn ran.
  bool answer_callback_queries = true;
  http::flood_limits flood = http::flood_limits::telegram();
  http::client_options http{};
};

struct polling_stats {
  std::uint64_t polls = 0;
  std::uint64_t updates = 0;
  std::uint64_t unknown = 0;
  std::uint64_t conflicts = 0; ///< 409: another poller was live
  std::uint64_t errors = 0;    ///< failed polls (network, 5xx, bad answers)
  std::uint64_t sent = 0;
  std::int64_t offset = 0;     ///< the next offset asked for
  /// Updates skipped because they did not parse (each logged with why).
  std::uint64_t malformed = 0;
  /// Answers with ids below the offset asked for: Telegram restarted its
  /// update ids (it does after a week without updates); they were handled
  /// as new and the offset follows the new ids.
  std::uint64_t id_restarts = 0;
  /// Why the last poll failed (the HTTP status and Telegram's own words,
  /// or the network error); empty once a poll succeeds. Each failure is
  /// also logged: as an error for a refused token (401/404) or a webhook
  /// still set (409 naming it), else as a warning.
  std::string last_error{};
};

/// `exclusive_session`: with coordination, only the elected replica runs it.
///
/// A 409 Conflict from getUpdates means another poller is live for this
/// token: the provider asks its host to yield the leadership
/// (`provider_host::yield_leadership("conflict")`) and stops polling until
/// it is started again; without an election it backs off and retries.
/// The offset advances past an update only once the bot accepted it, and is
/// written to `offset_store` after each batch.
class polling_provider final : public provider {
 public:
  /// Throws `invalid_argument_error` for an empty token ("token"), a bad
  /// api_url ("api_url"), a poll_timeout under 1 s ("poll_timeout") or a
  /// retry_backoff that is not positive ("retry_backoff").
  explicit polling_provider(polling_options opts);
  ~polling_provider() override;

  std::string id() const override;
  /// The bot's numeric id: the token up to ':'.
  std::string connection_id() const override;
  provider_capabilities capabilities() const override;
  provider_state state() const override;
  /// Starts the polling thread; returns at once.
  void start(provider_host& host) override;
  /// Cancels the poll in flight and joins the polling thread.
  void stop() override;
  void send(const outgoing_message& msg) override {
    send(msg, {});
  }
  void send(const outgoing_message& msg, std::stop_token cancel) override;

  polling_stats stats() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace botmesh::telegram
