#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <botmesh/runtime/core/clock.hpp>

namespace botmesh {

/// A parsed five-field cron expression:
///
///   ┌───── minute        0-59
///   │ ┌───── hour        0-23
///   │ │ ┌───── day of month 1-31
///   │ │ │ ┌───── month   1-12
///   │ │ │ │ ┌───── day of week 0-7 (0 and 7 are Sunday)
///   * * * * *
///
/// Each field is `*`, a number, a range `1-5`, a step `*/15` or `1-30/5`, or
/// a comma list of those. A step over `*` counts from the field's minimum.
/// Day rule of standard cron: when both day fields are restricted, a day
/// matches if either does; when one starts with `*` (also `*/2`), both must.
///
/// `parse` throws `invalid_argument_error` whose `field()` names the bad
/// field ("minute", "hour", "day_of_month", "month", "day_of_week") or is
/// "cron" for the expression as a whole: not five fields, names (`mon`,
/// `jan`), macros (`@daily`), values out of range, a step of 0, an inverted
/// range, or a day of month that no chosen month has (`0 0 30 2 *`).
class cron_expr {
 public:
  static cron_expr parse(std::string_view text);

  const std::string& text() const noexcept {
    return text_;
  }

  bool minute(int m) const noexcept {
    return (minutes_ >> m) & 1;
  }
  bool hour(int h) const noexcept {
    return (hours_ >> h) & 1;
  }
  bool month(int m) const noexcept {
    return (months_ >> m) & 1;
  }
  /// Applies the day rule to a calendar date (`weekday` 0 = Sunday).
  bool day(int day_of_month, int weekday) const noexcept;

  /// True when the hour field starts with `*`: the DST policy skips such
  /// slots inside a gap and runs them in both passes of an overlap.
  bool hour_is_wildcard() const noexcept {
    return hour_star_;
  }

  std::uint64_t minute_bits() const noexcept {
    return minutes_;
  }
  std::uint32_t hour_bits() const noexcept {
    return hours_;
  }
  std::uint32_t day_bits() const noexcept {
    return days_;
  }
  std::uint16_t month_bits() const noexcept {
    return months_;
  }
  std::uint8_t weekday_bits() const noexcept {
    return weekdays_;
  }
  /// True when a day must match both day fields (one of them starts with
  /// `*`), false when either suffices.
  bool day_rule_is_and() const noexcept {
    return dom_star_ || dow_star_;
  }

 private:
  std::string text_;
  std::uint64_t minutes_ = 0; // bit m: minute m
  std::uint32_t hours_ = 0;   // bit h: hour h
  std::uint32_t days_ = 0;    // bit d: day of month d (1-31)
  std::uint16_t months_ = 0;  // bit m: month m (1-12)
  std::uint8_t weekdays_ = 0; // bit d: weekday d (0 = Sunday)
  bool dom_star_ = false;
  bool dow_star_ = false;
  bool hour_star_ = false;
};

/// A cron expression read in a time zone: computes run instants.
///
/// DST policy (identical on every replica, run times strictly increase):
/// - gap (local time skipped): a fixed hour runs once, shifted forward by
///   the gap (02:30 -> 03:30); a slot that lands on another slot runs once.
///   A wildcard hour (`*`, `*/2`) skips the slots inside the gap.
/// - overlap (local time repeated): a fixed hour runs once, at the first
///   occurrence; a wildcard hour runs in both passes.
/// - a transition at midnight: `0 0 * * *` runs at 01:00 that day; day of
///   month and day of week stay those of the calendar.
/// The search looks up to 41 years ahead: every expression that runs at all
/// has its next run within that (the longest gap, 40 years, is Feb 29 on
/// one weekday).
///
/// Cost: the search runs on the local calendar first (a month at a time
/// with bit masks, so `0 0 29 2 *` costs about as much as `0 9 * * *`) and
/// resolves only the candidate it finds in the zone. Away from an offset
/// change that is one transition query; near one, the search goes through
/// the stretches of constant offset around it (at most a few). Copies share
/// the loaded zone.
class cron_schedule {
 public:
  /// Parses `expr` and loads `zone`: an IANA name ("Europe/Madrid"), "UTC"
  /// or "local" (the process zone, from TZ or /etc/localtime). Throws
  /// `invalid_argument_error`: see `cron_expr::parse`, field "time_zone"
  /// for an unknown zone, and field "cron" when the expression has no run
  /// within 41 years after `now` ("never runs ...").
  cron_schedule(std::string_view expr, std::string_view zone = "local",
                time_point now = clock::system().now());

  /// The first run instant strictly after `from`, or nothing when there is
  /// none within 41 years.
  std::optional<time_point> next_after(time_point from) const;

  /// How many run instants fall in (`after`, `until`]: the ones
  /// `next_after` would give one by one, counted arithmetically (by civil
  /// day, with the DST policy applied per offset change), so a missed
  /// stretch of years costs about a microsecond per day, not one step per
  /// slot.
  std::uint64_t count_between(time_point after, time_point until) const;

  const cron_expr& expr() const noexcept;

  /// The zone name as given ("local" stays "local").
  const std::string& zone() const noexcept;

  /// The stored form of the spec: `<cron>`, or `TZ=<zone> <cron>` when a
  /// zone other than "local" is set, so a changed zone reschedules.
  std::string spec() const;

  struct impl;

 private:
  std::shared_ptr<const impl> impl_;
};

/// Checks that `zone` is "local", "UTC" or a known IANA zone; throws
/// `invalid_argument_error` (field "time_zone") otherwise.
void validate_time_zone(std::string_view zone);

/// Formats an instant as ISO-8601 with the zone's offset, e.g.
/// "2026-03-29T03:00:00+02:00" (seconds precision; "Z" for UTC offsets when
/// `zone` is "UTC").
std::string format_iso8601(time_point t, std::string_view zone);

/// The years `parse_iso8601` accepts (in UTC): four-digit years from 1.
inline constexpr long long min_iso_year = 1;
inline constexpr long long max_iso_year = 9999;

/// Parses ISO-8601 "YYYY-MM-DDTHH:MM[:SS[.fff]]" followed by "Z" or
/// "+HH:MM"/"-HH:MM", or without offset (then read in `zone`). Throws
/// `invalid_argument_error` (field "from") for anything else, and for an
/// instant whose UTC year is outside `min_iso_year`..`max_iso_year`.
time_point parse_iso8601(std::string_view text, std::string_view zone = "UTC");

/// ISO-8601 in UTC with milliseconds, as JavaScript's toISOString():
/// "2026-03-29T01:00:00.000Z" (occurrence keys use it).
std::string to_iso_utc(time_point t);

} // namespace botmesh
