// bench_durability: what durable processing costs a bot's turns, measured
// against the same bot without it in the same run:
//
//   bench plain_turns_per_s     turns/s of a bot on Redis (store and
//                               coordination), each turn one reply
//   bench durable_turns_per_s   the same with durability on the same Redis
//                               (journal write, outbox claim, confirm)
//   ratio durable_vs_plain_turns   median over the rounds of durable / plain
//                               (each round runs both, back to back)
//   bench handover_message_p50 us   a flow waiting on replica A is answered
//   bench handover_store_read_p50 us on replica B while A's turn holds: from
//                               the end of A's turn until B's step has the
//                               answer, with the checkpoint handed over
//                               with B's grant (handover messages), and
//                               with them off (B reads the store)
//   ratio handover_message_vs_store_read   median over interleaved rounds of
//                               the per-round ratio of the two p50s
//
// Each round sends `messages` messages over `chats` chats to a fresh bot
// and waits until every reply is out; rounds alternate plain and durable.
// Redis from REDIS_URL. Options: --rounds N (5), --messages N (4000),
// --chats N (200), --handoffs N (hand-offs per variant and round, 40),
// --only plain|durable (runs that variant's turns alone and stops: for
// profiling one side; prints no ratio).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
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

// Leaves nothing of a round behind.
void delete_prefix(botmesh::redis_client& client, const std::string& prefix) {
  auto keys = client.call({"KEYS", prefix + ":*"});
  for (auto& k : keys.elements)
    client.call({"DEL", k.str});
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
  delete_prefix(*client, prefix);
  return messages / secs;
}

// Two replicas on Redis (store and coordination, forwarded flows). A's turn
// for the answer "café" holds after its handlers ran until the benchmark
// opens it; B's message waits for that turn meanwhile, so B's turn is
// granted by A's release.
struct handover_pair {
  struct replica {
    std::shared_ptr<botmesh::redis_client> client;
    std::shared_ptr<botmesh::testing_provider> provider =
      std::make_shared<botmesh::testing_provider>();
    std::unique_ptr<botmesh::bot> bot;
  };

  std::string prefix = fresh_prefix();
  replica a, b;
  std::atomic<bool> held{false};
  std::atomic<bool> open{false};
  std::atomic<std::int64_t> released_at{0}; // ns, steady clock
  std::atomic<std::int64_t> resumed_at{0};

  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
             clk::now().time_since_epoch())
      .count();
  }

  handover_pair(const std::string& url, bool message) {
    for (auto* r : {&a, &b}) {
      r->client = std::make_shared<botmesh::redis_client>(
        botmesh::redis_options{.url = url});
      auto store = std::make_shared<botmesh::redis_store>(
        botmesh::redis_store_options{.client = r->client, .prefix = prefix});
      botmesh::coordination_options co;
      co.coordinator = store->coordinator(r == &a ? "a" : "b");
      co.handover.flows = botmesh::handover_flows::forward;
      co.handover.message = message;
      r->bot = std::make_unique<botmesh::bot>(botmesh::bot_options{
        .provider = r->provider, .store = store, .log_messages = false,
        .coordination = co});
      botmesh::flow f{"pedido"};
      f.hears({"pedido"})
        .ask("producto", "¿Producto?",
             [](botmesh::flow_context&, const botmesh::answer&) {})
        .ask("cantidad", "¿Cantidad?",
             [this](botmesh::flow_context&, const botmesh::answer&) {
               resumed_at.store(now_ns());
             });
      r->bot->add_flow(std::move(f));
    }
    a.bot->use([this](botmesh::context& c, const std::function<void()>& next) {
      next();
      if (c.text() != "café")
        return;
      held.store(true);
      while (!open.exchange(false))
        std::this_thread::yield();
      released_at.store(now_ns());
    });
    a.bot->start();
    b.bot->start();
  }

  ~handover_pair() {
    a.bot->stop();
    b.bot->stop();
    delete_prefix(*a.client, prefix);
  }

  // Polls with short sleeps: a busy loop here would take one of the two
  // cores from the threads whose hand-off is measured (both timestamps are
  // taken inside the bots, so the poll's own delay is not measured).
  static bool wait(const std::function<bool()>& fn) {
    auto until = clk::now() + std::chrono::seconds(10);
    while (!fn()) {
      if (clk::now() > until)
        return false;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return true;
  }

  // One hand-off on a fresh chat: microseconds from the end of A's turn
  // until B's step has the answer.
  double once(int i) {
    auto chat = "h" + std::to_string(i);
    auto sent_a = a.provider->sent().size();
    a.provider->inject(chat, "pedido");
    if (!a.provider->wait_for_sent(sent_a + 1, std::chrono::seconds(10)))
      fail("A did not ask");
    held.store(false);
    resumed_at.store(0);
    a.provider->inject(chat, "café");
    if (!wait([&] { return held.load(); }))
      fail("A's turn did not hold");
    b.provider->inject(chat, "3");
    // B's ticket reaches Redis in well under a millisecond.
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    open.store(true);
    if (!wait([&] { return resumed_at.load() != 0; }))
      fail("B did not resume the flow");
    return (resumed_at.load() - released_at.load()) / 1000.0;
  }

  [[noreturn]] static void fail(const char* what) {
    std::fprintf(stderr, "bench_durability: hand-off: %s\n", what);
    std::exit(1);
  }
};

} // namespace

