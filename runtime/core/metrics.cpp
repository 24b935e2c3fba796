#include <botmesh/runtime/core/metrics.hpp>

#include <fmt/format.h>

namespace botmesh::metrics {

namespace {

// Label values escape backslash, double quote and newline (text format).
void append_labels(std::string& out, const labels& ls,
                   std::string_view extra_name = {},
                   std::string_view extra_value = {}) {
  bool any = false;
  auto one = [&](std::string_view k, std::string_view v) {
    out += any ? ',' : '{';
    any = true;
    out.append(k);
    out += "=\"";
    for (char c : v) {
      if (c == '\\')
        out += "\\\\";
      else if (c == '"')
        out += "\\\"";
      else if (c == '\n')
        out += "\\n";
      else
        out += c;
    }
    out += '"';
  };
  for (auto& [k, v] : ls)
    if (!v.empty())
      one(k, v);
  if (!extra_name.empty())
    one(extra_name, extra_value);
  if (any)
    out += '}';
}

std::string number(double v) {
  return fmt::format("{}", v);
}

} // namespace

// -- histogram ----------------------------------------------------------------

void histogram::observe(std::chrono::nanoseconds d) noexcept {
  auto ns = d.count() < 0 ? 0 : static_cast<std::uint64_t>(d.count());
  auto seconds = static_cast<double>(ns) / 1e9;
  std::size_t i = 0;
  while (i < bounds.size() && seconds > bounds[i])
    ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(ns, std::memory_order_relaxed);
}

histogram::snapshot histogram::read() const noexcept {
  snapshot s;
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    s.count += s.buckets[i];
  }
  s.sum_seconds =
    static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
  return s;
}

// -- exposition ---------------------------------------------------------------

exposition::family& exposition::get(std::string_view name,
                                    std::string_view help,
                                    std::string_view type) {
  auto i = families_.find(name);
  if (i == families_.end()) {
    order_.emplace_back(name);
    i = families_
          .emplace(std::string{name},
                   family{std::string{help}, std::string{type}, {}})
          .first;
  }
  return i->second;
}

void exposition::counter(std::string_view name, std::string_view help,
                         const labels& ls, std::uint64_t value) {
  auto& f = get(name, help, "counter");
  f.samples.append(name);
  append_labels(f.samples, ls);
  f.samples += fmt::format(" {}\n", value);
}

void exposition::gauge(std::string_view name, std::string_view help,
                       const labels& ls, double value) {
  auto& f = get(name, help, "gauge");
  f.samples.append(name);
  append_labels(f.samples, ls);
  f.samples += ' ';
  f.samples += number(value);
  f.samples += '\n';
}

void exposition::histogram(std::string_view name, std::string_view help,
                           const labels& ls, const histogram::snapshot& s) {
  auto& f = get(name, help, "histogram");
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < s.buckets.size(); ++i) {
    cumulative += s.buckets[i];
    f.samples.append(name);
    f.samples += "_bucket";
    auto le = i < histogram::bounds.size() ? number(histogram::bounds[i])
                                           : std::string{"+Inf"};
    append_labels(f.samples, ls, "le", le);
    f.samples += fmt::format(" {}\n", cumulative);
  }
  f.samples.append(name);
  f.samples += "_sum";
  append_labels(f.samples, ls);
  f.samples += ' ';
  f.samples += number(s.sum_seconds);
  f.samples += '\n';
  f.samples.append(name);
  f.samples += "_count";
  append_labels(f.samples, ls);
  f.samples += fmt::format(" {}\n", cumulative);
}

std::string exposition::str() const {
  std::string out;
  for (auto& name : order_) {
    auto& f = families_.find(name)->second;
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, f.help, name,
                       f.type);
    out += f.samples;
  }
  return out;
}

// -- registry -----------------------------------------------------------------

registry::registration::registration(registration&& other) noexcept
  : reg_(other.reg_), id_(other.id_) {
  other.reg_ = nullptr;
}

registry::registration&
registry::registration::operator=(registration&& other) noexcept {
  if (this != &other) {
    reset();
    reg_ = other.reg_;
    id_ = other.id_;
    other.reg_ = nullptr;
  }
  return *this;
}

registry::registration::~registration() {
  reset();
}

void registry::registration::reset() noexcept {
  if (!reg_)
    return;
  std::lock_guard guard{reg_->mtx_};
  reg_->collectors_.erase(id_);
  reg_ = nullptr;
}

registry::registration registry::add(collector c) {
  std::lock_guard guard{mtx_};
  auto id = ++next_;
  collectors_.emplace(id, std::move(c));
  return registration{this, id};
}

std::string registry::scrape() const {
  exposition e;
  std::lock_guard guard{mtx_};
  for (auto& [id, c] : collectors_)
    c(e);
  return e.str();
}

registry& global_registry() {
  // Never destroyed: registrations of static objects may outlive main().
  static auto* r = new registry;
  return *r;
}

} // namespace botmesh::metrics
