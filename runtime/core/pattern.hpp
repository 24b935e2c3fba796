#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace botmesh {

/// A regular expression for routes and flow triggers.
///
/// Matching runs in time linear in the text and in constant stack (RE2:
/// automata, no backtracking, no recursion), so no message, however long
/// or crafted (`(a+)+$` against 64 KiB of `a`), can exhaust a handler
/// thread's stack or hold it for long. The price is RE2's syntax: Perl-like
/// (`\d`, `\s`, `(?i)`, groups, alternation, repetition), without
/// backreferences or lookaround.
///
/// Cost: compiling happens once, at construction; a search over a 64 KiB
/// text takes well under a millisecond for ordinary patterns. Copies share
/// the compiled program; `search` is thread-safe.
class pattern {
 public:
  struct options {
    /// Letters match regardless of case (same as a leading `(?i)`).
    bool case_insensitive = false;
  };

  /// Compiles `expr`. Throws `invalid_argument_error` (field "pattern")
  /// naming the expression and what is wrong with it (bad syntax, or a
  /// construct RE2 does not support such as a backreference).
  explicit pattern(std::string_view expr);
  pattern(std::string_view expr, options opts);

  /// The expression as given.
  const std::string& str() const noexcept;

  /// True when `text` contains a match. With `groups`, it receives the
  /// whole match first, then each capturing group (empty for a group that
  /// did not take part).
  bool search(std::string_view text,
              std::vector<std::string>* groups = nullptr) const;

  struct impl;

 private:
  std::shared_ptr<const impl> impl_;
};

} // namespace botmesh
