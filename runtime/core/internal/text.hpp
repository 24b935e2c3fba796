#pragma once

// Internal: small text helpers shared by the parsers and the dispatchers.

#include <cctype>
#include <exception>
#include <initializer_list>
#include <string>
#include <string_view>

namespace botmesh::internal {

/// `s` without leading and trailing ASCII whitespace.
inline std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  return s;
}

/// Equality ignoring ASCII case; other bytes (UTF-8) compare exactly.
inline bool ascii_iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i) {
    auto x = static_cast<unsigned char>(a[i]);
    auto y = static_cast<unsigned char>(b[i]);
    if (x < 0x80)
      x = static_cast<unsigned char>(std::tolower(x));
    if (y < 0x80)
      y = static_cast<unsigned char>(std::tolower(y));
    if (x != y)
      return false;
  }
  return true;
}

// `parts` with `sep` between them, in one allocation, each part written
// by `append(out, part)`, which adds at most `extra` bytes in all.
template <class Append>
std::string join_parts(char sep, std::initializer_list<std::string_view> parts,
                       std::size_t extra, Append append) {
  std::size_t size = parts.size() + extra; // the separators, and one spare
  for (auto p : parts)
    size += p.size();
  std::string out;
  out.reserve(size);
  bool first = true;
  for (auto p : parts) {
    if (!first)
      out.push_back(sep);
    first = false;
    append(out, p);
  }
  return out;
}

/// `parts` with `sep` between them, in one allocation: for ids built per
/// message, where a format string's parsing shows in profiles.
inline std::string join(char sep,
                        std::initializer_list<std::string_view> parts) {
  return join_parts(sep, parts, 0,
                    [](std::string& out, std::string_view p) { out.append(p); });
}

/// As `join`, kept injective: when a part holds `sep` or a backslash, every
/// `sep` and backslash of every part is preceded by a backslash, so two
/// different lists of parts never make one string (a custom provider's ids
/// may hold any byte). Parts that hold neither keep `join`'s plain form,
/// which never holds a backslash: the two forms never meet either. The ids
/// built from it (journal, delivery, outbox) are stored, so this form is
/// their format.
inline std::string join_escaped(char sep,
                                std::initializer_list<std::string_view> parts) {
  const char special[] = {sep, '\\', '\0'};
  bool plain = true;
  for (auto p : parts)
    plain = plain && p.find_first_of(special) == std::string_view::npos;
  if (plain)
    return join(sep, parts);
  return join_parts(sep, parts, 8, [sep](std::string& out, std::string_view p) {
    for (char c : p) {
      if (c == sep || c == '\\')
        out.push_back('\\');
      out.push_back(c);
    }
  });
}

/// Lower-cases the ASCII letters of `s` in place (HTTP header names).
inline void ascii_lower(std::string& s) noexcept {
  for (auto& c : s)
    if (static_cast<unsigned char>(c) < 0x80)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

/// The text of the exception `e` holds, for logs and error events;
/// "unknown error" for one that is not a std::exception or says nothing.
inline std::string what_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    if (*x.what() != '\0')
      return x.what();
  } catch (...) {
  }
  return "unknown error";
}

} // namespace botmesh::internal
