#include <botmesh/scheduler/cron.hpp>

#include <array>
#include <bit>
#include <cctype>
#include <charconv>
#include <vector>

#include <cctz/civil_time.h>
#include <cctz/time_zone.h>
#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>

namespace botmesh {

namespace {

struct field_spec {
  const char* id;   // invalid_argument_error::field()
  const char* name; // in messages
  int min;
  int max;
};

constexpr std::array<field_spec, 5> fields{{
  {"minute", "minute", 0, 59},
  {"hour", "hour", 0, 23},
  {"day_of_month", "day of month", 1, 31},
  {"month", "month", 1, 12},
  {"day_of_week", "day of week", 0, 7},
}};

[[noreturn]] void bad(const field_spec& f, std::string_view expr,
                      std::string_view why) {
  throw invalid_argument_error(
    f.id, fmt::format("invalid cron expression \"{}\": {} field: {}", expr,
                      f.name, why));
}

int parse_number(const field_spec& f, std::string_view expr,
                 std::string_view s) {
  if (s.empty())
    bad(f, expr, "empty value");
  for (char c : s) {
    if (std::isalpha(static_cast<unsigned char>(c)))
      bad(f, expr, fmt::format("names like \"{}\" are not supported, use "
                               "numbers",
                               s));
    if (!std::isdigit(static_cast<unsigned char>(c)))
      bad(f, expr, fmt::format("\"{}\" is not a number", s));
  }
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size() || v < f.min || v > f.max)
    bad(f, expr, fmt::format("{} is out of range {}-{}", s, f.min, f.max));
  return v;
}

// Parses one field into a bit set (bit i = value i).
std::uint64_t parse_field(const field_spec& f, std::string_view expr,
                          std::string_view text) {
  std::uint64_t bits = 0;
  size_t start = 0;
  for (;;) {
    auto comma = text.find(',', start);
    auto item = text.substr(start, comma == std::string_view::npos
                                     ? std::string_view::npos
                                     : comma - start);
    if (item.empty())
      bad(f, expr, "empty list item");
    int lo = f.min;
    int hi = f.max;
    int step = 1;
    auto slash = item.find('/');
    auto range = item.substr(0, slash);
    if (slash != std::string_view::npos) {
      auto step_text = item.substr(slash + 1);
      if (step_text.empty())
        bad(f, expr, fmt::format("\"{}\" has no step after '/'", item));
      for (char c : step_text)
        if (!std::isdigit(static_cast<unsigned char>(c)))
          bad(f, expr, fmt::format("step \"{}\" is not a number", step_text));
      auto [p, ec] = std::from_chars(step_text.data(),
                                     step_text.data() + step_text.size(), step);
      if (ec != std::errc{} || step == 0)
        bad(f, expr, fmt::format("step {} must be a positive number",
                                 step_text));
      if (range != "*" && range.find('-') == std::string_view::npos)
        bad(f, expr, fmt::format("\"{}\": a step needs '*' or a range before "
                                 "it (e.g. */15 or 1-30/5)",
                                 item));
    }
    if (range == "*") {
      // all values, from the field minimum
    } else if (auto dash = range.find('-'); dash != std::string_view::npos) {
      lo = parse_number(f, expr, range.substr(0, dash));
      hi = parse_number(f, expr, range.substr(dash + 1));
      if (lo > hi)
        bad(f, expr, fmt::format("range {} is inverted", range));
    } else {
      lo = hi = parse_number(f, expr, range);
    }
    for (int v = lo; v <= hi; v += step)
      bits |= std::uint64_t{1} << v;
    if (comma == std::string_view::npos)
      break;
    start = comma + 1;
  }
  return bits;
}

constexpr int days_in_month_max[13] = {0,  31, 29, 31, 30, 31, 30,
                                       31, 31, 30, 31, 30, 31};

} // namespace

cron_expr cron_expr::parse(std::string_view text) {
  std::vector<std::string_view> parts;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i])))
      ++i;
    auto j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j])))
      ++j;
    if (j > i)
      parts.push_back(text.substr(i, j - i));
    i = j;
  }
  if (!parts.empty() && parts[0].starts_with('@'))
    throw invalid_argument_error(
      "cron", fmt::format("invalid cron expression \"{}\": macros like {} are "
                          "not supported, write the five fields",
                          text, parts[0]));
  if (parts.size() != 5)
    throw invalid_argument_error(
      "cron", fmt::format("invalid cron expression \"{}\": expected 5 fields "
                          "(minute hour day-of-month month day-of-week), got "
                          "{}",
                          text, parts.size()));
  cron_expr e;
  e.text_ = std::string{text};
  e.minutes_ = parse_field(fields[0], text, parts[0]);
  e.hours_ = static_cast<std::uint32_t>(parse_field(fields[1], text, parts[1]));
  e.days_ = static_cast<std::uint32_t>(parse_field(fields[2], text, parts[2]));
  e.months_ = static_cast<std::uint16_t>(parse_field(fields[3], text, parts[3]));
  auto dow = parse_field(fields[4], text, parts[4]);
  if (dow & (1u << 7))
    dow = (dow | 1u) & 0x7F; // 7 is Sunday too
  e.weekdays_ = static_cast<std::uint8_t>(dow);
  e.hour_star_ = parts[1].starts_with('*');
  e.dom_star_ = parts[2].starts_with('*');
  e.dow_star_ = parts[4].starts_with('*');
  // When the day of month must match (AND rule), some chosen month must
  // have one of the chosen days, or the task could never run.
  if (e.dom_star_ || e.dow_star_) {
    bool possible = false;
    for (int m = 1; m <= 12 && !possible; ++m)
      if (e.month(m))
        for (int d = 1; d <= days_in_month_max[m] && !possible; ++d)
          possible = (e.days_ >> d) & 1;
    if (!possible)
      bad(fields[2], text, "no chosen month has any of the chosen days, so "
                           "the expression can never run");
  }
  return e;
}

