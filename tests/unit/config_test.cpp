#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include <botmesh/runtime/botmesh.hpp>

using namespace std::chrono_literals;

namespace {

// Sets variables for one test and removes them afterwards.
class env_scope {
 public:
  void set(const std::string& name, const std::string& value) {
    ::setenv(name.c_str(), value.c_str(), 1);
    names_.push_back(name);
  }
  ~env_scope() {
    for (auto& n : names_)
      ::unsetenv(n.c_str());
  }

 private:
  std::vector<std::string> names_;
};

class ini_file {
 public:
  explicit ini_file(const std::string& text) {
    char tmpl[] = "/tmp/botmesh-config-XXXXXX";
    int fd = ::mkstemp(tmpl);
    if (fd >= 0)
      ::close(fd);
    path_ = tmpl;
    std::ofstream{path_} << text;
  }
  ~ini_file() {
    ::unlink(path_.c_str());
  }
  const std::string& path() const {
    return path_;
  }

 private:
  std::string path_;
};

std::string error_of(const std::function<void()>& fn, std::string* field = nullptr) {
  try {
    fn();
  } catch (const botmesh::invalid_argument_error& e) {
    if (field)
      *field = e.field();
    return e.what();
  } catch (const std::exception& e) {
    return std::string{"other: "} + e.what();
  }
  return "no error";
}

} // namespace

TEST_CASE("options come from BOTMESH_ variables and the rest keeps its "
          "defaults") {
  env_scope env;
  env.set("BOTMESH_STOP_TIMEOUT", "30s");
  env.set("BOTMESH_LOG_MESSAGES", "false");
  env.set("BOTMESH_MAX_PENDING_PER_CHAT", " 50 ");
  env.set("BOTMESH_LOG_LEVEL", "debug");
  env.set("BOTMESH_LIMITS_MAX_TEXT_BYTES", "1024");
  env.set("BOTMESH_SCHEDULER_TIME_ZONE", "Europe/Madrid");
  auto o = botmesh::bot_options::from_env();
  CHECK(o.stop_timeout.ms() == 30s);
  CHECK_FALSE(o.log_messages);
  CHECK(o.max_pending_per_chat == 50);
  CHECK(o.log_level == botmesh::log::level::debug);
  CHECK(o.limits.max_text_bytes == 1024);
  CHECK(o.scheduler.time_zone == "Europe/Madrid");
  CHECK(o.handler_threads == 64);
  CHECK(o.passivate_after.ms() == 1min);
  CHECK_FALSE(o.coordination.has_value());
  CHECK_FALSE(o.durability.has_value());
}

TEST_CASE("an environment value that does not parse names the variable and "
          "the option") {
  {
    env_scope env;
    env.set("BOTMESH_STOP_TIMEOUT", "ten seconds");
    std::string field;
    auto what = error_of([] { botmesh::bot_options::from_env(); }, &field);
    CHECK(field == "stop_timeout");
    CHECK(what.find("BOTMESH_STOP_TIMEOUT=\"ten seconds\"") != std::string::npos);
    CHECK(what.find("not a duration") != std::string::npos);
  }
  {
    // A bare number would be milliseconds: 30 meant as seconds would stop
    // the bot after 30 ms.
    env_scope env;
    env.set("BOTMESH_STOP_TIMEOUT", "30");
    std::string field;
    auto what = error_of([] { botmesh::bot_options::from_env(); }, &field);
    CHECK(field == "stop_timeout");
    CHECK(what.find("a duration needs its unit (\"30s\", \"30ms\")")
          != std::string::npos);
  }
  {
    env_scope env;
    env.set("BOTMESH_HANDLER_THREADS", "-3");
    std::string field;
    auto what = error_of([] { botmesh::bot_options::from_env(); }, &field);
    CHECK(field == "handler_threads");
    CHECK(what.find("BOTMESH_HANDLER_THREADS") != std::string::npos);
  }
  {
    env_scope env;
    env.set("BOTMESH_LOG_MESSAGES", "maybe");
    CHECK(error_of([] { botmesh::bot_options::from_env(); }).find("not a boolean")
          != std::string::npos);
  }
  {
    env_scope env;
    env.set("BOTMESH_COORDINATION_SESSION", "everyone");
    std::string field;
    error_of([] { botmesh::bot_options::from_env(); }, &field);
    CHECK(field == "coordination.session");
  }
}

TEST_CASE("the environment overrides what the application set, section by "
          "section") {
  env_scope env;
  env.set("BOTMESH_COORDINATION_TURN_WAIT", "5s");
  botmesh::bot_options base;
  base.bot_id = "shop";
  base.coordination.emplace();
  base.coordination->settle = "7s";
  auto o = botmesh::bot_options::from_env(std::move(base));
  CHECK(o.bot_id == "shop");
  REQUIRE(o.coordination.has_value());
  CHECK(o.coordination->turn_wait.ms() == 5s);
  CHECK(o.coordination->settle.ms() == 7s);
}

