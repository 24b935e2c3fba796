// Telegram long polling against a fake Bot API: offsets, resume, 409.

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <limits>
#include <mutex>
#include <thread>

#include <botmesh/providers/telegram/telegram_polling.hpp>
#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/stores/memory_coordinator.hpp>

#include "fake_platform.hpp"
#include "log_capture.hpp"
#include "test_util.hpp"

using namespace std::chrono_literals;
namespace http = botmesh::http;
namespace tg = botmesh::telegram;

namespace {

/// getUpdates answers the queued updates from the asked offset on, or an
/// empty result after a short while (a long poll in small).
struct update_feed {
  std::mutex mtx;
  std::vector<std::pair<std::int64_t, std::string>> updates;
  std::vector<std::int64_t> offsets_asked;
  std::vector<std::chrono::steady_clock::time_point> asked_at;
  /// As Telegram after it restarted its update ids: an offset that is no
  /// successor of a queued id (an old one, above them all) hides none.
  bool restarted = false;

  void attach(test::fake_api& api) {
    auto* srv = &api.server();
    api.on("getUpdates", [this, srv](const std::string& body, http::responder r) {
      std::int64_t offset = 0;
      if (auto p = body.find("\"offset\":"); p != std::string::npos)
        offset = std::stoll(body.substr(p + 9));
      std::size_t limit = 100;
      if (auto p = body.find("\"limit\":"); p != std::string::npos)
        limit = std::stoul(body.substr(p + 8));
      std::string result = "[";
      {
        std::lock_guard guard{mtx};
        offsets_asked.push_back(offset);
        asked_at.push_back(std::chrono::steady_clock::now());
        if (restarted
            && std::all_of(updates.begin(), updates.end(),
                           [&](auto& u) { return u.first + 1 < offset; }))
          offset = 0;
        std::size_t n = 0;
        for (auto& [id, json] : updates)
          if (id >= offset && n++ < limit) {
            if (result.size() > 1)
              result += ",";
            result += json;
          }
      }
      result += "]";
      auto answer = http::response{.body = R"({"ok":true,"result":)" + result + "}",
                                   .content_type = "application/json"};
      if (result.size() > 2)
        r.respond(std::move(answer));
      else
        srv->after(50ms, [r, answer] { r.respond(answer); });
    });
  }

  void push(std::int64_t id, std::int64_t chat, const std::string& text) {
    push_raw(id, test::tg_text_update(id, chat, text));
  }

  /// An item as it is, answered for offsets up to `id`.
  void push_raw(std::int64_t id, std::string json) {
    std::lock_guard guard{mtx};
    updates.emplace_back(id, std::move(json));
  }

  std::vector<std::int64_t> asked() {
    std::lock_guard guard{mtx};
    return offsets_asked;
  }
};

/// The texts a bot handled, in order (thread-safe).
struct text_log {
  std::mutex mtx;
  std::vector<std::string> texts;

  void attach(botmesh::bot& bot) {
    bot.on_message([this](botmesh::context& c) {
      std::lock_guard guard{mtx};
      texts.push_back(c.text());
    });
  }

  std::vector<std::string> all() {
    std::lock_guard guard{mtx};
    return texts;
  }
};

tg::polling_options options(const test::fake_api& api,
                            std::shared_ptr<botmesh::store> store,
                            std::string token = test::telegram_token) {
  tg::polling_options o;
  o.token = std::move(token);
  o.api_url = api.url();
  o.poll_timeout = "1s";
  o.retry_backoff = "50ms";
  o.offset_store = std::move(store);
  o.flood = http::flood_limits::none();
  return o;
}

/// A bot (not started) polling a fake Bot API whose getUpdates answers from
/// `feed`, with its offset store and the texts it handled.
struct polled_bot {
  update_feed feed; // outlives the fake API, whose thread calls it
  std::unique_ptr<test::fake_api> api = test::fake_telegram();
  std::shared_ptr<botmesh::memory_store> store =
    std::make_shared<botmesh::memory_store>();
  text_log handled; // outlives the bot, whose handler writes it
  std::shared_ptr<tg::polling_provider> p;
  std::unique_ptr<botmesh::bot> bot;