bool cron_expr::day(int day_of_month, int weekday) const noexcept {
  bool dom = (days_ >> day_of_month) & 1;
  bool dow = (weekdays_ >> weekday) & 1;
  if (dom_star_ || dow_star_)
    return dom && dow;
  return dom || dow;
}

// -- time zones ---------------------------------------------------------------

namespace {

bool load_zone(std::string_view name, cctz::time_zone* tz) {
  if (name == "local") {
    *tz = cctz::local_time_zone();
    return true;
  }
  if (name == "UTC") {
    *tz = cctz::utc_time_zone();
    return true;
  }
  if (name.empty())
    return false;
  return cctz::load_time_zone(std::string{name}, tz);
}

cctz::time_zone zone_or_throw(std::string_view name) {
  cctz::time_zone tz;
  if (!load_zone(name, &tz))
    throw invalid_argument_error(
      "time_zone", fmt::format("unknown time zone \"{}\": use an IANA name "
                               "such as \"Europe/Madrid\", \"UTC\" or "
                               "\"local\"",
                               name));
  return tz;
}

using sec_tp = cctz::time_point<cctz::seconds>;

sec_tp to_seconds(time_point t) {
  return std::chrono::floor<cctz::seconds>(t);
}

time_point from_seconds(sec_tp t) {
  return std::chrono::time_point_cast<std::chrono::milliseconds>(t);
}

int weekday_number(const cctz::civil_day& d) {
  // cctz: monday = 0 ... sunday = 6; cron: sunday = 0.
  return (static_cast<int>(cctz::get_weekday(d)) + 1) % 7;
}

constexpr int horizon_days = 4 * 366 + 2;

} // namespace

struct cron_schedule::impl {
  cron_expr expr;
  std::string zone_name;
  cctz::time_zone tz;

  // First matching civil minute strictly after `after`, not after `limit`.
  std::optional<cctz::civil_minute>
  first_civil_after(const cctz::civil_second& after,
                    const cctz::civil_second& limit) const {
    cctz::civil_day day{after};
    cctz::civil_day last{limit};
    int h0 = after.hour();
    int m0 = after.minute() + 1; // strictly after: seconds never match
    for (; day <= last; ++day, h0 = 0, m0 = 0) {
      if (!expr.month(day.month())) {
        // Jump to the first day of the next month.
        day = cctz::civil_day{cctz::civil_month{day} + 1} - 1;
        continue;
      }
      if (!expr.day(day.day(), weekday_number(day)))
        continue;
      for (int h = h0; h < 24; ++h) {
        if (!expr.hour(h))
          continue;
        int m_from = h == h0 ? m0 : 0;
        if (m_from >= 60)
          continue;
        auto rest = expr.minute_bits() >> m_from;
        if (rest == 0)
          continue;
        int m = m_from + std::countr_zero(rest);
        cctz::civil_minute c{day.year(), day.month(), day.day(), h, m};
        if (cctz::civil_second{c} > limit)
          return std::nullopt;
        return c;
      }
    }
    return std::nullopt;
  }

