// The telegram_bot example as a process, in webhook mode against a fake Bot
// API on loopback: SIGTERM drains what was accepted and exits 0.

#include <doctest/doctest.h>

#include <condition_variable>
#include <csignal>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <botmesh/providers/http/http_client.hpp>

#include "tools/process.hpp"
#include "unit/fake_platform.hpp"

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// The port in telegram_bot's "webhook mode on port N, ready" line.
std::string ready_port(const std::string& err) {
  auto port = test::number_after(err, "on port ");
  REQUIRE_FALSE(port.empty());
  return port;
}

} // namespace

TEST_CASE("telegram_bot drains on SIGTERM: a reply in progress and the "
          "update queued behind it are still sent, and it exits 0") {
  auto api = test::fake_telegram();
  // The first reply's sendMessage is held until the bot has the signal: the
  // handler is slow, still running when SIGTERM arrives.
  std::mutex mtx;
  std::condition_variable cv;
  std::optional<botmesh::http::responder> held;
  std::vector<bool> after_sigterm; // per sendMessage, in arrival order
  test::process* bot_process = nullptr;
  api->on("sendMessage", [&](const std::string&, botmesh::http::responder r) {
    bool draining = contains(bot_process->err(), "draining");
    std::lock_guard guard{mtx};
    after_sigterm.push_back(draining);
    if (after_sigterm.size() == 1) {
      held = std::move(r);
      cv.notify_all();
      return;
    }
    r.respond({.status = 200, .body = R"({"ok":true,"result":{"message_id":2}})",
               .content_type = "application/json"});
  });

  test::process bot{TELEGRAM_BOT,
                    {},
                    {{"TELEGRAM_TOKEN", test::telegram_token},
                     {"TELEGRAM_API_URL", api->url()},
                     {"TELEGRAM_MODE", std::nullopt},
                     // One process, in memory (scripts/test exports a
                     // REDIS_URL the example would otherwise share).
                     {"REDIS_URL", std::nullopt},
                     {"WEBHOOK_SECRET", "s3cret"},
                     {"LISTEN_ADDRESS", "127.0.0.1"},
                     {"PORT", "0"}}};
  bot_process = &bot;
  REQUIRE(bot.wait_for_stderr(", ready"));
  auto hook = "http://127.0.0.1:" + ready_port(bot.err()) + "/telegram";

  botmesh::http::client client;
  auto post = [&](std::int64_t id, const std::string& text) {
    return client
      .request({.url = hook,
                .body = test::tg_text_update(id, 42, text),
                .headers = {{"X-Telegram-Bot-Api-Secret-Token", "s3cret"}}})
      .status;
  };
  // The probes share the webhook's port.
  auto get = [&](const std::string& path) {
    botmesh::http::client_request req;
    req.method = "GET";
    req.url = "http://127.0.0.1:" + ready_port(bot.err()) + path;
    return client.request(req);
  };
  CHECK(get("/healthz").status == 200);
  CHECK(get("/readyz").status == 200);
  CHECK(post(1, "primero") == 200);
  CHECK(post(2, "segundo") == 200); // queued behind the first, same chat
  {
    std::unique_lock guard{mtx};
    REQUIRE(cv.wait_for(guard, std::chrono::seconds(30),
                        [&] { return held.has_value(); }));
  }
  // Both accepted; the second waits for its turn behind the held send.
  auto scrape = get("/metrics");
  CHECK(scrape.status == 200);
  CHECK(contains(scrape.body, "\nbotmesh_messages_received_total 2\n"));
  CHECK(contains(scrape.body, "# TYPE botmesh_turn_wait_seconds histogram"));
  bot.signal(SIGTERM);
  REQUIRE(bot.wait_for_stderr("signal 15, draining"));
  {
    std::lock_guard guard{mtx};
    held->respond({.status = 200,
                   .body = R"({"ok":true,"result":{"message_id":1}})",
                   .content_type = "application/json"});
  }
  CHECK(bot.wait() == 0);
  auto sends = api->calls("sendMessage");
  REQUIRE(sends.size() == 2);
  CHECK(contains(sends[0].body, R"("chat_id":42)"));
  CHECK(contains(sends[0].body, "Dijiste: primero"));
  CHECK(contains(sends[1].body, "Dijiste: segundo"));
  std::lock_guard guard{mtx};
  // The second handler ran only after the signal, during the drain.
  CHECK(after_sigterm == std::vector<bool>{false, true});
  CHECK_FALSE(contains(bot.err(), "error"));
}
