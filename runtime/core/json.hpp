#pragma once

#include <string>
#include <string_view>

namespace botmesh {

/// Appends `s` to `out` as a quoted JSON string, escaping as RFC 8259 asks.
/// Bytes that are not valid UTF-8 are replaced by U+FFFD so the output is
/// always valid JSON.
void append_json_string(std::string& out, std::string_view s);

/// Returns `s` as a quoted JSON string.
std::string json_quote(std::string_view s);

/// True when `text` is one complete, valid JSON document.
bool is_valid_json(std::string_view text) noexcept;

/// True when `text` is valid UTF-8.
bool is_valid_utf8(std::string_view text) noexcept;

} // namespace botmesh
