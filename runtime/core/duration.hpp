#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace botmesh {

/// Parses a human duration into milliseconds.
///
/// Accepted forms (whitespace around the number and unit is allowed):
///   "250"  or "250ms"                    -> 250 ms (a bare number is milliseconds)
///   "30s", "30 sec", "30 second(s)"      -> 30'000 ms
///   "5m",  "5 min", "5 minute(s)"        -> 300'000 ms
///   "2h",  "2 hour(s)"                   -> 7'200'000 ms
///   "1d",  "1 day(s)"                    -> 86'400'000 ms
/// Units are case-insensitive; the number is a non-negative integer or decimal
/// ("1.5s" = 1500 ms; a result with a fraction of a millisecond is rejected).
///
/// Throws `botmesh::invalid_argument_error` (field "duration") whose message
/// quotes the input for anything else: empty text, a negative number, an
/// unknown unit, trailing garbage, or more than 100 years (36500d): a
/// deadline `now + d` must fit the nanosecond clocks timers use.
std::chrono::milliseconds parse_duration(std::string_view text);

/// Formats milliseconds the shortest exact way: "250ms", "30s", "5m", "2h", "1d".
std::string format_duration(std::chrono::milliseconds ms);

/// A duration option value: built from a `std::chrono` duration or text that
/// `parse_duration` accepts. Lets options structs take `.lease = "15s"` or
/// `.lease = 15s` alike. A bare integer does not compile: `.lease = 15`
/// would have meant 15 ms where 15 s was meant (write `15s`, `15000ms` or
/// "15s"). Construction from text throws exactly what `parse_duration`
/// throws; negative chrono values, and those over 100 years, are rejected
/// (also those no count of milliseconds holds, as `seconds::max()`); a
/// chrono value finer than milliseconds is first cut to whole
/// milliseconds, toward zero (`-500us` is 0, `1500us` is 1 ms).
class duration {
 public:
  constexpr duration() noexcept = default;

  template <class Rep, class Period>
  duration(std::chrono::duration<Rep, Period> d)
    : duration(std::chrono::duration<double, std::milli>(d).count(), nullptr) {
    // nop: converted as a double, which no count overflows; checked there
  }

  /// Unit-less numbers are refused at compile time (see above).
  template <class Int,
            class = std::enable_if_t<std::is_integral_v<Int>
                                     || std::is_floating_point_v<Int>>>
  duration(Int) = delete;

  duration(std::string_view text) : ms_(parse_duration(text)) {
    // nop
  }

  duration(const char* text) : duration(std::string_view{text}) {
    // nop
  }

  duration(const std::string& text) : duration(std::string_view{text}) {
    // nop
  }

  std::chrono::milliseconds ms() const noexcept {
    return ms_;
  }

  std::int64_t count() const noexcept {
    return ms_.count();
  }

  operator std::chrono::milliseconds() const noexcept {
    return ms_;
  }

  friend bool operator==(const duration&, const duration&) = default;

 private:
  duration(double ms, std::nullptr_t);

  std::chrono::milliseconds ms_{0};
};

} // namespace botmesh
