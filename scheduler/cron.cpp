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
#include <botmesh/scheduler/internal/zone.hpp>

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

using internal::from_seconds;
using internal::sec_tp;
using internal::to_seconds;
using internal::zone_or_throw;

namespace {

int weekday_number(const cctz::civil_day& d) {
  // cctz: monday = 0 ... sunday = 6; cron: sunday = 0.
  return (static_cast<int>(cctz::get_weekday(d)) + 1) % 7;
}

// The longest wait between two runs of an expression that runs at all is
// 40 years: Feb 29 on one weekday ("0 0 29 2 */7" runs in 2032, then 2060;
// across 2100, which is no leap year, gaps reach 40). A shorter horizon
// would end such a task after its run, and plain "0 0 29 2 *" after 2096.
constexpr int horizon_days = 41 * 366;

// Days of the month whose weekday matches, by the weekday of the 1st: bit d
// is day d (1-31). Seven masks, built once per schedule.
std::array<std::uint32_t, 7> weekday_masks(const cron_expr& e) {
  std::array<std::uint32_t, 7> out{};
  for (int first = 0; first < 7; ++first)
    for (int d = 1; d <= 31; ++d)
      if ((e.weekday_bits() >> ((first + d - 1) % 7)) & 1)
        out[static_cast<size_t>(first)] |= std::uint32_t{1} << d;
  return out;
}

int days_in_month(cctz::year_t y, int m) {
  if (m != 2)
    return days_in_month_max[m];
  bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  return leap ? 29 : 28;
}

cctz::civil_second civil_of(sec_tp t, int offset) {
  return cctz::civil_second{1970, 1, 1, 0, 0, 0}
         + (t.time_since_epoch().count() + offset);
}

sec_tp instant_of(const cctz::civil_second& c, int offset) {
  return sec_tp{cctz::seconds{(c - cctz::civil_second{1970, 1, 1, 0, 0, 0})
                              - offset}};
}

constexpr auto near_change = std::chrono::hours{48};

} // namespace

struct cron_schedule::impl {
  cron_expr expr;
  std::string zone_name;
  cctz::time_zone tz;
  std::array<std::uint32_t, 7> dow_masks{};

  // Matching days of a month: bit d is day d.
  std::uint32_t month_mask(cctz::year_t y, int m) const {
    auto first = weekday_number(cctz::civil_day{y, m, 1});
    auto dow = dow_masks[static_cast<size_t>(first)];
    auto dom = expr.day_bits();
    auto both = expr.day_rule_is_and() ? (dom & dow) : (dom | dow);
    auto len = days_in_month(y, m);
    return both & static_cast<std::uint32_t>((std::uint64_t{2} << len) - 2);
  }

  // First matching civil minute strictly after `after`, not after `limit`:
  // whole months are skipped by bit masks, days found by a bit scan.
  std::optional<cctz::civil_minute>
  first_civil_after(const cctz::civil_second& after,
                    const cctz::civil_second& limit) const {
    auto from = cctz::civil_minute{after} + 1; // slots sit on whole minutes
    cctz::civil_day last{limit};
    cctz::civil_day day{from};
    int h0 = from.hour();
    int m0 = from.minute();
    unsigned months = expr.month_bits();
    while (day <= last) {
      auto y = day.year();
      int m = day.month();
      if (!expr.month(m)) {
        auto later = months >> (m + 1);
        day = later ? cctz::civil_day{y, m + 1 + std::countr_zero(later), 1}
                    : cctz::civil_day{y + 1, std::countr_zero(months), 1};
        h0 = m0 = 0;
        continue;
      }
      auto rest = month_mask(y, m) >> day.day();
      if (rest == 0) {
        day = cctz::civil_day{y, m + 1, 1};
        h0 = m0 = 0;
        continue;
      }
      if (int skip = std::countr_zero(rest); skip > 0) {
        day += skip;
        h0 = m0 = 0;
      }
      if (day > last)
        return std::nullopt;
      if (auto hm = first_in_day(h0, m0)) {
        cctz::civil_minute c{day.year(), day.month(), day.day(), hm->first,
                             hm->second};
        if (cctz::civil_second{c} > limit)
          return std::nullopt;
        return c;
      }
      ++day;
      h0 = m0 = 0;
    }
    return std::nullopt;
  }

  // First matching (hour, minute) of a matching day at or after (h0, m0).
  std::optional<std::pair<int, int>> first_in_day(int h0, int m0) const {
    auto minutes = expr.minute_bits();
    if (expr.hour(h0)) {
      if (auto rest = minutes >> m0; rest != 0)
        return std::pair{h0, m0 + std::countr_zero(rest)};
    }
    auto hours = expr.hour_bits() >> (h0 + 1);
    if (hours == 0)
      return std::nullopt;
    return std::pair{h0 + 1 + std::countr_zero(hours),
                     std::countr_zero(minutes)};
  }

