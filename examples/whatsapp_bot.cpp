// whatsapp_bot: answers every text message on WhatsApp (Cloud API).
//
// Configuration (environment):
//   WHATSAPP_TOKEN             Graph API access token (required)
//   WHATSAPP_APP_SECRET        app secret for X-Hub-Signature-256 (required)
//   WHATSAPP_VERIFY_TOKEN      the verify token set in the app's webhook (required)
//   WHATSAPP_PHONE_NUMBER_ID   sender; default: the number each message came to
//   GRAPH_API_URL              Graph API base URL (default https://graph.facebook.com)
//   PORT                       where GET|POST /whatsapp listens (default 8080)
//   LISTEN_ADDRESS             default 0.0.0.0
//   BOTMESH_*                  bot options (README: Configuration)
//
// GET /metrics, /healthz and /readyz are served on PORT too.
//
// SIGTERM or SIGINT: stops taking messages, drains what is queued, exits 0.

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <botmesh/providers/meta/meta_webhook.hpp>
#include <botmesh/runtime/botmesh.hpp>

#include "example_env.hpp"

using example::env;

int main() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::shared_ptr<botmesh::meta::webhook_provider> provider;
  try {
    botmesh::meta::webhook_options o;
    o.access_token = env("WHATSAPP_TOKEN");
    o.app_secret = env("WHATSAPP_APP_SECRET");
    o.verify_token = env("WHATSAPP_VERIFY_TOKEN");
    o.phone_number_id = env("WHATSAPP_PHONE_NUMBER_ID");
    o.api_url = env("GRAPH_API_URL", "https://graph.facebook.com");
    o.listen.address = env("LISTEN_ADDRESS", "0.0.0.0");
    o.listen.port = example::port_from_env();
    o.on_status = [](const botmesh::meta::status_event& s) {
      std::fprintf(stderr, "whatsapp_bot: %s %s\n", s.message_id.c_str(),
                   s.status.c_str());
    };
    provider = std::make_shared<botmesh::meta::webhook_provider>(o);
  } catch (const botmesh::invalid_argument_error& e) {
    std::fprintf(stderr, "whatsapp_bot: %s (field %s)\n", e.what(), e.field().c_str());
    return 2;
  }

  botmesh::bot_options opts;
  try {
    opts = botmesh::bot_options::from_env();
  } catch (const botmesh::invalid_argument_error& e) {
    std::fprintf(stderr, "whatsapp_bot: %s\n", e.what());
    return 2;
  }
  opts.provider = provider;
  auto made = example::make_bot("whatsapp_bot", std::move(opts));
  if (!made)
    return 2;
  auto& bot = *made;
  bot.on_message([](botmesh::context& c) {
    if (c.message().type == botmesh::message_type::text)
      c.reply("Dijiste: " + c.text());
  });
  // No error listener: the library logs every error event to stderr.
  botmesh::serve_observability(provider->server(), bot);
  std::thread waiter{[&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "whatsapp_bot: signal %d, draining\n", sig);
    bot.stop();
  }};
  try {
    bot.start();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "whatsapp_bot: %s\n", e.what());
    std::_Exit(1);
  }
  std::fprintf(stderr, "whatsapp_bot: listening on port %u\n",
               static_cast<unsigned>(provider->server().port()));
  auto rc = bot.run();
  waiter.join();
  return rc;
}