  explicit polled_bot(
    const std::function<void(tg::polling_options&)>& tune = {}) {
    feed.attach(*api);
    auto o = options(*api, store);
    if (tune)
      tune(o);
    p = std::make_shared<tg::polling_provider>(o);
    bot = std::make_unique<botmesh::bot>(
      botmesh::bot_options{.provider = p, .store = store});
    handled.attach(*bot);
  }
};

} // namespace

TEST_CASE("long polling delivers updates, keeps the next offset in the store "
          "and a new poller resumes from it without replaying") {
  update_feed feed; // outlives the fake API, whose thread calls it
  auto api = test::fake_telegram();
  feed.attach(*api);
  auto store = std::make_shared<botmesh::memory_store>();
  for (int i = 1; i <= 3; ++i)
    feed.push(i, 42, std::to_string(i));
  std::atomic<int> handled{0};
  {
    auto p = std::make_shared<tg::polling_provider>(options(*api, store));
    botmesh::bot bot{{.provider = p, .store = store}};
    bot.on_message([&](botmesh::context& c) {
      ++handled;
      c.reply("eco " + c.text());
    });
    bot.start();
    REQUIRE(api->wait_for_calls("sendMessage", 3));
    REQUIRE(test::eventually([&] { return p->stats().offset == 4; }));
  }
  CHECK(store->get_user_data("provider:telegram", "botmesh",
                             "telegram_offset:123")
        == std::optional<std::string>{"4"});
  feed.push(4, 42, "4");
  auto p2 = std::make_shared<tg::polling_provider>(options(*api, store));
  botmesh::bot bot2{{.provider = p2, .store = store}};
  bot2.on_message([&](botmesh::context& c) {
    ++handled;
    c.reply("eco " + c.text());
  });
  bot2.start();
  REQUIRE(api->wait_for_calls("sendMessage", 4));
  REQUIRE(test::eventually([&] { return p2->stats().offset == 5; }));
  CHECK(handled.load() == 4);
  auto asked = feed.asked();
  // The second poller's first request already asked from 4.
  CHECK(std::count(asked.begin(), asked.end(), 1) == 0);
  CHECK(std::find(asked.begin(), asked.end(), 4) != asked.end());
}

TEST_CASE("when Telegram restarts its update ids below the offset, the new "
          "updates are handled, not skipped as seen, and the offset follows") {
  update_feed feed;
  auto api = test::fake_telegram();
  feed.attach(*api);
  auto store = std::make_shared<botmesh::memory_store>();
  for (int i = 100; i <= 102; ++i)
    feed.push(i, 42, "viejo" + std::to_string(i));
  auto p = std::make_shared<tg::polling_provider>(options(*api, store));
  botmesh::bot bot{{.provider = p, .store = store}};
  text_log handled;
  handled.attach(bot);
  bot.start();
  REQUIRE(test::eventually([&] { return p->stats().offset == 103; }));
  {
    std::lock_guard guard{feed.mtx};
    feed.updates.clear();
    feed.restarted = true;
  }
  feed.push(7, 42, "nuevo7");
  feed.push(8, 42, "nuevo8");
  REQUIRE(test::eventually([&] { return p->stats().offset == 9; }));
  feed.push(9, 42, "nuevo9");
  REQUIRE(test::eventually([&] { return p->stats().offset == 10; }));
  REQUIRE(test::eventually([&] { return bot.stats().handled == 6; }));
  bot.stop();
  CHECK(p->stats().id_restarts == 1);
  CHECK(store->get_user_data("provider:telegram", "botmesh",
                             "telegram_offset:123")
        == std::optional<std::string>{"10"});
  CHECK(handled.all() == std::vector<std::string>{"viejo100", "viejo101",
                                                  "viejo102", "nuevo7", "nuevo8",
                                                  "nuevo9"});
}

namespace {

/// A poller of bot `token` over `store` handles the update `id` queued on
/// a fresh fake; returns the first offset it asked for.
std::int64_t first_offset_asked(std::shared_ptr<botmesh::store> store,
                                const std::string& token, std::int64_t id) {
  update_feed feed; // outlives the fake API, whose thread calls it
  auto api = test::fake_telegram(token);
  feed.attach(*api);
  feed.push(id, 42, "hola");
  auto p = std::make_shared<tg::polling_provider>(options(*api, store, token));
  botmesh::bot bot{{.provider = p, .store = store}};
  std::atomic<int> handled{0};
  bot.on_message([&](botmesh::context&) { ++handled; });
  bot.start();
  REQUIRE(test::eventually([&] { return handled.load() == 1; }));
  bot.stop();
  CHECK(p->stats().offset == id + 1);
  CHECK(p->stats().id_restarts == 0);
  return feed.asked().front();
}

} // namespace

