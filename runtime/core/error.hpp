#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <optional>
#include <string>
#include <string_view>

namespace botmesh {

/// The error codes of botmesh. Failures that cross an actor boundary travel
/// as `caf::error` with category `botmesh` and one of these codes (see
/// `caf_error.hpp`); failures of a synchronous call are thrown as
/// `botmesh::error` (or a subclass) carrying the same code.
enum class errc : std::uint8_t {
  /// Not an error.
  none = 0,
  /// An argument or an input field is invalid; the message names the field.
  invalid_argument,
  /// The turn of a chat was lost; the reason says why: "superseded" (another
  /// writer moved the checkpoint on), "expired" (the lease ran out),
  /// "frozen" (renewals failed for almost the whole lease).
  lease_lost,
  /// A message could not get its chat's turn (turn wait exceeded, backend down).
  coordination_unavailable,
  /// `send()` on a replica that is not the leader of an exclusive transport.
  provider_not_leader,
  /// A chat's pending queue is full; the message was refused, not queued.
  overloaded,
  /// The bot is stopping or stopped; the message was not processed.
  stopped,
  /// A user handler threw; the message counts as handled.
  handler_failed,
  /// The provider failed to send or is closed.
  provider_error,
  /// A stored record cannot be decoded; the message names the record.
  corrupted_record,
  /// The store failed (I/O, server error); the message names the operation.
  store_error,
  /// An operation did not complete within its bound.
  timeout,
  /// The platform asked to slow down (HTTP 429, Telegram "Too Many
  /// Requests"): `platform_error::retry_after()` says how long to wait.
  retry_after,
  /// The platform refused the bot for this chat (HTTP 403: the user blocked
  /// the bot, the bot was removed from the group). Retrying does not help.
  forbidden,
  /// The platform rejected the request as malformed (HTTP 400: a chat that
  /// does not exist, text too long, a bad button). Retrying does not help.
  bad_request,
};

/// Returns the stable name of a code, e.g. "lease_lost".
std::string_view to_string(errc code) noexcept;

/// A botmesh failure thrown from synchronous APIs. `what()` is the full text.
class error : public std::runtime_error {
 public:
  error(errc code, const std::string& what);

  errc code() const noexcept {
    return code_;
  }

 private:
  errc code_;
};

/// An invalid argument or input field: the spec's RangeError/TypeError.
/// `field()` names the offending field ("duration", "chat", "text"...).
class invalid_argument_error : public error {
 public:
  invalid_argument_error(std::string field, const std::string& what);

  const std::string& field() const noexcept {
    return field_;
  }

 private:
  std::string field_;
};

/// The turn of a chat was lost; `reason()` is "superseded", "expired" or
/// "frozen" (the spec's LeaseLostError).
class lease_lost_error : public error {
 public:
  lease_lost_error(std::string key, std::string reason);

  const std::string& key() const noexcept {
    return key_;
  }

  const std::string& reason() const noexcept {
    return reason_;
  }

 private:
  std::string key_;
  std::string reason_;
};

/// A stored checkpoint that cannot be decoded (`errc::corrupted_record`,
/// naming its key). `revision()` is its stored revision when that much was
/// readable: a clear of the damaged record can then be conditional on it,
/// so it never removes a newer checkpoint another replica wrote meanwhile.
class corrupted_checkpoint_error : public error {
 public:
  corrupted_checkpoint_error(const std::string& what,
                             std::optional<std::uint64_t> revision);

  const std::optional<std::uint64_t>& revision() const noexcept {
    return revision_;
  }

 private:
  std::optional<std::uint64_t> revision_;
};

/// A message did not get its chat's turn (the spec's CoordinationUnavailableError).
class coordination_unavailable_error : public error {
 public:
  explicit coordination_unavailable_error(const std::string& what);
};

/// A platform (Telegram Bot API, Graph API) refused a request. `code()` is
/// `errc::retry_after` (429), `errc::forbidden` (403), `errc::bad_request`
/// (400, 404) or `errc::provider_error` (anything else: 5xx, a network
/// failure, an unreadable answer).
class platform_error : public error {
 public:
  /// What a `retry_after` wait holds back: every send of the bot (the
  /// platform's limit for the whole bot or number), or only sends to the
  /// chat the refused one went to (a limit per recipient, as WhatsApp's
  /// pair rate).
  enum class scope : std::uint8_t { bot, chat };

  platform_error(errc code, int http_status, std::string description,
                 std::chrono::milliseconds retry_after,
                 const std::string& what, scope wait_scope = scope::bot);

  /// The HTTP status of the platform's answer; 0 when none arrived.
  int http_status() const noexcept {
    return http_status_;
  }

  /// The platform's own words ("Forbidden: bot was blocked by the user").
  const std::string& description() const noexcept {
    return description_;
  }

  /// How long the platform asked to wait before retrying; zero unless
  /// `code()` is `errc::retry_after`.
  std::chrono::milliseconds retry_after() const noexcept {
    return retry_after_;
  }

  /// Whom the `retry_after` wait is for (see `scope`).
  scope wait_scope() const noexcept {
    return scope_;
  }

 private:
  int http_status_;
  std::string description_;
  std::chrono::milliseconds retry_after_;
  scope scope_;
};

/// `send()` on a standby replica of an exclusive transport (the spec's
/// ProviderNotLeaderError).
class provider_not_leader_error : public error {
 public:
  explicit provider_not_leader_error(std::string provider_id);
};

} // namespace botmesh