TEST_CASE("an INI file sets options at the top level and in sections") {
  ini_file f{"; a bot\n"
             "bot_id = shop#2 ;a comment after a space\n"
             "stop_timeout = 20s   # comment\n"
             "\n"
             "[bot]\n"
             "lang = es\n"
             "[coordination]\n"
             "turn_wait = 45s\n"
             "session = shared\n"
             "[durability]\n"
             "instance_id = \"pod-1; a\"\n"
             "max_attempts = 3\n"
             "[limits]\n"
             "max_id_bytes = 128\n"};
  auto o = botmesh::bot_options::from_file(f.path());
  CHECK(o.bot_id == "shop#2"); // no space before '#': part of the value
  CHECK(o.stop_timeout.ms() == 20s);
  CHECK(o.lang == "es");
  REQUIRE(o.coordination.has_value());
  CHECK(o.coordination->turn_wait.ms() == 45s);
  CHECK(o.coordination->session == botmesh::provider_session::shared);
  REQUIRE(o.durability.has_value());
  CHECK(o.durability->instance_id == "pod-1; a");
  CHECK(o.durability->max_attempts == 3);
  CHECK(o.limits.max_id_bytes == 128);
}

TEST_CASE("a malformed configuration file is refused naming the file, the "
          "line and what was wrong") {
  {
    ini_file f{"stop_timeout = 1s\nthis line has no equals sign\n"};
    auto what = error_of([&] { botmesh::bot_options::from_file(f.path()); });
    CHECK(what.find(f.path() + ":2:") != std::string::npos);
    CHECK(what.find("expected \"key = value\"") != std::string::npos);
  }
  {
    ini_file f{"[coordination]\nturn_wiat = 1s\n"};
    std::string field;
    auto what = error_of([&] { botmesh::bot_options::from_file(f.path()); }, &field);
    CHECK(field == "coordination.turn_wiat");
    CHECK(what.find("unknown option \"coordination.turn_wiat\"") != std::string::npos);
  }
  {
    ini_file f{"\n\nmax_throughput = 0\n"};
    std::string field;
    auto what = error_of([&] { botmesh::bot_options::from_file(f.path()); }, &field);
    CHECK(field == "max_throughput");
    CHECK(what.find(":3:") != std::string::npos);
    CHECK(what.find("must be > 0") != std::string::npos);
  }
  {
    ini_file f{"[coordination\n"};
    CHECK(error_of([&] { botmesh::bot_options::from_file(f.path()); })
            .find("malformed section header")
          != std::string::npos);
  }
  CHECK(error_of([] { botmesh::bot_options::from_file("/nonexistent/bot.ini"); })
          .find("/nonexistent/bot.ini cannot be read")
        != std::string::npos);
}

TEST_CASE("a configuration path that is a directory, an option set twice and "
          "a count beyond its type are refused, not passed over") {
  // A directory opens as a stream that reads nothing: it gave the defaults.
  CHECK(error_of([] { botmesh::bot_options::from_file("/tmp"); })
          .find("/tmp is a directory")
        != std::string::npos);
  {
    ini_file f{"stop_timeout = 1s\n[bot]\n\nstop_timeout = 30s\n"};
    std::string field;
    auto what = error_of([&] { botmesh::bot_options::from_file(f.path()); }, &field);
    CHECK(field == "stop_timeout");
    CHECK(what.find(f.path() + ":4:") != std::string::npos);
    CHECK(what.find("first on line 1") != std::string::npos);
  }
  {
    // The same key in two sections is two options.
    ini_file f{"[coordination]\nturn_wait = 1m\n[durability]\nlease = 5s\n"};
    auto o = botmesh::bot_options::from_file(f.path());
    CHECK(o.coordination->turn_wait.ms() == 1min);
  }
  {
    ini_file f{"[durability]\nmax_attempts = 5000000000\n"};
    std::string field;
    auto what = error_of([&] { botmesh::bot_options::from_file(f.path()); }, &field);
    CHECK(field == "durability.max_attempts");
    CHECK(what.find("at most 4294967295") != std::string::npos);
  }
  env_scope env;
  env.set("BOTMESH_DURABILITY_MAX_ATTEMPTS", "4294967296");
  std::string field;
  error_of([] { botmesh::bot_options::from_env(); }, &field);
  CHECK(field == "durability.max_attempts");
  env.set("BOTMESH_DURABILITY_MAX_ATTEMPTS", "4294967295");
  CHECK(botmesh::bot_options::from_env().durability->max_attempts == 4294967295u);
}

TEST_CASE("the README's configuration table lists every option with its "
          "variable") {
  std::ifstream in{std::string{BOTMESH_SOURCE_DIR} + "/README.md"};
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  auto readme = ss.str();
  for (auto& o : botmesh::configuration_options()) {
    INFO(o.key);
    CHECK(readme.find("| `" + std::string{o.key} + "` | `" + std::string{o.env} + "` |")
          != std::string::npos);
  }
}
