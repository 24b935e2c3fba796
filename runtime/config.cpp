// bot_options from the environment and from INI files. One table describes
// every option (key, variable, unit, default, how to apply a value), so the
// environment, the file format and the README cannot drift apart: a unit
// test checks that the README's table names every key.

#include <botmesh/runtime/bot.hpp>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/internal/text.hpp>

namespace botmesh {

namespace {

using setter = void (*)(bot_options&, std::string_view);

struct option_entry {
  option_info info;
  setter apply;
};

// A bad value: the caller adds where it came from (variable or file line).
struct bad_value {
  std::string why;
};

std::chrono::milliseconds to_duration(std::string_view v) {
  // A unit is required here: a bare number would be milliseconds, and
  // STOP_TIMEOUT=30 or lease = 15 meant as seconds would pass unnoticed
  // (a 15 ms lease makes every replica look dead). Code that builds
  // options may still write "250" (see duration).
  auto t = internal::trim(v);
  if (!t.empty() && (std::isdigit(static_cast<unsigned char>(t.back()))
                     || t.back() == '.'))
    throw bad_value{fmt::format("a duration needs its unit (\"{}s\", "
                                "\"{}ms\"): a bare number would be taken "
                                "as milliseconds",
                                t, t)};
  try {
    return parse_duration(v);
  } catch (const std::exception& e) {
    throw bad_value{fmt::format("not a duration ({})", e.what())};
  }
}

std::size_t to_count(std::string_view v) {
  std::size_t n = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec != std::errc{} || end != v.data() + v.size())
    throw bad_value{"not a whole number >= 0"};
  return n;
}

std::size_t to_positive(std::string_view v) {
  auto n = to_count(v);
  if (n == 0)
    throw bad_value{"must be > 0"};
  return n;
}

bool to_bool(std::string_view v) {
  auto is = [v](std::string_view w) { return internal::ascii_iequals(v, w); };
  if (is("true") || is("1") || is("yes") || is("on"))
    return true;
  if (is("false") || is("0") || is("no") || is("off"))
    return false;
  throw bad_value{"not a boolean (true/false, 1/0, yes/no, on/off)"};
}

coordination_options& co(bot_options& o) {
  if (!o.coordination)
    o.coordination.emplace();
  return *o.coordination;
}

durability_options& du(bot_options& o) {
  if (!o.durability)
    o.durability.emplace();
  return *o.durability;
}

// The table. Keep it in the README's order; the README's table is checked
// against it (tests/unit/config_test.cpp).
const std::vector<option_entry>& entries() {
  static const std::vector<option_entry> all{
    {{"bot_id", "BOTMESH_BOT_ID", "text", "\"\"",
      "names the bot among bots sharing a backend (durable task namespace)"},
     [](bot_options& o, std::string_view v) { o.bot_id = std::string{v}; }},
    {{"lang", "BOTMESH_LANG", "text", "en", "language of runtime texts (es, en)"},
     [](bot_options& o, std::string_view v) {
       if (v != "es" && v != "en")
         throw bad_value{"must be \"es\" or \"en\""};
       o.lang = std::string{v};
     }},
    {{"passivate_after", "BOTMESH_PASSIVATE_AFTER", "duration", "1m",
      "an idle chat gives its actor back after this"},
     [](bot_options& o, std::string_view v) {
       o.passivate_after = duration{to_duration(v)};
     }},
    {{"max_pending_per_chat", "BOTMESH_MAX_PENDING_PER_CHAT", "count", "1000",
      "messages one chat may hold waiting; more are refused (overloaded)"},
     [](bot_options& o, std::string_view v) {
       o.max_pending_per_chat = to_positive(v);
     }},
    {{"handler_threads", "BOTMESH_HANDLER_THREADS", "count", "64",
      "most threads running handlers at once"},
     [](bot_options& o, std::string_view v) {
       o.handler_threads = to_positive(v);
     }},
    {{"stop_timeout", "BOTMESH_STOP_TIMEOUT", "duration", "10s",
      "how long stop() (and SIGTERM) waits for queued and running turns"},
     [](bot_options& o, std::string_view v) {
       o.stop_timeout = duration{to_duration(v)};
     }},
    {{"log_messages", "BOTMESH_LOG_MESSAGES", "bool", "true",
      "record chats and message texts in the store"},
     [](bot_options& o, std::string_view v) { o.log_messages = to_bool(v); }},
    {{"log_level", "BOTMESH_LOG_LEVEL", "level", "warn",
      "trace, debug, info, warn, error or off (process-wide)"},
     [](bot_options& o, std::string_view v) {
       auto l = log::parse_level(v);
       if (!l)
         throw bad_value{"not a level (trace, debug, info, warn, error, off)"};
       o.log_level = *l;
     }},
    {{"log_message_text", "BOTMESH_LOG_MESSAGE_TEXT", "bool", "false",
      "let user message text appear in log lines"},
     [](bot_options& o, std::string_view v) { o.log_message_text = to_bool(v); }},
    {{"scheduler_threads", "BOTMESH_SCHEDULER_THREADS", "count", "0",
      "CAF worker threads of an owned actor system (0: one per core)"},
     [](bot_options& o, std::string_view v) { o.scheduler_threads = to_count(v); }},
    {{"max_throughput", "BOTMESH_MAX_THROUGHPUT", "count", "32",
      "messages an actor handles before yielding its CAF worker"},
     [](bot_options& o, std::string_view v) { o.max_throughput = to_positive(v); }},
    {{"retry_window", "BOTMESH_RETRY_WINDOW", "duration", "the provider's",
      "how long an inbound id is remembered to drop redeliveries"},
     [](bot_options& o, std::string_view v) {
       o.retry_window = duration{to_duration(v)};
     }},
    {{"max_remembered_ids", "BOTMESH_MAX_REMEMBERED_IDS", "count", "100000",
      "without durability: most inbound ids remembered"},
     [](bot_options& o, std::string_view v) {
       o.max_remembered_ids = to_positive(v);
     }},
    {{"limits.max_text_bytes", "BOTMESH_LIMITS_MAX_TEXT_BYTES", "bytes", "65536",
      "largest accepted inbound text"},
     [](bot_options& o, std::string_view v) {
       o.limits.max_text_bytes = to_positive(v);
     }},
    {{"limits.max_id_bytes", "BOTMESH_LIMITS_MAX_ID_BYTES", "bytes", "512",
      "largest accepted chat, participant, sender or message id"},
     [](bot_options& o, std::string_view v) {
       o.limits.max_id_bytes = to_positive(v);
     }},
    {{"coordination.turn_wait", "BOTMESH_COORDINATION_TURN_WAIT", "duration",
      "2m", "longest a message waits for its chat's turn"},
     [](bot_options& o, std::string_view v) {
       co(o).turn_wait = duration{to_duration(v)};
     }},
    {{"coordination.settle", "BOTMESH_COORDINATION_SETTLE", "duration", "1m",
      "longest a running step holds its turn"},
     [](bot_options& o, std::string_view v) {
       co(o).settle = duration{to_duration(v)};
     }},
    {{"coordination.max_poll", "BOTMESH_COORDINATION_MAX_POLL", "duration",
      "100ms", "longest pause between polls while waiting for a turn"},
     [](bot_options& o, std::string_view v) {
       co(o).max_poll = duration{to_duration(v)};
     }},
    {{"coordination.session", "BOTMESH_COORDINATION_SESSION", "enum",
      "automatic", "which replicas run the transport: automatic, leader, shared"},
     [](bot_options& o, std::string_view v) {
       if (v == "automatic")
         co(o).session = provider_session::automatic;
       else if (v == "leader")
         co(o).session = provider_session::leader;
       else if (v == "shared")
         co(o).session = provider_session::shared;
       else
         throw bad_value{"must be automatic, leader or shared"};
     }},
    {{"coordination.provider_down", "BOTMESH_COORDINATION_PROVIDER_DOWN",
      "duration", "1m", "a leader whose transport stays closed this long yields"},
     [](bot_options& o, std::string_view v) {
       co(o).provider_down = duration{to_duration(v)};
     }},
    {{"durability.instance_id", "BOTMESH_DURABILITY_INSTANCE_ID", "text",
      "random", "names this replica in the journal (a pod or host name)"},
     [](bot_options& o, std::string_view v) {
       du(o).instance_id = std::string{v};
     }},
    {{"durability.lease", "BOTMESH_DURABILITY_LEASE", "duration",
      "the coordinator's lease, else 15s",
      "a replica silent this long is dead; its records are claimed"},
     [](bot_options& o, std::string_view v) {
       du(o).lease = duration{to_duration(v)};
     }},
    {{"durability.max_attempts", "BOTMESH_DURABILITY_MAX_ATTEMPTS", "count", "5",
      "a record handled this many times is given up"},
     [](bot_options& o, std::string_view v) {
       auto n = to_positive(v);
       if (n > UINT32_MAX)
         throw bad_value{"at most 4294967295"};
       du(o).max_attempts = static_cast<std::uint32_t>(n);
     }},
    {{"durability.claim_batch", "BOTMESH_DURABILITY_CLAIM_BATCH", "count", "256",
      "most records claimed per beat"},
     [](bot_options& o, std::string_view v) {
       du(o).claim_batch = to_positive(v);
     }},
    {{"scheduler.tick", "BOTMESH_SCHEDULER_TICK", "duration", "1s",
      "scheduler polling period and grace period"},
     [](bot_options& o, std::string_view v) {
       o.scheduler.tick = duration{to_duration(v)};
     }},
    {{"scheduler.leader_ttl", "BOTMESH_SCHEDULER_LEADER_TTL", "duration", "30s",
      "the scheduler's leader lease (the coordinator's lease with coordination)"},
     [](bot_options& o, std::string_view v) {
       o.scheduler.leader_ttl = duration{to_duration(v)};
     }},
    {{"scheduler.time_zone", "BOTMESH_SCHEDULER_TIME_ZONE", "zone", "local",
      "default zone of cron tasks (an IANA name)"},
     [](bot_options& o, std::string_view v) {
       o.scheduler.time_zone = std::string{v};
     }},
  };
  return all;
}

const option_entry* find_entry(std::string_view key) {
  for (auto& e : entries())
    if (e.info.key == key)
      return &e;
  return nullptr;
}

using internal::trim;

} // namespace

