// WhatsApp Cloud / Messenger / Instagram webhooks against a fake Graph API.

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <tuple>

#include <botmesh/providers/http/http_server.hpp>
#include <botmesh/providers/http/signature.hpp>
#include <botmesh/providers/meta/internal/payload.hpp>
#include <botmesh/providers/meta/meta_webhook.hpp>
#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/runtime/core/internal/delivery_id.hpp>
#include <botmesh/runtime/core/json.hpp>

#include "fake_platform.hpp"
#include "gated_backend.hpp"
#include "log_capture.hpp"
#include "test_util.hpp"

using namespace std::chrono_literals;
namespace http = botmesh::http;
namespace meta = botmesh::meta;

namespace {

constexpr const char* app_secret = "app-secret";

std::string wa_payload(const std::string& messages, const std::string& statuses = "[]",
                       const std::string& phone = "PHONE1") {
  return R"({"object":"whatsapp_business_account","entry":[{"id":"1","changes":[{"field":"messages","value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"34600","phone_number_id":")"
         + phone + R"("},"messages":)" + messages + R"(,"statuses":)" + statuses
         + "}}]}]}";
}

std::string wa_text(const std::string& id, const std::string& from,
                    const std::string& text) {
  return R"({"from":")" + from + R"(","id":")" + id
         + R"(","timestamp":"1700000000","type":"text","text":{"body":")" + text
         + R"("}})";
}

struct signed_poster {
  std::string url;
  std::unique_ptr<http::client> client = std::make_unique<http::client>();

  http::client_response post(const std::string& body, std::string signature = {}) {
    if (signature.empty())
      signature = "sha256=" + http::hmac_sha256_hex(app_secret, body);
    http::client_request req{.url = url, .body = body};
    if (signature != "none")
      req.headers.emplace_back("X-Hub-Signature-256", signature);
    return client->request(req);
  }

  /// `post(body)` on a thread of its own (a POST whose answer waits for
  /// acceptances the test gives): its status, once answered.
  std::future<int> post_later(std::string body) {
    return std::async(std::launch::async, [this, body = std::move(body)] {
      return static_cast<int>(post(body).status);
    });
  }
};

std::unique_ptr<test::fake_api> fake_graph() {
  return std::make_unique<test::fake_api>(
    "/v21.0/",
    std::vector<std::string>{"PHONE1/messages", "PHONE2/messages", "me/messages"},
    R"({"messaging_product":"whatsapp","messages":[{"id":"wamid.out"}]})");
}

meta::webhook_options wa_options(const test::fake_api& api) {
  meta::webhook_options o;
  o.access_token = "token";
  o.app_secret = app_secret;
  o.verify_token = "verify-me";
  o.api_url = api.url();
  o.flood = http::flood_limits::none();
  return o;
}

// For a test that stops the provider with a POST still held: its stop
// does not wait the default 10 s for that POST.
meta::webhook_options wa_options_quick_stop(const test::fake_api& api) {
  auto o = wa_options(api);
  o.listen.shutdown_timeout = "100ms";
  return o;
}

} // namespace

namespace {

// Takes every message, except that handing over `fail_on` throws once.
struct throwing_host final : botmesh::provider_host {
  std::mutex mtx;
  std::vector<std::string> ids;
  std::string fail_on;

  void deliver(botmesh::inbound_message msg) override {
    std::lock_guard guard{mtx};
    if (!fail_on.empty() && msg.id == fail_on) {
      fail_on.clear();
      throw std::runtime_error("host failed");
    }
    ids.push_back(msg.id);
  }
  void state_changed(botmesh::provider_state) override {}
  void input_closed() override {}
};

// Keeps each delivery's callbacks: its acceptance comes when the test says.
struct holding_host final : botmesh::provider_host {
  std::mutex mtx;
  std::vector<std::string> ids;
  std::vector<botmesh::delivery_callbacks> held;

  void deliver(botmesh::inbound_message msg) override {
    deliver(std::move(msg), {});
  }
  void deliver(botmesh::inbound_message msg,
               botmesh::delivery_callbacks cb) override {
    std::lock_guard guard{mtx};
    ids.push_back(msg.id);
    held.push_back(std::move(cb));
  }
  void accept(std::size_t i, botmesh::errc code) {
    botmesh::delivery_callbacks cb;
    {
      std::lock_guard guard{mtx};
      cb = held.at(i);
    }
    cb.accepted(code);
  }
  std::size_t delivered() {
    std::lock_guard guard{mtx};
    return ids.size();
  }
  // Accepts delivery `i` once it came as the last one so far; false when
  // that did not happen.
  bool accept_when_delivered(std::size_t i, botmesh::errc code) {
    if (!test::eventually([&] { return delivered() == i + 1; }))
      return false;
    accept(i, code);
    return true;
  }
  void state_changed(botmesh::provider_state) override {}
  void input_closed() override {}
};

// A host that holds the first delivery's acceptance (`first`, reported by
// the test) and reports each later one inside deliver, on the provider's
// thread: accepted, or refused for a retry at delivery `refuse_at`
// (1-based; 0: never).
struct inline_host final : botmesh::provider_host {
  std::mutex mtx;
  std::vector<std::string> ids;
  botmesh::delivery_callbacks first;
  std::size_t refuse_at = 0;

  void deliver(botmesh::inbound_message msg) override {
    deliver(std::move(msg), {});
  }
  void deliver(botmesh::inbound_message msg,
               botmesh::delivery_callbacks cb) override {
    std::size_t n = 0;
    {
      std::lock_guard guard{mtx};
      ids.push_back(msg.id);
      n = ids.size();
      if (n == 1) {
        first = std::move(cb);
        return;
      }
    }
    cb.accepted(n == refuse_at ? botmesh::errc::store_error
                               : botmesh::errc::none);
  }
  std::size_t delivered() {
    std::lock_guard guard{mtx};
    return ids.size();
  }
  void state_changed(botmesh::provider_state) override {}
  void input_closed() override {}
};

} // namespace

