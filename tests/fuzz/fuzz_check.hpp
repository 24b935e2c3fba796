#pragma once

// Shared by the fuzz targets: a check that reports and aborts (libFuzzer
// then keeps the input), and the switch for checks of bugs still open.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

namespace botmesh::fuzz {

/// True when BOTMESH_FUZZ_STRICT=1: the targets then also feed the inputs of
/// bugs still open (tests/fuzz/regressions/open.txt names them). CTest runs
/// without it so its bounded runs pass until those bugs are fixed; each
/// place that holds an input back says which item of which issue it waits
/// for, and goes away with the fix.
inline bool strict() {
  static const bool on = [] {
    auto v = std::getenv("BOTMESH_FUZZ_STRICT");
    return v != nullptr && std::string_view{v} == "1";
  }();
  return on;
}

[[noreturn]] inline void fail(const char* file, int line, const char* cond,
                              const std::string& detail) {
  std::fprintf(stderr, "%s:%d: check failed: %s\n  %s\n", file, line, cond,
               detail.c_str());
  std::abort();
}

/// Splits `in` at the first '\n': the line and the rest.
inline std::pair<std::string_view, std::string_view>
next_line(std::string_view in) {
  auto nl = in.find('\n');
  if (nl == std::string_view::npos)
    return {in, {}};
  return {in.substr(0, nl), in.substr(nl + 1)};
}

} // namespace botmesh::fuzz

#define FUZZ_CHECK(cond, detail)                                             \
  do {                                                                       \
    if (!(cond))                                                             \
      ::botmesh::fuzz::fail(__FILE__, __LINE__, #cond, (detail));            \
  } while (false)
