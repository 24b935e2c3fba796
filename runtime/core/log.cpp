#include <botmesh/runtime/core/log.hpp>

#include <memory>
#include <utility>

#include <fmt/format.h>
#include <spdlog/logger.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <botmesh/runtime/core/internal/log_limiter.hpp>
#include <botmesh/runtime/core/internal/text.hpp>

namespace botmesh::log {

namespace {

std::atomic<level> the_level{level::warn};
std::atomic<bool> the_text{false};

// The sink and the default logger: replaced rarely, used under the mutex so
// records of different threads never interleave inside a line.
struct state {
  std::mutex mtx;
  sink custom;
  std::shared_ptr<spdlog::logger> fallback;
};

state& global() {
  static state st; // never destroyed before the last static user: see write()
  return st;
}

spdlog::level::level_enum to_spdlog(level l) {
  switch (l) {
    case level::trace:
      return spdlog::level::trace;
    case level::debug:
      return spdlog::level::debug;
    case level::info:
      return spdlog::level::info;
    case level::warn:
      return spdlog::level::warn;
    case level::error:
      return spdlog::level::err;
    case level::off:
      break;
  }
  return spdlog::level::off;
}

// One line: "[component] text key=value ...". Values with spaces or quotes
// are quoted so the line stays parseable as logfmt.
void append_field(std::string& out, std::string_view key, std::string_view v) {
  if (v.empty())
    return;
  out += ' ';
  out.append(key);
  out += '=';
  bool quote = v.find_first_of(" \"=\t\n") != std::string_view::npos;
  if (!quote) {
    out.append(v);
    return;
  }
  out += '"';
  for (char c : v) {
    if (c == '"' || c == '\\')
      out += '\\';
    if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  out += '"';
}

std::string render(const record& r) {
  std::string line;
  line.reserve(64 + r.text.size());
  line.append(to_string(r.severity));
  line.append(6 - to_string(r.severity).size(), ' '); // aligned: "warn  "
  line += "botmesh [";
  line.append(r.component);
  line += "] ";
  line.append(r.text);
  if (r.f) {
    append_field(line, "bot", r.f->bot);
    append_field(line, "chat", r.f->chat);
    append_field(line, "replica", r.f->replica);
    if (r.f->fence != 0)
      append_field(line, "fence", fmt::format("{}", r.f->fence));
    append_field(line, "message_id", r.f->message_id);
    append_field(line, "code", r.f->code);
  }
  return line;
}

} // namespace

std::string_view to_string(level l) noexcept {
  switch (l) {
    case level::trace:
      return "trace";
    case level::debug:
      return "debug";
    case level::info:
      return "info";
    case level::warn:
      return "warn";
    case level::error:
      return "error";
    case level::off:
      return "off";
  }
  return "off";
}

std::optional<level> parse_level(std::string_view s) noexcept {
  static constexpr std::pair<std::string_view, level> names[] = {
    {"trace", level::trace}, {"debug", level::debug}, {"info", level::info},
    {"warn", level::warn},   {"warning", level::warn}, {"error", level::error},
    {"off", level::off}};
  for (auto [name, l] : names)
    if (internal::ascii_iequals(s, name))
      return l;
  return std::nullopt;
}

void set_level(level l) noexcept {
  the_level.store(l, std::memory_order_relaxed);
}

level current_level() noexcept {
  return the_level.load(std::memory_order_relaxed);
}

bool enabled(level l) noexcept {
  auto cur = the_level.load(std::memory_order_relaxed);
  return l != level::off && cur != level::off && l >= cur;
}

void set_sink(sink s) {
  auto& st = global();
  std::lock_guard guard{st.mtx};
  st.custom = std::move(s);
}

void set_log_text(bool on) noexcept {
  the_text.store(on, std::memory_order_relaxed);
}

bool log_text() noexcept {
  return the_text.load(std::memory_order_relaxed);
}

std::string redact(std::string_view text) {
  if (log_text())
    return std::string{text};
  return fmt::format("<redacted {} bytes>", text.size());
}

void write(level l, std::string_view component, std::string_view text,
           const fields& f) noexcept {
  if (!enabled(l))
    return;
  try {
    record r{l, component, text, &f};
    auto& st = global();
    std::lock_guard guard{st.mtx};
    if (st.custom) {
      st.custom(r);
      return;
    }
    if (!st.fallback) {
      // stderr, unbuffered per line; UTC timestamps so replicas' lines sort.
      auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
      st.fallback = std::make_shared<spdlog::logger>("botmesh", sink);
      st.fallback->set_formatter(std::make_unique<spdlog::pattern_formatter>(
        "%Y-%m-%dT%H:%M:%S.%eZ %v", spdlog::pattern_time_type::utc));
      st.fallback->set_level(spdlog::level::trace); // the facade filters
    }
    st.fallback->log(to_spdlog(l), "{}", render(r));
    if (l >= level::warn)
      st.fallback->flush();
  } catch (...) {
    // A log line must never take the process down.
  }
}

} // namespace botmesh::log

namespace botmesh::internal {

bool log_limiter::allow(std::uint64_t& suppressed,
                    std::chrono::steady_clock::time_point now) {
  std::lock_guard guard{mtx_};
  if (last_ && now - *last_ < interval_) {
    ++dropped_;
    return false;
  }
  last_ = now;
  suppressed = dropped_;
  dropped_ = 0;
  return true;
}

bool log_limiter::reset() {
  std::lock_guard guard{mtx_};
  bool was = last_.has_value();
  last_.reset();
  dropped_ = 0;
  return was;
}

} // namespace botmesh::internal