TEST_CASE("the X-Hub-Signature-256 check accepts only the HMAC of the raw "
          "body with the app secret") {
  std::string body = R"({"entry":[]})";
  auto good = "sha256=" + http::hmac_sha256_hex(app_secret, body);
  CHECK(http::verify_hub_signature(good, app_secret, body));
  auto upper = good;
  for (auto& c : upper)
    if (c >= 'a' && c <= 'f')
      c = static_cast<char>(c - 'a' + 'A');
  upper.replace(0, 7, "sha256=");
  CHECK(http::verify_hub_signature(upper, app_secret, body));
  CHECK_FALSE(http::verify_hub_signature(good, "other", body));
  CHECK_FALSE(http::verify_hub_signature(good, app_secret, body + " "));
  CHECK_FALSE(http::verify_hub_signature(good.substr(7), app_secret, body));
  CHECK_FALSE(http::verify_hub_signature("sha256=zz", app_secret, body));
  CHECK_FALSE(http::verify_hub_signature("", app_secret, body));
  // RFC 4231 test case 2.
  CHECK(http::hmac_sha256_hex("Jefe", "what do ya want for nothing?")
        == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST_CASE("WhatsApp payloads yield text, button and list replies, media and "
          "locations as messages and statuses as events") {
  auto p = meta::internal::parse_payload(
    wa_payload(
      "[" + wa_text("w1", "346", "hola")
        + R"(,{"from":"346","id":"w2","timestamp":"1","type":"interactive","interactive":{"type":"button_reply","button_reply":{"id":"yes","title":"Sí"}}})"
        + R"(,{"from":"346","id":"w3","timestamp":"1","type":"interactive","interactive":{"type":"list_reply","list_reply":{"id":"row2","title":"Dos"}}})"
        + R"(,{"from":"346","id":"w4","timestamp":"1","type":"image","image":{"id":"MEDIA1","mime_type":"image/jpeg","caption":"foto"}})"
        + R"(,{"from":"346","id":"w5","timestamp":"1","type":"location","location":{"latitude":40.4,"longitude":-3.7}})"
        + R"(,{"from":"346","id":"w6","timestamp":"1","type":"unsupported"}])",
      R"([{"id":"wamid.out","status":"read","timestamp":"1700000001","recipient_id":"346"}])"),
    meta::platform::whatsapp, "whatsapp");
  REQUIRE(p.messages.size() == 5);
  CHECK(p.messages[0].text == "hola");
  CHECK(p.messages[0].chat == "346");
  CHECK(p.messages[0].provider == "whatsapp");
  CHECK(p.messages[1].type == botmesh::message_type::button);
  CHECK(p.messages[1].data == "yes");
  CHECK(p.messages[1].text == "Sí");
  CHECK(p.messages[2].data == "row2");
  CHECK(p.messages[3].media_id == "MEDIA1");
  CHECK(p.messages[3].text == "foto");
  CHECK(p.messages[4].type == botmesh::message_type::location);
  CHECK(p.messages[4].latitude == 40.4);
  CHECK(p.unknown == 1);
  REQUIRE(p.statuses.size() == 1);
  CHECK(p.statuses[0].status == "read");
  CHECK(p.statuses[0].message_id == "wamid.out");
  CHECK(p.phone_number_ids[0] == "PHONE1");
}

TEST_CASE("a WhatsApp messages, statuses or errors field that is not an "
          "array counts as unknown, not as an empty delivery") {
  auto one = R"({"from":"346","id":"w1","timestamp":"1","type":"text","text":{"body":"hola"}})";
  auto p = meta::internal::parse_payload(wa_payload(one, "[]"),
                                         meta::platform::whatsapp, "whatsapp");
  CHECK(p.messages.empty());
  CHECK(p.unknown == 1);
  p = meta::internal::parse_payload(wa_payload("[]", R"({"id":"wamid.s"})"),
                                    meta::platform::whatsapp, "whatsapp");
  CHECK(p.statuses.empty());
  CHECK(p.unknown == 1);
  std::string body = R"({"object":"whatsapp_business_account","entry":[{"id":"1","changes":[{"field":"messages","value":{"metadata":{"phone_number_id":"PHONE1"},"errors":"down"}}]}]})";
  p = meta::internal::parse_payload(body, meta::platform::whatsapp, "whatsapp");
  CHECK(p.unknown == 1);
  // Absent is not unknown.
  p = meta::internal::parse_payload(wa_payload("[]", "[]"),
                                    meta::platform::whatsapp, "whatsapp");
  CHECK(p.unknown == 0);
}

TEST_CASE("WhatsApp errors carry their code and details: a failed status's, "
          "and those of the webhook outside any message, which are logged") {
  auto failed = R"([{"id":"wamid.f","status":"failed","timestamp":"1","recipient_id":"346","errors":[{"code":131047,"title":"Re-engagement message","error_data":{"details":"More than 24 hours have passed"}}]}])";
  auto p = meta::internal::parse_payload(wa_payload("[]", failed),
                                         meta::platform::whatsapp, "whatsapp");
  REQUIRE(p.statuses.size() == 1);
  CHECK(p.statuses[0].error
        == "131047 Re-engagement message: More than 24 hours have passed");
  auto untitled = R"([{"id":"wamid.g","status":"failed","timestamp":"1","recipient_id":"346","errors":[{"code":131000}]}])";
  p = meta::internal::parse_payload(wa_payload("[]", untitled),
                                    meta::platform::whatsapp, "whatsapp");
  CHECK(p.statuses.at(0).error == "131000");
  // An error of the webhook itself, outside messages and statuses.
  std::string body = R"({"object":"whatsapp_business_account","entry":[{"id":"1","changes":[{"field":"messages","value":{"messaging_product":"whatsapp","metadata":{"phone_number_id":"PHONE1"},"errors":[{"code":131000,"title":"Something went wrong","message":"Something went wrong","error_data":{"details":"Unknown error"}}]}}]}]})";
  p = meta::internal::parse_payload(body, meta::platform::whatsapp, "whatsapp");
  CHECK(p.errors
        == std::vector<std::string>{
          "131000 Something went wrong: Unknown error"});
  auto api = fake_graph();
  auto provider = std::make_shared<meta::webhook_provider>(wa_options(*api));
  throwing_host host;
  test::log_capture logs;
  provider->start(host);
  signed_poster post{provider->server().url() + "/whatsapp"};
  CHECK(post.post(body).status == 200);
  provider->stop();
  CHECK(provider->stats().platform_errors == 1);
  CHECK(logs.count("whatsapp", "131000 Something went wrong: Unknown error") == 1);
}

TEST_CASE("a failed delivery receipt with no status listener is logged "
          "with its error, once") {
  auto api = fake_graph();
  auto p = std::make_shared<meta::webhook_provider>(wa_options(*api));
  botmesh::bot bot{{.provider = p}};
  bot.start();
  test::log_capture logs;
  signed_poster post{p->server().url() + "/whatsapp"};
  auto failed = wa_payload(
    "[]", R"([{"id":"wamid.out","status":"failed","timestamp":"1","recipient_id":"346","errors":[{"code":131047,"title":"Re-engagement message"}]}])");
  auto read = wa_payload(
    "[]", R"([{"id":"wamid.out","status":"read","timestamp":"2","recipient_id":"346"}])");
  CHECK(post.post(failed).status == 200);
  CHECK(post.post(failed).status == 200); // redelivered: said once
  CHECK(post.post(read).status == 200);
  bot.stop();
  CHECK(logs.count("whatsapp", "message wamid.out to 346 was not delivered: "
                               "131047 Re-engagement message")
        == 1);
  CHECK(logs.count("whatsapp", "wamid.out") == 1); // the read receipt: not
  CHECK(p->stats().statuses == 3);
}

TEST_CASE("a Meta credential with a control character or an outer space is "
          "refused, naming the option") {
  auto api = fake_graph();
  auto field_of = [&](auto change) {
    auto o = wa_options(*api);
    change(o);
    try {
      meta::webhook_provider p{o};
    } catch (const botmesh::invalid_argument_error& e) {
      return e.field();
    }
    return std::string{"(accepted)"};
  };
  CHECK(field_of([](auto& o) { o.access_token = "token\n"; }) == "access_token");
  CHECK(field_of([](auto& o) { o.app_secret = "secret\r\n"; }) == "app_secret");
  CHECK(field_of([](auto& o) { o.verify_token = " verify"; }) == "verify_token");
  CHECK(field_of([](auto& o) { o.access_token = "a\tb"; }) == "access_token");
  CHECK(field_of([](auto&) {}) == "(accepted)");
}

TEST_CASE("a WhatsApp timestamp too large for milliseconds leaves the "
          "message without a time instead of overflowing") {
  auto p = meta::internal::parse_payload(
    wa_payload(
      R"([{"from":"346","id":"w1","timestamp":"9223372036854775","type":"text","text":{"body":"a"}})"
      R"(,{"from":"346","id":"w2","timestamp":"9223372036854776","type":"text","text":{"body":"b"}})"
      R"(,{"from":"346","id":"w3","timestamp":"9223372036854775807","type":"text","text":{"body":"c"}}])"),
    meta::platform::whatsapp, "whatsapp");
  REQUIRE(p.messages.size() == 3);
  CHECK(botmesh::to_unix_ms(p.messages[0].timestamp) == 9223372036854775000);
  CHECK(botmesh::to_unix_ms(p.messages[1].timestamp) == 0);
  CHECK(botmesh::to_unix_ms(p.messages[2].timestamp) == 0);
  CHECK(p.messages[2].text == "c");
}

TEST_CASE("a WhatsApp sender with an '@', or a phone number id of anything "
          "but letters and digits, is not taken as a chat to reply to") {
  // A chat id is <wa_id>@<phone_number_id>: "111@222" would send the
  // reply to 111 from the number 222, and the phone number id goes into a
  // Graph API path.
  auto p = meta::internal::parse_payload(
    wa_payload(
      R"([{"from":"111@222","id":"w1","timestamp":"1","type":"text","text":{"body":"a"}})"
      R"(,{"from":"346","id":"w2","timestamp":"1","type":"text","text":{"body":"b"}}])"),
    meta::platform::whatsapp, "whatsapp");
  REQUIRE(p.messages.size() == 1);
  CHECK(p.messages[0].chat == "346");
  CHECK(p.unknown == 1);
  auto with_phone = [](const std::string& phone) {
    return meta::internal::parse_payload(
      wa_payload(
        R"([{"from":"346","id":"w1","timestamp":"1","type":"text","text":{"body":"a"}}])",
        "[]", phone),
      meta::platform::whatsapp, "whatsapp");
  };
  auto good = with_phone("1234");
  REQUIRE(good.messages.size() == 1);
  CHECK(good.phone_number_ids[0] == "1234");
  for (std::string bad : {"12/../me", "12?x=1", "12@3", "12 3", "12%2F"}) {
    CAPTURE(bad);
    auto q = with_phone(bad);
    CHECK(q.messages.empty());
    CHECK(q.phone_number_ids.empty());
    CHECK(q.unknown == 1);
  }
}

TEST_CASE("Messenger and Instagram payloads share entry[].messaging[]: text, "
          "quick replies, postbacks, echoes and reads are not messages") {
  auto p = meta::internal::parse_payload(
    R"({"object":"page","entry":[{"id":"PAGE","time":1,"messaging":[
      {"sender":{"id":"PSID1"},"recipient":{"id":"PAGE"},"timestamp":1700000000000,"message":{"mid":"m1","text":"hola"}},
      {"sender":{"id":"PSID1"},"recipient":{"id":"PAGE"},"timestamp":1,"message":{"mid":"m2","text":"Sí","quick_reply":{"payload":"YES"}}},
      {"sender":{"id":"PSID1"},"recipient":{"id":"PAGE"},"timestamp":1,"postback":{"mid":"m3","title":"Empezar","payload":"START"}},
      {"sender":{"id":"PAGE"},"recipient":{"id":"PSID1"},"timestamp":1,"message":{"mid":"m4","text":"eco","is_echo":true}},
      {"sender":{"id":"PSID1"},"recipient":{"id":"PAGE"},"timestamp":1,"read":{"watermark":1}},
      {"sender":{"id":"PSID1"},"recipient":{"id":"PAGE"},"timestamp":1700000009000,"message_edit":{"mid":"m1","text":"hola!","num_edit":1}},
      {"sender":{"id":"PSID1"},"recipient":{"id":"PAGE"},"timestamp":1700000010000,"message_edit":{"mid":"m1","text":"hola!!","num_edit":"2"}}]}]})",
    meta::platform::messenger, "messenger");
  REQUIRE(p.messages.size() == 5);
  // Edits: the original's id, the new text, told apart by their count.
  for (int i : {3, 4}) {
    CHECK(p.messages[i].id == "m1");
    CHECK(p.messages[i].edited);
    CHECK(p.messages[i].edit_id == std::to_string(i - 2));
    using botmesh::internal::delivery_id;
    CHECK(botmesh::journal_id("messenger:PSID1", delivery_id(p.messages[i]))
          != botmesh::journal_id("messenger:PSID1", delivery_id(p.messages[0])));
  }
  CHECK(p.messages[4].text == "hola!!");
  CHECK(p.messages[0].chat == "PSID1");
  CHECK(p.messages[0].text == "hola");
  CHECK(p.messages[1].data == "YES");
  CHECK(p.messages[2].type == botmesh::message_type::button);
  CHECK(p.messages[2].data == "START");
  CHECK(p.unknown == 1);
  CHECK(p.statuses.size() == 1);
  CHECK_THROWS_AS(meta::internal::parse_payload("{\"entry\":", meta::platform::instagram, "ig"),
                  botmesh::invalid_argument_error);
  CHECK_THROWS_AS(meta::internal::parse_payload("{}", meta::platform::instagram, "ig"),
                  botmesh::invalid_argument_error);
}

