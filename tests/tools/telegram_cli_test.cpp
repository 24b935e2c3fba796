// `botmesh telegram set-webhook | delete-webhook | webhook-info` against a
// fake Bot API on loopback.

#include <doctest/doctest.h>

#include "tools/process.hpp"
#include "unit/fake_platform.hpp"

namespace {

/// Runs the tool with the fake's token and URL in the environment (unless
/// `env` says otherwise).
test::run_result tool(test::fake_api& api, std::vector<std::string> args,
                      test::process::env_changes env = {}) {
  env.try_emplace("TELEGRAM_TOKEN", test::telegram_token);
  env.try_emplace("TELEGRAM_API_URL", api.url());
  env.try_emplace("WEBHOOK_SECRET", std::nullopt);
  args.insert(args.begin(), "telegram");
  return test::run(BOTMESH_TOOL, std::move(args), env);
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("botmesh telegram set-webhook sends the URL, secret and options "
          "to setWebhook") {
  auto api = test::fake_telegram();
  auto r = tool(*api, {"set-webhook", "--url", "https://bot.example/telegram",
                       "--secret", "s3cret_-X", "--max-connections", "10",
                       "--allowed-updates", "message,callback_query",
                       "--drop-pending-updates"});
  CHECK(r.rc == 0);
  CHECK(r.out == "webhook set: https://bot.example/telegram\n");
  CHECK(r.err == "");
  auto calls = api->calls("setWebhook");
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].body
        == R"({"url":"https://bot.example/telegram","secret_token":"s3cret_-X",)"
           R"("max_connections":10,"allowed_updates":["message","callback_query"],)"
           R"("drop_pending_updates":true})");
}

TEST_CASE("botmesh telegram takes the secret from WEBHOOK_SECRET and lets "
          "--token and --api-url override the environment") {
  auto api = test::fake_telegram();
  auto r = tool(*api,
                {"set-webhook", "--url", "https://bot.example/t", "--token",
                 test::telegram_token, "--api-url", api->url()},
                {{"TELEGRAM_TOKEN", "999:wrong"},
                 {"TELEGRAM_API_URL", "http://127.0.0.1:1"},
                 {"WEBHOOK_SECRET", "from_env"}});
  CHECK(r.rc == 0);
  auto calls = api->calls("setWebhook");
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].body
        == R"({"url":"https://bot.example/t","secret_token":"from_env","max_connections":40})");
}

TEST_CASE("botmesh telegram delete-webhook calls deleteWebhook, dropping "
          "pending updates when asked") {
  auto api = test::fake_telegram();
  auto r = tool(*api, {"delete-webhook"});
  CHECK(r.rc == 0);
  CHECK(r.out == "webhook deleted\n");
  r = tool(*api, {"delete-webhook", "--drop-pending-updates"});
  CHECK(r.rc == 0);
  auto calls = api->calls("deleteWebhook");
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].body == "{}");
  CHECK(calls[1].body == R"({"drop_pending_updates":true})");
}

TEST_CASE("botmesh telegram webhook-info prints getWebhookInfo's result as "
          "JSON") {
  auto api = test::fake_telegram();
  api->script("getWebhookInfo", 200,
              R"({"ok":true,"result":{"url":"https://bot.example/telegram",)"
              R"("has_custom_certificate":false,"pending_update_count":3}})");
  auto r = tool(*api, {"webhook-info"});
  CHECK(r.rc == 0);
  CHECK(r.out
        == R"({"url":"https://bot.example/telegram","has_custom_certificate":false,)"
           R"("pending_update_count":3})"
           "\n");
}

