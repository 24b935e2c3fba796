// The whatsapp_bot example as a process against a fake Graph API on
// loopback: the GET verification, signed and unsigned POSTs, the reply, and
// SIGTERM.

#include <doctest/doctest.h>

#include <csignal>
#include <string>

#include <botmesh/providers/http/http_client.hpp>
#include <botmesh/providers/http/signature.hpp>

#include "tools/process.hpp"
#include "unit/fake_platform.hpp"

namespace {

constexpr const char* secret = "app-secret";

/// The port in whatsapp_bot's "listening on port N" line.
std::string listening_port(const std::string& err) {
  auto port = test::number_after(err, "listening on port ");
  REQUIRE_FALSE(port.empty());
  return port;
}

} // namespace

TEST_CASE("whatsapp_bot verifies its webhook, answers a signed text from the "
          "number it came to, refuses a bad signature, and exits 0 on "
          "SIGTERM") {
  test::fake_api api{"/v21.0/",
                     {"PHONE7/messages"},
                     R"({"messaging_product":"whatsapp","messages":[{"id":"wamid.out"}]})"};
  test::process bot{WHATSAPP_BOT,
                    {},
                    {{"WHATSAPP_TOKEN", "token"},
                     {"WHATSAPP_APP_SECRET", secret},
                     {"WHATSAPP_VERIFY_TOKEN", "verify-me"},
                     {"WHATSAPP_PHONE_NUMBER_ID", std::nullopt},
                     {"GRAPH_API_URL", api.url()},
                     {"REDIS_URL", std::nullopt},
                     {"LISTEN_ADDRESS", "127.0.0.1"},
                     {"PORT", "0"}}};
  REQUIRE(bot.wait_for_stderr("listening on port "));
  auto base = "http://127.0.0.1:" + listening_port(bot.err()) + "/whatsapp";
  botmesh::http::client client;
  auto get = [&](const std::string& query) {
    botmesh::http::client_request req;
    req.method = "GET";
    req.url = base + query;
    return client.request(req);
  };
  auto ok = get("?hub.mode=subscribe&hub.verify_token=verify-me&hub.challenge=1158201444");
  CHECK(ok.status == 200);
  CHECK(ok.body == "1158201444");
  CHECK(get("?hub.mode=subscribe&hub.verify_token=wrong&hub.challenge=1").status
        == 403);

  std::string body =
    R"({"object":"whatsapp_business_account","entry":[{"id":"1","changes":[{"field":"messages","value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"34600","phone_number_id":"PHONE7"},"messages":[{"from":"346","id":"wamid.1","timestamp":"1700000000","type":"text","text":{"body":"hola"}}]}}]}]})";
  auto post = [&](const std::string& signature) {
    botmesh::http::client_request req{.url = base, .body = body};
    req.headers.emplace_back("X-Hub-Signature-256", signature);
    return client.request(req).status;
  };
  CHECK(post("sha256=" + std::string(64, '0')) == 401);
  CHECK(post("sha256=" + botmesh::http::hmac_sha256_hex(secret, body)) == 200);
  REQUIRE(api.wait_for_calls("PHONE7/messages", 1));
  auto sent = api.calls("PHONE7/messages")[0].body;
  CHECK(sent.find(R"("to":"346")") != std::string::npos);
  CHECK(sent.find("Dijiste: hola") != std::string::npos);
  bot.signal(SIGTERM);
  REQUIRE(bot.wait_for_stderr("signal 15, draining"));
  CHECK(bot.wait() == 0);
  CHECK(api.calls("PHONE7/messages").size() == 1);
}

namespace {

// The bot's environment with `name` set to `value` (a value it refuses).
test::process::env_changes refused_env(const char* name, const char* value) {
  test::process::env_changes env{
    {"WHATSAPP_TOKEN", "token"},
    {"WHATSAPP_APP_SECRET", secret},
    {"WHATSAPP_VERIFY_TOKEN", "verify-me"},
    {"GRAPH_API_URL", "http://127.0.0.1:9"},
    {"REDIS_URL", std::nullopt},
    {"LISTEN_ADDRESS", "127.0.0.1"},
    {"PORT", "0"}};
  env[name] = value;
  return env;
}

} // namespace

TEST_CASE("whatsapp_bot refuses a PORT that is not a port, naming it, and "
          "exits 2") {
  for (const char* port : {"abc", "70000", "-1", "80x"}) {
    CAPTURE(port);
    test::process bot{WHATSAPP_BOT, {}, refused_env("PORT", port)};
    // (Accepted, it would listen and never exit: the wait is bounded.)
    REQUIRE(bot.wait_for_stderr("field PORT", std::chrono::seconds(10)));
    CHECK(bot.wait() == 2);
  }
}

TEST_CASE("whatsapp_bot refuses a coordination wait of zero, naming it, and "
          "exits 2") {
  test::process bot{WHATSAPP_BOT, {},
                    refused_env("BOTMESH_COORDINATION_TURN_WAIT", "0ms")};
  REQUIRE(bot.wait_for_stderr("coordination.turn_wait", std::chrono::seconds(10)));
  CHECK(bot.wait() == 2);
}
