// The Telegram webhook provider against a fake Bot API on loopback.

#include <doctest/doctest.h>

#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <latch>
#include <utility>

#include <botmesh/providers/http/flood_control.hpp>
#include <botmesh/providers/http/http_server.hpp>
#include <botmesh/providers/telegram/internal/methods.hpp>
#include <botmesh/providers/telegram/internal/update_parser.hpp>
#include <botmesh/providers/telegram/telegram_polling.hpp>
#include <botmesh/providers/telegram/telegram_webhook.hpp>
#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/stores/memory_coordinator.hpp>
#include <botmesh/stores/memory_durable_backend.hpp>

#include <botmesh/runtime/core/json.hpp>

#include "fake_platform.hpp"
#include "log_capture.hpp"
#include "gated_backend.hpp"
#include "test_util.hpp"

using namespace std::chrono_literals;
namespace http = botmesh::http;
namespace tg = botmesh::telegram;

namespace {

constexpr const char* secret = "s3cret";

tg::webhook_options options(const test::fake_api& api) {
  tg::webhook_options o;
  o.token = test::telegram_token;
  o.api_url = api.url();
  o.secret_token = secret;
  o.flood = http::flood_limits::none();
  return o;
}

/// A webhook provider on `api` that replies in the webhook's response.
std::shared_ptr<tg::webhook_provider>
replying_provider(const test::fake_api& api, const char* reply_wait = nullptr) {
  auto o = options(api);
  o.reply_in_webhook = true;
  if (reply_wait)
    o.reply_wait = reply_wait;
  return std::make_shared<tg::webhook_provider>(o);
}

/// Posts updates to a bot's webhook like Telegram does.
struct poster {
  explicit poster(std::string u) : url(std::move(u)), client(std::make_unique<http::client>()) {}
  std::string url;
  std::unique_ptr<http::client> client;

  http::client_response post(const std::string& body,
                             const char* token = secret) {
    http::client_request req{.url = url, .body = body};
    if (token)
      req.headers.emplace_back("X-Telegram-Bot-Api-Secret-Token", token);
    return client->request(req);
  }
};

poster poster_for(tg::webhook_provider& p) {
  return poster{p.server().url() + "/telegram"};
}

// The Bot API's 429, asking to retry after `seconds`.
std::string too_many_requests(int seconds) {
  return fmt::format(R"({{"ok":false,"error_code":429,"description":"Too Many Requests: retry after {0}","parameters":{{"retry_after":{0}}}}})",
                     seconds);
}

} // namespace

TEST_CASE("a Telegram update is parsed into a message with its command, "
          "sender and group participant") {
  auto u = tg::internal::parse_update(
    R"({"update_id":7,"message":{"message_id":3,"from":{"id":42},"chat":{"id":-100123,"type":"supergroup"},"date":1700000000,"text":"/start@my_bot ref","entities":[{"type":"bot_command","offset":0,"length":13}]}})",
    "telegram");
  CHECK(u.update_id == 7);
  CHECK(u.kind == tg::internal::update_kind::message);
  CHECK(u.message.chat == "-100123");
  CHECK(u.message.participant == "42");
  CHECK(u.message.sender == "42");
  CHECK(u.message.id == "3");
  CHECK(u.message.command == "start");
  CHECK(u.message.text == "/start@my_bot ref");
  CHECK(botmesh::to_unix_ms(u.message.timestamp) == 1700000000000);
}

TEST_CASE("a Telegram date too large for milliseconds leaves the message "
          "without a time instead of overflowing") {
  auto at = [](const std::string& date) {
    auto u = tg::internal::parse_update(
      R"({"update_id":1,"message":{"message_id":1,"from":{"id":4},"chat":{"id":4,"type":"private"},"date":)"
        + date + R"(,"text":"hola"}})",
      "telegram");
    CHECK(u.kind == tg::internal::update_kind::message);
    CHECK(u.message.text == "hola");
    return botmesh::to_unix_ms(u.message.timestamp);
  };
  // The largest that fits, the first that does not, and the int64 limit.
  CHECK(at("9223372036854775") == 9223372036854775000);
  CHECK(at("9223372036854776") == 0);
  CHECK(at("9223372036854775807") == 0);
  CHECK(at("-5") == 0);
}

TEST_CASE("a Telegram edit_date too large for milliseconds is taken as none: "
          "the message keeps its send date") {
  auto at = [](const std::string& edit_date) {
    auto u = tg::internal::parse_update(
      R"({"update_id":1,"edited_message":{"message_id":1,"chat":{"id":5,"type":"private"},"date":1700000000,"edit_date":)"
        + edit_date + R"(,"text":"x"}})",
      "telegram");
    CHECK(u.kind == tg::internal::update_kind::edited_message);
    CHECK(u.message.edited);
    return botmesh::to_unix_ms(u.message.timestamp);
  };
  CHECK(at("1700000300") == 1700000300000);
  CHECK(at("9223372036854775") == 9223372036854775000);
  CHECK(at("9223372036854776") == 1700000000000);
  CHECK(at("9223372036854775807") == 1700000000000);
  CHECK(at("0") == 1700000000000);
}

TEST_CASE("a Telegram update_id whose next offset would overflow, or a "
          "negative one, is refused naming the update_id") {
  auto parse = [](const std::string& id) {
    return tg::internal::parse_update(
      R"({"update_id":)" + id
        + R"(,"message":{"message_id":1,"chat":{"id":5,"type":"private"},"date":1,"text":"x"}})",
      "telegram");
  };
  CHECK(parse("9223372036854775806").update_id == 9223372036854775806);
  CHECK(parse("0").update_id == 0);
  for (std::string bad : {"9223372036854775807", "-1"}) {
    CAPTURE(bad);
    try {
      parse(bad);
      FAIL("no error");
    } catch (const botmesh::invalid_argument_error& e) {
      CHECK(e.field() == "update_id");
      CHECK(std::string{e.what()}.find("out of range") != std::string::npos);
      CHECK(std::string{e.what()}.find(bad) != std::string::npos);
    }
  }
  // In a getUpdates batch: the item is malformed with no id (the offset is
  // not moved by it), the others parse.
  auto batch = tg::internal::parse_updates(
    R"([{"update_id":9223372036854775807,"message":{"message_id":1,"chat":{"id":5},"date":1,"text":"x"}},)"
    R"({"update_id":7,"message":{"message_id":2,"chat":{"id":5},"date":1,"text":"y"}}])",
    "telegram");
  REQUIRE(batch.size() == 2);
  CHECK(batch[0].kind == tg::internal::update_kind::malformed);
  CHECK(batch[0].update_id == 0);
  CHECK(batch[0].unknown_kind.find("out of range") != std::string::npos);
  CHECK(batch[1].kind == tg::internal::update_kind::message);
  CHECK(batch[1].update_id == 7);
}

