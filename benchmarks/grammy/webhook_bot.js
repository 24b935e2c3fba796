// Reference bot for bench_webhook: the same load answered by grammY.
//
// A grammY bot served with webhookCallback on Node's http server, on a
// loopback port. Like botmesh's Telegram webhook provider it refuses a
// request without the right X-Telegram-Bot-Api-Secret-Token (401) and
// answers every text message in the webhook response (grammY's webhook
// reply: canUseWebhookReply lets sendMessage go into the HTTP response
// instead of a call to the Bot API).
//
//   node webhook_bot.js [--port P] [--secret S] [--path /telegram]
//                       [--api-root URL]
//
// Prints "ready <port>" on stdout once it listens. --port 0 (the default)
// takes a free port. The API root is never called while replies fit in
// the webhook response; the default points at a loopback port that
// nobody serves, so a call that escapes fails loudly (logged on stderr,
// answered 500).

"use strict";

const http = require("node:http");
const { Bot, webhookCallback } = require("grammy");

function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

const port = Number(arg("--port", "0"));
const secret = arg("--secret", "bench-secret");
const path = arg("--path", "/telegram");
const apiRoot = arg("--api-root", "http://127.0.0.1:9");

const bot = new Bot("1:bench", {
  // Known up front, so the bot never calls getMe.
  botInfo: {
    id: 1,
    is_bot: true,
    first_name: "bench",
    username: "bench_bot",
    can_join_groups: true,
    can_read_all_group_messages: false,
    supports_inline_queries: false,
    can_connect_to_business: false,
    has_main_web_app: false,
  },
  client: {
    apiRoot,
    // Webhook reply: the first sendMessage of an update is written into
    // the webhook's HTTP response instead of being sent to the Bot API.
    canUseWebhookReply: (method) => method === "sendMessage",
  },
});

bot.on("message:text", (ctx) => ctx.reply("ok"));

bot.catch((err) => {
  process.stderr.write(`grammy bot error: ${err.error ?? err}\n`);
});

const handle = webhookCallback(bot, "http", { secretToken: secret });

const server = http.createServer((req, res) => {
  if (req.method !== "POST" || req.url !== path) {
    res.writeHead(404).end();
    return;
  }
  handle(req, res).catch((err) => {
    process.stderr.write(`grammy webhook error: ${err}\n`);
    if (!res.headersSent)
      res.writeHead(500);
    res.end();
  });
});

server.listen(port, "127.0.0.1", () => {
  process.stdout.write(`ready ${server.address().port}\n`);
});

// Exit cleanly on a signal (bench_webhook sends SIGTERM when it is done).
for (const s of ["SIGINT", "SIGTERM"])
  process.on(s, () => process.exit(0));
