#include <botmesh/runtime/core/duration.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/internal/text.hpp>

namespace botmesh {

namespace {

struct unit {
  std::string_view name;
  std::int64_t ms;
};

// Every spelling a user may write; matched case-insensitively.
constexpr std::array<unit, 20> units{{
  {"ms", 1},          {"millisecond", 1}, {"milliseconds", 1},
  {"s", 1000},        {"sec", 1000},      {"secs", 1000},
  {"second", 1000},   {"seconds", 1000},  {"m", 60'000},
  {"min", 60'000},    {"mins", 60'000},   {"minute", 60'000},
  {"minutes", 60'000}, {"h", 3'600'000},  {"hour", 3'600'000},
  {"hours", 3'600'000}, {"hr", 3'600'000}, {"d", 86'400'000},
  {"day", 86'400'000}, {"days", 86'400'000},
}};


[[noreturn]] void reject(std::string_view text, std::string_view why) {
  throw invalid_argument_error(
    "duration", fmt::format("invalid duration \"{}\": {} (expected a number of "
                            "milliseconds or e.g. '250ms', '30s', '5m', '2h', "
                            "'1d', '30 seconds')",
                            text, why));
}

bool is_space(char c) {
  return c == ' ' || c == '\t';
}

} // namespace

// The longest duration accepted: 100 years (36500 days).
constexpr std::int64_t max_duration_ms = 36'500LL * 86'400'000LL;

std::chrono::milliseconds parse_duration(std::string_view text) {
  std::string_view s = text;
  while (!s.empty() && is_space(s.front()))
    s.remove_prefix(1);
  while (!s.empty() && is_space(s.back()))
    s.remove_suffix(1);
  if (s.empty())
    reject(text, "empty");
  if (s.front() == '-')
    reject(text, "negative");
  size_t i = 0;
  std::int64_t whole = 0;
  bool digits = false;
  constexpr auto max = std::numeric_limits<std::int64_t>::max();
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    int d = s[i] - '0';
    if (whole > (max - d) / 10)
      reject(text, "too large");
    whole = whole * 10 + d;
    digits = true;
    ++i;
  }
  // Up to 9 fractional digits, kept exactly as a numerator over 10^n.
  std::int64_t frac = 0;
  std::int64_t frac_den = 1;
  if (i < s.size() && s[i] == '.') {
    ++i;
    bool frac_digits = false;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      if (frac_den >= 1'000'000'000)
        reject(text, "too many decimals");
      frac = frac * 10 + (s[i] - '0');
      frac_den *= 10;
      frac_digits = true;
      ++i;
    }
    if (!frac_digits)
      reject(text, "a decimal point needs digits after it");
  }
  if (!digits)
    reject(text, "it does not start with a number");
  while (i < s.size() && is_space(s[i]))
    ++i;
  std::string_view name = s.substr(i);
  std::int64_t per = 1;
  if (!name.empty()) {
    bool found = false;
    for (auto& u : units) {
      if (internal::ascii_iequals(name, u.name)) {
        per = u.ms;
        found = true;
        break;
      }
    }
    if (!found)
      reject(text, fmt::format("unknown unit \"{}\"", name));
  }
  if (whole > max / per)
    reject(text, "too large");
  std::int64_t ms = whole * per;
  if (frac != 0) {
    // frac/frac_den * per must be a whole number of milliseconds. No
    // overflow: frac < 10^9 and per <= 8.64e7, so num < 8.64e16.
    std::int64_t num = frac * per;
    if (num % frac_den != 0)
      reject(text, "not a whole number of milliseconds");
    auto extra = static_cast<std::int64_t>(num / frac_den);
    if (ms > max - extra)
      reject(text, "too large");
    ms += extra;
  }
  if (ms > max_duration_ms)
    reject(text, "too large: at most 36500d (100 years)");
  return std::chrono::milliseconds{ms};
}

std::string format_duration(std::chrono::milliseconds ms) {
  auto n = ms.count();
  if (n != 0) {
    if (n % 86'400'000 == 0)
      return fmt::format("{}d", n / 86'400'000);
    if (n % 3'600'000 == 0)
      return fmt::format("{}h", n / 3'600'000);
    if (n % 60'000 == 0)
      return fmt::format("{}m", n / 60'000);
    if (n % 1000 == 0)
      return fmt::format("{}s", n / 1000);
  }
  return fmt::format("{}ms", n);
}

// `ms` as a double: a chrono count converted with duration_cast could
// overflow (seconds::max() wrapped to -1000 ms; a large count of hours to
// a few minutes, accepted).
duration::duration(double ms, std::nullptr_t) {
  if (std::isnan(ms))
    throw invalid_argument_error("duration", "invalid duration: not a number");
  ms = std::trunc(ms); // whole milliseconds, toward zero (as duration_cast)
  if (ms < 0)
    throw invalid_argument_error(
      "duration", fmt::format("invalid duration {:.0f}ms: negative",
                              std::min(ms, -1.0)));
  if (ms > static_cast<double>(max_duration_ms))
    throw invalid_argument_error(
      "duration", fmt::format("invalid duration {:.0f}ms: at most 36500d (100 "
                              "years)",
                              ms));
  // Below 2^53, so the double holds the whole milliseconds exactly.
  ms_ = std::chrono::milliseconds{static_cast<std::int64_t>(ms)};
}

} // namespace botmesh