TEST_CASE("Messenger receipts report every message they cover, a postback "
          "without mid keeps one id across redeliveries, an unsend is not a "
          "message") {
  auto body = std::string{R"({"object":"page","entry":[{"id":"PAGE","time":1,"messaging":[
      {"sender":{"id":"PSID1"},"recipient":{"id":"PAGE"},"timestamp":1700000000000,"delivery":{"mids":["m1","m2","m3"],"watermark":1}},
      {"sender":{"id":"PSID1"},"recipient":{"id":"PAGE"},"timestamp":1700000000001,"read":{"mid":"m4"}},
      {"sender":{"id":"PSID1"},"recipient":{"id":"PAGE"},"timestamp":1700000000002,"postback":{"title":"Empezar","payload":"START"}},
      {"sender":{"id":"PSID1"},"recipient":{"id":"PAGE"},"timestamp":1700000000003,"message":{"mid":"m5","is_deleted":true}}]}]})"};
  auto p = meta::internal::parse_payload(body, meta::platform::instagram, "ig");
  REQUIRE(p.statuses.size() == 4);
  CHECK(p.statuses[0].message_id == "m1");
  CHECK(p.statuses[1].message_id == "m2");
  CHECK(p.statuses[2].message_id == "m3");
  CHECK(p.statuses[2].status == "delivered");
  CHECK(p.statuses[3].message_id == "m4");
  CHECK(p.statuses[3].status == "read");
  REQUIRE(p.messages.size() == 1);
  CHECK(p.messages[0].data == "START");
  CHECK_FALSE(p.messages[0].id.empty());
  CHECK(p.unknown == 1); // the unsend
  auto again = meta::internal::parse_payload(body, meta::platform::instagram, "ig");
  REQUIRE(again.messages.size() == 1);
  CHECK(again.messages[0].id == p.messages[0].id);
}

