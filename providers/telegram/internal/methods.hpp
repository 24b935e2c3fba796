#pragma once

// Internal: outgoing messages as Bot API method calls, and Bot API error
// answers as typed errors.

#include <cstdint>
#include <string>
#include <string_view>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/message.hpp>

namespace botmesh::telegram::internal {

/// A chat id as botmesh writes it: `chat_id`, or `chat_id/thread_id` for a
/// forum topic (update_parser fills it so; the same text addresses a send).
struct chat_address {
  std::string_view chat_id{};
  std::string_view thread_id{}; ///< empty outside a topic

  /// A group or supergroup (negative ids): its own flood limits, which its
  /// topics share.
  bool group() const noexcept {
    return !chat_id.empty() && chat_id.front() == '-';
  }
};

/// Splits `chat` at its last '/' when what follows is a positive integer;
/// otherwise the whole text is the chat id.
chat_address split_chat(std::string_view chat) noexcept;

/// `chat_id/thread_id`.
std::string topic_chat(std::string_view chat_id, std::string_view thread_id);

/// The bot's numeric id: its token up to ':'.
inline std::string bot_id(std::string_view token) {
  return std::string{token.substr(0, token.find(':'))};
}

struct method_call {
  std::string method{}; ///< "sendMessage", "sendPhoto"...
  std::string body{};   ///< the JSON parameters
};

/// The method call that sends `msg` (a topic chat adds `message_thread_id`;
/// validated first: throws
/// `invalid_argument_error` naming the field, or "buttons" for callback
/// data over Telegram's 64 bytes).
method_call to_method_call(const outgoing_message& msg);

/// The same call as a webhook answer: the parameters with a "method" field.
std::string to_webhook_answer(const method_call& call);

/// The longest retry_after (seconds) a 429 is waited out for; a larger one
/// is taken as this.
inline constexpr std::int64_t max_retry_after_seconds = 86'400;

/// An answer that is no JSON object (an integer past 64 bits, invalid
/// UTF-8, nesting past simdjson's depth...): a `platform_error`
/// (`errc::provider_error`) that keeps the body, so a poller can find the
/// update it cannot read and step past it.
class unreadable_answer : public platform_error {
 public:
  unreadable_answer(int status, std::string body, const std::string& what)
    : platform_error(errc::provider_error, status, {},
                     std::chrono::milliseconds{0}, what),
      body_(std::move(body)) {
    // nop
  }

  const std::string& body() const noexcept {
    return body_;
  }

 private:
  std::string body_;
};

/// Throws the `platform_error` an answer with ok=false stands for (see
/// bot_api.hpp; a 429's retry_after is clamped to 1..max_retry_after_seconds);
/// returns the raw JSON of `result` for ok=true. `status` is the HTTP status.
/// A body that cannot be read throws `unreadable_answer`, naming why.
std::string check_answer(std::string_view method, int status,
                         std::string_view body);

} // namespace botmesh::telegram::internal
