// telegram_bot: answers every text message on Telegram.
//
// Configuration (environment):
//   TELEGRAM_TOKEN     the bot's token (required)
//   TELEGRAM_MODE      webhook (default) | polling
//   WEBHOOK_SECRET     the secret_token given to setWebhook (webhook mode; required)
//   TELEGRAM_API_URL   Bot API base URL (default https://api.telegram.org)
//   TELEGRAM_USERNAME  the bot's @name without '@': group commands for other
//                      bots are then left to them
//   PORT               where POST /telegram listens (default 8080; 0: any
//                      free port, printed in the "ready" line)
//   LISTEN_ADDRESS     default 0.0.0.0
//   REDIS_URL          when set (redis://host:6379), replicas share a Redis
//                      (Redis >= 7): store, coordination and durable
//                      processing; each replica names itself by HOSTNAME
//   BOTMESH_*          bot options (README: Configuration), e.g.
//                      BOTMESH_LOG_LEVEL=info, BOTMESH_STOP_TIMEOUT=30s
//
// GET /metrics, /healthz and /readyz are served on PORT in both modes (on
// the webhook's server, or on a listener of their own when polling).
//
// SIGTERM or SIGINT: stops taking updates, drains what is queued, exits 0.

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include <botmesh/providers/telegram/telegram_polling.hpp>
#include <botmesh/providers/telegram/telegram_webhook.hpp>
#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/stores/redis/redis_durable_backend.hpp>
#include <botmesh/stores/redis/redis_store.hpp>

#include "example_env.hpp"

using example::env;

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
      o.username = env("TELEGRAM_USERNAME");
      provider = std::make_shared<botmesh::telegram::polling_provider>(o);
    } else if (mode == "webhook") {
      botmesh::telegram::webhook_options o;
      o.token = token;
      o.api_url = api_url;
      o.username = env("TELEGRAM_USERNAME");
      o.secret_token = env("WEBHOOK_SECRET");
      o.listen.address = env("LISTEN_ADDRESS", "0.0.0.0");
      o.listen.port = example::port_from_env();
      provider = webhook = std::make_shared<botmesh::telegram::webhook_provider>(o);
    } else {
      std::fprintf(stderr, "telegram_bot: TELEGRAM_MODE must be webhook or polling\n");
      return 2;
    }
  } catch (const botmesh::invalid_argument_error& e) {
    std::fprintf(stderr, "telegram_bot: %s (field %s)\n", e.what(), e.field().c_str());
    return 2;
  }

  botmesh::bot_options opts;
  try {
    opts = botmesh::bot_options::from_env();
  } catch (const botmesh::invalid_argument_error& e) {
    std::fprintf(stderr, "telegram_bot: %s\n", e.what());
    return 2;
  }
  opts.provider = provider;
  if (auto url = env("REDIS_URL"); !url.empty()) try {
    // Several replicas behind one webhook URL (or one polling leader).
    auto replica = env("HOSTNAME");
    auto client = std::make_shared<botmesh::redis_client>(
      botmesh::redis_options{.url = url});
    auto store = std::make_shared<botmesh::redis_store>(
      botmesh::redis_store_options{.client = client, .prefix = "telegram_bot"});
    botmesh::coordination_options co =
      opts.coordination.value_or(botmesh::coordination_options{});
    co.coordinator = store->coordinator(replica);
    botmesh::durability_options du =
      opts.durability.value_or(botmesh::durability_options{});
    du.backend = std::make_shared<botmesh::redis_durable_backend>(
      botmesh::redis_durable_options{.client = client, .prefix = "telegram_bot"});
    if (du.instance_id.empty())
      du.instance_id = replica;
    opts.store = store;
    opts.coordination = std::move(co);
    opts.durability = std::move(du);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "telegram_bot: REDIS_URL: %s\n", e.what());
    return 2;
  }
  auto made = example::make_bot("telegram_bot", std::move(opts));
  if (!made)
    return 2;
  auto& bot = *made;
  // "/start ref-42" (a deep link t.me/<bot>?start=ref-42).
  bot.command("start", [](botmesh::context& c) {
    c.reply(c.payload().empty() ? std::string{"¡Hola!"}
                                : "¡Hola! Vienes de " + std::string{c.payload()});
  });
  bot.on_message([](botmesh::context& c) {
    if (c.message().type == botmesh::message_type::text)
      c.reply("Dijiste: " + c.text());
  });
  // No error listener: the library logs every error event to stderr.
  std::optional<botmesh::observability_server> probes;
  try {
    if (webhook) {
      botmesh::serve_observability(webhook->server(), bot);
    } else {
      probes.emplace(bot, botmesh::http::server_options{
                            .address = env("LISTEN_ADDRESS", "0.0.0.0"),
                            .port = example::port_from_env()});
    }
  } catch (const botmesh::invalid_argument_error& e) {
    std::fprintf(stderr, "telegram_bot: %s (field %s)\n", e.what(), e.field().c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "telegram_bot: %s\n", e.what());
    return 1;
  }
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
    std::fprintf(stderr, "telegram_bot: polling mode, probes on port %u, ready\n",
                 static_cast<unsigned>(probes->port()));
  auto rc = bot.run(); // until stop()
  waiter.join();
  return rc;
}
