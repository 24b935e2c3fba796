#pragma once

// What the example bots read from their environment, and how they make
// their bot.

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include <botmesh/runtime/bot.hpp>
#include <botmesh/runtime/core/error.hpp>

namespace example {

/// The variable's value; `fallback` when it is unset or empty.
inline std::string env(const char* name, const char* fallback = "") {
  auto* v = std::getenv(name);
  return v && *v ? v : fallback;
}

/// PORT (default 8080; 0: any free port). Anything but a number from 0 to
/// 65535 throws `invalid_argument_error` (field "PORT"): "abc" must not
/// become 0 (a free port nobody knows) nor 70000 wrap to 4464.
inline std::uint16_t port_from_env() {
  auto text = env("PORT", "8080");
  unsigned value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || value > 65535)
    throw botmesh::invalid_argument_error(
      "PORT", fmt::format("PORT must be a number from 0 to 65535, got \"{}\"",
                          text));
  return static_cast<std::uint16_t>(value);
}

/// The bot made from `opts`; nothing when it refuses them (it checks them
/// when made: a zero coordination wait, say), after printing
/// "<name>: <why> (field <option>)" to stderr. The examples then exit 2.
inline std::optional<botmesh::bot> make_bot(const char* name,
                                            botmesh::bot_options opts) {
  try {
    return std::optional<botmesh::bot>{std::in_place, std::move(opts)};
  } catch (const botmesh::invalid_argument_error& e) {
    std::fprintf(stderr, "%s: %s (field %s)\n", name, e.what(), e.field().c_str());
    return std::nullopt;
  }
}

} // namespace example
