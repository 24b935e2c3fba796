#pragma once

// Internal: Meta webhook payloads -> inbound messages and status events,
// outgoing messages -> Graph API bodies. Fuzzed by
// tests/fuzz/meta_payload_fuzz.cpp.

#include <string>
#include <string_view>
#include <vector>

#include <botmesh/providers/meta/meta_webhook.hpp>
#include <botmesh/runtime/core/message.hpp>

namespace botmesh::meta::internal {

struct parsed_payload {
  std::vector<inbound_message> messages{};
  /// WhatsApp: the phone number id each message arrived on (same order).
  std::vector<std::string> phone_number_ids{};
  std::vector<status_event> statuses{};
  /// WhatsApp: `value.errors[]`, errors not tied to a message, described.
  std::vector<std::string> errors{};
  /// Changes, events and message types the bot does not handle.
  std::size_t unknown = 0;
};

/// Throws `invalid_argument_error` (field "body") for anything but a JSON
/// object with an `entry` array; entries and items of unexpected shape are
/// counted in `unknown`, not thrown.
parsed_payload parse_payload(std::string_view json, platform kind,
                             std::string_view provider);

/// As above, reading `json` in place when its spare capacity holds the
/// parser's padding (64 bytes; the HTTP server leaves it after a request
/// body) instead of copying it into a padded buffer.
parsed_payload parse_payload_in_place(const std::string& json, platform kind,
                                      std::string_view provider);

/// A WhatsApp chat id as the webhook writes it: the user's wa_id, or
/// `<wa_id>@<phone_number_id>` for a message that arrived on a business
/// number other than `webhook_options::phone_number_id` (or when none is
/// configured), so a reply goes out from the number it answers.
struct whatsapp_address {
  std::string_view to{};
  std::string_view phone_number_id{}; ///< empty: the configured one
};

/// Splits `chat` at its last '@' (a wa_id has none).
whatsapp_address split_whatsapp_chat(std::string_view chat) noexcept;

/// The Graph API request body that sends `msg` (validated first; throws
/// `invalid_argument_error` naming the field, "buttons" over the platform's
/// limits: WhatsApp 10 rows, titles of 20/24 characters; Messenger 13).
std::string to_graph_body(const outgoing_message& msg, platform kind);

/// Throws the `platform_error` a Graph API error answer stands for;
/// returns the body for a 2xx.
std::string check_graph_answer(int status, std::string_view body);

} // namespace botmesh::meta::internal