TEST_CASE("the stored offset belongs to its bot: another token under the same "
          "provider id starts from its own, and a corrupt one is ignored") {
  auto store = std::make_shared<botmesh::memory_store>();
  CHECK(first_offset_asked(store, "999:xyz", 500) == 0);
  // Bot 123's ids are below bot 999's offset (501): they are not skipped.
  CHECK(first_offset_asked(store, test::telegram_token, 5) == 0);
  CHECK(first_offset_asked(store, test::telegram_token, 6) == 6);
  // A stored value that is no update id: logged, and polling starts from
  // Telegram's own offset.
  store->set_user_data("provider:telegram", "botmesh", "telegram_offset:123",
                       "\"not-a-number\"");
  CHECK(first_offset_asked(store, test::telegram_token, 7) == 0);
}

TEST_CASE("an update that does not parse is skipped, logged and counted, "
          "the ones around it are handled and the offset moves on") {
  polled_bot t;
  t.feed.push(10, 42, "antes");
  // A message without its chat, and an item that is not an object.
  t.feed.push_raw(11, R"({"update_id":11,"message":{"message_id":1,"text":"x"}})");
  t.feed.push_raw(12, R"("not an update")");
  t.feed.push(13, 42, "despues");
  t.bot->start();
  REQUIRE(test::eventually([&] { return t.p->stats().offset == 14; }));
  REQUIRE(test::eventually([&] { return t.bot->stats().handled == 2; }));
  // An item without a readable id later on (read as id 0) is no restart
  // of Telegram's ids: the offset goes on from where it was.
  // Both in one answer: pushed apart, a poll between them sees the item
  // alone, and it is counted once per answer that brings it.
  {
    std::lock_guard guard{t.feed.mtx};
    t.feed.updates.emplace_back(14, R"({"message":{"message_id":2}})");
    t.feed.updates.emplace_back(15, test::tg_text_update(15, 42, "luego"));
  }
  REQUIRE(test::eventually([&] { return t.p->stats().offset == 16; }));
  REQUIRE(test::eventually([&] { return t.bot->stats().handled == 3; }));
  t.bot->stop();
  CHECK(t.p->stats().malformed == 3);
  CHECK(t.p->stats().id_restarts == 0);
  CHECK(t.handled.all()
        == std::vector<std::string>{"antes", "despues", "luego"});
}

TEST_CASE("an update that breaks the whole getUpdates answer is found by "
          "asking one at a time, skipped and counted, and the others are "
          "handled") {
  // An integer past 64 bits, and a string that is not UTF-8: the parser
  // refuses the whole answer, which came back the same forever.
  for (std::string damage : {R"("x":18446744073709551616)", "\"x\":\"\xff\xfe\""}) {
    CAPTURE(damage);
    polled_bot t;
    t.feed.push(10, 42, "antes");
    t.feed.push_raw(
      11, R"({"update_id":11,"message":{"message_id":9,"from":{"id":42},"chat":{"id":42,"type":"private"},"date":1700000000,"text":"roto",)"
            + damage + "}}");
    t.feed.push(12, 42, "despues");
    t.feed.push(13, 42, "luego");
    test::log_capture logs;
    t.bot->start();
    REQUIRE(test::eventually([&] { return t.p->stats().offset == 14; }));
    REQUIRE(test::eventually([&] { return t.bot->stats().handled == 3; }));
    t.bot->stop();
    CHECK(t.p->stats().malformed == 1);
    CHECK(t.handled.all()
          == std::vector<std::string>{"antes", "despues", "luego"});
    CHECK(logs.count("telegram", "skipping update 11") == 1);
  }
}

