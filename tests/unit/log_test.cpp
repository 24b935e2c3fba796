#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/runtime/core/internal/log_limiter.hpp>
#include <botmesh/runtime/core/log.hpp>
#include <botmesh/stores/memory_coordinator.hpp>
#include <botmesh/stores/schedule_store.hpp>

#include "log_capture.hpp"
#include "test_util.hpp"

using namespace std::chrono_literals;
namespace log = botmesh::log;

namespace {

// A leader lease whose backend is down until told otherwise.
class flaky_lease final : public botmesh::lease_provider {
 public:
  std::optional<std::uint64_t> try_acquire(std::string_view, std::string_view,
                                           botmesh::time_point,
                                           std::chrono::milliseconds) override {
    ++calls;
    if (down.load())
      throw std::runtime_error("connection refused");
    return 1;
  }
  void release(std::string_view, std::string_view) override {
    // nop
  }

  std::atomic<bool> down{true};
  std::atomic<int> calls{0};
};

} // namespace

TEST_CASE("the default level writes errors and warnings only") {
  test::log_capture cap;
  CHECK(log::current_level() == log::level::warn);
  CHECK(log::enabled(log::level::error));
  CHECK(log::enabled(log::level::warn));
  CHECK_FALSE(log::enabled(log::level::info));
  log::info("test", "not written");
  log::warn("test", "written", {.bot = "shop", .chat = "tg:1", .fence = 7});
  log::set_level(log::level::off);
  log::error("test", "not written either");
  auto all = cap.all();
  REQUIRE(all.size() == 1);
  CHECK(all[0].text == "written");
  CHECK(all[0].bot == "shop");
  CHECK(all[0].chat == "tg:1");
  CHECK(all[0].fence == 7);
}

TEST_CASE("log levels parse by name and reject anything else") {
  CHECK(log::parse_level("DEBUG") == log::level::debug);
  CHECK(log::parse_level("warning") == log::level::warn);
  CHECK(log::parse_level("off") == log::level::off);
  CHECK_FALSE(log::parse_level("verbose").has_value());
  CHECK(log::to_string(log::level::error) == "error");
}

TEST_CASE("message text is redacted unless asked for") {
  test::log_capture cap;
  CHECK(log::redact("hola") == "<redacted 4 bytes>");
  log::set_log_text(true);
  CHECK(log::redact("hola") == "hola");
}

TEST_CASE("the limiter lets the first occurrence through, then one per "
          "interval with the count held back") {
  botmesh::internal::log_limiter lim{30s};
  auto t0 = std::chrono::steady_clock::time_point{} + 1h;
  std::uint64_t held = 99;
  CHECK(lim.allow(held, t0));
  CHECK(held == 0);
  CHECK_FALSE(lim.allow(held, t0 + 1s));
  CHECK_FALSE(lim.allow(held, t0 + 29s));
  CHECK(lim.allow(held, t0 + 30s));
  CHECK(held == 2);
  CHECK(lim.reset());
  CHECK(lim.allow(held, t0 + 31s)); // a new episode passes at once
  CHECK(held == 0);
}

TEST_CASE("an error event with no listener is logged once with its fields, "
          "the text redacted") {
  test::log_capture cap;
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .bot_id = "shop"}};
  b.on_message([](botmesh::context&) { throw std::runtime_error("boom"); });
  b.start();
  p->inject("ana", "my secret order");
  REQUIRE(test::eventually([&] { return b.stats().handler_errors == 1; }));
  REQUIRE(test::eventually([&] { return cap.count("bot", "boom") == 1; }));
  b.stop();
  CHECK(cap.count("bot", "boom") == 1);
  for (auto& c : cap.all()) {
    CHECK(c.text.find("my secret order") == std::string::npos);
    if (c.text.find("boom") != std::string::npos) {
      CHECK(c.severity == log::level::error);
      CHECK(c.bot == "shop");
      CHECK(c.chat == "test:ana");
      CHECK(c.code == "handler_failed");
      CHECK_FALSE(c.message_id.empty());
    }
  }
}

TEST_CASE("message text appears in an error's log line only when asked for") {
  test::log_capture cap;
  log::set_log_text(true);
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p}};
  b.on_message([](botmesh::context&) { throw std::runtime_error("boom"); });
  b.start();
  p->inject("ana", "my order");
  REQUIRE(test::eventually([&] { return cap.count("bot", "boom") == 1; }));
  CHECK(cap.count("bot", "text=\"my order\"") == 1);
}

TEST_CASE("an error event taken by a listener is not logged") {
  test::log_capture cap;
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p}};
  errors.attach(b);
  b.on_message([](botmesh::context&) { throw std::runtime_error("boom"); });
  b.start();
  p->inject("ana", "x");
  REQUIRE(test::eventually(
    [&] { return errors.count(botmesh::errc::handler_failed) == 1; }));
  b.stop();
  CHECK(cap.count("bot", "boom") == 0);
}

TEST_CASE("the scheduler's lease failures are logged only with tasks, "
          "rate-limited, and their end once") {
  test::log_capture cap;
  auto lease = std::make_shared<flaky_lease>();
  botmesh::scheduler_options o;
  o.lease = lease;
  o.tick = "2ms";
  botmesh::scheduler s{o};
  s.start();
  // No task: the lease is tried every tick, and nothing is written.
  // (A call counts when made, its failure when its reply is handled.)
  REQUIRE(test::eventually([&] { return s.stats().store_errors >= 10; }));
  CHECK(cap.count("scheduler", "leader lease failed") == 0);
  // With a task, the failure is written once for many ticks (30 s limit).
  auto t = s.every("1h", [] {});
  auto before = lease->calls.load();
  REQUIRE(test::eventually([&] { return lease->calls.load() >= before + 20; }));
  CHECK(cap.count("scheduler", "leader lease failed") == 1);
  // Back up: one line says so.
  lease->down = false;
  REQUIRE(test::eventually(
    [&] { return cap.count("scheduler", "succeed again") == 1; }));
  auto now = lease->calls.load();
  REQUIRE(test::eventually([&] { return lease->calls.load() >= now + 5; }));
  CHECK(cap.count("scheduler", "succeed again") == 1);
  CHECK(cap.count("scheduler", "leader lease failed") == 1);
  s.stop();
}

TEST_CASE("the log line of a coordinated turn's error carries its fence") {
  test::log_capture cap;
  botmesh::memory_coordination_hub hub;
  auto coord = std::make_shared<botmesh::memory_coordinator>(
    hub, botmesh::memory_coordinator_options{.replica_id = "r1"});
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::coordination_options co;
  co.coordinator = coord;
  botmesh::bot_options o{.provider = p, .coordination = co};
  o.bot_id = "shop";
  botmesh::bot b{std::move(o)};
  std::atomic<std::uint64_t> seen{0};
  b.on_message([&](botmesh::context& c) {
    seen = c.fence();
    throw std::runtime_error("boom");
  });
  b.start();
  p->inject("ana", "x");
  REQUIRE(test::eventually([&] { return cap.count("bot", "boom") == 1; }));
  REQUIRE(seen.load() > 0);
  for (auto& c : cap.all())
    if (c.text.find("boom") != std::string::npos) {
      CHECK(c.fence == seen.load());
      CHECK(c.replica == "r1");
    }
}
