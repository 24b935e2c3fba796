// botmesh telegram set-webhook | delete-webhook | webhook-info: the Bot API's
// webhook set-up through telegram::bot_api.

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <botmesh/providers/telegram/bot_api.hpp>
#include <botmesh/runtime/core/error.hpp>

#include "command.hpp"

namespace botmesh::tool {

const char* const telegram_usage =
  "usage: botmesh telegram set-webhook --url URL [--secret TOKEN]\n"
  "                        [--max-connections N] [--allowed-updates a,b,...]\n"
  "                        [--drop-pending-updates] [common options]\n"
  "       botmesh telegram delete-webhook [--drop-pending-updates] [common options]\n"
  "       botmesh telegram webhook-info [common options]\n"
  "  --url                   the public HTTPS URL Telegram posts updates to\n"
  "  --secret                sent back in X-Telegram-Bot-Api-Secret-Token\n"
  "                          (1-256 of A-Z a-z 0-9 _ -; default: $WEBHOOK_SECRET)\n"
  "  --max-connections       parallel connections Telegram may open (1-100, 40)\n"
  "  --allowed-updates       update kinds to receive (default: Telegram's)\n"
  "  --drop-pending-updates  discard the updates waiting for delivery\n"
  "common options:\n"
  "  --token                 the bot's token (default: $TELEGRAM_TOKEN)\n"
  "  --api-url               the Bot API's base URL (default: $TELEGRAM_API_URL,\n"
  "                          else https://api.telegram.org)\n"
  "webhook-info prints Telegram's getWebhookInfo result as JSON.\n"
  "Exit codes: 0 done, 1 the Bot API refused the request or could not be\n"
  "reached (its answer is printed), 2 bad usage (nothing was sent).\n";

namespace {

std::string from_env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string{v} : std::string{};
}

std::vector<std::string> split_commas(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    auto comma = s.find(',');
    auto part = s.substr(0, comma);
    if (part.empty())
      throw usage_error("--allowed-updates has an empty item");
    out.emplace_back(part);
    if (comma == std::string_view::npos)
      break;
    s.remove_prefix(comma + 1);
    if (s.empty())
      throw usage_error("--allowed-updates has an empty item");
  }
  return out;
}

} // namespace

int telegram(const args& all) {
  if (all.empty())
    throw usage_error("missing telegram command");
  auto cmd = all[0];
  if (cmd != "set-webhook" && cmd != "delete-webhook" && cmd != "webhook-info")
    throw usage_error("unknown telegram command \"" + std::string{cmd} + "\"");
  telegram::bot_api_options api;
  api.token = from_env("TELEGRAM_TOKEN");
  if (auto url = from_env("TELEGRAM_API_URL"); !url.empty())
    api.api_url = url;
  telegram::webhook_settings hook;
  hook.secret_token = from_env("WEBHOOK_SECRET");
  bool drop_pending = false;
  for (std::size_t i = 1; i < all.size(); ++i) {
    auto a = all[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= all.size())
        throw usage_error(std::string{a} + " needs a value");
      return std::string{all[++i]};
    };
    auto only_for_set = [&] {
      if (cmd != "set-webhook")
        throw usage_error(std::string{a} + " is an option of set-webhook");
    };
    if (a == "--token") {
      api.token = value();
    } else if (a == "--api-url") {
      api.api_url = value();
    } else if (a == "--url") {
      only_for_set();
      hook.url = value();
    } else if (a == "--secret") {
      only_for_set();
      hook.secret_token = value();
    } else if (a == "--max-connections") {
      only_for_set();
      auto v = value();
      char* end = nullptr;
      auto n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 1 || n > 100)
        throw usage_error("--max-connections must be a number from 1 to 100, "
                          "got \"" + v + "\"");
      hook.max_connections = static_cast<int>(n);
    } else if (a == "--allowed-updates") {
      only_for_set();
      hook.allowed_updates = split_commas(value());
    } else if (a == "--drop-pending-updates") {
      if (cmd == "webhook-info")
        throw usage_error("--drop-pending-updates is an option of set-webhook "
                          "and delete-webhook");
      drop_pending = true;
    } else {
      throw usage_error("unknown option \"" + std::string{a} + "\"");
    }
  }
  if (api.token.empty())
    throw usage_error("no bot token: pass --token or set TELEGRAM_TOKEN");
  if (cmd == "set-webhook" && hook.url.empty())
    throw usage_error("set-webhook needs --url");
  hook.drop_pending_updates = drop_pending;
  // Arguments the library rejects before sending anything are bad usage.
  std::optional<telegram::bot_api> bot;
  try {
    bot.emplace(api);
    if (cmd == "set-webhook")
      telegram::validate(hook);
  } catch (const invalid_argument_error& e) {
    throw usage_error(e.what());
  }
  try {
    if (cmd == "set-webhook") {
      bot->set_webhook(hook);
      std::printf("webhook set: %s\n", hook.url.c_str());
    } else if (cmd == "delete-webhook") {
      bot->delete_webhook(drop_pending);
      std::printf("webhook deleted\n");
    } else {
      std::printf("%s\n", bot->webhook_info().c_str());
    }
  } catch (const platform_error&) {
    throw; // "telegram setWebhook: 400 Bad Request: ..." says it all
  } catch (const error& e) {
    // The transport's message names the host, never the token.
    throw error(e.code(), "telegram " + std::string{cmd} + ": " + e.what());
  }
  return exit_ok;
}

} // namespace botmesh::tool