TEST_CASE("a getUpdates answer whose only item has no readable id is polled "
          "again after a pause, not at once") {
  polled_bot t{[](tg::polling_options& o) { o.retry_backoff = "100ms"; }};
  // Past the largest id the parser takes: a malformed item read as id 0,
  // which moves no offset.
  t.feed.push_raw(std::numeric_limits<std::int64_t>::max(),
                  R"({"update_id":9223372036854775807,"message":{"message_id":1}})");
  t.bot->start();
  REQUIRE(test::eventually([&] { return t.p->stats().malformed >= 1; }));
  std::this_thread::sleep_for(700ms);
  // Waits of 100, 200 and 400 ms after the first poll: at most six polls
  // (waits that stayed at 100 ms made eight or more). Asked again at once,
  // it was thousands.
  CHECK(t.p->stats().polls <= 6);
  // A later update is handled, and the offset moves past it.
  t.feed.push(5, 42, "despues");
  REQUIRE(test::eventually([&] { return t.bot->stats().handled == 1; }));
  t.bot->stop();
}

TEST_CASE("an error page instead of a getUpdates answer is a failed poll, "
          "not an update to look for") {
  polled_bot t;
  t.api->script("getUpdates", 502, "<html><body>502 Bad Gateway</body></html>");
  t.feed.push(1, 42, "hola");
  test::log_capture logs;
  t.bot->start();
  REQUIRE(test::eventually([&] { return t.bot->stats().handled == 1; }));
  t.bot->stop();
  CHECK(t.p->stats().errors == 1);
  CHECK(t.p->stats().malformed == 0);
  CHECK(logs.count("telegram", "HTTP 502") == 1);
  CHECK(logs.count("telegram", "one update at a time") == 0);
}

TEST_CASE("a poller whose replica does not lead (a lapse not acted on yet) "
          "asks Telegram nothing until it leads again") {
  struct host final : botmesh::provider_host {
    std::atomic<bool> leading{false};
    std::atomic<int> delivered{0};
    void deliver(botmesh::inbound_message) override {
      ++delivered;
    }
    void state_changed(botmesh::provider_state) override {}
    void input_closed() override {}
    bool leads() const override {
      return leading.load();
    }
  };
  update_feed feed;
  auto api = test::fake_telegram();
  feed.attach(*api);
  feed.push(1, 42, "hola");
  auto store = std::make_shared<botmesh::memory_store>();
  tg::polling_provider p{options(*api, store)};
  host h;
  p.start(h);
  std::this_thread::sleep_for(300ms);
  // A getUpdates now would end the leader's long poll with a 409.
  CHECK(feed.asked().empty());
  CHECK(h.delivered.load() == 0);
  h.leading = true;
  CHECK(test::eventually([&] { return h.delivered.load() == 1; }));
  p.stop();
  CHECK_FALSE(feed.asked().empty());
}

TEST_CASE("getUpdates items out of order, or a malformed copy of an id "
          "ahead of its sound one, are all handled in id order") {
  polled_bot t;
  t.feed.push(11, 42, "once");
  t.feed.push(10, 42, "diez");
  t.feed.push_raw(12, R"({"update_id":12,"message":{"message_id":1}})");
  t.feed.push(12, 42, "doce");
  t.bot->start();
  REQUIRE(test::eventually([&] { return t.p->stats().offset == 13; }));
  REQUIRE(test::eventually([&] { return t.bot->stats().handled == 3; }));
  t.bot->stop();
  CHECK(t.handled.all() == std::vector<std::string>{"diez", "once", "doce"});
}

TEST_CASE("a refused token is named in the log and the stats, and polling "
          "goes on once Telegram takes it again") {
  test::log_capture logs;
  update_feed feed; // outlives the fake API, whose thread calls it
  auto api = test::fake_telegram();
  api->script("getUpdates", 401,
              R"({"ok":false,"error_code":401,"description":"Unauthorized"})");
  feed.attach(*api);
  auto p = std::make_shared<tg::polling_provider>(options(*api, nullptr));
  botmesh::bot bot{{.provider = p}};
  text_log handled;
  handled.attach(bot);
  bot.start();
  // (The count, the last error and the log record are written one after
  // the other by the poller's thread: each is waited for.)
  REQUIRE(test::eventually([&] {
    return p->stats().errors == 1 && !p->stats().last_error.empty();
  }));
  auto why = p->stats().last_error;
  CHECK(why.find("401 Unauthorized") != std::string::npos);
  CHECK(why.find("refuses the bot's token") != std::string::npos);
  CHECK(test::eventually([&] {
    auto named = logs.all();
    return std::any_of(named.begin(), named.end(), [&](auto& c) {
      return c.severity == botmesh::log::level::error
             && c.component == "telegram" && c.text == why;
    });
  }));
  feed.push(1, 7, "hola");
  REQUIRE(test::eventually([&] { return bot.stats().handled == 1; }));
  CHECK(p->stats().last_error.empty());
  bot.stop();
}

