#pragma once

// botmesh's logging facade: levels, structured fields and one process-wide
// sink. The default sink is spdlog writing to stderr (spdlog stays inside
// log.cpp); an application may install its own sink instead.
//
//   botmesh::log::write(log::level::warn, "scheduler", "leader lease failed",
//                       {.bot = "shop", .replica = "r1"});
//
// A line of the default sink:
//   2026-11-30T11:40:02.120Z warn  [scheduler] leader lease failed bot=shop replica=r1
//
// Message text is never logged unless `set_log_text(true)`: `redact()` gives
// what may be written for a user's text.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace botmesh::log {

/// Severity, lowest first. `off` disables logging.
enum class level : std::uint8_t { trace, debug, info, warn, error, off };

/// "trace" ... "off".
std::string_view to_string(level l) noexcept;

/// Parses "trace", "debug", "info", "warn" (or "warning"), "error", "off"
/// (ASCII case ignored); nothing for anything else.
std::optional<level> parse_level(std::string_view s) noexcept;

/// Structured fields of one record; empty strings (and fence 0) are left out.
struct fields {
  std::string_view bot{};     ///< bot_options::bot_id
  std::string_view chat{};    ///< chat key (provider:chat[:participant])
  std::string_view replica{}; ///< coordinator replica id / durable instance
  std::uint64_t fence = 0;    ///< the turn's fence, with coordination
  std::string_view message_id{};
  std::string_view code{};    ///< an errc name, for error events
};

/// One record as a sink sees it. Views are valid during the sink call only.
struct record {
  level severity = level::info;
  std::string_view component{}; ///< "bot", "scheduler", "redis", "http"...
  std::string_view text{};
  const fields* f = nullptr;
};

/// A sink gets every record at or above the level, from any thread (calls
/// are serialized by the facade). It must not call back into the logger.
using sink = std::function<void(const record&)>;

/// The process-wide level; `warn` by default (errors and warnings).
void set_level(level l) noexcept;
level current_level() noexcept;

/// True when a record of `l` would be written: one relaxed atomic load, so
/// callers test it before formatting.
bool enabled(level l) noexcept;

/// Replaces the sink (an empty function restores the default stderr sink).
void set_sink(sink s);

/// Whether user message text may appear in logs (false by default).
void set_log_text(bool on) noexcept;
bool log_text() noexcept;

/// `text` itself when `log_text()`, else "<redacted N bytes>".
std::string redact(std::string_view text);

/// Writes one record if `l` is enabled. Never throws (a failing sink is
/// ignored). Cost: nothing when disabled; else one mutex and the sink.
void write(level l, std::string_view component, std::string_view text,
           const fields& f = {}) noexcept;

inline void error(std::string_view component, std::string_view text,
                  const fields& f = {}) noexcept {
  write(level::error, component, text, f);
}

inline void warn(std::string_view component, std::string_view text,
                 const fields& f = {}) noexcept {
  write(level::warn, component, text, f);
}

inline void info(std::string_view component, std::string_view text,
                 const fields& f = {}) noexcept {
  write(level::info, component, text, f);
}

inline void debug(std::string_view component, std::string_view text,
                  const fields& f = {}) noexcept {
  write(level::debug, component, text, f);
}

} // namespace botmesh::log
