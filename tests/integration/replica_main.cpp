// A bot replica for multi-process tests: a bot on a Redis store with its
// Redis coordinator and a testing provider.
//
//   botmesh_test_replica <redis-url> <prefix> <replica-id> <lease-ms> [durable]
//
// With "durable", durable processing on the same Redis (journal + outbox).
//
// stdin:  "inject <chat> <text>" or "inject-id <chat> <platform id> <text>"
//         per line.
// stdout: "ready", "start <chat> <text>" when a handler begins,
//         "sent <chat> <text>", "error <code> <what>", "lost <key> <reason>",
//         and for inject-id "accepted <id>" (journaled, with durability)
//         and "duplicate <id>".
// A text "sleep:<ms>" makes the handler block that long (holding the turn)
// before it answers; "sendsleep:<ms>" answers first, then blocks.

#include <cstdio>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/stores/redis/redis_durable_backend.hpp>
#include <botmesh/stores/redis/redis_store.hpp>

namespace {

std::mutex out_mtx;

void say(const std::string& line) {
  std::lock_guard guard{out_mtx};
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 5 && !(argc == 6 && std::string{argv[5]} == "durable")) {
    std::fprintf(stderr,
                 "usage: botmesh_test_replica URL PREFIX ID LEASE_MS [durable]\n");
    return 2;
  }
  std::string id = argv[3];
  auto client = std::make_shared<botmesh::redis_client>(
    botmesh::redis_options{.url = argv[1]});
  auto store = std::make_shared<botmesh::redis_store>(
    botmesh::redis_store_options{.client = client, .prefix = argv[2]});
  auto provider = std::make_shared<botmesh::testing_provider>();
  botmesh::coordination_options co;
  co.coordinator = store->coordinator(id, std::chrono::milliseconds(std::atoi(argv[4])));
  co.turn_wait = "20s";
  std::optional<botmesh::durability_options> durability;
  if (argc == 6)
    durability = botmesh::durability_options{
      .backend = std::make_shared<botmesh::redis_durable_backend>(
        botmesh::redis_durable_options{.client = client, .prefix = argv[2]}),
      .instance_id = id};
  botmesh::bot bot{{.provider = provider, .store = store, .coordination = co,
                    .durability = durability}};
  bot.on_message([&](botmesh::context& c) {
    say("start " + c.message().chat + " " + c.text());
    if (c.text().rfind("sendsleep:", 0) == 0) {
      c.reply(id + " " + c.text());
      std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(c.text().substr(10))));
      return;
    }
    if (c.text().rfind("sleep:", 0) == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(c.text().substr(6))));
    c.reply(id + " " + c.text());
  });
  bot.on<botmesh::events::message_out>([](const botmesh::events::message_out& e) {
    say("sent " + e.message.chat + " " + e.message.text);
  });
  bot.on<botmesh::events::error>([](const botmesh::events::error& e) {
    say("error " + std::string{botmesh::to_string(e.code)} + " " + e.what);
  });
  bot.on<botmesh::events::lease_lost>([](const botmesh::events::lease_lost& e) {
    say("lost " + e.key + " " + e.reason);
  });
  bot.start();
  say("ready");
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.rfind("inject-id ", 0) == 0) {
      std::istringstream in{line.substr(10)};
      botmesh::inbound_message m;
      in >> m.chat >> m.id;
      std::getline(in >> std::ws, m.text);
      m.sender = m.chat;
      auto mid = m.id;
      provider->inject(std::move(m),
                       {.accepted = [mid](botmesh::errc e) {
                          if (e == botmesh::errc::none)
                            say("accepted " + mid);
                        },
                        .turn_ended = [mid](botmesh::turn_outcome o) {
                          if (o == botmesh::turn_outcome::duplicate)
                            say("duplicate " + mid);
                        }});
      continue;
    }
    if (line.rfind("inject ", 0) != 0)
      continue;
    auto rest = line.substr(7);
    auto sp = rest.find(' ');
    provider->inject(rest.substr(0, sp), rest.substr(sp + 1));
  }
  bot.stop();
  return 0;
}