  // The walk through stretches of constant offset, for a search that starts
  // or ends near an offset change. A stretch [b, e) with offset `o` runs
  // the slots whose civil time lies in [b + o, e + o), except the second
  // pass of an overlap for a fixed hour; a fixed hour whose slot falls in
  // the gap before the stretch runs shifted forward by the gap (its civil
  // time read in the previous offset). The first stretch with a run
  // strictly after `from` holds the answer.
  std::optional<sec_tp> by_stretches(sec_tp from,
                                     const cctz::civil_second& limit) const {
    bool wildcard = expr.hour_is_wildcard();
    int o = tz.lookup(from).offset;
    cctz::time_zone::civil_transition begin;
    bool has_begin = tz.prev_transition(from + cctz::seconds{1}, &begin);
    int prev_o = has_begin ? o - static_cast<int>(begin.to - begin.from) : o;
    auto cursor = from;
    for (;;) {
      std::optional<sec_tp> best;
      auto lower = civil_of(from, o);
      if (has_begin) {
        if (o > prev_o && !wildcard) { // the gap [begin.from, begin.to)
          auto lo = std::max(civil_of(from, prev_o), begin.from - 1);
          if (auto c = first_civil_after(lo, std::min(begin.to - 1, limit)))
            best = instant_of(cctz::civil_second{*c}, prev_o);
        }
        auto start = (o < prev_o && !wildcard) ? begin.from : begin.to;
        lower = std::max(lower, start - 1);
      }
      cctz::time_zone::civil_transition end;
      bool has_end = tz.next_transition(cursor, &end);
      auto last = has_end ? std::min(end.from - 1, limit) : limit;
      if (auto c = first_civil_after(lower, last)) {
        auto t = instant_of(cctz::civil_second{*c}, o);
        if (!best || t < *best)
          best = t;
      }
      if (best)
        return best;
      if (!has_end || end.from > limit)
        return std::nullopt;
      cursor = instant_of(end.from, o);
      begin = end;
      has_begin = true;
      prev_o = o;
      o += static_cast<int>(end.to - end.from);
    }
  }

  // True when an offset changes in (a, b].
  bool change_in(sec_tp a, sec_tp b) const {
    cctz::time_zone::civil_transition tr;
    if (!tz.next_transition(a, &tr))
      return false;
    return instant_of(tr.from, tz.lookup(a).offset) <= b;
  }

  std::optional<time_point> next_after(time_point from) const {
    auto from_s = to_seconds(from);
    auto cl = tz.lookup(from_s);
    auto start = cl.cs;
    cctz::civil_second limit = start + horizon_days * 86400;
    auto done = [](std::optional<sec_tp> t) -> std::optional<time_point> {
      if (!t)
        return std::nullopt;
      return from_seconds(*t);
    };
    // Near an offset change, civil times just before `start` may run after
    // `from` (an overlap) or runs may be shifted (a gap): walk the stretches.
    cctz::time_zone::civil_transition tr;
    bool has_change = tz.next_transition(from_s - near_change, &tr);
    sec_tp change = has_change ? instant_of(tr.from, tz.lookup(from_s - near_change).offset)
                               : sec_tp::max();
    if (change <= from_s + near_change)
      return done(by_stretches(from_s, limit));
    // The local calendar first: no slot lies in (start, c) ...
    auto c = first_civil_after(start, limit);
    if (!c)
      return std::nullopt;
    cctz::civil_second cs{*c};
    // ... and with no offset change until well after it, `from`'s offset
    // maps it.
    auto guess = instant_of(cs, cl.offset);
    if (change > guess + near_change)
      return from_seconds(guess);
    // Otherwise resolve it in the zone; away from a change that is the run.
    auto at = tz.lookup(cs);
    if (at.kind == cctz::time_zone::civil_lookup::UNIQUE
        && !change_in(at.pre - near_change, at.pre + near_change))
      return from_seconds(at.pre);
    // Near a change: no slot runs in (from, at - 72 h], so walk the
    // stretches from there (offsets differ by less than a day).
    auto resume = std::max(from_s, at.pre - 3 * std::chrono::hours{24});
    return done(by_stretches(resume, limit));
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
  i->dow_masks = weekday_masks(i->expr);
  impl_ = std::move(i);
  if (!next_after(now))
    throw invalid_argument_error(
      "cron", fmt::format("cron expression \"{}\" never runs within 41 "
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

} // namespace botmesh