TEST_CASE("a message in a forum topic is a conversation of its own and its "
          "reply goes to the same topic") {
  auto in_topic = [](int update_id, int thread, bool topic) {
    return fmt::format(
      R"({{"update_id":{},"message":{{"message_id":{},"from":{{"id":42}},"chat":{{"id":-100123,"type":"supergroup","is_forum":true}},"date":1700000000,"message_thread_id":{},{}"text":"hola"}}}})",
      update_id, update_id, thread, topic ? R"("is_topic_message":true,)" : "");
  };
  auto a = tg::internal::parse_update(in_topic(1, 7, true), "telegram");
  auto b = tg::internal::parse_update(in_topic(2, 9, true), "telegram");
  CHECK(a.message.chat == "-100123/7");
  CHECK(b.message.chat == "-100123/9");
  CHECK(botmesh::chat_key(a.message) != botmesh::chat_key(b.message));
  // A reply thread in a group that is no forum: the group itself.
  CHECK(tg::internal::parse_update(in_topic(3, 7, false), "telegram").message.chat
        == "-100123");
  botmesh::outgoing_message m;
  m.chat = a.message.chat;
  m.text = "eco";
  auto c = tg::internal::to_method_call(m);
  CHECK(c.body.starts_with(R"({"chat_id":-100123,"message_thread_id":7,)"));
  auto split = tg::internal::split_chat("@channel/12");
  CHECK(split.chat_id == "@channel");
  CHECK(split.thread_id == "12");
  // Not a topic: the whole text is the chat.
  for (std::string_view odd : {"-100123/", "-100123/0", "-100123/x", "/5", "42"}) {
    CHECK(tg::internal::split_chat(odd).chat_id == odd);
    CHECK(tg::internal::split_chat(odd).thread_id.empty());
  }
}

TEST_CASE("with the bot's username a command for another bot is no command, "
          "the sender's language is kept") {
  auto update = [](std::string_view text, std::size_t len) {
    return fmt::format(
      R"({{"update_id":7,"message":{{"message_id":3,"from":{{"id":42,"language_code":"pt-BR"}},"chat":{{"id":-1,"type":"group"}},"text":"{}","entities":[{{"type":"bot_command","offset":0,"length":{}}}]}}}})",
      text, len);
  };
  auto mine = tg::internal::parse_update(update("/start@My_Bot x", 13),
                                         "telegram", true, "my_bot");
  CHECK(mine.message.command == "start");
  CHECK(mine.message.language == "pt-BR");
  auto other = tg::internal::parse_update(update("/start@other_bot x", 16),
                                          "telegram", true, "my_bot");
  CHECK(other.message.command.empty());
  CHECK(other.message.text == "/start@other_bot x");
  auto bare = tg::internal::parse_update(update("/start x", 6), "telegram",
                                         true, "my_bot");
  CHECK(bare.message.command == "start");
  // Without a username any @name is taken (the bot cannot tell).
  auto unknown = tg::internal::parse_update(update("/start@other_bot x", 16),
                                            "telegram");
  CHECK(unknown.message.command == "start");
  auto cq = tg::internal::parse_update(
    R"({"update_id":3,"callback_query":{"id":"cq1","from":{"id":5,"language_code":"es"},"message":{"message_id":9,"from":{"id":1,"language_code":"en"},"chat":{"id":5,"type":"private"}},"data":"yes"}})",
    "telegram");
  CHECK(cq.message.language == "es"); // the presser's, not the message author's
}

TEST_CASE("Telegram media, location, edits and button presses are parsed, "
          "other kinds are reported unknown") {
  auto photo = tg::internal::parse_update(
    R"({"update_id":1,"message":{"message_id":1,"chat":{"id":5,"type":"private"},"caption":"mira","photo":[{"file_id":"small"},{"file_id":"big"}]}})",
    "telegram");
  CHECK(photo.message.type == botmesh::message_type::image);
  CHECK(photo.message.media_id == "big");
  CHECK(photo.message.text == "mira");
  auto loc = tg::internal::parse_update(
    R"({"update_id":2,"edited_message":{"message_id":9,"chat":{"id":5,"type":"private"},"date":1700000000,"edit_date":1700000300,"location":{"latitude":40.5,"longitude":-3.25}}})",
    "telegram");
  CHECK(loc.kind == tg::internal::update_kind::edited_message);
  // Stamped when edited, not when first sent.
  CHECK(botmesh::to_unix_ms(loc.message.timestamp) == 1700000300000);
  CHECK(loc.message.edited);
  CHECK(loc.message.id == "9");
  CHECK(loc.message.edit_id == "2");
  CHECK(loc.message.type == botmesh::message_type::location);
  CHECK(loc.message.latitude == 40.5);
  CHECK(loc.message.longitude == -3.25);
  auto cq = tg::internal::parse_update(
    R"({"update_id":3,"callback_query":{"id":"cq1","from":{"id":5},"message":{"message_id":9,"chat":{"id":5,"type":"private"}},"data":"yes"}})",
    "telegram");
  CHECK(cq.kind == tg::internal::update_kind::callback_query);
  CHECK(cq.callback_query_id == "cq1");
  CHECK(cq.message.type == botmesh::message_type::button);
  CHECK(cq.message.data == "yes");
  CHECK(cq.message.chat == "5");
  auto poll = tg::internal::parse_update(R"({"update_id":4,"poll":{"id":"p"}})",
                                         "telegram");
  CHECK(poll.kind == tg::internal::update_kind::unknown);
  CHECK(poll.unknown_kind == "poll");
  CHECK_THROWS_AS(tg::internal::parse_update("{\"update_id\":", "telegram"),
                  botmesh::invalid_argument_error);
  CHECK_THROWS_AS(tg::internal::parse_update(R"({"message":{}})", "telegram"),
                  botmesh::invalid_argument_error);
  CHECK_THROWS_AS(
    tg::internal::parse_update(R"({"update_id":5,"message":{"text":"x"}})", "telegram"),
    botmesh::invalid_argument_error);
}