const std::vector<option_info>& configuration_options() {
  static const std::vector<option_info> all = [] {
    std::vector<option_info> v;
    for (auto& e : entries())
      v.push_back(e.info);
    return v;
  }();
  return all;
}

bot_options bot_options::from_env(bot_options base) {
  for (auto& e : entries()) {
    std::string env{e.info.env};
    auto* raw = std::getenv(env.c_str());
    if (!raw)
      continue;
    std::string_view v = trim(raw);
    try {
      e.apply(base, v);
    } catch (const bad_value& b) {
      throw invalid_argument_error(
        std::string{e.info.key},
        fmt::format("{}=\"{}\": option {}: {}", env, v, e.info.key, b.why));
    }
  }
  return base;
}

bot_options bot_options::from_env() {
  return from_env(bot_options{});
}

bot_options bot_options::from_file(const std::string& path) {
  return from_file(path, bot_options{});
}

bot_options bot_options::from_file(const std::string& path, bot_options base) {
  // An ifstream opens a directory (a config map mounted where a file was
  // meant) and then reads nothing: the defaults would pass for the file.
  std::error_code dir_ec;
  if (std::filesystem::is_directory(path, dir_ec))
    throw error(errc::invalid_argument,
                fmt::format("configuration file {} is a directory", path));
  std::ifstream in{path};
  if (!in)
    throw error(errc::invalid_argument,
                fmt::format("configuration file {} cannot be read", path));
  // Where each option was set: set twice, one of the two was a mistake.
  std::unordered_map<std::string, int> set_at;
  std::string section;
  std::string line;
  int n = 0;
  auto fail = [&](std::string field, std::string why) {
    throw invalid_argument_error(std::move(field),
                                 fmt::format("{}:{}: {}", path, n, why));
  };
  while (std::getline(in, line)) {
    ++n;
    auto text = trim(line);
    if (text.empty() || text.front() == ';' || text.front() == '#')
      continue;
    if (text.front() == '[') {
      if (text.back() != ']' || text.size() < 3)
        fail("section", fmt::format("malformed section header \"{}\"", text));
      section = std::string{trim(text.substr(1, text.size() - 2))};
      if (section == "bot")
        section.clear();
      continue;
    }
    auto eq = text.find('=');
    if (eq == std::string_view::npos)
      fail("line", fmt::format("expected \"key = value\", got \"{}\"", text));
    auto key = trim(text.substr(0, eq));
    auto value = trim(text.substr(eq + 1));
    if (key.empty())
      fail("line", "a key is missing before \"=\"");
    // A quoted value keeps ';' and '#'; otherwise they start a comment
    // after white space only: "shop#2" is a value, not "shop" and a
    // comment (a bot id cut short would share another's namespace).
    if (!value.empty() && value.front() == '"') {
      auto close = value.find('"', 1);
      if (close == std::string_view::npos)
        fail(std::string{key}, "a quoted value has no closing quote");
      auto rest = trim(value.substr(close + 1));
      if (!rest.empty() && rest.front() != ';' && rest.front() != '#')
        fail(std::string{key}, "text after a quoted value");
      value = value.substr(1, close - 1);
    } else {
      for (std::size_t c = 0; c < value.size(); ++c)
        if ((value[c] == ';' || value[c] == '#')
            && (c == 0 || value[c - 1] == ' ' || value[c - 1] == '\t')) {
          value = trim(value.substr(0, c));
          break;
        }
    }
    auto full = section.empty() ? std::string{key}
                                : section + "." + std::string{key};
    auto* e = find_entry(full);
    if (!e)
      fail(full, fmt::format("unknown option \"{}\"", full));
    if (auto [at, fresh] = set_at.emplace(full, n); !fresh)
      fail(full, fmt::format("option {} is set again (first on line {})",
                             full, at->second));
    try {
      e->apply(base, value);
    } catch (const bad_value& b) {
      fail(full, fmt::format("option {} = \"{}\": {}", full, value, b.why));
    }
  }
  if (in.bad())
    throw error(errc::invalid_argument,
                fmt::format("configuration file {} cannot be read past line "
                            "{}",
                            path, n));
  return base;
}

} // namespace botmesh