TEST_CASE("a 409 because a webhook is still set is an error named as such, "
          "not another poller to yield to") {
  test::log_capture logs;
  update_feed feed; // outlives the fake API, whose thread calls it
  auto api = test::fake_telegram();
  for (int i = 0; i < 2; ++i)
    api->script("getUpdates", 409,
                R"({"ok":false,"error_code":409,"description":"Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first"})");
  feed.attach(*api);
  botmesh::memory_coordination_hub hub;
  auto p = std::make_shared<tg::polling_provider>(options(*api, nullptr));
  botmesh::coordination_options co;
  co.coordinator = std::make_shared<botmesh::memory_coordinator>(
    hub, botmesh::memory_coordinator_options{.replica_id = "a", .lease = "1s"});
  botmesh::bot bot{{.provider = p, .coordination = co}};
  std::atomic<int> yielded{0};
  bot.on<botmesh::events::follower>([&](const botmesh::events::follower& f) {
    if (f.reason == "conflict")
      ++yielded;
  });
  text_log handled;
  handled.attach(bot);
  bot.start();
  feed.push(1, 7, "hola");
  REQUIRE(test::eventually([&] { return bot.stats().handled == 1; }));
  bot.stop();
  CHECK(yielded.load() == 0);
  CHECK(p->stats().conflicts == 0);
  CHECK(p->stats().errors == 2);
  CHECK(logs.count("telegram", "a webhook is set for this bot") == 2);
}

TEST_CASE("a 429 on getUpdates waits the retry_after Telegram asked for") {
  update_feed feed; // outlives the fake API, whose thread calls it
  auto api = test::fake_telegram();
  api->script("getUpdates", 429,
              R"({"ok":false,"error_code":429,"description":"Too Many Requests: retry after 1","parameters":{"retry_after":1}})");
  feed.attach(*api);
  feed.push(1, 7, "hola");
  auto p = std::make_shared<tg::polling_provider>(options(*api, nullptr));
  botmesh::bot bot{{.provider = p}};
  bot.on_message([](botmesh::context&) {});
  auto t0 = std::chrono::steady_clock::now();
  bot.start();
  REQUIRE(test::eventually([&] { return bot.stats().handled == 1; }));
  bot.stop();
  CHECK(p->stats().errors == 1);
  std::lock_guard guard{feed.mtx};
  // The scripted 429 answered the first poll; the feed saw the next one,
  // which came a second later, not after the 50 ms backoff.
  REQUIRE(!feed.asked_at.empty());
  CHECK(feed.asked_at.front() - t0 >= 1s);
}

TEST_CASE("polling options that would make the poller spin are refused, "
          "naming the field") {
  auto api = test::fake_telegram();
  // The field an invalid_argument_error names, and its message.
  auto refused = [](tg::polling_options o) -> std::pair<std::string, std::string> {
    try {
      tg::polling_provider p{std::move(o)};
    } catch (const botmesh::invalid_argument_error& e) {
      return {std::string{e.field()}, e.what()};
    }
    return {};
  };
  auto o = options(*api, nullptr);
  o.poll_timeout = "500ms";
  auto [field, why] = refused(o);
  CHECK(field == "poll_timeout");
  CHECK(why.find("at least 1s") != std::string::npos);
  o = options(*api, nullptr);
  o.retry_backoff = "0s";
  std::tie(field, why) = refused(o);
  CHECK(field == "retry_backoff");
  CHECK(why.find("positive") != std::string::npos);
}

TEST_CASE("long polling answers a pressed button whose turn sent nothing, "
          "and one that was replied to only once") {
  update_feed feed;
  auto api = test::fake_telegram();
  feed.attach(*api);
  {
    std::lock_guard guard{feed.mtx};
    for (auto [id, cq] : {std::pair{1, "silent"}, std::pair{2, "replied"}})
      feed.updates.emplace_back(
        id, R"({"update_id":)" + std::to_string(id) + R"(,"callback_query":{"id":")"
              + cq + R"(","from":{"id":42},"message":{"message_id":5,"chat":{"id":42,"type":"private"}},"data":")"
              + cq + R"("}})");
  }
  auto p = std::make_shared<tg::polling_provider>(options(*api, nullptr));
  botmesh::bot bot{{.provider = p}};
  bot.on_message([](botmesh::context& c) {
    if (c.message().data == "replied")
      c.reply("ok");
  });
  bot.start();
  REQUIRE(api->wait_for_calls("answerCallbackQuery", 2));
  REQUIRE(test::eventually([&] { return bot.stats().handled == 2; }));
  bot.stop();
  std::vector<std::string> answered;
  for (auto& call : api->calls("answerCallbackQuery"))
    answered.push_back(call.body);
  std::sort(answered.begin(), answered.end());
  CHECK(answered == std::vector<std::string>{R"({"callback_query_id":"replied"})",
                                             R"({"callback_query_id":"silent"})"});
}