int main(int argc, char** argv) {
  int rounds = 5, messages = 4000, chats = 200, handoffs = 40;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rounds"))
      rounds = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--messages"))
      messages = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--chats"))
      chats = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--handoffs"))
      handoffs = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--only"))
      only = argv[i + 1];
  }
  auto url = std::getenv("REDIS_URL");
  if (!url || !*url) {
    std::fprintf(stderr, "bench_durability: set REDIS_URL\n");
    return 2;
  }
  std::printf("bench_durability: %d rounds of %d messages over %d chats\n",
              rounds, messages, chats);
  if (only == "plain" || only == "durable") {
    for (int r = 0; r < rounds; ++r)
      std::printf("  round %d: %s %.0f turns/s\n", r, only.c_str(),
                  round_turns(url, only == "durable", messages, chats));
    return 0;
  }
  std::vector<double> plain, durable, turn_ratios;
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
    turn_ratios.push_back(durable.back() / plain.back());
    std::printf("  round %d: plain %.0f, durable %.0f turns/s\n", r,
                plain.back(), durable.back());
  }
  std::printf("bench plain_turns_per_s %.1f turns/s\n", median(plain));
  std::printf("bench durable_turns_per_s %.1f turns/s\n", median(durable));
  std::printf("ratio durable_vs_plain_turns %.3f\n", median(turn_ratios));

  // Hand-offs: both pairs live through all rounds; rounds alternate which
  // variant goes first.
  handover_pair with{url, true};
  handover_pair without{url, false};
  int next_chat = 0;
  auto p50 = [&](handover_pair& p) {
    std::vector<double> us;
    for (int i = 0; i < handoffs; ++i)
      us.push_back(p.once(next_chat++));
    return median(us);
  };
  p50(with); // warm-up
  p50(without);
  std::vector<double> msg, read, ratios;
  for (int r = 0; r < std::max(rounds, 5); ++r) {
    if (r % 2 == 0) {
      msg.push_back(p50(with));
      read.push_back(p50(without));
    } else {
      read.push_back(p50(without));
      msg.push_back(p50(with));
    }
    ratios.push_back(msg.back() / read.back());
    std::printf("  hand-off round %d: message %.0f us, store read %.0f us\n",
                r, msg.back(), read.back());
  }
  std::printf("bench handover_message_p50 %.1f us\n", median(msg));
  std::printf("bench handover_store_read_p50 %.1f us\n", median(read));
  std::printf("ratio handover_message_vs_store_read %.3f\n", median(ratios));
  return 0;
}