TEST_CASE("an outgoing message with buttons, media and formatting becomes "
          "the matching Bot API call") {
  botmesh::outgoing_message m;
  m.chat = "42";
  m.text = "<b>¿Seguro?</b>";
  m.format = botmesh::text_format::html;
  m.buttons = {{{.text = "Sí", .data = "yes"}, {.text = "No", .data = "no"}},
               {{.text = "Web", .url = "https://example.org"}}};
  auto c = tg::internal::to_method_call(m);
  CHECK(c.method == "sendMessage");
  CHECK(c.body.find(R"("chat_id":42)") != std::string::npos);
  CHECK(c.body.find(R"("parse_mode":"HTML")") != std::string::npos);
  CHECK(c.body.find(
          R"("reply_markup":{"inline_keyboard":[[{"text":"Sí","callback_data":"yes"},{"text":"No","callback_data":"no"}],[{"text":"Web","url":"https://example.org"}]]})")
        != std::string::npos);
  CHECK(botmesh::is_valid_json(c.body));
  auto answer = tg::internal::to_webhook_answer(c);
  CHECK(answer.starts_with(R"({"method":"sendMessage","chat_id":42)"));
  CHECK(botmesh::is_valid_json(answer));
  botmesh::outgoing_message photo;
  photo.chat = "@channel";
  photo.media = botmesh::message_type::image;
  photo.media_url = "https://example.org/a.png";
  photo.text = "pie";
  auto p = tg::internal::to_method_call(photo);
  CHECK(p.method == "sendPhoto");
  CHECK(p.body == R"({"chat_id":"@channel","photo":"https://example.org/a.png","caption":"pie"})");
  m.buttons = {{{.text = "x", .data = std::string(65, 'd')}}};
  CHECK_THROWS_AS(tg::internal::to_method_call(m), botmesh::invalid_argument_error);
}

TEST_CASE("Bot API errors become typed errors: retry_after, forbidden, "
          "bad_request") {
  auto code_of = [](int status, const std::string& body) {
    try {
      tg::internal::check_answer("sendMessage", status, body);
    } catch (const botmesh::platform_error& e) {
      return std::make_pair(e.code(), e.retry_after());
    }
    return std::make_pair(botmesh::errc::none, 0ms);
  };
  CHECK(code_of(429, too_many_requests(7))
        == std::make_pair(botmesh::errc::retry_after, std::chrono::milliseconds{7000}));
  // A retry_after of 0, beyond a day, or so large its milliseconds would
  // overflow: one second to one day.
  CHECK(code_of(429, too_many_requests(0)).second == 1000ms);
  CHECK(code_of(429, too_many_requests(86'401)).second == 86'400'000ms);
  CHECK(code_of(429, R"({"ok":false,"error_code":429,"parameters":{"retry_after":9223372036854775807}})")
        == std::make_pair(botmesh::errc::retry_after, std::chrono::milliseconds{86'400'000}));
  CHECK(code_of(403, R"({"ok":false,"error_code":403,"description":"Forbidden: bot was blocked by the user"})").first
        == botmesh::errc::forbidden);
  CHECK(code_of(400, R"({"ok":false,"error_code":400,"description":"Bad Request: chat not found"})").first
        == botmesh::errc::bad_request);
  CHECK(code_of(502, "<html>bad gateway</html>").first == botmesh::errc::provider_error);
  // An error_code that is no HTTP status (here 2^32 + 429) is not taken
  // for one: the answer's status decides.
  CHECK(code_of(400, R"({"ok":false,"error_code":4294967725,"description":"x"})").first
        == botmesh::errc::bad_request);
  // A group upgraded to a supergroup: the error names the new id.
  try {
    tg::internal::check_answer(
      "sendMessage", 400,
      R"({"ok":false,"error_code":400,"description":"Bad Request: group chat was upgraded to a supergroup chat","parameters":{"migrate_to_chat_id":-1001234567890}})");
    FAIL("expected an error");
  } catch (const botmesh::platform_error& e) {
    CHECK(std::string{e.what()}.find("(migrate_to_chat_id -1001234567890)")
          != std::string::npos);
  }
  CHECK(tg::internal::check_answer("getMe", 200, R"({"ok":true,"result":{"id":1}})")
        == R"({"id":1})");
}

TEST_CASE("a flood control pause is taken as at most a day, a negative one "
          "as none") {
  http::flood_control f{http::flood_limits::none()};
  CHECK(f.wait_time("1", false) == 0ms);
  // Milliseconds this large would overflow the clock sum (and then not
  // pause at all).
  f.pause(std::chrono::milliseconds::max());
  auto w = f.wait_time("1", false);
  CHECK(w > 23h);
  CHECK(w <= 24h);
  http::flood_control g{http::flood_limits::none()};
  g.pause(-5s);
  CHECK(g.wait_time("1", false) == 0ms);
  g.pause(3s);
  CHECK(g.wait_time("1", false) > 2s);
}

using platform_error_scope = botmesh::platform_error::scope;

TEST_CASE("a 429 on a send's last attempt still pauses the sends after it") {
  // One attempt to chat "7", refused with a 3 s wait of `scope`.
  auto refused_once = [](http::flood_control& f, platform_error_scope scope) {
    auto refuse = [scope](std::stop_token) {
      throw botmesh::platform_error(botmesh::errc::retry_after, 429, "slow down",
                                    3s, "429", scope);
    };
    CHECK_THROWS_AS(http::send_with_retry(f, "7", false, refuse, {}, {}, 1),
                    botmesh::platform_error);
  };
  http::flood_control f{http::flood_limits::none()};
  refused_once(f, platform_error_scope::bot);
  CHECK(f.wait_time("8", false) > 2s);
  http::flood_control g{http::flood_limits::none()};
  refused_once(g, platform_error_scope::chat);
  CHECK(g.wait_time("7", false) > 2s);
  CHECK(g.wait_time("8", false) == 0ms);
}

TEST_CASE("a flood control pause of one chat holds that chat only, bounded "
          "as a whole pause is") {
  http::flood_control f{http::flood_limits::none()};
  f.pause_chat("1", 3s);
  CHECK(f.wait_time("1", false) > 2s);
  CHECK(f.wait_time("2", false) == 0ms);
  CHECK(f.try_acquire("2", false));
  CHECK_FALSE(f.try_acquire("1", false));
  f.pause_chat("1", 1s); // a shorter pause does not cut the longer one
  CHECK(f.wait_time("1", false) > 2s);
  f.pause_chat("3", std::chrono::milliseconds::max());
  CHECK(f.wait_time("3", false) <= 24h);
  CHECK(f.wait_time("3", false) > 23h);
  f.pause_chat("4", -5s);
  CHECK(f.wait_time("4", false) == 0ms);
  // A paused chat's bucket outlives the sweep of idle buckets (more than
  // 10 000 chats tracked).
  http::flood_control g{{0, 0, 1, 1, 0, 0}};
  g.pause_chat("held", 1h);
  for (int i = 0; i < 25000; ++i)
    g.try_acquire("c" + std::to_string(i), false);
  CHECK(g.wait_time("held", false) > 59min);
}

TEST_CASE("a Telegram update with the right secret is answered 200 and the "
          "handler's reply reaches the Bot API") {
  auto api = test::fake_telegram();
  auto p = std::make_shared<tg::webhook_provider>(options(*api));
  botmesh::bot bot{{.provider = p}};
  bot.on_message([](botmesh::context& c) { c.reply("eco: " + c.text()); });
  bot.start();
  auto post = poster_for(*p);
  CHECK(post.post(test::tg_text_update(1, 42, "hola")).status == 200);
  REQUIRE(api->wait_for_calls("sendMessage", 1));
  auto body = api->calls("sendMessage")[0].body;
  CHECK(body.find(R"("chat_id":42)") != std::string::npos);
  CHECK(body.find(R"("text":"eco: hola")") != std::string::npos);
  CHECK(p->stats().accepted == 1);
}

TEST_CASE("a Telegram webhook with a wrong or missing secret answers 401 and "
          "enqueues nothing") {
  auto api = test::fake_telegram();
  auto p = std::make_shared<tg::webhook_provider>(options(*api));
  botmesh::bot bot{{.provider = p}};
  bot.on_message([](botmesh::context& c) { c.reply("x"); });
  bot.start();
  auto post = poster_for(*p);
  CHECK(post.post(test::tg_text_update(1, 42, "hola"), "wrong").status == 401);
  CHECK(post.post(test::tg_text_update(2, 42, "hola"), "s3cre").status == 401);
  CHECK(post.post(test::tg_text_update(3, 42, "hola"), nullptr).status == 401);
  CHECK(p->stats().unauthorized == 3);
  CHECK(bot.stats().received == 0);
  CHECK_THROWS_AS(tg::webhook_provider(tg::webhook_options{.token = "t"}),
                  botmesh::invalid_argument_error);
}

TEST_CASE("malformed JSON is answered 400 and an unknown update kind 200, "
          "neither enqueued") {
  auto api = test::fake_telegram();
  auto p = std::make_shared<tg::webhook_provider>(options(*api));
  botmesh::bot bot{{.provider = p}};
  bot.on_message([](botmesh::context&) {});
  bot.start();
  auto post = poster_for(*p);
  CHECK(post.post("{\"update_id\": 1, \"message\":").status == 400);
  CHECK(post.post("[1,2]").status == 400);
  CHECK(post.post(R"({"update_id":9,"poll":{"id":"1"}})").status == 200);
  CHECK(p->stats().malformed == 2);
  CHECK(p->stats().unknown == 1);
  CHECK(bot.stats().received == 0);
}

namespace {

// A started webhook bot that counts the messages it handles.
struct counting_bot {
  std::unique_ptr<test::fake_api> api = test::fake_telegram();
  std::shared_ptr<tg::webhook_provider> p =
    std::make_shared<tg::webhook_provider>(options(*api));
  botmesh::bot bot{{.provider = p}};
  std::atomic<int> handled{0};

  counting_bot() {
    bot.on_message([this](botmesh::context&) { ++handled; });
    bot.start();
  }

  int post(const std::string& body) {
    return poster_for(*p).post(body).status;
  }
};

} // namespace

TEST_CASE("an update of a known kind missing what it needs is answered 200, "
          "skipped and counted, so Telegram does not hold the next ones back") {
  counting_bot f;
  // A message without its chat, and a pressed button without its id.
  CHECK(f.post(R"({"update_id":3,"message":{"message_id":1,"text":"hola"}})")
        == 200);
  CHECK(f.post(R"({"update_id":4,"callback_query":{"from":{"id":42},"data":"x"}})")
        == 200);
  CHECK(f.p->stats().skipped == 2);
  CHECK(f.p->stats().malformed == 0);
  // The next update is taken as usual.
  CHECK(f.post(test::tg_text_update(5, 42, "hola")) == 200);
  REQUIRE(test::eventually([&] { return f.handled.load() == 1; }));
  CHECK(f.bot.stats().received == 1);
}

TEST_CASE("a duplicate Telegram update is answered 200 and handled once") {
  counting_bot f;
  auto u = test::tg_text_update(5, 42, "hola");
  CHECK(f.post(u) == 200);
  CHECK(f.post(u) == 200);
  CHECK(f.post(test::tg_text_update(6, 42, "otra")) == 200);
  REQUIRE(test::eventually([&] { return f.bot.stats().handled == 2; }));
  CHECK(f.handled.load() == 2);
  CHECK(f.p->stats().duplicates == 1);
}

namespace {

// An edit of message `message_id`, delivered as update `update_id`.
std::string tg_edit_update(std::int64_t update_id, std::int64_t chat,
                           std::int64_t message_id, const std::string& text) {
  auto u = test::tg_text_update(update_id, chat, text, message_id);
  u.replace(u.find("\"message\""), 9, "\"edited_message\"");
  return u.insert(u.rfind('}'), ",\"edit_date\":1700000100");
}

// Posts a message, two edits of it and a redelivery of each; every version
// is handled once, in order.
void edits_are_messages_of_their_own(botmesh::bot_options o) {
  auto api = test::fake_telegram();
  auto p = std::make_shared<tg::webhook_provider>(options(*api));
  o.provider = p;
  botmesh::bot bot{std::move(o)};
  std::mutex mtx;
  std::vector<std::pair<std::string, bool>> seen;
  bot.on_message([&](botmesh::context& c) {
    std::lock_guard guard{mtx};
    seen.emplace_back(c.message().text, c.message().edited);
  });
  bot.start();
  auto post = poster_for(*p);
  CHECK(post.post(test::tg_text_update(20, 42, "hola", 9)).status == 200);
  CHECK(post.post(tg_edit_update(21, 42, 9, "hola!")).status == 200);
  CHECK(post.post(tg_edit_update(22, 42, 9, "hola!!")).status == 200);
  CHECK(post.post(tg_edit_update(21, 42, 9, "hola!")).status == 200);
  CHECK(post.post(test::tg_text_update(20, 42, "hola", 9)).status == 200);
  REQUIRE(test::eventually([&] { return bot.stats().handled >= 3; }));
  bot.stop();
  std::lock_guard guard{mtx};
  REQUIRE(seen.size() == 3);
  CHECK(seen[0] == std::pair<std::string, bool>{"hola", false});
  CHECK(seen[1] == std::pair<std::string, bool>{"hola!", true});
  CHECK(seen[2] == std::pair<std::string, bool>{"hola!!", true});
}

} // namespace

TEST_CASE("an edit of a Telegram message is handled, not taken for a "
          "redelivery of the original") {
  edits_are_messages_of_their_own({});
}

TEST_CASE("with durability, each edit of a Telegram message is journaled "
          "and handled once") {
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  edits_are_messages_of_their_own(
    {.durability = botmesh::durability_options{.backend = backend}});
}

TEST_CASE("with durability a Telegram update is answered 200 only once "
          "journaled, 503 when the journal fails, and Telegram's retry is "
          "handled once") {
  auto api = test::fake_telegram();
  auto p = std::make_shared<tg::webhook_provider>(options(*api));
  auto backend = test::failing_journal();
  botmesh::bot bot{{.provider = p, .durability = test::durable_over(backend)}};
  std::atomic<int> handled{0};
  bot.on_message([&](botmesh::context&) { ++handled; });
  bot.start();
  auto post = poster_for(*p);
  auto u = test::tg_text_update(7, 42, "hola");
  CHECK(post.post(u).status == 503);
  CHECK(bot.stats().received == 0);
  backend->fail_records = false;
  CHECK(post.post(u).status == 200);
  REQUIRE(test::eventually([&] { return bot.stats().handled == 1; }));
  // A later redelivery is a duplicate.
  CHECK(post.post(u).status == 200);
  bot.stop();
  CHECK(handled.load() == 1);
}

TEST_CASE("with durability a redelivery that comes while the update is "
          "being journaled gets the original's answer: 503 when the write "
          "fails, never a 200 for an update that was lost") {
  auto api = test::fake_telegram();
  auto p = std::make_shared<tg::webhook_provider>(options(*api));
  auto backend = std::make_shared<test::gated_backend>(); // writes wait
  botmesh::bot bot{{.provider = p, .durability = test::durable_over(backend)}};
  std::atomic<int> handled{0};
  bot.on_message([&](botmesh::context&) { ++handled; });
  bot.start();
  auto post = poster_for(*p);
  auto again = poster_for(*p);
  auto u = test::tg_text_update(7, 42, "hola");
  auto first = std::async(std::launch::async, [&] { return post.post(u).status; });
  REQUIRE(test::eventually([&] {
    std::lock_guard guard{backend->mtx};
    return backend->held.size() == 1;
  }));
  // Telegram (or a proxy that dropped the first connection) sends it again.
  auto second = std::async(std::launch::async, [&] { return again.post(u).status; });
  REQUIRE(test::eventually([&] { return p->stats().duplicates == 1; }));
  CHECK(second.wait_for(100ms) == std::future_status::timeout); // not yet
  backend->fail_held = true;
  backend->open(); // the journal write fails
  CHECK(first.get() == 503);
  CHECK(second.get() == 503);
  // Telegram's next retry is taken and handled once.
  backend->fail_held = false;
  CHECK(post.post(u).status == 200);
  REQUIRE(test::eventually([&] { return bot.stats().handled == 1; }));
  bot.stop();
  CHECK(handled.load() == 1);
}

TEST_CASE("with reply in webhook a turn's only reply goes back in the webhook "
          "response, and a turn that sends more sends them all through the "
          "Bot API, in order") {
  auto api = test::fake_telegram();
  auto p = replying_provider(*api);
  botmesh::bot bot{{.provider = p}};
  bot.hears("una", [](botmesh::context& c) { c.reply("sola"); });
  bot.hears("dos", [](botmesh::context& c) {
    c.reply("primera");
    c.reply("segunda");
  });
  bot.hears("nada", [](botmesh::context&) {});
  bot.start();
  auto post = poster_for(*p);
  auto one = post.post(test::tg_text_update(1, 42, "una"));
  CHECK(one.status == 200);
  CHECK(one.body.starts_with(R"({"method":"sendMessage","chat_id":42)"));
  CHECK(one.body.find("sola") != std::string::npos);
  CHECK(api->calls("sendMessage").empty());
  // Telegram runs a response's method after it reads the response: the
  // second reply through the API could come first. Both go there.
  auto two = post.post(test::tg_text_update(2, 42, "dos"));
  CHECK(two.status == 200);
  CHECK(two.body.empty());
  REQUIRE(api->wait_for_calls("sendMessage", 2));
  auto sent = api->calls("sendMessage");
  REQUIRE(sent.size() == 2);
  CHECK(sent[0].body.find("primera") != std::string::npos);
  CHECK(sent[1].body.find("segunda") != std::string::npos);
  // A handler that sends nothing: an empty 200 once its turn ended.
  auto empty = post.post(test::tg_text_update(3, 42, "nada"));
  CHECK(empty.status == 200);
  CHECK(empty.body.empty());
  CHECK(p->stats().replies_in_webhook == 1);
  CHECK(api->calls("sendMessage").size() == 2);
}

TEST_CASE("with reply in webhook a kept reply that fails through the API is "
          "logged, and the send that flushed it still goes") {
  test::log_capture logs;
  auto api = test::fake_telegram();
  api->script("sendMessage", 500,
              R"({"ok":false,"error_code":500,"description":"Internal Server Error"})");
  auto p = replying_provider(*api);
  botmesh::bot bot{{.provider = p}};
  std::atomic<int> threw{0};
  bot.on_message([&](botmesh::context& c) {
    try {
      c.reply("primera");
      c.reply("segunda");
    } catch (const botmesh::error&) {
      ++threw;
    }
  });
  bot.start();
  auto post = poster_for(*p);
  CHECK(post.post(test::tg_text_update(1, 42, "hola")).status == 200);
  REQUIRE(api->wait_for_calls("sendMessage", 2));
  auto sent = api->calls("sendMessage");
  CHECK(sent[0].body.find("primera") != std::string::npos); // answered 500
  CHECK(sent[1].body.find("segunda") != std::string::npos);
  bot.stop();
  CHECK(threw.load() == 0);
  CHECK(logs.count("telegram", "the reply to message") == 1);
}

TEST_CASE("with reply in webhook a formatted or over-long reply goes through "
          "the Bot API, where its errors reach the handler") {
  auto api = test::fake_telegram();
  api->script("sendMessage", 400,
              R"({"ok":false,"error_code":400,"description":"Bad Request: can't parse entities"})");
  auto p = replying_provider(*api);
  botmesh::bot bot{{.provider = p}};
  std::atomic<int> refused{0};
  bot.hears("html", [&](botmesh::context& c) {
    botmesh::outgoing_message m;
    m.chat = c.message().chat;
    m.reply_to = c.message().id;
    m.text = "<b>roto";
    m.format = botmesh::text_format::html;
    try {
      c.bot().send(m);
    } catch (const botmesh::error& e) {
      if (e.code() == botmesh::errc::bad_request)
        ++refused;
    }
  });
  // 2049 emoji: 2049 characters, 4098 UTF-16 units (Telegram's count).
  std::string emoji;
  for (int i = 0; i < 2049; ++i)
    emoji += "\xF0\x9F\x98\x80";
  bot.hears("largo", [&](botmesh::context& c) { c.reply(emoji); });
  // Telegram refuses a text of white space alone, and may fail to fetch a
  // photo: in a response, either was dropped unseen and counted as sent.
  bot.hears("blanco", [&](botmesh::context& c) { c.reply(" \n\t "); });
  bot.hears("foto", [&](botmesh::context& c) {
    botmesh::outgoing_message m;
    m.chat = c.message().chat;
    m.media = botmesh::message_type::image;
    m.media_url = "https://example.invalid/foto.jpg";
    c.bot().send(m);
  });
  bot.start();
  auto post = poster_for(*p);
  auto res = post.post(test::tg_text_update(1, 42, "html"));
  CHECK(res.body.empty());
  CHECK(refused.load() == 1);
  auto long_res = post.post(test::tg_text_update(2, 42, "largo"));
  CHECK(long_res.body.empty());
  REQUIRE(api->wait_for_calls("sendMessage", 2));
  auto blank_res = post.post(test::tg_text_update(3, 42, "blanco"));
  CHECK(blank_res.body.empty());
  REQUIRE(api->wait_for_calls("sendMessage", 3));
  auto photo_res = post.post(test::tg_text_update(4, 42, "foto"));
  CHECK(photo_res.body.empty());
  REQUIRE(api->wait_for_calls("sendPhoto", 1));
  CHECK(p->stats().replies_in_webhook == 0);
}

TEST_CASE("a Telegram webhook with a secret checks it even when "
          "allow_unauthenticated is set") {
  auto api = test::fake_telegram();
  auto o = options(*api);
  o.allow_unauthenticated = true; // excuses a missing secret, no more
  auto p = std::make_shared<tg::webhook_provider>(o);
  botmesh::bot bot{{.provider = p}};
  std::atomic<int> handled{0};
  bot.on_message([&](botmesh::context&) { ++handled; });
  bot.start();
  auto post = poster_for(*p);
  CHECK(post.post(test::tg_text_update(1, 42, "sin"), nullptr).status == 401);
  CHECK(post.post(test::tg_text_update(2, 42, "mal"), "wrong").status == 401);
  CHECK(p->stats().unauthorized == 2);
  CHECK(post.post(test::tg_text_update(3, 42, "bien")).status == 200);
  CHECK(test::eventually([&] { return handled.load() == 1; }));
  bot.stop();
  CHECK(handled.load() == 1);
}

namespace {

std::string tg_press(std::int64_t update_id, const std::string& cq) {
  return R"({"update_id":)" + std::to_string(update_id)
         + R"(,"callback_query":{"id":")" + cq
         + R"(","from":{"id":42},"message":{"message_id":5,"chat":{"id":42,"type":"private"}},"data":"yes"}})";
}

} // namespace

TEST_CASE("with reply in webhook a reply the flood control would hold back "
          "goes through the Bot API, after its wait, not in the response") {
  auto api = test::fake_telegram();
  auto o = options(*api);
  o.reply_in_webhook = true;
  o.flood.per_chat_per_second = 1; // one message a second to a chat
  o.flood.per_chat_burst = 1;
  auto p = std::make_shared<tg::webhook_provider>(o);
  botmesh::bot bot{{.provider = p}};
  bot.on_message([](botmesh::context& c) { c.reply("eco " + c.text()); });
  bot.start();
  auto post = poster_for(*p);
  auto first = post.post(test::tg_text_update(1, 42, "uno"));
  CHECK(first.body.find("eco uno") != std::string::npos);
  // At once after, a pressed button: the chat's bucket is empty. Its
  // update is answered as without a reply (the button's answer in it).
  auto second = post.post(tg_press(2, "cq-2"));
  CHECK(second.status == 200);
  CHECK(second.body
        == R"({"method":"answerCallbackQuery","callback_query_id":"cq-2"})");
  REQUIRE(api->wait_for_calls("sendMessage", 1));
  CHECK(api->calls("sendMessage")[0].body.find("eco ") != std::string::npos);
  CHECK(p->stats().replies_in_webhook == 1);
}

TEST_CASE("replies to a forum topic, in the webhook response and through the "
          "Bot API, name the topic") {
  auto api = test::fake_telegram();
  auto p = replying_provider(*api);
  botmesh::bot bot{{.provider = p}};
  bot.on_message([](botmesh::context& c) {
    c.reply("uno");
    if (c.text() == "otra")
      c.reply("dos");
  });
  bot.start();
  auto post = poster_for(*p);
  auto in_topic = [](int update, int id, std::string text) {
    return R"({"update_id":)" + std::to_string(update)
           + R"(,"message":{"message_id":)" + std::to_string(id)
           + R"(,"from":{"id":42},"chat":{"id":-100777,"type":"supergroup","is_forum":true},"date":1700000000,"message_thread_id":3,"is_topic_message":true,"text":")"
           + text + R"("}})";
  };
  auto res = post.post(in_topic(5, 11, "hola"));
  CHECK(res.status == 200);
  CHECK(res.body.starts_with(
    R"({"method":"sendMessage","chat_id":-100777,"message_thread_id":3,)"));
  // Two replies: both through the API.
  post.post(in_topic(6, 12, "otra"));
  REQUIRE(api->wait_for_calls("sendMessage", 2));
  auto body = api->calls("sendMessage")[1].body;
  CHECK(body.find(R"("chat_id":-100777,"message_thread_id":3)") != std::string::npos);
  CHECK(body.find("dos") != std::string::npos);
}