TEST_CASE("botmesh telegram exits 1 with the Bot API's words when it refuses, "
          "and names the host when it cannot reach it") {
  auto api = test::fake_telegram();
  SUBCASE("a refused webhook") {
    api->script("setWebhook", 400,
                R"({"ok":false,"error_code":400,"description":)"
                R"("Bad Request: bad webhook: An HTTPS URL must be provided for webhook"})");
    auto r = tool(*api, {"set-webhook", "--url", "http://bot.example/t"});
    CHECK(r.rc == 1);
    CHECK(r.out == "");
    CHECK(r.err
          == "botmesh: telegram setWebhook: 400 Bad Request: bad webhook: An "
             "HTTPS URL must be provided for webhook\n");
  }
  SUBCASE("a wrong token") {
    api->script("getWebhookInfo", 401,
                R"({"ok":false,"error_code":401,"description":"Unauthorized"})");
    auto r = tool(*api, {"webhook-info"});
    CHECK(r.rc == 1);
    CHECK(r.err == "botmesh: telegram getWebhookInfo: 401 Unauthorized\n");
  }
  SUBCASE("no server") {
    auto r = tool(*api, {"delete-webhook"},
                  {{"TELEGRAM_API_URL", "http://127.0.0.1:1"}});
    CHECK(r.rc == 1);
    CHECK(contains(r.err, "botmesh: telegram delete-webhook: http "
                          "http://127.0.0.1:1: connect failed"));
    CHECK_FALSE(contains(r.err, test::telegram_token));
  }
}

TEST_CASE("botmesh telegram exits 2 on bad usage and sends nothing") {
  auto api = test::fake_telegram();
  struct bad {
    std::vector<std::string> args;
    test::process::env_changes env;
    std::string says;
  };
  std::vector<bad> cases{
    {{"set-webhook", "--url", "https://x.example/t"},
     {{"TELEGRAM_TOKEN", std::nullopt}},
     "botmesh: no bot token: pass --token or set TELEGRAM_TOKEN\n"},
    {{"set-webhook"}, {}, "botmesh: set-webhook needs --url\n"},
    {{"set-webhook", "--url", "https://x.example/t", "--secret", "has space"},
     {},
     "botmesh: telegram set_webhook: secret_token may only contain A-Z, a-z, "
     "0-9, _ and -\n"},
    {{"set-webhook", "--url", "https://x.example/t", "--secret",
      std::string(257, 'a')},
     {},
     "botmesh: telegram set_webhook: secret_token has 257 characters, at most "
     "256 are allowed\n"},
    {{"set-webhook", "--url", "bot.example/t"},
     {},
     "botmesh: URL \"bot.example/t\" does not start with http:// or "
     "https://\n"},
    {{"set-webhook", "--url", "https://x.example/t", "--max-connections", "0"},
     {},
     "botmesh: --max-connections must be a number from 1 to 100, got \"0\"\n"},
    {{"set-webhook", "--url"}, {}, "botmesh: --url needs a value\n"},
    {{"delete-webhook", "--url", "https://x.example/t"},
     {},
     "botmesh: --url is an option of set-webhook\n"},
    {{"webhook-info", "--drop-pending-updates"},
     {},
     "botmesh: --drop-pending-updates is an option of set-webhook and "
     "delete-webhook\n"},
    {{"webhook-info", "--verbose"}, {}, "botmesh: unknown option \"--verbose\"\n"},
    {{"get-me"}, {}, "botmesh: unknown telegram command \"get-me\"\n"},
    {{}, {}, "botmesh: missing telegram command\n"},
    {{"webhook-info", "--api-url", "ftp://x"},
     {},
     "botmesh: URL \"ftp://x\" does not start with http:// or https://\n"},
  };
  for (auto& c : cases) {
    CAPTURE(c.says);
    auto r = tool(*api, c.args, c.env);
    CHECK(r.rc == 2);
    CHECK(r.out == "");
    CHECK(r.err
          == c.says + "run 'botmesh telegram --help' for its options\n");
  }
  CHECK(api->calls().empty());
}

TEST_CASE("botmesh --help and botmesh telegram --help print the usage and "
          "exit 0") {
  auto top = test::run(BOTMESH_TOOL, {"--help"});
  CHECK(top.rc == 0);
  CHECK(contains(top.out, "telegram set-webhook"));
  for (auto args : std::vector<std::vector<std::string>>{
         {"telegram", "--help"}, {"telegram", "set-webhook", "--help"},
         {"telegram", "webhook-info", "-h"}}) {
    auto r = test::run(BOTMESH_TOOL, args, {{"TELEGRAM_TOKEN", std::nullopt}});
    CHECK(r.rc == 0);
    CHECK(r.err == "");
    CHECK(contains(r.out, "usage: botmesh telegram set-webhook --url URL"));
    CHECK(contains(r.out, "--api-url"));
  }
  auto none = test::run(BOTMESH_TOOL, {});
  CHECK(none.rc == 2);
  CHECK(contains(none.err, "botmesh: missing command\nusage: botmesh COMMAND"));
}
