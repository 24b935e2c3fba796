// Time zones by name, and ISO-8601 formatting and parsing (occurrence keys,
// cron previews).

#include <botmesh/scheduler/cron.hpp>

#include <string>

#include <cctz/civil_time.h>
#include <cctz/time_zone.h>
#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/scheduler/internal/iso_time.hpp>
#include <botmesh/scheduler/internal/zone.hpp>

namespace botmesh {

namespace internal {

namespace {

// An IANA name is letters, digits, '_', '-' and '+' in components joined by
// '/'. cctz would otherwise read any file: an absolute path, or one climbing
// out of the zoneinfo folder with "..", from a name that came from a config.
bool iana_shaped(std::string_view name) {
  if (name.empty() || name.size() > 255)
    return false;
  std::size_t component = 0;
  for (char c : name) {
    if (c == '/') {
      if (component == 0)
        return false; // leading '/' or "//"
      component = 0;
      continue;
    }
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')
              || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '+';
    if (!ok)
      return false; // '.', so no "..", spaces, controls, '\\'
    ++component;
  }
  return component != 0;
}

// `name` is "local", "UTC" or IANA-shaped (zone_or_throw checks first).
bool load_zone(std::string_view name, cctz::time_zone* tz) {
  if (name == "local") {
    *tz = cctz::local_time_zone();
    return true;
  }
  if (name == "UTC") {
    *tz = cctz::utc_time_zone();
    return true;
  }
  return cctz::load_time_zone(std::string{name}, tz);
}

} // namespace

cctz::time_zone zone_or_throw(std::string_view name) {
  cctz::time_zone tz;
  if (name != "local" && !iana_shaped(name))
    throw invalid_argument_error(
      "time_zone", fmt::format("time zone \"{}\" is not an IANA name: "
                               "letters, digits, '_', '-' and '+' in parts "
                               "joined by '/', such as \"Europe/Madrid\"",
                               name));
  if (!load_zone(name, &tz))
    throw invalid_argument_error(
      "time_zone", fmt::format("unknown time zone \"{}\": use an IANA name "
                               "such as \"Europe/Madrid\", \"UTC\" or "
                               "\"local\"",
                               name));
  return tz;
}

} // namespace internal

using internal::from_seconds;
using internal::sec_tp;
using internal::to_seconds;
using internal::zone_or_throw;

void validate_time_zone(std::string_view zone) {
  zone_or_throw(zone);
}

std::string format_iso8601(time_point t, std::string_view zone) {
  auto tz = zone_or_throw(zone);
  auto s = to_seconds(t);
  if (zone == "UTC")
    return cctz::format("%E4Y-%m-%dT%H:%M:%SZ", s, tz);
  // Offsets of old local mean times have seconds (Africa/Monrovia was
  // -00:44:30): printed as +HH:MM they would name another instant.
  if (tz.lookup(s).offset % 60 != 0)
    return cctz::format("%E4Y-%m-%dT%H:%M:%S%E*z", s, tz);
  return cctz::format("%E4Y-%m-%dT%H:%M:%S%Ez", s, tz);
}

time_point parse_iso8601(std::string_view text, std::string_view zone) {
  auto tz = zone_or_throw(zone);
  std::string in{text};
  sec_tp s;
  cctz::detail::femtoseconds fs;
  for (const char* fmt_str :
       {"%Y-%m-%dT%H:%M:%E*S%Ez", "%Y-%m-%dT%H:%M:%E*S%E*z",
        "%Y-%m-%dT%H:%M:%E*SZ", "%Y-%m-%dT%H:%M%Ez",
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

namespace {

constexpr std::size_t iso_utc_size = 24; // "2026-03-29T01:00:00.000Z"

// Writes to_iso_utc(t) to out[0..iso_utc_size); false, nothing written,
// for a year outside 0-9999.
bool write_iso_utc(time_point t, char* out) {
  // Every durable run builds its occurrence key with this, so the years
  // 0-9999 take plain arithmetic (days to a civil date, the proleptic
  // Gregorian calendar as in cctz) and fixed-width digits instead of a
  // zone lookup and a format string.
  auto unix_ms = to_unix_ms(t);
  auto secs = unix_ms / 1000;
  auto ms = unix_ms % 1000;
  if (ms < 0) { // floor, without overflowing next to the minimum
    ms += 1000;
    --secs;
  }
  auto days = secs / 86400;
  auto sod = secs % 86400;
  if (sod < 0) {
    sod += 86400;
    --days;
  }
  // Days since 1970-01-01 to year/month/day, counted in 400-year eras
  // that start on March 1st (so the leap day ends a year).
  auto z = days + 719468;
  auto era = (z >= 0 ? z : z - 146096) / 146097;
  auto doe = z - era * 146097;
  auto yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  auto doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  auto mp = (5 * doy + 2) / 153;
  auto day = doy - (153 * mp + 2) / 5 + 1;
  auto month = mp < 10 ? mp + 3 : mp - 9;
  auto year = yoe + era * 400 + (month <= 2 ? 1 : 0);
  if (year < 0 || year > 9999)
    return false;
  auto put = [&](std::size_t at, long long v, int width) {
    for (int i = width - 1; i >= 0; --i, v /= 10)
      out[at + static_cast<std::size_t>(i)] = static_cast<char>('0' + v % 10);
  };
  put(0, year, 4);
  out[4] = '-';
  put(5, month, 2);
  out[7] = '-';
  put(8, day, 2);
  out[10] = 'T';
  put(11, sod / 3600, 2);
  out[13] = ':';
  put(14, sod / 60 % 60, 2);
  out[16] = ':';
  put(17, sod % 60, 2);
  out[19] = '.';
  put(20, ms, 3);
  out[23] = 'Z';
  return true;
}

} // namespace

std::string to_iso_utc(time_point t) {
  std::string out(iso_utc_size, '0');
  if (write_iso_utc(t, out.data()))
    return out;
  auto ms = to_unix_ms(t) % 1000;
  if (ms < 0)
    ms += 1000;
  // Four-digit years, as JavaScript's toISOString() writes them.
  auto c = cctz::convert(to_seconds(t), cctz::utc_time_zone());
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", c.year(),
                     c.month(), c.day(), c.hour(), c.minute(), c.second(), ms);
}

std::string internal::occurrence_key(std::string_view task_id, time_point slot) {
  std::string key;
  key.reserve(task_id.size() + 1 + iso_utc_size);
  key.append(task_id).append(1, '@');
  auto at = key.size();
  key.resize(at + iso_utc_size);
  if (!write_iso_utc(slot, key.data() + at)) {
    key.resize(at);
    key += to_iso_utc(slot);
  }
  return key;
}

} // namespace botmesh