namespace {

// Sends a whole webhook POST on a raw loopback connection and closes it
// without reading the answer: Telegram giving up on a slow webhook.
void post_and_hang_up(std::uint16_t port, const std::string& body) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  auto req = fmt::format("POST /telegram HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         "Content-Type: application/json\r\n"
                         "X-Telegram-Bot-Api-Secret-Token: {}\r\n"
                         "Content-Length: {}\r\n\r\n{}",
                         secret, body.size(), body);
  REQUIRE(::send(fd, req.data(), req.size(), MSG_NOSIGNAL)
          == static_cast<ssize_t>(req.size()));
  ::close(fd);
}

} // namespace

TEST_CASE("with reply in webhook a reply whose update's connection was "
          "closed meanwhile goes through the Bot API, not into the closed "
          "connection") {
  auto api = test::fake_telegram();
  auto o = options(*api);
  o.reply_in_webhook = true;
  // Held until the reply (at most 4 s); watched from the first tick (1 s).
  o.reply_wait = "4s";
  auto p = std::make_shared<tg::webhook_provider>(o);
  std::promise<void> hung_up_p;
  auto hung_up_f = hung_up_p.get_future().share();
  botmesh::bot bot{{.provider = p}};
  test::opener hung_up{hung_up_p};
  std::atomic<bool> in_handler{false};
  bot.on_message([&](botmesh::context& c) {
    in_handler = true;
    hung_up_f.wait();
    c.reply("tarde");
  });
  bot.start();
  post_and_hang_up(p->server().port(), test::tg_text_update(1, 42, "hola"));
  REQUIRE(test::eventually([&] { return in_handler.load(); }));
  REQUIRE(test::eventually([&] { return p->server().stats().peers_gone == 1; }));
  hung_up.open();
  REQUIRE(api->wait_for_calls("sendMessage", 1));
  CHECK(api->calls("sendMessage")[0].body.find("tarde") != std::string::npos);
  CHECK(p->stats().replies_in_webhook == 0);
  bot.stop();
}

