// bench_durability: what durable processing costs a bot's turns, measured
// against the same bot without it in the same run:
//
//   bench plain_turns_per_s     turns/s of a bot on Redis (store and
//                               coordination), each turn one reply
//   bench durable_turns_per_s   the same with durability on the same Redis
//                               (journal write, outbox claim, confirm)
//   ratio durable_vs_plain_turns   median durable / median plain
//
// Each round sends `messages` messages over `chats` chats to a fresh bot
// and waits until every reply is out; rounds alternate plain and durable.
// Redis from REDIS_URL. Options: --rounds N (5), --messages N (4000),
// --chats N (200).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/stores/redis/redis_durable_backend.hpp>
#include <botmesh/stores/redis/redis_store.hpp>

using clk = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string fresh_prefix() {
  static std::mt19937_64 rng{std::random_device{}()};
  return "bmbench-dur-" + std::to_string(rng());
}

// Turns per second of one bot over `messages` messages.
double round_turns(const std::string& url, bool durable, int messages,
                   int chats) {
  auto prefix = fresh_prefix();
  auto client = std::make_shared<botmesh::redis_client>(
    botmesh::redis_options{.url = url});
  auto store = std::make_shared<botmesh::redis_store>(
    botmesh::redis_store_options{.client = client, .prefix = prefix});
  auto provider = std::make_shared<botmesh::testing_provider>();
  botmesh::coordination_options co;
  co.coordinator = store->coordinator("bench");
  std::optional<botmesh::durability_options> d;
  if (durable)
    d = botmesh::durability_options{
      .backend = std::make_shared<botmesh::redis_durable_backend>(
        botmesh::redis_durable_options{.client = client, .prefix = prefix}),
      .instance_id = "bench"};
  botmesh::bot bot{{.provider = provider, .store = store, .log_messages = false,
                    .coordination = co, .durability = d}};
  bot.on_message([](botmesh::context& c) { c.reply(c.text()); });
  bot.start();
  auto t0 = clk::now();
  for (int i = 0; i < messages; ++i) {
    botmesh::inbound_message m;
    m.chat = "c" + std::to_string(i % chats);
    m.sender = m.chat;
    m.id = "m" + std::to_string(i);
    m.text = "t";
    provider->inject(std::move(m));
  }
  if (!provider->wait_for_sent(static_cast<std::size_t>(messages),
                               std::chrono::minutes(5))) {
    std::fprintf(stderr, "bench_durability: replies missing (%zu of %d)\n",
                 provider->sent().size(), messages);
    std::exit(1);
  }
  auto secs = std::chrono::duration<double>(clk::now() - t0).count();
  bot.stop();
  // Leave nothing behind.
  auto keys = client->call({"KEYS", prefix + ":*"});
  for (auto& k : keys.elements)
    client->call({"DEL", k.str});
  return messages / secs;
}

} // namespace

int main(int argc, char** argv) {
  int rounds = 5, messages = 4000, chats = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rounds"))
      rounds = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--messages"))
      messages = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--chats"))
      chats = std::max(1, std::atoi(argv[i + 1]));
  }
  auto url = std::getenv("REDIS_URL");
  if (!url || !*url) {
    std::fprintf(stderr, "bench_durability: set REDIS_URL\n");
    return 2;
  }
  std::printf("bench_durability: %d rounds of %d messages over %d chats\n",
              rounds, messages, chats);
  std::vector<double> plain, durable;
  round_turns(url, false, messages / 4, chats); // warm-up
  for (int r = 0; r < rounds; ++r) {
    // Alternate which goes first, so a drift favours neither.
    if (r % 2 == 0) {
      plain.push_back(round_turns(url, false, messages, chats));
      durable.push_back(round_turns(url, true, messages, chats));
    } else {
      durable.push_back(round_turns(url, true, messages, chats));
      plain.push_back(round_turns(url, false, messages, chats));
    }
    std::printf("  round %d: plain %.0f, durable %.0f turns/s\n", r,
                plain.back(), durable.back());
  }
  std::printf("bench plain_turns_per_s %.1f turns/s\n", median(plain));
  std::printf("bench durable_turns_per_s %.1f turns/s\n", median(durable));
  std::printf("ratio durable_vs_plain_turns %.3f\n",
              median(durable) / median(plain));
  return 0;
}
