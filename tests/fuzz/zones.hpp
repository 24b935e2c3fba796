#pragma once

// Time zones the fuzz targets choose from: fixed names, so no input makes
// the targets read an arbitrary file as a zone. Zones with DST gaps and
// overlaps at several hours, a 30-minute DST shift, a zone with a 24-hour
// jump (Pacific/Apia skipped 2011-12-30) and one whose offset had seconds
// until 1972 (Africa/Monrovia, -00:44:30).

#include <array>
#include <string_view>

namespace botmesh::fuzz {

inline constexpr std::array<std::string_view, 9> zones{
  "UTC",          "Europe/Madrid",    "America/New_York",
  "Australia/Lord_Howe", "America/Santiago", "Asia/Kolkata",
  "Pacific/Apia", "America/St_Johns", "Africa/Monrovia"};

/// The zone named by `line` when it is one of `zones`; otherwise one picked
/// by the line's bytes (so every input maps to some zone).
inline std::string_view pick_zone(std::string_view line) {
  unsigned h = 0;
  for (auto z : zones)
    if (z == line)
      return z;
  for (unsigned char c : line)
    h = h * 31 + c;
  return zones[h % zones.size()];
}

} // namespace botmesh::fuzz