TEST_CASE("an error listener that stops the bot on the webhook's own thread "
          "stops it: the listener returns, the port closes, nothing hangs") {
  auto api = test::fake_telegram();
  auto p = std::make_shared<tg::webhook_provider>(options(*api));
  botmesh::bot bot{{.provider = p, .limits = {.max_text_bytes = 8}}};
  std::atomic<bool> stop_returned{false};
  std::atomic<bool> stop_threw{false};
  bot.on<botmesh::events::error>([&](const botmesh::events::error& e) {
    if (e.code != botmesh::errc::invalid_argument || stop_returned)
      return;
    try {
      bot.stop(); // on the I/O thread that delivers the update
    } catch (...) {
      stop_threw = true;
    }
    stop_returned = true;
  });
  bot.on_message([](botmesh::context& c) { c.reply("x"); });
  bot.start();
  auto url = p->server().url();
  auto post = poster_for(*p);
  // Over max_text_bytes: refused at intake, raised as an error event.
  try {
    post.post(test::tg_text_update(1, 42, "demasiado largo"));
  } catch (const botmesh::error&) {
    // the connection may close with the stop
  }
  REQUIRE(test::eventually([&] { return stop_returned.load(); }));
  CHECK_FALSE(stop_threw.load());
  CHECK(test::eventually([&] {
    try {
      http::client fresh{{.connect_timeout = "1s"}};
      fresh.request({.method = "GET", .url = url + "/probe"});
      return false;
    } catch (const botmesh::error&) {
      return true; // refused: the server stopped
    }
  }));
  bot.stop(); // stopped already: returns at once
}