  // Full search with the DST policy, for windows near an offset change.
  std::optional<time_point> general(time_point from,
                                    const cctz::civil_second& start) const {
    std::optional<sec_tp> best;
    std::optional<cctz::civil_day> best_day;
    auto consider = [&](sec_tp t) {
      if (from_seconds(t) > from && (!best || t < *best))
        best = t;
    };
    cctz::civil_day day = cctz::civil_day{start} - 1;
    cctz::civil_day end = cctz::civil_day{start} + horizon_days;
    for (; day <= end; ++day) {
      if (best) {
        if (!best_day)
          best_day = cctz::civil_day{cctz::convert(*best, tz)};
        if (day > *best_day + 1)
          break;
      }
      if (!expr.month(day.month()) || !expr.day(day.day(), weekday_number(day)))
        continue;
      for (int h = 0; h < 24; ++h) {
        if (!expr.hour(h))
          continue;
        for (int m = 0; m < 60; ++m) {
          if (!expr.minute(m))
            continue;
          cctz::civil_second cs{day.year(), day.month(), day.day(), h, m, 0};
          // Offsets differ by less than a day: a slot more than two days
          // before `start` cannot map after `from`.
          if (cs < start - 2 * 86400)
            continue;
          auto cl = tz.lookup(cs);
          switch (cl.kind) {
            case cctz::time_zone::civil_lookup::UNIQUE:
              consider(cl.pre);
              break;
            case cctz::time_zone::civil_lookup::SKIPPED:
              if (!expr.hour_is_wildcard())
                consider(cl.pre); // shifted forward by the gap
              break;
            case cctz::time_zone::civil_lookup::REPEATED:
              consider(cl.pre); // first pass
              if (expr.hour_is_wildcard())
                consider(cl.post); // and the second
              break;
          }
        }
      }
      best_day.reset();
    }
    if (!best)
      return std::nullopt;
    return from_seconds(*best);
  }

  std::optional<time_point> next_after(time_point from) const {
    auto from_s = to_seconds(from);
    auto start = cctz::convert(from_s, tz);
    auto horizon = start + horizon_days * 86400;
    // Fast path: no offset change from two days before `from` until the
    // candidate, so local time maps to instants by one fixed offset.
    cctz::time_zone::civil_transition tr;
    cctz::civil_second limit = horizon;
    if (tz.next_transition(from_s - std::chrono::hours(48), &tr))
      limit = std::min(limit, tr.from - 86400);
    if (limit > start) {
      if (auto c = first_civil_after(start, limit)) {
        auto offset = tz.lookup(from_s).offset;
        auto secs = (cctz::civil_second{*c} - cctz::civil_second{1970, 1, 1})
                    - offset;
        return from_seconds(sec_tp{cctz::seconds{secs}});
      }
      if (limit == horizon)
        return std::nullopt;
    }
    return general(from, start);
  }
};

cron_schedule::cron_schedule(std::string_view expr, std::string_view zone,
                             time_point now) {
  auto i = std::make_shared<impl>();
  i->expr = cron_expr::parse(expr);
  i->zone_name = std::string{zone};
  i->tz = zone_or_throw(zone);
  impl_ = std::move(i);
  if (!next_after(now))
    throw invalid_argument_error(
      "cron", fmt::format("cron expression \"{}\" never runs within four "
                          "years after {} in time zone {}",
                          expr, format_iso8601(now, zone), zone));
}

std::optional<time_point> cron_schedule::next_after(time_point from) const {
  return impl_->next_after(from);
}

const cron_expr& cron_schedule::expr() const noexcept {
  return impl_->expr;
}

const std::string& cron_schedule::zone() const noexcept {
  return impl_->zone_name;
}

std::string cron_schedule::spec() const {
  if (impl_->zone_name == "local")
    return impl_->expr.text();
  return fmt::format("TZ={} {}", impl_->zone_name, impl_->expr.text());
}

void validate_time_zone(std::string_view zone) {
  zone_or_throw(zone);
}

std::string format_iso8601(time_point t, std::string_view zone) {
  auto tz = zone_or_throw(zone);
  auto s = to_seconds(t);
  if (zone == "UTC")
    return cctz::format("%Y-%m-%dT%H:%M:%SZ", s, tz);
  return cctz::format("%Y-%m-%dT%H:%M:%S%Ez", s, tz);
}

time_point parse_iso8601(std::string_view text, std::string_view zone) {
  auto tz = zone_or_throw(zone);
  std::string in{text};
  sec_tp s;
  cctz::detail::femtoseconds fs;
  for (const char* fmt_str :
       {"%Y-%m-%dT%H:%M:%E*S%Ez", "%Y-%m-%dT%H:%M:%E*SZ", "%Y-%m-%dT%H:%M%Ez",
        "%Y-%m-%dT%H:%MZ", "%Y-%m-%dT%H:%M:%E*S", "%Y-%m-%dT%H:%M"}) {
    std::string f = fmt_str;
    bool utc = f.back() == 'Z';
    if (cctz::detail::parse(f, in, utc ? cctz::utc_time_zone() : tz, &s, &fs))
      return from_seconds(s)
             + std::chrono::duration_cast<std::chrono::milliseconds>(fs);
  }
  throw invalid_argument_error(
    "from", fmt::format("invalid ISO-8601 time \"{}\": expected e.g. "
                        "2026-03-29T01:30:00Z or 2026-03-29T01:30:00+01:00",
                        text));
}

std::string to_iso_utc(time_point t) {
  auto ms = to_unix_ms(t) % 1000;
  if (ms < 0)
    ms += 1000;
  return fmt::format("{}.{:03}Z",
                     cctz::format("%Y-%m-%dT%H:%M:%S", to_seconds(t),
                                  cctz::utc_time_zone()),
                     ms);
}

} // namespace botmesh
