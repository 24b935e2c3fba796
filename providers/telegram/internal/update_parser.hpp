#pragma once

// Internal: Telegram Bot API updates -> inbound messages (simdjson stays in
// the .cpp). Used by the webhook and the long-polling providers and fuzzed
// by tests/fuzz/telegram_update_fuzz.cpp.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <botmesh/runtime/core/message.hpp>

namespace botmesh::telegram::internal {

enum class update_kind : std::uint8_t {
  message,
  edited_message,
  callback_query,
  /// Valid JSON with an update_id but a kind the bot does not handle
  /// (channel posts, polls, inline queries...): answered 200, counted.
  unknown,
  /// In a getUpdates batch: an item that does not parse (a message without
  /// its chat...). `unknown_kind` holds why; `update_id` is 0 when the item
  /// had none (or one out of range). The others of the batch parse on their own.
  malformed,
};

struct parsed_update {
  std::int64_t update_id = 0;
  update_kind kind = update_kind::unknown;
  /// For `unknown`: the update's field that names its kind ("poll"...);
  /// for `malformed`: what was wrong.
  std::string unknown_kind{};
  inbound_message message{};
  /// For `callback_query`: the id to answer with answerCallbackQuery.
  std::string callback_query_id{};
};

/// Parses one update object. `provider` fills `message.provider`; the raw
/// update goes to `message.raw` when `keep_raw`. With `username` (the bot's
/// @name without '@'), a command addressed to another bot ("/start@other")
/// leaves `message.command` empty. Throws
/// `invalid_argument_error` (field "body") for anything that is not a JSON
/// object, (field "update_id") for an update_id missing, not an integer or
/// outside 0..2^63-2 (its successor is the next offset), and (field named
/// after the JSON path)
/// for a known kind missing what it needs (a message without chat.id).
parsed_update parse_update(std::string_view json, std::string_view provider,
                           bool keep_raw = true,
                           std::string_view username = {});

/// As above, reading `json` in place when its spare capacity holds the
/// parser's padding (64 bytes; the HTTP server leaves it after a request
/// body) instead of copying it into a padded buffer.
parsed_update parse_update_in_place(const std::string& json, std::string_view provider,
                           bool keep_raw = true,
                           std::string_view username = {});

/// Parses a getUpdates answer's `result` array (the raw JSON of the array).
/// Throws (field "result") when the answer is not a JSON array; an item that
/// does not parse becomes a `malformed` update, so one bad update cannot
/// hold the offset (and every update after it) back forever.
std::vector<parsed_update> parse_updates(std::string_view result_json,
                                         std::string_view provider,
                                         std::string_view username = {});

/// The first "update_id" of a getUpdates answer too broken to parse (asked
/// with limit 1, its one update's id): a valid id, or nothing. Telegram
/// writes update_id first in each update; a plain scan finds it where a
/// parser stops at the damage.
std::optional<std::int64_t> first_update_id(std::string_view raw);

} // namespace botmesh::telegram::internal
