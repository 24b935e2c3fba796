// telegram_bot: answers every text message on Telegram.
//
// Configuration (environment):
//   TELEGRAM_TOKEN     the bot's token (required)
//   TELEGRAM_MODE      webhook (default) | polling
//   WEBHOOK_SECRET     the secret_token given to setWebhook (webhook mode; required)
//   TELEGRAM_API_URL   Bot API base URL (default https://api.telegram.org)
//   PORT               where POST /telegram listens (default 8080; 0: any
//                      free port, printed in the "ready" line)
//   LISTEN_ADDRESS     default 0.0.0.0
//
// SIGTERM or SIGINT: stops taking updates, drains what is queued, exits 0.

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <botmesh/providers/telegram/telegram_polling.hpp>
#include <botmesh/providers/telegram/telegram_webhook.hpp>
#include <botmesh/runtime/botmesh.hpp>

namespace {

std::string env(const char* name, const char* fallback = "") {
  auto* v = std::getenv(name);
  return v && *v ? v : fallback;
}

} // namespace

int main() {
  // Signals go to one thread that stops the bot (not a signal handler).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto token = env("TELEGRAM_TOKEN");
  if (token.empty()) {
    std::fprintf(stderr, "telegram_bot: TELEGRAM_TOKEN is required\n");
    return 2;
  }
  auto mode = env("TELEGRAM_MODE", "webhook");
  auto api_url = env("TELEGRAM_API_URL", "https://api.telegram.org");
  std::shared_ptr<botmesh::provider> provider;
  std::shared_ptr<botmesh::telegram::webhook_provider> webhook;
  try {
    if (mode == "polling") {
      botmesh::telegram::polling_options o;
      o.token = token;
      o.api_url = api_url;
      provider = std::make_shared<botmesh::telegram::polling_provider>(o);
    } else if (mode == "webhook") {
      botmesh::telegram::webhook_options o;
      o.token = token;
      o.api_url = api_url;
      o.secret_token = env("WEBHOOK_SECRET");
      o.listen.address = env("LISTEN_ADDRESS", "0.0.0.0");
      o.listen.port = static_cast<std::uint16_t>(std::atoi(env("PORT", "8080").c_str()));
      provider = webhook = std::make_shared<botmesh::telegram::webhook_provider>(o);
    } else {
      std::fprintf(stderr, "telegram_bot: TELEGRAM_MODE must be webhook or polling\n");
      return 2;
    }
  } catch (const botmesh::invalid_argument_error& e) {
    std::fprintf(stderr, "telegram_bot: %s (field %s)\n", e.what(), e.field().c_str());
    return 2;
  }

  botmesh::bot bot{{.provider = provider}};
  bot.on_message([](botmesh::context& c) {
    if (c.message().type == botmesh::message_type::text)
      c.reply("Dijiste: " + c.text());
  });
  bot.on<botmesh::events::error>([](const botmesh::events::error& e) {
    std::fprintf(stderr, "telegram_bot: %s\n", e.what.c_str());
  });
  std::thread waiter{[&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "telegram_bot: signal %d, draining\n", sig);
    bot.stop();
  }};
  try {
    bot.start();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "telegram_bot: %s\n", e.what());
    std::_Exit(1);
  }
  if (webhook)
    std::fprintf(stderr, "telegram_bot: webhook mode on port %u, ready\n",
                 static_cast<unsigned>(webhook->server().port()));
  else
    std::fprintf(stderr, "telegram_bot: polling mode, ready\n");
  auto rc = bot.run(); // until stop()
  waiter.join();
  return rc;
}