TEST_CASE("with reply in webhook a slow handler's held answer is released "
          "after reply_wait and its reply goes through the Bot API") {
  auto api = test::fake_telegram();
  auto p = replying_provider(*api, "100ms");
  botmesh::bot bot{{.provider = p}};
  std::latch answered{1};
  bot.on_message([&](botmesh::context& c) {
    answered.wait(); // until Telegram got its answer
    c.reply("tarde");
  });
  bot.start();
  auto post = poster_for(*p);
  auto res = post.post(test::tg_text_update(1, 42, "hola"));
  CHECK(res.status == 200);
  CHECK(res.body.empty());
  answered.count_down();
  REQUIRE(api->wait_for_calls("sendMessage", 1));
  CHECK(api->calls("sendMessage")[0].body.find("tarde") != std::string::npos);
  CHECK(p->stats().reply_wait_expired == 1);
}

TEST_CASE("with reply in webhook a reply kept past reply_wait goes back in "
          "the response then, not at the slow turn's end") {
  auto api = test::fake_telegram();
  auto p = replying_provider(*api, "100ms");
  botmesh::bot bot{{.provider = p}};
  std::latch answered{1};
  bot.on_message([&](botmesh::context& c) {
    c.reply("un momento");
    answered.wait(); // a long job, until Telegram got its answer
    c.reply("listo");
  });
  bot.start();
  auto post = poster_for(*p);
  auto res = post.post(test::tg_text_update(1, 42, "hola"));
  CHECK(res.status == 200);
  CHECK(res.body.find("un momento") != std::string::npos);
  answered.count_down();
  REQUIRE(api->wait_for_calls("sendMessage", 1));
  CHECK(api->calls("sendMessage")[0].body.find("listo") != std::string::npos);
  bot.stop();
  CHECK(api->calls("sendMessage").size() == 1);
  CHECK(p->stats().replies_in_webhook == 1);
  CHECK(p->stats().reply_wait_expired == 1);
}

namespace {

// Accepts every update and never ends its turn: a held answer goes back
// only past reply_wait (or at stop).
struct accepting_host final : botmesh::provider_host {
  std::atomic<int> delivered{0};
  void deliver(botmesh::inbound_message) override { ++delivered; }
  void deliver(botmesh::inbound_message,
               botmesh::delivery_callbacks cb) override {
    ++delivered;
    cb.accepted(botmesh::errc::none);
  }
  void state_changed(botmesh::provider_state) override {}
  void input_closed() override {}
};

} // namespace

TEST_CASE("a Telegram webhook stopped and started again (a leadership lost "
          "and won back) listens again on its port and still answers held "
          "updates past reply_wait") {
  auto api = test::fake_telegram();
  auto p = replying_provider(*api, "100ms");
  accepting_host host;
  p->start(host);
  auto post = poster_for(*p);
  auto url = post.url;
  // Stopped while an update is held: its tick goes with the server.
  auto held = std::async(std::launch::async, [&] {
    return post.post(test::tg_text_update(1, 42, "uno")).status;
  });
  REQUIRE(test::eventually([&] { return host.delivered.load() == 1; }));
  p->stop();
  CHECK(held.get() == 200);
  p->start(host);
  CHECK(p->server().url() + "/telegram" == url);
  poster again{url};
  again.client = std::make_unique<http::client>(
    http::client_options{.request_timeout = "5s"});
  // Answered by the tick past reply_wait (without it, the request would
  // hang until the client gives up, and throw).
  CHECK(again.post(test::tg_text_update(2, 42, "dos")).status == 200);
  p->stop();
  CHECK(host.delivered.load() == 2);
}