TEST_CASE("WhatsApp replies with up to three buttons become reply buttons "
          "and more become a list, media go by link or id") {
  botmesh::outgoing_message m;
  m.chat = "346";
  m.text = "¿Seguro?";
  m.buttons = {{{.text = "Sí", .data = "yes"}, {.text = "No", .data = "no"}}};
  auto b = meta::internal::to_graph_body(m, meta::platform::whatsapp);
  CHECK(botmesh::is_valid_json(b));
  CHECK(b.find(R"("interactive":{"type":"button")") != std::string::npos);
  CHECK(b.find(R"({"type":"reply","reply":{"id":"yes","title":"Sí"}})") != std::string::npos);
  m.buttons = {{{.text = "1", .data = "a"}, {.text = "2", .data = "b"}},
               {{.text = "3", .data = "c"}, {.text = "4", .data = "d"}}};
  m.menu_label = "Ver";
  auto l = meta::internal::to_graph_body(m, meta::platform::whatsapp);
  CHECK(botmesh::is_valid_json(l));
  CHECK(l.find(R"("type":"list")") != std::string::npos);
  CHECK(l.find(R"("button":"Ver")") != std::string::npos);
  CHECK(l.find(R"({"id":"d","title":"4"})") != std::string::npos);
  botmesh::outgoing_message img;
  img.chat = "346";
  img.media = botmesh::message_type::image;
  img.media_url = "https://example.org/a.png";
  img.text = "pie";
  CHECK(meta::internal::to_graph_body(img, meta::platform::whatsapp)
        == R"({"messaging_product":"whatsapp","recipient_type":"individual","to":"346","type":"image","image":{"link":"https://example.org/a.png","caption":"pie"}})");
  m.buttons = {{{.text = "un título demasiado largo", .data = "x"}}};
  CHECK_THROWS_AS(meta::internal::to_graph_body(m, meta::platform::whatsapp),
                  botmesh::invalid_argument_error);
}

TEST_CASE("a WhatsApp reply with media and buttons carries the media as the "
          "buttons' header, and media a header cannot hold is refused, naming "
          "it") {
  botmesh::outgoing_message m;
  m.chat = "346";
  m.text = "¿Lo quieres?";
  m.media = botmesh::message_type::image;
  m.media_url = "https://example.org/a.png";
  m.buttons = {{{.text = "Sí", .data = "yes"}, {.text = "No", .data = "no"}}};
  auto b = meta::internal::to_graph_body(m, meta::platform::whatsapp);
  CHECK(botmesh::is_valid_json(b));
  CHECK(b.find(R"("interactive":{"type":"button","header":{"type":"image","image":{"link":"https://example.org/a.png"}},"body":{"text":"¿Lo quieres?"})")
        != std::string::npos);
  m.media = botmesh::message_type::document;
  m.media_url.clear();
  m.media_id = "MEDIA1";
  b = meta::internal::to_graph_body(m, meta::platform::whatsapp);
  CHECK(b.find(R"("header":{"type":"document","document":{"id":"MEDIA1"}})")
        != std::string::npos);
  auto refused = [&] {
    try {
      meta::internal::to_graph_body(m, meta::platform::whatsapp);
    } catch (const botmesh::invalid_argument_error& e) {
      return e.field();
    }
    return std::string{"(sent)"};
  };
  m.media = botmesh::message_type::audio;
  CHECK(refused() == "media");
  m.media = botmesh::message_type::image;
  m.buttons = {{{.text = "1", .data = "a"}, {.text = "2", .data = "b"}},
               {{.text = "3", .data = "c"}, {.text = "4", .data = "d"}}};
  CHECK(refused() == "media"); // a list has no media header
}

TEST_CASE("the WhatsApp GET verification echoes the challenge only for the "
          "right verify token") {
  auto api = fake_graph();
  auto p = std::make_shared<meta::webhook_provider>(wa_options(*api));
  botmesh::bot bot{{.provider = p}};
  bot.start();
  http::client c;
  auto base = p->server().url() + "/whatsapp";
  auto ok = c.request({.method = "GET",
                       .url = base + "?hub.mode=subscribe&hub.verify_token=verify-me&hub.challenge=1158201444"});
  CHECK(ok.status == 200);
  CHECK(ok.body == "1158201444");
  CHECK(c.request({.method = "GET",
                   .url = base + "?hub.mode=subscribe&hub.verify_token=nope&hub.challenge=1"})
          .status
        == 403);
  CHECK(p->stats().verifications == 1);
}

TEST_CASE("a signed WhatsApp message is answered 200 and the reply reaches "
          "the Graph API, bad signatures get 401 and enqueue nothing") {
  auto api = fake_graph();
  std::mutex mtx;
  std::vector<std::string> statuses;
  auto o = wa_options(*api);
  o.on_status = [&](const meta::status_event& s) {
    std::lock_guard guard{mtx};
    statuses.push_back(s.status);
  };
  auto p = std::make_shared<meta::webhook_provider>(o);
  botmesh::bot bot{{.provider = p}};
  bot.on_message([](botmesh::context& c) { c.reply("eco: " + c.text()); });
  bot.start();
  signed_poster post{p->server().url() + "/whatsapp"};
  auto body = wa_payload("[" + wa_text("w1", "346", "hola") + "]");
  CHECK(post.post(body, "sha256=" + std::string(64, '0')).status == 401);
  CHECK(post.post(body, "none").status == 401);
  CHECK(bot.stats().received == 0);
  CHECK(post.post(body).status == 200);
  CHECK(post.post(body).status == 200); // a duplicate
  REQUIRE(api->wait_for_calls("PHONE1/messages", 1));
  auto sent = api->calls("PHONE1/messages")[0].body;
  CHECK(sent.find(R"("to":"346")") != std::string::npos);
  CHECK(sent.find(R"("body":"eco: hola")") != std::string::npos);
  CHECK(post.post("{not json").status == 400);
  auto receipt = wa_payload("[]", R"([{"id":"x","status":"delivered","timestamp":"1","recipient_id":"346"}])");
  CHECK(post.post(receipt).status == 200);
  CHECK(post.post(receipt).status == 200); // redelivered: reported once
  CHECK(p->stats().unauthorized == 2);
  CHECK(p->stats().duplicates == 2);
  CHECK(p->stats().malformed == 1);
  REQUIRE(test::eventually([&] { return bot.stats().handled == 1; }));
  std::lock_guard guard{mtx};
  CHECK(statuses == std::vector<std::string>{"delivered"});
}

TEST_CASE("a WhatsApp webhook with an app secret checks it even when "
          "allow_unauthenticated is set, and its 401 says what was wrong") {
  auto api = fake_graph();
  auto o = wa_options(*api);
  o.allow_unauthenticated = true; // excuses a missing secret, no more
  auto p = std::make_shared<meta::webhook_provider>(o);
  botmesh::bot bot{{.provider = p}};
  std::atomic<int> handled{0};
  bot.on_message([&](botmesh::context&) { ++handled; });
  bot.start();
  signed_poster post{p->server().url() + "/whatsapp"};
  auto body = wa_payload("[" + wa_text("w1", "346", "hola") + "]");
  auto none = post.post(body, "none");
  CHECK(none.status == 401);
  CHECK(none.body.find("no X-Hub-Signature-256") != std::string::npos);
  auto shape = post.post(body, "sha256=zz");
  CHECK(shape.status == 401);
  CHECK(shape.body.find("not sha256=<64 hex digits>") != std::string::npos);
  auto wrong = post.post(body, "sha256=" + std::string(64, '0'));
  CHECK(wrong.status == 401);
  CHECK(wrong.body.find("does not match") != std::string::npos);
  CHECK(p->stats().unauthorized == 3);
  CHECK(bot.stats().received == 0);
  CHECK(post.post(body).status == 200);
  CHECK(test::eventually([&] { return handled.load() == 1; }));
  bot.stop();
  CHECK(handled.load() == 1);
}

TEST_CASE("a WhatsApp user writing to two business numbers has two "
          "conversations, each answered from its number, by any replica") {
  auto api = fake_graph();
  auto o = wa_options(*api);
  o.phone_number_id = "PHONE1";
  auto p = std::make_shared<meta::webhook_provider>(o);
  botmesh::bot bot{{.provider = p}};
  std::mutex mtx;
  std::vector<std::string> chats;
  bot.on_message([&](botmesh::context& c) {
    {
      std::lock_guard guard{mtx};
      chats.push_back(c.message().chat);
    }
    c.reply("eco: " + c.text());
  });
  bot.start();
  signed_poster post{p->server().url() + "/whatsapp"};
  CHECK(post.post(wa_payload("[" + wa_text("w1", "346", "uno") + "]")).status == 200);
  REQUIRE(api->wait_for_calls("PHONE1/messages", 1));
  CHECK(post.post(wa_payload("[" + wa_text("w2", "346", "dos") + "]", "[]", "PHONE2"))
          .status
        == 200);
  REQUIRE(api->wait_for_calls("PHONE2/messages", 1));
  CHECK(api->calls("PHONE2/messages")[0].body.find(R"("to":"346")")
        != std::string::npos);
  CHECK(api->calls("PHONE2/messages")[0].body.find("dos") != std::string::npos);
  {
    std::lock_guard guard{mtx};
    CHECK(chats == std::vector<std::string>{"346", "346@PHONE2"});
  }
  // A send from elsewhere (another replica, a scheduled message) needs no
  // memory of what arrived: the chat names the number.
  bot.send({.provider = "whatsapp", .chat = "347@PHONE2", .text = "hola"});
  REQUIRE(api->wait_for_calls("PHONE2/messages", 2));
  CHECK(api->calls("PHONE2/messages")[1].body.find(R"("to":"347")")
        != std::string::npos);
  CHECK(api->calls("PHONE1/messages").size() == 1);
  // A number that is not letters and digits would be another Graph path
  // (or another request): refused, nothing sent.
  for (std::string chat : {"347@../../PHONE1", "347@P 1", "347@P\r\nX: y"}) {
    CAPTURE(chat);
    try {
      bot.send({.provider = "whatsapp", .chat = chat, .text = "hola"});
      FAIL("expected a refusal");
    } catch (const botmesh::invalid_argument_error& e) {
      CHECK(std::string{e.what()}.find("not letters and digits")
            != std::string::npos);
    }
  }
  CHECK(api->calls("PHONE1/messages").size() == 1);
  CHECK(api->calls("PHONE2/messages").size() == 2);
}

TEST_CASE("a Messenger edit reaches the handler as an edit, once, not as "
          "its original's duplicate") {
  auto api = fake_graph();
  auto o = wa_options(*api);
  o.kind = meta::platform::messenger;
  o.id = "messenger";
  o.path = "/messenger";
  auto p = std::make_shared<meta::webhook_provider>(o);
  botmesh::bot bot{{.provider = p}};
  std::mutex mtx;
  std::vector<std::string> seen;
  bot.on_message([&](botmesh::context& c) {
    std::lock_guard guard{mtx};
    seen.push_back((c.message().edited ? "edit:" : "") + c.text());
  });
  bot.start();
  signed_poster post{p->server().url() + "/messenger"};
  auto event = [](const std::string& inner) {
    return R"({"object":"page","entry":[{"id":"PAGE","time":1,"messaging":[{"sender":{"id":"PSID1"},"recipient":{"id":"PAGE"},"timestamp":1700000000000,)"
           + inner + "}]}]}";
  };
  CHECK(post.post(event(R"("message":{"mid":"m1","text":"hola"})")).status == 200);
  auto edit = event(R"("message_edit":{"mid":"m1","text":"hola!","num_edit":1})");
  CHECK(post.post(edit).status == 200);
  CHECK(post.post(edit).status == 200); // Meta's retry of the same edit
  REQUIRE(test::eventually([&] { return bot.stats().handled == 2; }));
  bot.stop();
  CHECK(p->stats().duplicates == 1);
  std::lock_guard guard{mtx};
  CHECK(seen == std::vector<std::string>{"hola", "edit:hola!"});
}

TEST_CASE("a WhatsApp message refused for a retry keeps its whole duplicate "
          "window once the retry is accepted") {
  auto api = fake_graph();
  auto o = wa_options(*api);
  o.dedup_window = 2;
  auto p = std::make_shared<meta::webhook_provider>(o);
  auto backend = test::failing_journal();
  botmesh::bot bot{{.provider = p, .durability = test::durable_over(backend)}};
  bot.on_message([](botmesh::context&) {});
  bot.start();
  signed_poster post{p->server().url() + "/whatsapp"};
  auto m1 = wa_payload("[" + wa_text("w1", "346", "uno") + "]");
  auto m2 = wa_payload("[" + wa_text("w2", "346", "dos") + "]");
  CHECK(post.post(m1).status == 503); // the journal failed: forgotten
  backend->fail_records = false;
  CHECK(post.post(m1).status == 200);
  CHECK(post.post(m2).status == 200);
  // w1 and w2 fill the window of two; w1's first, forgotten entry must not
  // push the live one out.
  CHECK(post.post(m1).status == 200);
  CHECK(p->stats().duplicates == 1);
  bot.stop();
}

TEST_CASE("with durability a WhatsApp message redelivered while it is being "
          "journaled gets the original's answer: 503 when the write fails") {
  auto api = fake_graph();
  auto p = std::make_shared<meta::webhook_provider>(wa_options(*api));
  auto backend = std::make_shared<test::gated_backend>(); // writes wait
  botmesh::bot bot{{.provider = p, .durability = test::durable_over(backend)}};
  std::atomic<int> handled{0};
  bot.on_message([&](botmesh::context&) { ++handled; });
  bot.start();
  signed_poster post{p->server().url() + "/whatsapp"};
  signed_poster again{p->server().url() + "/whatsapp"};
  auto m1 = wa_payload("[" + wa_text("w1", "346", "uno") + "]");
  auto first = post.post_later(m1);
  REQUIRE(test::eventually([&] {
    std::lock_guard guard{backend->mtx};
    return backend->held.size() == 1;
  }));
  auto second = again.post_later(m1);
  REQUIRE(test::eventually([&] { return p->stats().duplicates == 1; }));
  CHECK(second.wait_for(100ms) == std::future_status::timeout); // not yet
  backend->fail_held = true;
  backend->open(); // the journal write fails
  CHECK(first.get() == 503);
  CHECK(second.get() == 503);
  // Meta's next redelivery is taken and handled once.
  backend->fail_held = false;
  CHECK(post.post(m1).status == 200);
  REQUIRE(test::eventually([&] { return bot.stats().handled == 1; }));
  bot.stop();
  CHECK(handled.load() == 1);
}


TEST_CASE("when handing over one message of a WhatsApp payload fails, it and "
          "the rest are not taken for duplicates on Meta's retry") {
  auto api = fake_graph();
  auto p = std::make_shared<meta::webhook_provider>(wa_options(*api));
  throwing_host host;
  host.fail_on = "w2";
  p->start(host);
  signed_poster post{p->server().url() + "/whatsapp"};
  auto body = wa_payload("[" + wa_text("w1", "346", "uno") + ","
                         + wa_text("w2", "346", "dos") + ","
                         + wa_text("w3", "346", "tres") + "]");
  CHECK(post.post(body).status == 503);
  CHECK(post.post(body).status == 200);
  p->stop();
  std::lock_guard guard{host.mtx};
  CHECK(host.ids == std::vector<std::string>{"w1", "w2", "w3"});
  CHECK(p->stats().duplicates == 1); // w1, on the retry
}

TEST_CASE("a WhatsApp POST hands a chat's messages over one after the "
          "other: one refused for a retry holds back the next, not other "
          "chats") {
  auto api = fake_graph();
  auto p = std::make_shared<meta::webhook_provider>(wa_options(*api));
  holding_host host;
  p->start(host);
  signed_poster post{p->server().url() + "/whatsapp"};
  auto body = wa_payload("[" + wa_text("w1", "346", "uno") + ","
                         + wa_text("w2", "346", "dos") + ","
                         + wa_text("w3", "347", "otro chat") + "]");
  auto first = post.post_later(body);
  REQUIRE(test::eventually([&] { return host.delivered() == 2; }));
  {
    std::lock_guard guard{host.mtx};
    // w2 waits for w1's acceptance; the other chat's w3 does not.
    CHECK(host.ids == std::vector<std::string>{"w1", "w3"});
  }
  // w1's journal write failed: w2 must not run before Meta's retry of w1,
  // so it is not handed over, and that retry brings it again.
  host.accept(0, botmesh::errc::store_error);
  host.accept(1, botmesh::errc::none);
  CHECK(first.get() == 503);
  CHECK(host.delivered() == 2);
  signed_poster again{p->server().url() + "/whatsapp"};
  auto second = again.post_later(body);
  REQUIRE(host.accept_when_delivered(2, botmesh::errc::none));
  REQUIRE(host.accept_when_delivered(3, botmesh::errc::none));
  CHECK(second.get() == 200);
  {
    std::lock_guard guard{host.mtx};
    CHECK(host.ids == std::vector<std::string>{"w1", "w3", "w1", "w2"});
  }
  CHECK(p->stats().duplicates == 1); // w3, on the retry
  p->stop();
}

TEST_CASE("a WhatsApp retry whose earlier message is still pending holds "
          "back that chat's later messages") {
  auto api = fake_graph();
  auto p = std::make_shared<meta::webhook_provider>(wa_options(*api));
  holding_host host;
  p->start(host);
  auto url = p->server().url() + "/whatsapp";
  signed_poster post1{url}, post2{url}, post3{url};
  auto only_a1 = wa_payload("[" + wa_text("a1", "346", "uno") + "]");
  auto both = wa_payload("[" + wa_text("a1", "346", "uno") + ","
                         + wa_text("a2", "346", "dos") + "]");
  auto first = post1.post_later(only_a1);
  REQUIRE(test::eventually([&] { return host.delivered() == 1; }));
  // Meta gave up on the first POST's answer and sends a batch with a1 (still
  // pending) and a2: a2 must not be handed over before a1 is decided.
  auto second = post2.post_later(both);
  REQUIRE(test::eventually([&] { return p->stats().duplicates == 1; }));
  CHECK(second.wait_for(200ms) == std::future_status::timeout);
  CHECK(host.delivered() == 1);
  host.accept(0, botmesh::errc::store_error); // a1's journal write failed
  CHECK(first.get() == 503);
  CHECK(second.get() == 503);
  auto third = post3.post_later(both);
  REQUIRE(host.accept_when_delivered(1, botmesh::errc::none));
  REQUIRE(host.accept_when_delivered(2, botmesh::errc::none));
  CHECK(third.get() == 200);
  {
    std::lock_guard guard{host.mtx};
    CHECK(host.ids == std::vector<std::string>{"a1", "a1", "a2"});
  }
  p->stop();
}

TEST_CASE("a WhatsApp message repeated within one POST is handed over once "
          "and holds nothing back: the POST is answered 200") {
  auto api = fake_graph();
  auto p = std::make_shared<meta::webhook_provider>(wa_options(*api));
  holding_host host;
  p->start(host);
  signed_poster post{p->server().url() + "/whatsapp"};
  auto body = wa_payload("[" + wa_text("a1", "346", "uno") + ","
                         + wa_text("a1", "346", "uno") + ","
                         + wa_text("a2", "346", "dos") + "]");
  auto answer = post.post_later(body);
  REQUIRE(host.accept_when_delivered(0, botmesh::errc::none));
  REQUIRE(host.accept_when_delivered(1, botmesh::errc::none));
  CHECK(answer.get() == 200);
  CHECK(p->stats().duplicates == 1);
  std::lock_guard guard{host.mtx};
  CHECK(host.ids == std::vector<std::string>{"a1", "a2"});
  p->stop();
}

namespace {

// A started durable bot on `p` and `backend` that keeps its messages' texts.
struct durable_texts_bot {
  botmesh::bot bot;
  std::mutex mtx;
  std::vector<std::string> seen;

  durable_texts_bot(std::shared_ptr<meta::webhook_provider> p,
                    std::shared_ptr<test::gated_backend> backend)
    : bot{{.provider = std::move(p),
           .durability = test::durable_over(std::move(backend))}} {
    bot.on_message([this](botmesh::context& c) {
      std::lock_guard guard{mtx};
      seen.push_back(c.text());
    });
    bot.start();
  }

  std::vector<std::string> texts() {
    std::lock_guard guard{mtx};
    return seen;
  }
};

} // namespace

TEST_CASE("with durability a WhatsApp chat's message whose journal write "
          "failed still runs before the next one of its POST") {
  auto api = fake_graph();
  auto p = std::make_shared<meta::webhook_provider>(wa_options(*api));
  auto backend = std::make_shared<test::gated_backend>();
  backend->open();
  backend->fail_next_records = 1; // w1's write fails, w2's would land
  durable_texts_bot b{p, backend};
  auto& bot = b.bot;
  signed_poster post{p->server().url() + "/whatsapp"};
  auto body = wa_payload("[" + wa_text("w1", "346", "uno") + ","
                         + wa_text("w2", "346", "dos") + "]");
  CHECK(post.post(body).status == 503);
  CHECK(post.post(body).status == 200); // Meta's retry
  REQUIRE(test::eventually([&] { return bot.stats().handled == 2; }));
  bot.stop();
  // Before, w2 was journaled and ran at once; w1 came after it.
  CHECK(b.texts() == std::vector<std::string>{"uno", "dos"});
  CHECK(p->stats().duplicates == 0);
}

TEST_CASE("with durability a WhatsApp chat's next message of a POST, handed "
          "over once the one before was accepted, runs after it") {
  auto api = fake_graph();
  auto p = std::make_shared<meta::webhook_provider>(wa_options(*api));
  auto backend = std::make_shared<test::gated_backend>(); // writes wait
  durable_texts_bot b{p, backend};
  auto& bot = b.bot;
  signed_poster post{p->server().url() + "/whatsapp"};
  auto body = wa_payload("[" + wa_text("w1", "346", "uno") + ","
                         + wa_text("w2", "346", "dos") + "]");
  auto answer = post.post_later(body);
  REQUIRE(test::eventually([&] {
    std::lock_guard guard{backend->mtx};
    return backend->held.size() == 1; // w1's write; w2 waits for it
  }));
  // w1's write lands here; its acceptance hands w2 over, whose write now
  // lands at once. Before, the acceptance came before w1 was on its way
  // to its chat, and w2 overtook it.
  backend->open();
  CHECK(answer.get() == 200);
  REQUIRE(test::eventually([&] { return bot.stats().handled == 2; }));
  bot.stop();
  CHECK(b.texts() == std::vector<std::string>{"uno", "dos"});
}

TEST_CASE("with durability a WhatsApp chat's next message, handed over from "
          "the report of a journal write that failed for good, raises its "
          "error events off the backend's thread") {
  auto api = fake_graph();
  auto p = std::make_shared<meta::webhook_provider>(wa_options(*api));
  auto backend = std::make_shared<test::gated_backend>(); // writes wait
  backend->fail_held_code = botmesh::errc::corrupted_record;
  botmesh::bot bot{{.provider = p,
                    .limits = {.max_id_bytes = 16},
                    .durability = test::durable_over(backend)}};
  std::mutex mtx;
  std::vector<std::pair<botmesh::errc, std::thread::id>> errors;
  bot.on<botmesh::events::error>([&](const botmesh::events::error& e) {
    std::lock_guard guard{mtx};
    errors.emplace_back(e.code, std::this_thread::get_id());
  });
  bot.on_message([](botmesh::context&) {});
  bot.start();
  signed_poster post{p->server().url() + "/whatsapp"};
  // w2's id is over the bot's limit: refused when it is handed over.
  auto body = wa_payload("[" + wa_text("w1", "346", "uno") + ","
                         + wa_text("w2-" + std::string(40, 'x'), "346", "dos")
                         + "]");
  auto answer = post.post_later(body);
  REQUIRE(test::eventually([&] {
    std::lock_guard guard{backend->mtx};
    return backend->held.size() == 1; // w1's write; w2 waits for it
  }));
  // w1's write fails for good on this thread; its report hands w2 over
  // here. Before, w2's refusal ran the listener on this (the backend's)
  // thread, inside the failed write's completion.
  backend->fail_held = true;
  backend->open();
  // Neither is worth Meta's retry: a damaged record, a message over limits.
  CHECK(answer.get() == 200);
  REQUIRE(test::eventually([&] {
    std::lock_guard guard{mtx};
    return errors.size() == 2;
  }));
  bot.stop();
  std::lock_guard guard{mtx};
  std::vector<botmesh::errc> codes;
  for (auto& [code, thread] : errors) {
    codes.push_back(code);
    CHECK(thread != std::this_thread::get_id());
  }
  std::sort(codes.begin(), codes.end());
  auto want = std::vector<botmesh::errc>{botmesh::errc::corrupted_record,
                                         botmesh::errc::invalid_argument};
  std::sort(want.begin(), want.end());
  CHECK(codes == want);
  CHECK(bot.stats().handled == 0);
}

TEST_CASE("with durability a WhatsApp chat's message found a duplicate by the "
          "journal does not let the next one overtake the one before") {
  auto api = fake_graph();
  auto o = wa_options(*api);
  o.dedup_window = 1; // the provider forgets b1 after one more id
  auto p = std::make_shared<meta::webhook_provider>(o);
  auto backend = std::make_shared<test::gated_backend>();
  backend->open();
  durable_texts_bot b{p, backend};
  signed_poster post{p->server().url() + "/whatsapp"};
  CHECK(post.post(wa_payload("[" + wa_text("b1", "346", "antes") + "]")).status
        == 200);
  // (Two chats: handled in parallel, so one after the other here.)
  REQUIRE(test::eventually([&] { return b.bot.stats().handled == 1; }));
  CHECK(post.post(wa_payload("[" + wa_text("x1", "999", "otro") + "]")).status
        == 200);
  REQUIRE(test::eventually([&] { return b.bot.stats().handled == 2; }));
  backend->close(); // a1's write waits; b1 and c1 wait for it
  auto body = wa_payload("[" + wa_text("a1", "346", "uno") + ","
                         + wa_text("b1", "346", "antes") + ","
                         + wa_text("c1", "346", "dos") + "]");
  auto answer = post.post_later(body);
  REQUIRE(test::eventually([&] {
    std::lock_guard guard{backend->mtx};
    return backend->held.size() == 1;
  }));
  // a1 lands; its acceptance hands b1 over, a duplicate for the journal,
  // whose acceptance hands c1 over, which lands at once. Before, c1 went
  // to its chat when b1's report ended, ahead of a1.
  backend->open();
  CHECK(answer.get() == 200);
  REQUIRE(test::eventually([&] { return b.bot.stats().handled == 4; }));
  b.bot.stop();
  CHECK(b.texts() == std::vector<std::string>{"antes", "otro", "uno", "dos"});
}

TEST_CASE("a WhatsApp provider stopped while a POST's chat is being handed "
          "over forgets the rest of the chat: Meta's retry brings it after "
          "a restart, in order") {
  auto api = fake_graph();
  auto p =
    std::make_shared<meta::webhook_provider>(wa_options_quick_stop(*api));
  holding_host host;
  p->start(host);
  auto url = p->server().url() + "/whatsapp";
  std::string items;
  for (int i = 0; i < 5; ++i)
    items += (i ? "," : "")
             + wa_text("s" + std::to_string(i), "346", "t" + std::to_string(i));
  auto body = wa_payload("[" + items + "]");
  signed_poster post{url};
  auto first = post.post_later(body);
  REQUIRE(host.accept_when_delivered(0, botmesh::errc::none));
  REQUIRE(host.accept_when_delivered(1, botmesh::errc::none));
  // s2 is handed over and waits for its acceptance; s3 and s4 behind it.
  REQUIRE(test::eventually([&] { return host.delivered() == 3; }));
  p->stop();
  // s2's acceptance comes after the stop: the loop finds the provider
  // stopped and forgets s3 and s4 instead of handing them to a host that
  // is gone.
  host.accept(2, botmesh::errc::none);
  // Its answer comes after the stop closed the POST's connection (the
  // server waits for it only `shutdown_timeout`): Meta retries.
  CHECK_THROWS(first.get());
  CHECK(host.delivered() == 3);
  p->start(host);
  signed_poster again{url};
  auto second = again.post_later(body);
  // What came before the stop is not handed over again; s3 and s4 are, in
  // order.
  REQUIRE(host.accept_when_delivered(3, botmesh::errc::none));
  REQUIRE(host.accept_when_delivered(4, botmesh::errc::none));
  CHECK(second.get() == 200);
  p->stop();
  std::lock_guard guard{host.mtx};
  CHECK(host.ids
        == std::vector<std::string>{"s0", "s1", "s2", "s3", "s4"});
  CHECK(p->stats().duplicates == 3);
}

TEST_CASE("a WhatsApp provider stopped and started again (a leadership lost "
          "and won back) listens again, on the same port") {
  auto api = fake_graph();
  auto p = std::make_shared<meta::webhook_provider>(wa_options(*api));
  throwing_host host;
  p->start(host);
  auto url = p->server().url() + "/whatsapp";
  signed_poster post{url};
  CHECK(post.post(wa_payload("[" + wa_text("w1", "346", "uno") + "]")).status
        == 200);
  p->stop();
  CHECK(p->state() == botmesh::provider_state::closed);
  p->start(host);
  CHECK(p->state() == botmesh::provider_state::open);
  CHECK(p->server().url() + "/whatsapp" == url);
  signed_poster again{url};
  CHECK(again.post(wa_payload("[" + wa_text("w2", "346", "dos") + "]")).status
        == 200);
  p->stop();
  p->start(host); // and once more: a restart leaves nothing behind
  signed_poster third{url};
  CHECK(third.post(wa_payload("[" + wa_text("w3", "346", "tres") + "]")).status
        == 200);
  p->stop();
  std::lock_guard guard{host.mtx};
  CHECK(host.ids == std::vector<std::string>{"w1", "w2", "w3"});
}

TEST_CASE("a WhatsApp payload of 2 MiB (Meta sends up to 3 MB) is taken "
          "with the default options") {
  auto api = fake_graph();
  auto p = std::make_shared<meta::webhook_provider>(wa_options(*api));
  holding_host host;
  p->start(host);
  signed_poster post{p->server().url() + "/whatsapp"};
  std::string texts;
  for (int i = 0; i < 512; ++i)
    texts += (i ? "," : "") + wa_text("w" + std::to_string(i), "346",
                                      std::string(4100, 'a'));
  auto body = wa_payload("[" + texts + "]");
  REQUIRE(body.size() > 2 * 1024 * 1024);
  auto answer = post.post_later(body);
  // One chat's: each is handed over once the one before was accepted.
  for (std::size_t i = 0; i < 512; ++i)
    REQUIRE(host.accept_when_delivered(i, botmesh::errc::none));
  CHECK(answer.get() == 200);
  CHECK(host.delivered() == 512);
  p->stop();
}

TEST_CASE("a WhatsApp chat's messages accepted on the thread that hands "
          "them over follow one another without growing the stack") {
  auto api = fake_graph();
  auto o = wa_options(*api);
  o.listen.max_body_bytes = 16 * 1024 * 1024;
  auto p = std::make_shared<meta::webhook_provider>(o);
  // The first message's acceptance comes later (a journal write), once the
  // POST queued the chat's others; each of those is accepted at once,
  // inside deliver (a bot that needs no write).
  inline_host host;
  p->start(host);
  signed_poster post{p->server().url() + "/whatsapp"};
  constexpr int n = 60000;
  std::string texts;
  for (int i = 0; i < n; ++i)
    texts += (i ? "," : "") + wa_text("w" + std::to_string(i), "346", "a");
  auto answer = post.post_later(wa_payload("[" + texts + "]"));
  REQUIRE(test::eventually([&] { return host.delivered() == 1; }));
  // Until the POST's loop is done, only the first is handed over (the
  // others wait for it); then its acceptance hands the rest over here.
  std::this_thread::sleep_for(200ms);
  CHECK(host.delivered() == 1);
  std::thread releaser{[&] { host.first.accepted(botmesh::errc::none); }};
  releaser.join();
  CHECK(answer.get() == 200);
  REQUIRE(host.delivered() == n);
  std::lock_guard guard{host.mtx};
  for (int i = 0; i < n; ++i)
    if (host.ids[i] != "w" + std::to_string(i)) {
      FAIL_CHECK("message " << i << " came as " << host.ids[i]);
      break;
    }
  p->stop();
}

TEST_CASE("a WhatsApp chat's message refused inline while its chain is "
          "handed over forgets the rest: the POST is answered 503") {
  auto api = fake_graph();
  auto p = std::make_shared<meta::webhook_provider>(wa_options(*api));
  // The first acceptance comes later; then w1 is accepted inline and w2
  // refused inline (its journal write failed).
  inline_host host;
  host.refuse_at = 3;
  p->start(host);
  signed_poster post{p->server().url() + "/whatsapp"};
  std::string texts;
  for (int i = 0; i < 5; ++i)
    texts += (i ? "," : "") + wa_text("w" + std::to_string(i), "346", "a");
  auto answer = post.post_later(wa_payload("[" + texts + "]"));
  REQUIRE(test::eventually([&] { return host.delivered() == 1; }));
  std::this_thread::sleep_for(100ms); // the POST queues the chat's others
  host.first.accepted(botmesh::errc::none);
  CHECK(answer.get() == 503);
  {
    std::lock_guard guard{host.mtx};
    // w3 and w4 were never handed over: Meta's retry brings them, after w2.
    CHECK(host.ids == std::vector<std::string>{"w0", "w1", "w2"});
  }
  // The retry: w0 and w1 are duplicates; w2 on are handed over again.
  signed_poster again{p->server().url() + "/whatsapp"};
  auto retry = again.post_later(wa_payload("[" + texts + "]"));
  CHECK(retry.get() == 200);
  std::lock_guard guard{host.mtx};
  CHECK(host.ids
        == std::vector<std::string>{"w0", "w1", "w2", "w2", "w3", "w4"});
  p->stop();
}

TEST_CASE("a WhatsApp message whose acceptance is still coming when the "
          "provider stops gets that acceptance's answer on its redelivery "
          "after a restart") {
  auto api = fake_graph();
  auto p =
    std::make_shared<meta::webhook_provider>(wa_options_quick_stop(*api));
  holding_host host;
  p->start(host);
  auto url = p->server().url() + "/whatsapp";
  auto m1 = wa_payload("[" + wa_text("w1", "346", "uno") + "]");
  signed_poster post{url};
  auto first = std::async(std::launch::async, [&] {
    try {
      return post.post(m1).status;
    } catch (const botmesh::error&) {
      return 0; // closed unanswered by the stop
    }
  });
  REQUIRE(test::eventually([&] { return host.delivered() == 1; }));
  p->stop();
  CHECK(first.get() != 200);
  p->start(host);
  signed_poster again{url};
  auto second = again.post_later(m1);
  REQUIRE(test::eventually([&] { return p->stats().duplicates == 1; }));
  // It waits for w1's acceptance, which fails: Meta must deliver it again.
  CHECK(second.wait_for(100ms) == std::future_status::timeout);
  host.accept(0, botmesh::errc::store_error);
  CHECK(second.get() == 503);
  auto third = again.post_later(m1);
  REQUIRE(host.accept_when_delivered(1, botmesh::errc::none));
  CHECK(third.get() == 200);
  p->stop();
}

TEST_CASE("a Graph API rate limit is waited out and retried in order, a "
          "permission error becomes forbidden") {
  auto api = fake_graph();
  api->script("PHONE1/messages", 400,
              R"({"error":{"message":"(#130429) Rate limit hit","type":"OAuthException","code":130429}})");
  auto p = std::make_shared<meta::webhook_provider>(wa_options(*api));
  botmesh::bot bot{{.provider = p}};
  bot.on_message([](botmesh::context& c) { c.reply(c.text()); });
  bot.start();
  signed_poster post{p->server().url() + "/whatsapp"};
  REQUIRE(post.post(wa_payload("[" + wa_text("w1", "346", "1") + "," + wa_text("w2", "346", "2") + "]"))
            .status
          == 200);
  REQUIRE(api->wait_for_calls("PHONE1/messages", 3));
  auto calls = api->calls("PHONE1/messages");
  CHECK(calls[1].body.find(R"("body":"1")") != std::string::npos);
  CHECK(calls[2].body.find(R"("body":"2")") != std::string::npos);
  CHECK(p->stats().retried == 1);
  try {
    meta::internal::check_graph_answer(403, R"({"error":{"message":"no permission","code":10}})");
    FAIL("expected forbidden");
  } catch (const botmesh::platform_error& e) {
    CHECK(e.code() == botmesh::errc::forbidden);
  }
  // A 2xx that is no Graph answer (a proxy's page, a body cut short, an
  // error object) is no delivery.
  for (std::string body : {"<html>login</html>", R"({"messages":[{"id")", "",
                           R"({"error":{"message":"down","code":2}})"}) {
    CAPTURE(body);
    try {
      meta::internal::check_graph_answer(200, body);
      FAIL("expected an error");
    } catch (const botmesh::platform_error& e) {
      CHECK(e.code() == botmesh::errc::provider_error);
      CHECK(e.http_status() == 200);
    }
  }
  CHECK(meta::internal::check_graph_answer(200, R"({"message_id":"m.1"})")
        == R"({"message_id":"m.1"})");
}

TEST_CASE("a WhatsApp pair rate limit holds back that user's chat for 6 "
          "seconds while other chats go on") {
  auto api = fake_graph();
  api->script("PHONE1/messages", 400,
              R"({"error":{"message":"(#131056) (Business Account, Consumer Account) pair rate limit hit","type":"OAuthException","code":131056}})");
  auto p = std::make_shared<meta::webhook_provider>(wa_options(*api));
  botmesh::bot bot{{.provider = p}};
  bot.on_message([](botmesh::context& c) { c.reply(c.text()); });
  bot.start();
  signed_poster post{p->server().url() + "/whatsapp"};
  REQUIRE(post.post(wa_payload("[" + wa_text("w1", "346", "uno") + "]")).status
          == 200);
  REQUIRE(api->wait_for_calls("PHONE1/messages", 1));
  auto refused_at = std::chrono::steady_clock::now();
  REQUIRE(post.post(wa_payload("[" + wa_text("w2", "347", "otro") + "]")).status
          == 200);
  // The other user's reply goes out within the first user's pause (6 s), so
  // well before it ends; a pause of every chat would hold it until then.
  REQUIRE(api->wait_for_calls("PHONE1/messages", 2, std::chrono::seconds(4)));
  auto calls = api->calls("PHONE1/messages");
  CHECK(calls[1].body.find(R"("to":"347")") != std::string::npos);
  CHECK(calls[1].body.find(R"("body":"otro")") != std::string::npos);
  // The first user's reply is sent again once the pause is over: not
  // before 6 s (a pause of every chat for 1 s sent both at about 1 s).
  REQUIRE(api->wait_for_calls("PHONE1/messages", 3));
  CHECK(std::chrono::steady_clock::now() - refused_at >= 5500ms);
  calls = api->calls("PHONE1/messages");
  CHECK(calls[2].body.find(R"("to":"346")") != std::string::npos);
  CHECK(calls[2].body.find(R"("body":"uno")") != std::string::npos);
  CHECK(p->stats().retried == 1);
  CHECK(test::eventually([&] { return p->stats().sent == 2; }));
}

TEST_CASE("Graph API rate-limit codes ask for a wait, of the whole bot except "
          "WhatsApp's pair rate, which is one chat's") {
  auto answer = [](int status, std::int64_t code) {
    try {
      meta::internal::check_graph_answer(
        status, R"({"error":{"message":"m","code":)" + std::to_string(code) + "}}");
    } catch (const botmesh::platform_error& e) {
      return std::make_tuple(e.code(), e.wait_scope(), e.retry_after());
    }
    FAIL("no error thrown");
    return std::make_tuple(botmesh::errc::none, botmesh::platform_error::scope::bot,
                           std::chrono::milliseconds{0});
  };
  using scope = botmesh::platform_error::scope;
  for (std::int64_t code : {4, 17, 32, 613, 80001, 80007, 80014, 130429}) {
    CAPTURE(code);
    auto [kind, where, wait] = answer(400, code);
    CHECK(kind == botmesh::errc::retry_after);
    CHECK(where == scope::bot);
    CHECK(wait == 1s);
  }
  auto [kind, where, wait] = answer(400, 131056);
  CHECK(kind == botmesh::errc::retry_after);
  CHECK(where == scope::chat);
  CHECK(wait == 6s);
  CHECK(std::get<0>(answer(400, 100)) == botmesh::errc::bad_request);
  CHECK(std::get<0>(answer(400, 80015)) == botmesh::errc::bad_request);
  CHECK(std::get<0>(answer(500, 1)) == botmesh::errc::provider_error);
}

TEST_CASE("a payload read in place parses as the copying parser does") {
  std::string json = wa_payload("[" + wa_text("w1", "346", "hola") + "]", "[]");
  std::string padded = json;
  padded.reserve(json.size() + botmesh::http::request::body_padding);
  auto a = meta::internal::parse_payload(json, meta::platform::whatsapp, "whatsapp");
  auto b = meta::internal::parse_payload_in_place(padded, meta::platform::whatsapp,
                                                  "whatsapp");
  REQUIRE(a.messages.size() == 1);
  REQUIRE(b.messages.size() == 1);
  CHECK(b.messages[0].text == "hola");
  CHECK(b.messages[0].raw == a.messages[0].raw);
  CHECK(b.messages[0].chat == a.messages[0].chat);
}
