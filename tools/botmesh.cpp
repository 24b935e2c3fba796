// botmesh: the command-line tool.
//
//   botmesh cron next '<expr>' [--tz ZONE] [--from ISO-8601] [--count N]
//
// Prints the next N run instants of a cron expression as ISO-8601 with the
// zone's offset, one per line. On a bad expression, zone or argument it
// prints the validation message to stderr and exits 1 (2 for bad usage).

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/scheduler/cron.hpp>

namespace {

constexpr const char* usage =
  "usage: botmesh cron next '<expr>' [--tz ZONE] [--from ISO-8601] [--count "
  "N]\n"
  "  --tz     IANA zone the fields are read in (default: local)\n"
  "  --from   start instant, exclusive (default: now)\n"
  "  --count  how many run instants to print (default: 5, at most 10000)\n";

int fail_usage(const std::string& why) {
  std::fprintf(stderr, "botmesh: %s\n%s", why.c_str(), usage);
  return 2;
}

int cron_next(const std::vector<std::string_view>& args) {
  if (args.empty())
    return fail_usage("missing cron expression");
  std::string_view expr;
  std::string zone = "local";
  std::string from_text;
  long count = 5;
  for (size_t i = 0; i < args.size(); ++i) {
    auto a = args[i];
    auto value = [&](std::string_view flag) -> std::string {
      if (i + 1 >= args.size())
        throw std::runtime_error(std::string{flag} + " needs a value");
      return std::string{args[++i]};
    };
    if (a == "--tz") {
      zone = value(a);
    } else if (a == "--from") {
      from_text = value(a);
    } else if (a == "--count") {
      auto v = value(a);
      char* end = nullptr;
      count = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || count < 1 || count > 10000)
        throw std::runtime_error("--count must be a number from 1 to 10000, "
                                 "got \""
                                 + v + "\"");
    } else if (a.starts_with("--")) {
      throw std::runtime_error("unknown option " + std::string{a});
    } else if (expr.empty()) {
      expr = a;
    } else {
      throw std::runtime_error("unexpected argument \"" + std::string{a}
                               + "\" (quote the expression)");
    }
  }
  if (expr.empty())
    throw std::runtime_error("missing cron expression");
  botmesh::validate_time_zone(zone);
  auto from = from_text.empty() ? botmesh::clock::system().now()
                                : botmesh::parse_iso8601(from_text, zone);
  botmesh::cron_schedule sched{expr, zone, from};
  auto t = from;
  for (long n = 0; n < count; ++n) {
    auto next = sched.next_after(t);
    if (!next)
      break;
    std::printf("%s\n", botmesh::format_iso8601(*next, zone).c_str());
    t = *next;
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  if (args.size() < 2 || args[0] != "cron" || args[1] != "next")
    return fail_usage(args.empty() ? "missing command" : "unknown command");
  try {
    return cron_next({args.begin() + 2, args.end()});
  } catch (const botmesh::invalid_argument_error& e) {
    std::fprintf(stderr, "botmesh: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    return fail_usage(e.what());
  }
}