TEST_CASE("a Telegram token with a character no token has (a trailing "
          "newline) is refused at construction, naming the token") {
  auto api = test::fake_telegram();
  for (const char* token : {"123:abc\n", "123:abc\r\n", "123:a b", "123/abc"}) {
    CAPTURE(token);
    auto o = options(*api);
    o.token = token;
    try {
      tg::webhook_provider p{o};
      FAIL("accepted a bad token");
    } catch (const botmesh::invalid_argument_error& e) {
      CHECK(e.field() == "token");
    }
    tg::polling_options po;
    po.token = token;
    po.api_url = api->url();
    CHECK_THROWS_AS(tg::polling_provider{po}, botmesh::invalid_argument_error);
  }
}

TEST_CASE("a 429 with retry_after is waited out and retried, keeping the "
          "chat's order") {
  auto api = test::fake_telegram();
  api->script("sendMessage", 429, too_many_requests(1));
  auto p = std::make_shared<tg::webhook_provider>(options(*api));
  botmesh::bot bot{{.provider = p}};
  test::error_log errors;
  errors.attach(bot);
  bot.on_message([](botmesh::context& c) { c.reply(c.text()); });
  bot.start();
  auto post = poster_for(*p);
  for (int i = 1; i <= 3; ++i)
    REQUIRE(post.post(test::tg_text_update(i, 42, std::to_string(i))).status == 200);
  REQUIRE(api->wait_for_calls("sendMessage", 4));
  auto calls = api->calls("sendMessage");
  REQUIRE(calls.size() == 4);
  // The refused first send, then 1, 2, 3 in order.
  CHECK(calls[0].body.find(R"("text":"1")") != std::string::npos);
  CHECK(calls[1].body.find(R"("text":"1")") != std::string::npos);
  CHECK(calls[2].body.find(R"("text":"2")") != std::string::npos);
  CHECK(calls[3].body.find(R"("text":"3")") != std::string::npos);
  CHECK(p->stats().retried == 1);
  CHECK(errors.all().empty());
}

TEST_CASE("a send waiting out a long retry_after gives up when the bot's "
          "stop passes its bound, instead of holding the stop") {
  auto api = test::fake_telegram();
  for (int i = 0; i < 5; ++i)
    api->script("sendMessage", 429, too_many_requests(60));
  auto p = std::make_shared<tg::webhook_provider>(options(*api));
  botmesh::bot bot{{.provider = p, .stop_timeout = "200ms"}};
  test::error_log errors;
  errors.attach(bot);
  bot.on_message([](botmesh::context& c) { c.reply(c.text()); });
  bot.start();
  auto post = poster_for(*p);
  REQUIRE(post.post(test::tg_text_update(1, 42, "hola")).status == 200);
  REQUIRE(api->wait_for_calls("sendMessage", 1));
  // Without the stop reaching the wait, this takes minutes (5 x 60 s).
  auto stopped = std::async(std::launch::async, [&] { bot.stop(); });
  REQUIRE(stopped.wait_for(20s) == std::future_status::ready);
  CHECK(api->calls("sendMessage").size() == 1);
}

TEST_CASE("a reply waiting out a retry_after gives up when its turn ends "
          "(settle): it never goes out after the chat moved on") {
  auto api = test::fake_telegram();
  api->script("sendMessage", 429, too_many_requests(30));
  auto p = std::make_shared<tg::webhook_provider>(options(*api));
  botmesh::memory_coordination_hub hub;
  botmesh::coordination_options co{.settle = "300ms"};
  co.coordinator = std::make_shared<botmesh::memory_coordinator>(
    hub, botmesh::memory_coordinator_options{.replica_id = "a"});
  botmesh::bot bot{{.provider = p,
                    .store = std::make_shared<botmesh::memory_store>(),
                    .coordination = co}};
  test::error_log errors;
  errors.attach(bot);
  bot.on_message([](botmesh::context& c) { c.reply(c.text()); });
  bot.start();
  auto post = poster_for(*p);
  REQUIRE(post.post(test::tg_text_update(1, 42, "hola")).status == 200);
  REQUIRE(api->wait_for_calls("sendMessage", 1));
  // Settle ends the turn while the reply waits (30 s): the wait gives up
  // and the step fails as a lost turn, instead of sending 30 s later,
  // when another replica may have answered the chat's next messages.
  REQUIRE(test::eventually(
    [&] { return errors.count(botmesh::errc::lease_lost) == 1; }));
  CHECK(errors.all()[0].what.find("settle") != std::string::npos);
  CHECK(api->calls("sendMessage").size() == 1);
  bot.stop();
  CHECK(api->calls("sendMessage").size() == 1);
}

TEST_CASE("on a shared server, stop() waits for an update being delivered: "
          "nothing reaches the host once it returned") {
  auto api = test::fake_telegram();
  auto srv = std::make_shared<http::server>();
  auto o = options(*api);
  o.server = srv;
  tg::webhook_provider p{o};
  // A host whose delivery waits until the test lets it go.
  struct slow_host final : botmesh::provider_host {
    std::latch entered{1};
    std::promise<void> go;
    std::shared_future<void> gone = go.get_future().share();
    std::atomic<bool> stopped{false}, after_stop{false};
    void deliver(botmesh::inbound_message) override {
      entered.count_down();
      gone.wait();
      if (stopped)
        after_stop = true; // the bot behind it may be gone by now
    }
    void state_changed(botmesh::provider_state) override {}
    void input_closed() override {}
  } host;
  srv->start();
  p.start(host);
  auto post = poster_for(p);
  auto posted = std::async(std::launch::async, [&] {
    return post.post(test::tg_text_update(1, 42, "hola")).status;
  });
  host.entered.wait();
  auto stopping = std::async(std::launch::async, [&] {
    p.stop();
    host.stopped = true;
  });
  // Still delivering: stop() waits for it.
  CHECK(stopping.wait_for(300ms) == std::future_status::timeout);
  host.go.set_value();
  CHECK(stopping.wait_for(10s) == std::future_status::ready);
  CHECK_FALSE(host.after_stop.load());
  CHECK(posted.get() == 200);
  srv->stop();
}

TEST_CASE("a blocked user's 403 reaches the handler as a forbidden "
          "platform error, and a Bot API that never answers as a timeout") {
  auto api = test::fake_telegram();
  api->script("sendMessage", 403,
              R"({"ok":false,"error_code":403,"description":"Forbidden: bot was blocked by the user"})");
  auto o = options(*api);
  o.http.request_timeout = "300ms";
  auto p = std::make_shared<tg::webhook_provider>(o);
  botmesh::bot bot{{.provider = p}};
  std::mutex mtx;
  std::vector<botmesh::errc> codes;
  bot.on_message([&](botmesh::context& c) {
    try {
      c.reply("x");
      std::lock_guard guard{mtx};
      codes.push_back(botmesh::errc::none);
    } catch (const botmesh::error& e) {
      std::lock_guard guard{mtx};
      codes.push_back(e.code());
    }
  });
  bot.start();
  auto post = poster_for(*p);
  REQUIRE(post.post(test::tg_text_update(1, 42, "a")).status == 200);
  REQUIRE(test::eventually([&] {
    std::lock_guard guard{mtx};
    return codes.size() == 1;
  }));
  api->silence("sendMessage");
  REQUIRE(post.post(test::tg_text_update(2, 42, "b")).status == 200);
  REQUIRE(test::eventually([&] {
    std::lock_guard guard{mtx};
    return codes.size() == 2;
  }));
  std::lock_guard guard{mtx};
  CHECK(codes[0] == botmesh::errc::forbidden);
  CHECK(codes[1] == botmesh::errc::timeout);
  bot.stop();
  api->release_held();
}

