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
      // A step wider than the field can only ever select its first value;
      // larger ones (near INT_MAX) would also overflow `v += step` below.
      auto span = f.max - f.min + 1;
      if (ec != std::errc{} || step == 0 || step > span)
        bad(f, expr, fmt::format("step {} must be a number from 1 to {}",
                                 step_text, span));
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

namespace {

// Slots of one matching civil day at or after minute-of-day (h0, m0).
std::uint64_t slots_from(const cron_expr& e, int h0, int m0) {
  auto per_hour = static_cast<std::uint64_t>(std::popcount(e.minute_bits()));
  std::uint64_t n = 0;
  if (h0 < 24 && e.hour(h0) && m0 < 60)
    n += std::popcount(e.minute_bits() >> m0);
  for (int h = h0 + 1; h < 24; ++h)
    if (e.hour(h))
      n += per_hour;
  return n;
}

bool day_matches(const cron_expr& e, const cctz::civil_day& d) {
  return e.month(d.month()) && e.day(d.day(), weekday_number(d));
}

// Civil slots s with a < s <= b (slots sit on whole minutes).
std::uint64_t civil_slots(const cron_expr& e, const cctz::civil_second& a,
                          const cctz::civil_second& b) {
  if (b <= a)
    return 0;
  // First slot strictly after a: the next whole minute.
  auto from = cctz::civil_minute{a} + 1;
  auto to = cctz::civil_minute{b}; // slots <= b
  if (to < from)
    return 0;
  auto per_day = slots_from(e, 0, 0);
  std::uint64_t n = 0;
  cctz::civil_day d{from};
  cctz::civil_day last{to};
  for (; d <= last; ++d) {
    if (!e.month(d.month())) {
      d = cctz::civil_day{cctz::civil_month{d} + 1} - 1; // next month
      continue;
    }
    if (!e.day(d.day(), weekday_number(d)))
      continue;
    std::uint64_t k = per_day;
    if (d == cctz::civil_day{from})
      k = slots_from(e, from.hour(), from.minute());
    if (d == last) {
      // Remove the slots after `to` on the last day.
      auto after = slots_from(e, to.hour(), to.minute() + 1);
      k -= std::min(k, after);
    }
    n += k;
  }
  return n;
}

} // namespace

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

std::uint64_t cron_schedule::count_between(time_point after,
                                           time_point until) const {
  auto& i = *impl_;
  if (until <= after)
    return 0;
  // Walks near the ends (where an instant may fall in a gap or an overlap)
  // and counts the middle arithmetically: whole civil days by their
  // matching hours and minutes, then each offset change by the DST policy.
  constexpr auto day = std::chrono::hours{24};
  auto walk = [&](time_point from, time_point to) {
    std::uint64_t n = 0;
    for (auto t = next_after(from); t && *t <= to; t = next_after(*t))
      ++n;
    return n;
  };
  // A middle boundary must not sit within a day of an offset change, so
  // that it maps to one civil time and the change is counted once.
  auto near_transition = [&](time_point t) {
    cctz::time_zone::civil_transition tr;
    auto s = to_seconds(t - day);
    return i.tz.next_transition(s, &tr)
           && i.tz.lookup(tr.to).post <= to_seconds(t + day);
  };
  auto a = after + day;
  while (a < until && near_transition(a))
    a += day;
  auto b = until - day;
  while (b > a && near_transition(b))
    b -= day;
  if (b <= a + day)
    return walk(after, until);
  auto& e = i.expr;
  std::uint64_t n = walk(after, a) + walk(b, until);
  n += civil_slots(e, cctz::convert(to_seconds(a), i.tz),
                   cctz::convert(to_seconds(b), i.tz));
  // Offset changes inside (a, b]: slots inside a gap were counted once but
  // run once shifted (a fixed hour) unless they land on another slot, or
  // never (a wildcard hour); slots inside an overlap were counted once and
  // run twice with a wildcard hour.
  cctz::time_zone::civil_transition tr;
  auto at = to_seconds(a);
  while (i.tz.next_transition(at, &tr)) {
    // The instant the new offset starts: `to` read in the new offset.
    auto instant = i.tz.lookup(tr.to).post;
    if (instant > to_seconds(b) || instant <= at)
      break;
    at = instant;
    if (tr.to > tr.from) { // gap [from, to)
      auto gap = tr.to - tr.from;
      for (auto m = cctz::civil_minute{tr.from - 1} + 1;
           cctz::civil_second{m} < tr.to; ++m) {
        if (!day_matches(e, cctz::civil_day{m}) || !e.hour(m.hour())
            || !e.minute(m.minute()))
          continue;
        if (e.hour_is_wildcard()) {
          --n;
          continue;
        }
        auto shifted = cctz::civil_minute{cctz::civil_second{m} + gap};
        if (day_matches(e, cctz::civil_day{shifted}) && e.hour(shifted.hour())
            && e.minute(shifted.minute()))
          --n; // lands on another slot: runs once
      }
    } else if (e.hour_is_wildcard()) { // overlap [to, from) runs twice
      for (auto m = cctz::civil_minute{tr.to - 1} + 1;
           cctz::civil_second{m} < tr.from; ++m)
        if (day_matches(e, cctz::civil_day{m}) && e.hour(m.hour())
            && e.minute(m.minute()))
          ++n;
    }
  }
  return n;
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
    if (!cctz::detail::parse(f, in, utc ? cctz::utc_time_zone() : tz, &s,
                             &fs))
      continue;
    // Bounded so that the instant fits a millisecond time_point (seconds x
    // 1000 of a year like 999999999 would wrap around silently).
    auto year = cctz::convert(s, cctz::utc_time_zone()).year();
    if (year < min_iso_year || year > max_iso_year)
      throw invalid_argument_error(
        "from", fmt::format("ISO-8601 time \"{}\": year {} is outside the "
                            "supported range {}-{}",
                            text, year, min_iso_year, max_iso_year));
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
  // Four-digit years, as JavaScript's toISOString() writes them.
  auto c = cctz::convert(to_seconds(t), cctz::utc_time_zone());
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", c.year(),
                     c.month(), c.day(), c.hour(), c.minute(), c.second(), ms);
}

} // namespace botmesh
