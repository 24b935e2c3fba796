// botmesh: the command-line tool.
//
//   botmesh cron next '<expr>' [--tz ZONE] [--from ISO-8601] [--count N]
//   botmesh telegram set-webhook --url URL [--secret S] [...]
//   botmesh telegram delete-webhook [--drop-pending-updates]
//   botmesh telegram webhook-info
//   botmesh redis inspect [--source URL] [--prefix P] [--json]
//   botmesh redis migrate [--source URL] [--target URL] [...]
//   botmesh [COMMAND] --help
//   botmesh [COMMAND] --version
//
// Options take their value as `--opt value` or `--opt=value`.
//
// Exit codes: 0 done; 1 the work failed (a cron expression, zone or instant
// the library rejects, with its validation message; a Bot API request that
// was refused or could not be sent; Redis failed, a live bot blocks a
// migration, or records could not be read); 2 bad usage (printed with the usage).

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/scheduler/cron.hpp>

#include "command.hpp"

namespace botmesh::tool {

const char* const cron_usage =
  "usage: botmesh cron next '<expr>' [--tz ZONE] [--from ISO-8601] [--count "
  "N]\n"
  "  --tz     IANA zone the fields are read in (default: local)\n"
  "  --from   start instant, exclusive (default: now)\n"
  "  --count  how many run instants to print (default: 5, at most 10000)\n";

bool is_help(std::string_view a) {
  return a == "-h" || a == "--help" || a == "help";
}

int cron(const args& all) {
  if (all.empty() || all[0] != "next")
    throw usage_error(all.empty() ? "missing cron command" : "unknown command");
  args a{all.begin() + 1, all.end()};
  if (a.empty())
    throw usage_error("missing cron expression");
  std::string_view expr;
  std::string zone = "local";
  std::string from_text;
  long count = 5;
  for (size_t i = 0; i < a.size(); ++i) {
    auto arg = a[i];
    auto value = [&](std::string_view flag) -> std::string {
      if (i + 1 >= a.size())
        throw usage_error(std::string{flag} + " needs a value");
      return std::string{a[++i]};
    };
    if (arg == "--tz") {
      zone = value(arg);
    } else if (arg == "--from") {
      from_text = value(arg);
    } else if (arg == "--count") {
      auto v = value(arg);
      char* end = nullptr;
      count = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || count < 1 || count > 10000)
        throw usage_error("--count must be a number from 1 to 10000, got \""
                          + v + "\"");
    } else if (arg.starts_with("--")) {
      throw usage_error("unknown option " + std::string{arg});
    } else if (expr.empty()) {
      expr = arg;
    } else {
      throw usage_error("unexpected argument \"" + std::string{arg}
                        + "\" (quote the expression)");
    }
  }
  if (expr.empty())
    throw usage_error("missing cron expression");
  validate_time_zone(zone);
  auto from = from_text.empty() ? clock::system().now()
                                : parse_iso8601(from_text, zone);
  cron_schedule sched{expr, zone, from};
  auto t = from;
  for (long n = 0; n < count; ++n) {
    auto next = sched.next_after(t);
    if (!next)
      break;
    std::printf("%s\n", format_iso8601(*next, zone).c_str());
    t = *next;
  }
  return exit_ok;
}

} // namespace botmesh::tool

namespace {

constexpr const char* general_usage =
  "usage: botmesh COMMAND ...\n"
  "  cron next '<expr>' ...        the next run instants of a cron expression\n"
  "  telegram set-webhook ...      register the bot's webhook with Telegram\n"
  "  telegram delete-webhook ...   remove it\n"
  "  telegram webhook-info         what Telegram knows about it\n"
  "  redis inspect ...             a prefix's Redis keys per layout and kind\n"
  "  redis migrate ...             copy a keyspace legacy <-> cluster:v1\n"
  "botmesh COMMAND --help shows a command's options; --version the version.\n"
  "Options take a value as --opt value or --opt=value.\n"
  "Exit codes: 0 done, 1 the work failed, 2 bad usage.\n";

bool is_version(std::string_view a) {
  return a == "-V" || a == "--version";
}

int print_version() {
  std::printf("botmesh %s\n", BOTMESH_VERSION);
  return botmesh::tool::exit_ok;
}

// Splits every `--opt=value` into `--opt` `value`; the strings live in
// `store` (reserved up front, so the views stay valid).
botmesh::tool::args split_equals(const botmesh::tool::args& in,
                                 std::vector<std::string>& store) {
  store.reserve(in.size() * 2);
  botmesh::tool::args out;
  for (auto a : in) {
    auto eq = a.find('=');
    if (a.starts_with("--") && eq != std::string_view::npos && eq > 2) {
      out.push_back(store.emplace_back(a.substr(0, eq)));
      out.push_back(store.emplace_back(a.substr(eq + 1)));
    } else {
      out.push_back(a);
    }
  }
  return out;
}

int fail_usage(const std::string& why, const char* usage) {
  std::fprintf(stderr, "botmesh: %s\n%s", why.c_str(), usage);
  return botmesh::tool::exit_usage;
}

} // namespace

int main(int argc, char** argv) {
  using namespace botmesh::tool;
  std::vector<std::string> store;
  args a = split_equals(args(argv + 1, argv + argc), store);
  if (a.empty())
    return fail_usage("missing command", general_usage);
  if (is_help(a[0])) {
    std::fputs(general_usage, stdout);
    return exit_ok;
  }
  if (is_version(a[0]))
    return print_version();
  const char* usage = general_usage;
  // What follows the error of a bad command line: the usage, or for a long
  // one where to find it.
  const char* hint = general_usage;
  int (*command)(const args&) = nullptr;
  if (a[0] == "cron") {
    usage = hint = cron_usage;
    command = cron;
  } else if (a[0] == "telegram") {
    usage = telegram_usage;
    hint = "run 'botmesh telegram --help' for its options\n";
    command = telegram;
  } else if (a[0] == "redis") {
    usage = redis_usage;
    hint = "run 'botmesh redis --help' for its options\n";
    command = redis;
  } else {
    return fail_usage("unknown command \"" + std::string{a[0]} + "\"", usage);
  }
  args rest{a.begin() + 1, a.end()};
  for (auto arg : rest) {
    if (arg == "-h" || arg == "--help") {
      std::fputs(usage, stdout);
      return exit_ok;
    }
    if (is_version(arg))
      return print_version();
  }
  try {
    return command(rest);
  } catch (const usage_error& e) {
    return fail_usage(e.what(), hint);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "botmesh: %s\n", e.what());
    return exit_failed;
  }
}