TEST_CASE("a pressed button arrives with its data and the reply answers "
          "its callback query") {
  auto api = test::fake_telegram();
  auto p = std::make_shared<tg::webhook_provider>(options(*api));
  botmesh::bot bot{{.provider = p}};
  std::mutex mtx;
  std::string seen;
  bot.on_message([&](botmesh::context& c) {
    {
      std::lock_guard guard{mtx};
      seen = std::string{to_string(c.message().type)} + ":" + c.message().data;
    }
    c.reply("ok");
  });
  bot.start();
  auto post = poster_for(*p);
  REQUIRE(post.post(R"({"update_id":1,"callback_query":{"id":"cq9","from":{"id":42},"message":{"message_id":5,"chat":{"id":42,"type":"private"}},"data":"yes"}})")
            .status
          == 200);
  REQUIRE(api->wait_for_calls("answerCallbackQuery", 1));
  CHECK(api->calls("answerCallbackQuery")[0].body == R"({"callback_query_id":"cq9"})");
  std::lock_guard guard{mtx};
  CHECK(seen == "button:yes");
}

TEST_CASE("every pressed button gets one answer: from its reply, or once a "
          "turn that sent nothing ran") {
  for (bool in_webhook : {false, true}) {
    CAPTURE(in_webhook);
    auto api = test::fake_telegram();
    auto o = options(*api);
    o.reply_in_webhook = in_webhook;
    auto p = std::make_shared<tg::webhook_provider>(o);
    botmesh::bot bot{{.provider = p}};
    bot.on_message([&](botmesh::context& c) {
      if (c.message().data == "yes" && c.message().id == "cq-reply")
        c.reply("ok");
    });
    bot.start();
    auto post = poster_for(*p);
    // Many silent presses: none may be left spinning, however many came.
    for (int i = 0; i < 20; ++i)
      REQUIRE(post.post(tg_press(100 + i, "cq-silent-" + std::to_string(i))).status
              == 200);
    auto replied = post.post(tg_press(200, "cq-reply"));
    REQUIRE(replied.status == 200);
    REQUIRE(test::eventually([&] { return bot.stats().handled == 21; }));
    REQUIRE(api->wait_for_calls("answerCallbackQuery", in_webhook ? 1 : 21));
    bot.stop();
    std::vector<std::string> answered;
    for (auto& call : api->calls("answerCallbackQuery"))
      answered.push_back(call.body);
    if (in_webhook) {
      // The silent ones are answered in their webhook responses; the
      // replied one carries its reply there, and its answer goes through
      // the API.
      CHECK(answered == std::vector<std::string>{R"({"callback_query_id":"cq-reply"})"});
      CHECK(replied.body.find("sendMessage") != std::string::npos);
    } else {
      CHECK(answered.size() == 21);
      CHECK(std::count(answered.begin(), answered.end(),
                       R"({"callback_query_id":"cq-reply"})")
            == 1);
    }
  }
}

TEST_CASE("a stopping bot answers Telegram 503 for new updates and its held "
          "answers are given before the server closes") {
  auto api = test::fake_telegram();
  auto p = replying_provider(*api);
  auto bot = std::make_unique<botmesh::bot>(botmesh::bot_options{.provider = p});
  std::latch entered{1};
  std::latch release{1};
  bot->on_message([&](botmesh::context& c) {
    entered.count_down();
    release.wait();
    c.reply("hecho");
  });
  bot->start();
  auto url = p->server().url() + "/telegram";
  auto in_flight = std::async(std::launch::async, [&] {
    poster post{url};
    return post.post(test::tg_text_update(1, 42, "hola"));
  });
  entered.wait();
  auto stopping = std::async(std::launch::async, [&] { bot->stop(); });
  poster late{url};
  REQUIRE(test::eventually([&] {
    return late.post(test::tg_text_update(2, 43, "tarde")).status == 503;
  }));
  release.count_down();
  auto res = in_flight.get();
  CHECK(res.status == 200);
  CHECK(res.body.find("hecho") != std::string::npos);
  stopping.get();
}

TEST_CASE("two replicas behind the same Telegram webhook with coordination "
          "answer one chat's updates in order") {
  auto api = test::fake_telegram();
  botmesh::memory_coordination_hub hub;
  auto store = std::make_shared<botmesh::memory_store>();
  struct replica {
    std::shared_ptr<tg::webhook_provider> provider;
    std::unique_ptr<botmesh::bot> bot;
  };
  std::vector<replica> replicas;
  for (auto id : {"a", "b"}) {
    auto o = options(*api);
    o.reply_in_webhook = true;
    replica r;
    r.provider = std::make_shared<tg::webhook_provider>(o);
    botmesh::coordination_options co;
    co.coordinator = std::make_shared<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = id});
    r.bot = std::make_unique<botmesh::bot>(botmesh::bot_options{
      .provider = r.provider, .store = store, .coordination = co});
    // Odd updates: one reply (in the response); even ones: two (both
    // through the API).
    r.bot->on_message([](botmesh::context& c) {
      c.reply("uno " + c.text());
      if (std::stoi(c.text()) % 2 == 0)
        c.reply("dos " + c.text());
    });
    r.bot->start();
    replicas.push_back(std::move(r));
  }
  std::vector<poster> posters;
  for (auto& r : replicas)
    posters.push_back(poster_for(*r.provider));
  // Like Telegram: one update at a time, spread over both replicas.
  std::vector<std::string> answers;
  for (int i = 1; i <= 20; ++i) {
    auto res = posters[static_cast<size_t>(i) % 2].post(
      test::tg_text_update(i, 42, std::to_string(i)));
    REQUIRE(res.status == 200);
    answers.push_back(res.body);
  }
  REQUIRE(api->wait_for_calls("sendMessage", 20));
  auto calls = api->calls("sendMessage");
  REQUIRE(calls.size() == 20);
  for (int i = 1; i <= 20; ++i) {
    CAPTURE(i);
    auto& answer = answers[static_cast<size_t>(i - 1)];
    auto n = std::to_string(i);
    if (i % 2 == 1) {
      CHECK(answer.find("\"uno " + n + "\"") != std::string::npos);
      continue;
    }
    CHECK(answer.empty());
    auto at = static_cast<size_t>(i - 2); // two calls per even update
    CHECK(calls[at].body.find("\"uno " + n + "\"") != std::string::npos);
    CHECK(calls[at + 1].body.find("\"dos " + n + "\"") != std::string::npos);
  }
  // A turn counts as handled after its reply went back: wait for the count.
  CHECK(test::eventually([&] {
    return replicas[0].bot->stats().handled == 10
           && replicas[1].bot->stats().handled == 10;
  }));
}

TEST_CASE("an update read in place (padded capacity) or copied (tight "
          "capacity) parses the same, raw JSON included") {
  std::string json =
    R"({"update_id":9,"message":{"message_id":4,"from":{"id":5},"chat":{"id":6,"type":"private"},"text":"hola"}})";
  std::string padded = json;
  padded.reserve(json.size() + botmesh::http::request::body_padding);
  std::string tight = json;
  tight.shrink_to_fit(); // may keep some spare capacity: then it is read in place too
  for (auto* s : {&padded, &tight}) {
    auto u = tg::internal::parse_update_in_place(*s, "telegram");
    CHECK(u.update_id == 9);
    CHECK(u.message.chat == "6");
    CHECK(u.message.text == "hola");
    CHECK(u.message.raw == json);
  }
  std::string bad = "{\"update_id\":";
  bad.reserve(bad.size() + 64);
  CHECK_THROWS_AS(tg::internal::parse_update_in_place(bad, "telegram"),
                  botmesh::invalid_argument_error);
}
