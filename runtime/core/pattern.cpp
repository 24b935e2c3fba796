#include <botmesh/runtime/core/pattern.hpp>

#include <fmt/format.h>
#include <re2/re2.h>

#include <botmesh/runtime/core/error.hpp>

namespace botmesh {

struct pattern::impl {
  std::string text;
  std::unique_ptr<RE2> re;
};

namespace {

std::shared_ptr<const pattern::impl> compile(std::string_view expr,
                                             pattern::options opts) {
  RE2::Options o;
  o.set_case_sensitive(!opts.case_insensitive);
  // Errors become our exception; RE2 must not write to stderr (a DFA that
  // runs out of its memory budget falls back to the NFA silently).
  o.set_log_errors(false);
  auto i = std::make_shared<pattern::impl>();
  i->text = std::string{expr};
  i->re = std::make_unique<RE2>(re2::StringPiece{expr.data(), expr.size()}, o);
  if (!i->re->ok())
    throw invalid_argument_error(
      "pattern", fmt::format("invalid pattern \"{}\": {}", expr,
                             i->re->error()));
  return i;
}

} // namespace

pattern::pattern(std::string_view expr) : pattern(expr, options{}) {
  // nop
}

pattern::pattern(std::string_view expr, options opts)
  : impl_(compile(expr, opts)) {
  // nop
}

const std::string& pattern::str() const noexcept {
  return impl_->text;
}

bool pattern::search(std::string_view text,
                     std::vector<std::string>* groups) const {
  auto& re = *impl_->re;
  re2::StringPiece in{text.data(), text.size()};
  if (!groups)
    return re.Match(in, 0, in.size(), RE2::UNANCHORED, nullptr, 0);
  auto n = 1 + re.NumberOfCapturingGroups();
  std::vector<re2::StringPiece> sub(static_cast<std::size_t>(n));
  if (!re.Match(in, 0, in.size(), RE2::UNANCHORED, sub.data(), n))
    return false;
  groups->clear();
  groups->reserve(sub.size());
  for (auto& s : sub)
    groups->emplace_back(s.data() ? std::string{s.data(), s.size()}
                                  : std::string{});
  return true;
}

} // namespace botmesh