TEST_CASE("a 409 Conflict on getUpdates yields the leadership instead of "
          "fighting the other poller") {
  update_feed feed; // outlives the fake API, whose thread calls it
  auto api = test::fake_telegram();
  api->script("getUpdates", 409,
              R"({"ok":false,"error_code":409,"description":"Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"})");
  feed.attach(*api);
  botmesh::memory_coordination_hub hub;
  auto store = std::make_shared<botmesh::memory_store>();
  auto p = std::make_shared<tg::polling_provider>(options(*api, store));
  botmesh::coordination_options co;
  co.coordinator = std::make_shared<botmesh::memory_coordinator>(
    hub, botmesh::memory_coordinator_options{.replica_id = "a", .lease = "1s"});
  botmesh::bot bot{{.provider = p, .store = store, .coordination = co}};
  std::mutex mtx;
  std::vector<std::string> reasons;
  bot.on<botmesh::events::follower>([&](const botmesh::events::follower& f) {
    std::lock_guard guard{mtx};
    reasons.push_back(f.reason);
  });
  bot.start();
  REQUIRE(test::eventually([&] {
    std::lock_guard guard{mtx};
    return !reasons.empty() && reasons.back() == "conflict";
  }));
  CHECK(p->stats().conflicts == 1);
  auto polls_at_yield = api->calls("getUpdates").size();
  CHECK(polls_at_yield == 1);
  // It presents itself again later and polls normally.
  feed.push(1, 7, "hola");
  REQUIRE(test::eventually([&] { return p->stats().updates == 1; }, 15s));
  CHECK(bot.ready(5s));
}

TEST_CASE("without coordination a 409 makes the poller back off and retry") {
  update_feed feed; // outlives the fake API, whose thread calls it
  auto api = test::fake_telegram();
  api->script("getUpdates", 409, R"({"ok":false,"error_code":409,"description":"Conflict"})");
  feed.attach(*api);
  feed.push(1, 7, "hola");
  auto p = std::make_shared<tg::polling_provider>(options(*api, nullptr));
  botmesh::bot bot{{.provider = p}};
  bot.on_message([](botmesh::context&) {});
  bot.start();
  REQUIRE(test::eventually([&] { return p->stats().updates == 1; }));
  CHECK(p->stats().conflicts == 1);
}

TEST_CASE("an error listener that stops the bot from the poller's thread "
          "stops it, without the poller waiting for itself") {
  update_feed feed; // outlives the fake API, whose thread calls it
  auto api = test::fake_telegram();
  feed.attach(*api);
  auto store = std::make_shared<botmesh::memory_store>();
  auto p = std::make_shared<tg::polling_provider>(options(*api, store));
  botmesh::bot_options bo{.provider = p, .store = store};
  bo.limits.max_text_bytes = 3;
  botmesh::bot bot{bo};
  std::atomic<bool> asked{false};
  // The refusal's error event runs on the poller's thread. Before, the
  // stop ran there too: stopping the provider joined that very thread
  // (std::terminate), or, with an exclusive transport, waited for the
  // transport thread that waited for it.
  bot.on<botmesh::events::error>([&](const botmesh::events::error& e) {
    if (e.code == botmesh::errc::invalid_argument && !asked.exchange(true))
      bot.stop();
  });
  bot.start();
  feed.push(1, 7, "hola mundo"); // over 3 bytes: refused
  REQUIRE(test::eventually([&] { return asked.load(); }));
  CHECK(test::eventually(
    [&] { return p->state() == botmesh::provider_state::closed; }, 10s));
  CHECK_THROWS_AS(bot.run(), botmesh::error); // stopped
}
