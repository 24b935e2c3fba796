#pragma once

// Meta's webhook platforms: WhatsApp Cloud API, Messenger and Instagram.
// Inbound: a signed POST (X-Hub-Signature-256) on a route, plus the GET
// verification handshake. Outbound: the Graph API.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <botmesh/providers/http/flood_control.hpp>
#include <botmesh/providers/http/http_client.hpp>
#include <botmesh/providers/http/http_server.hpp>
#include <botmesh/providers/provider.hpp>
#include <botmesh/runtime/core/clock.hpp>

namespace botmesh::meta {

enum class platform : std::uint8_t {
  /// entry[].changes[].value.messages[] / statuses[]
  whatsapp,
  /// entry[].messaging[] ("object": "page")
  messenger,
  /// entry[].messaging[] ("object": "instagram")
  instagram,
};

/// A delivery receipt (WhatsApp statuses[], Messenger delivery/read): an
/// event, never a message.
struct status_event {
  std::string message_id{}; ///< the sent message's id (wamid...)
  std::string recipient{};
  std::string status{}; ///< "sent", "delivered", "read", "failed"
  /// For "failed": the platform's error code, title and details
  /// ("131047 Re-engagement message: ...").
  std::string error{};
  time_point at{};
};

struct webhook_options {
  /// The provider id (chat keys "whatsapp:<wa_id>").
  std::string id = "whatsapp";
  platform kind = platform::whatsapp;
  /// The Graph API access token. Required.
  std::string access_token{};
  /// The app secret: every POST must carry X-Hub-Signature-256, the
  /// HMAC-SHA256 of its raw body with it (checked in constant time; wrong
  /// or missing -> 401, whose body says which, and a warning logged at
  /// most once a minute). Required unless `allow_unauthenticated`.
  std::string app_secret{};
  /// Excuses a missing `app_secret` (tests, a proxy that checks it): POSTs
  /// are then taken unsigned. A configured secret is checked regardless.
  bool allow_unauthenticated = false;
  /// Compared with hub.verify_token on the GET verification. Required.
  std::string verify_token{};
  /// WhatsApp: the business phone number id messages are sent from. A
  /// message that arrives on another number (or on any, when this is
  /// empty) has chat `<wa_id>@<phone_number_id>`: a conversation of that
  /// number, whose replies go out from it. A send's chat may name the
  /// number the same way; a bare wa_id is sent from this one.
  std::string phone_number_id{};
  /// The Graph API's base URL (tests: a local fake over plain HTTP).
  std::string api_url = "https://graph.facebook.com";
  std::string api_version = "v21.0";
  /// The route's path (GET and POST).
  std::string path = "/whatsapp";
  std::shared_ptr<http::server> server{};
  /// Meta batches notifications (up to 1000 in one POST) and documents
  /// webhook payloads of up to 3 MB, hence the larger body cap: a signed
  /// delivery answered 413 is retried with the same body until Meta gives
  /// up, and every message in it is lost. Options written anew
  /// (`listen = {.port = ...}`) get the server's 1 MiB: set
  /// `max_body_bytes` with them. Cost: a body is read whole before its
  /// signature can be checked, so up to `max_connections` x this cap of
  /// memory (1.5 GiB at 512) for unauthenticated senders at worst.
  http::server_options listen{.max_body_bytes = 3 * 1024 * 1024};
  std::size_t dedup_window = 4096;
  http::flood_limits flood = http::flood_limits::whatsapp();
  http::client_options http{};
  /// Receives delivery receipts, on an I/O thread (keep it short). Each
  /// once: the same receipt in a redelivered POST counts as a duplicate.
  /// Without it, a "failed" receipt (a reply the platform did not deliver)
  /// is logged as a warning with its error, once.
  std::function<void(const status_event&)> on_status{};
};

struct webhook_stats {
  std::uint64_t payloads = 0;     ///< signed POSTs with valid JSON
  std::uint64_t messages = 0;     ///< messages delivered to the bot
  std::uint64_t accepted = 0;
  std::uint64_t statuses = 0;
  std::uint64_t unauthorized = 0; ///< 401: signature wrong or missing
  std::uint64_t malformed = 0;    ///< 400
  std::uint64_t unknown = 0;      ///< changes, events or message types ignored
  /// Messages and statuses seen recently, ignored. A message whose
  /// original's acceptance is not known yet (its journal write is on its
  /// way) makes its POST wait for it: 503 when it failed.
  std::uint64_t duplicates = 0;
  std::uint64_t verifications = 0; ///< successful GET handshakes
  std::uint64_t sent = 0;
  std::uint64_t retried = 0;
  /// Errors a webhook reported outside any message (`value.errors[]`),
  /// each logged as an error with its code and details.
  std::uint64_t platform_errors = 0;
};

/// Shared session (every replica receives). Answers 401 (signature), 400
/// (malformed JSON), 403 (GET with a wrong verify token), 503 while the bot
/// is stopping, 200 otherwise once every message of the payload was
/// accepted. `send` blocks: flood control, then the Graph API; rate-limit
/// errors are waited out and retried in order; others throw
/// `platform_error` (`forbidden`, `bad_request`, `retry_after`...).
class webhook_provider final : public provider {
 public:
  /// Throws `invalid_argument_error` naming the missing field
  /// ("access_token", "app_secret", "verify_token", "path", "api_url").
  explicit webhook_provider(webhook_options opts);
  ~webhook_provider() override;

  std::string id() const override;
  /// `phone_number_id` (empty when not configured).
  std::string connection_id() const override;
  provider_state state() const override;
  void start(provider_host& host) override;
  void stop() override;
  void send(const outgoing_message& msg) override {
    send(msg, {});
  }
  void send(const outgoing_message& msg, std::stop_token cancel) override;

  http::server& server() noexcept;
  webhook_stats stats() const;

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

} // namespace botmesh::meta
