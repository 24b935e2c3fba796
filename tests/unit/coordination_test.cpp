#include <doctest/doctest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <latch>
#include <mutex>

#include <nlohmann/json.hpp>

#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/stores/forwarding_coordinator.hpp>
#include <botmesh/stores/memory_coordinator.hpp>

#include "test_util.hpp"

using namespace std::chrono_literals;

namespace {

struct replica {
  std::shared_ptr<botmesh::testing_provider> provider =
    std::make_shared<botmesh::testing_provider>();
  std::shared_ptr<botmesh::memory_coordinator> coord;
  std::unique_ptr<botmesh::bot> bot;
  test::error_log errors;

  // `wrap` puts a watching coordinator around the hub's.
  replica(botmesh::memory_coordination_hub& hub,
          std::shared_ptr<botmesh::store> store, std::string id,
          botmesh::coordination_options co = {},
          botmesh::duration lease = "15s",
          std::function<std::shared_ptr<botmesh::coordinator>(
            std::shared_ptr<botmesh::coordinator>)> wrap = {}) {
    coord = std::make_shared<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = std::move(id),
                                               .lease = lease});
    co.coordinator = wrap ? wrap(coord) : coord;
    bot = std::make_unique<botmesh::bot>(botmesh::bot_options{
      .provider = provider, .store = std::move(store), .coordination = co});
    errors.attach(*bot);
  }

  // The bot goes first: its threads may still report into `errors`.
  ~replica() {
    bot.reset();
  }
};

// Counts the enters answered (granted or queued behind a holder).
class ticket_counter final : public botmesh::forwarding_coordinator {
 public:
  using forwarding_coordinator::forwarding_coordinator;
  std::atomic<int> entered{0};
  void enter(std::string_view key, std::uint64_t req, bool retry,
             completion<botmesh::turn_state> done) override {
    c_->enter(key, req, retry,
              [this, done = std::move(done)](botmesh::turn_state s,
                                             std::exception_ptr e) {
                if (!e)
                  ++entered;
                done(std::move(s), e);
              });
  }
};

std::vector<std::string> texts(const botmesh::testing_provider& p) {
  std::vector<std::string> out;
  for (auto& m : p.sent())
    out.push_back(m.text);
  return out;
}

botmesh::flow order_flow() {
  botmesh::flow f{"pedido"};
  f.hears({"pedido"})
    .ask("producto", "¿Producto?",
         [](botmesh::flow_context& c, const botmesh::answer& a) {
           c.state()["producto"] = a.text();
         })
    .ask("cantidad", "¿Cantidad?",
         [](botmesh::flow_context& c, const botmesh::answer& a) {
           c.send(a.text() + " x " + c.state()["producto"].get<std::string>());
         })
    .persistent();
  return f;
}

} // namespace

TEST_CASE("three replicas on one hub never run a chat's handlers at once and "
          "keep each replica's order") {
  botmesh::memory_coordination_hub hub;
  auto store = std::make_shared<botmesh::memory_store>();
  std::atomic<int> in_flight{0};
  std::atomic<int> overlaps{0};
  std::mutex mtx;
  std::map<std::string, std::vector<int>> seen; // per replica
  replica a{hub, store, "a"};
  replica b{hub, store, "b"};
  replica c{hub, store, "c"};
  auto handler = [&](std::string who) {
    return [&, who](botmesh::context& ctx) {
      if (in_flight.fetch_add(1) != 0)
        ++overlaps;
      std::this_thread::sleep_for(200us);
      {
        std::lock_guard guard{mtx};
        seen[who].push_back(std::stoi(ctx.text()));
      }
      in_flight.fetch_sub(1);
    };
  };
  std::vector<replica*> all{&a, &b, &c};
  std::vector<std::string> names{"a", "b", "c"};
  for (size_t i = 0; i < all.size(); ++i) {
    all[i]->bot->on_message(handler(names[i]));
    all[i]->bot->start();
  }
  std::vector<std::thread> injectors;
  for (size_t i = 0; i < all.size(); ++i)
    injectors.emplace_back([&, i] {
      for (int n = 0; n < 40; ++n)
        all[i]->provider->inject("x", std::to_string(static_cast<int>(i) * 100 + n));
    });
  for (auto& t : injectors)
    t.join();
  REQUIRE(test::eventually([&] {
    return a.bot->stats().handled + b.bot->stats().handled
             + c.bot->stats().handled
           == 120;
  }));
  CHECK(overlaps.load() == 0);
  for (auto& n : names) {
    CAPTURE(n);
    CHECK(seen[n].size() == 40);
    CHECK(std::is_sorted(seen[n].begin(), seen[n].end()));
  }
  for (auto* r : all)
    CHECK(r->errors.all().empty());
}

TEST_CASE("a handler sees its turn's fence, growing with every turn of the "
          "chat across replicas, 0 without coordination") {
  botmesh::memory_coordination_hub hub;
  auto store = std::make_shared<botmesh::memory_store>();
  replica a{hub, store, "a"};
  replica b{hub, store, "b"};
  std::mutex mtx;
  std::vector<std::uint64_t> fences;
  auto record = [&](botmesh::context& c) {
    std::lock_guard guard{mtx};
    fences.push_back(c.fence());
    c.reply("ok");
  };
  a.bot->on_message(record);
  b.bot->on_message(record);
  a.bot->start();
  b.bot->start();
  a.provider->inject("ana", "1");
  REQUIRE(a.provider->wait_for_sent(1, 5s));
  b.provider->inject("ana", "2");
  REQUIRE(b.provider->wait_for_sent(1, 5s));
  a.provider->inject("ana", "3");
  REQUIRE(a.provider->wait_for_sent(2, 5s));
  std::lock_guard guard{mtx};
  REQUIRE(fences.size() == 3);
  CHECK(fences[0] > 0);
  CHECK(fences[0] < fences[1]);
  CHECK(fences[1] < fences[2]);

  auto solo = std::make_shared<botmesh::testing_provider>();
  botmesh::bot plain{{.provider = solo}};
  std::atomic<std::uint64_t> seen{1};
  plain.on_message([&](botmesh::context& c) {
    seen = c.fence();
    c.reply("ok");
  });
  plain.start();
  solo->inject("ana", "1");
  REQUIRE(solo->wait_for_sent(1, 5s));
  CHECK(seen.load() == 0);
}

TEST_CASE("a persistent conversation moves between replicas through the "
          "store, each dropping its stale copy") {
  botmesh::memory_coordination_hub hub;
  auto store = std::make_shared<botmesh::memory_store>();
  replica a{hub, store, "a"};
  replica b{hub, store, "b"};
  a.bot->add_flow(order_flow());
  b.bot->add_flow(order_flow());
  a.bot->start();
  b.bot->start();
  a.provider->inject("ana", "pedido");
  REQUIRE(a.provider->wait_for_sent(1, 5s));
  b.provider->inject("ana", "café"); // B reads A's checkpoint: the answer
  REQUIRE(b.provider->wait_for_sent(1, 5s));
  CHECK(texts(*b.provider) == std::vector<std::string>{"¿Cantidad?"});
  // Back on A: its in-memory copy (waiting for the product) is stale.
  a.provider->inject("ana", "3");
  REQUIRE(a.provider->wait_for_sent(2, 5s));
  CHECK(texts(*a.provider) == std::vector<std::string>{"¿Producto?", "3 x café"});
  REQUIRE(test::eventually([&] { return !store->get_checkpoint("test:ana"); }));
}

TEST_CASE("a crashed replica's chat is taken over after its lease, its late "
          "reply is fenced with lease_lost") {
  botmesh::memory_coordination_hub hub;
  auto store = std::make_shared<botmesh::memory_store>();
  std::latch a_running{1};
  std::latch a_release{1};
  std::mutex mtx;
  std::vector<std::string> lost;
  replica a{hub, store, "a", {}, "300ms"};
  replica b{hub, store, "b", {}, "300ms"};
  a.bot->on<botmesh::events::lease_lost>(
    [&](const botmesh::events::lease_lost& e) {
      std::lock_guard guard{mtx};
      lost.push_back(e.key + " " + e.reason);
    });
  a.bot->on_message([&](botmesh::context& c) {
    a_running.count_down();
    a_release.wait();
    c.reply("late answer from a");
  });
  b.bot->on_message([](botmesh::context& c) { c.reply("b: " + c.text()); });
  a.bot->start();
  b.bot->start();
  a.provider->inject("x", "uno");
  a_running.wait();
  a.coord->crash(); // a freezes: no more renewals
  b.provider->inject("x", "dos");
  REQUIRE(b.provider->wait_for_sent(1, 5s)); // after a's lease ran out
  CHECK(b.provider->sent()[0].text == "b: dos");
  REQUIRE(test::eventually([&] {
    std::lock_guard guard{mtx};
    return !lost.empty();
  }));
  a_release.count_down();
  REQUIRE(test::eventually(
    [&] { return a.errors.count(botmesh::errc::lease_lost) == 1; }));
  CHECK(a.provider->sent().empty()); // the late answer never went out
  std::lock_guard guard{mtx};
  CHECK(lost.at(0).rfind("test:x ", 0) == 0);
}

TEST_CASE("a message that cannot get its turn within turn_wait gets "
          "coordination_unavailable") {
  botmesh::memory_coordination_hub hub;
  auto store = std::make_shared<botmesh::memory_store>();
  std::latch a_running{1};
  std::latch a_release{1};
  replica a{hub, store, "a"};
  replica b{hub, store, "b", {.turn_wait = "100ms"}};
  a.bot->on_message([&](botmesh::context&) {
    a_running.count_down();
    a_release.wait();
  });
  b.bot->on_message([](botmesh::context& c) { c.reply("b"); });
  a.bot->start();
  b.bot->start();
  a.provider->inject("x", "uno");
  a_running.wait();
  b.provider->inject("x", "dos");
  REQUIRE(test::eventually([&] {
    return b.errors.count(botmesh::errc::coordination_unavailable) == 1;
  }));
  CHECK(b.errors.all()[0].what.find("turn_wait") != std::string::npos);
  CHECK(b.bot->stats().turn_failures == 1);
  a_release.count_down();
  // The given-up ticket does not block the chat afterwards.
  b.provider->inject("x", "tres");
  REQUIRE(b.provider->wait_for_sent(1, 5s));
}

TEST_CASE("an error listener that blocks on a failed turn holds no CAF "
          "worker: other chats go on meanwhile") {
  botmesh::memory_coordination_hub hub;
  auto store = std::make_shared<botmesh::memory_store>();
  std::latch a_running{1};
  std::latch a_release{1};
  replica a{hub, store, "a"};
  auto provider = std::make_shared<botmesh::testing_provider>();
  botmesh::coordination_options co;
  co.coordinator = std::make_shared<botmesh::memory_coordinator>(
    hub, botmesh::memory_coordinator_options{.replica_id = "b"});
  co.turn_wait = "100ms";
  // One CAF worker: a listener run on it would stop every chat actor.
  botmesh::bot b{{.provider = provider, .store = store,
                  .scheduler_threads = 1, .coordination = co}};
  std::atomic<int> answered_meanwhile{-1};
  b.on<botmesh::events::error>([&](const botmesh::events::error& e) {
    if (e.code != botmesh::errc::coordination_unavailable)
      return;
    // Another chat's message, answered while this listener still blocks.
    provider->inject("y", "hola");
    answered_meanwhile = provider->wait_for_sent(1, 5s) ? 1 : 0;
  });
  a.bot->on_message([&](botmesh::context&) {
    a_running.count_down();
    a_release.wait();
  });
  b.on_message([](botmesh::context& c) { c.reply("b " + c.text()); });
  a.bot->start();
  b.start();
  a.provider->inject("x", "uno");
  a_running.wait();
  provider->inject("x", "dos"); // waits for a's turn past turn_wait
  REQUIRE(test::eventually([&] { return answered_meanwhile.load() != -1; },
                           10s));
  CHECK(answered_meanwhile.load() == 1);
  CHECK(provider->sent_to("y").size() == 1);
  a_release.count_down();
  b.stop();
}

namespace {

// A memory coordinator whose first enter is lost before it ran (as a
// command failed with its connection): the lease actor retries it, after
// the chat's next request took its ticket.
class first_enter_lost final : public botmesh::forwarding_coordinator {
 public:
  using forwarding_coordinator::forwarding_coordinator;

  void enter(std::string_view key, std::uint64_t req, bool retry,
             completion<botmesh::turn_state> done) override {
    if (!lost_.exchange(true))
      return done({}, std::make_exception_ptr(
                        botmesh::coordination_unavailable_error("lost")));
    c_->enter(key, req, retry, std::move(done));
  }

 private:
  std::atomic<bool> lost_{false};
};

} // namespace

TEST_CASE("a message whose ticket request was lost and retried after the "
          "chat's next message took its ticket still runs first, without "
          "waiting for turn_wait") {
  botmesh::memory_coordination_hub hub;
  auto coord = std::make_shared<first_enter_lost>(
    std::make_shared<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = "a"}));
  auto provider = std::make_shared<botmesh::testing_provider>();
  botmesh::coordination_options co;
  co.coordinator = coord;
  co.turn_wait = "5s";
  test::error_log errors; // outlives the bot, whose threads report into it
  botmesh::bot bot{{.provider = provider, .coordination = co}};
  errors.attach(bot);
  bot.on_message([](botmesh::context& c) { c.reply(c.text()); });
  bot.start();
  provider->inject("x", "1");
  provider->inject("x", "2");
  provider->inject("x", "3");
  REQUIRE(provider->wait_for_sent(3, 2s));
  CHECK(texts(*provider) == std::vector<std::string>{"1", "2", "3"});
  CHECK(errors.all().empty());
}

TEST_CASE("settle stops a step that holds the turn too long and lets the "
          "chat go on") {
  botmesh::memory_coordination_hub hub;
  auto store = std::make_shared<botmesh::memory_store>();
  std::atomic<bool> stopped{false};
  replica a{hub, store, "a", {.settle = "200ms"}, "600ms"};
  a.bot->on_message([&](botmesh::context& c) {
    if (c.text() == "lento") {
      while (!c.stop_token().stop_requested())
        std::this_thread::sleep_for(1ms);
      stopped = true;
      c.reply("too late"); // fenced: the turn was settled
    } else {
      c.reply("ok " + c.text());
    }
  });
  a.bot->start();
  a.provider->inject("x", "lento");
  REQUIRE(test::eventually([&] { return stopped.load(); }));
  REQUIRE(test::eventually(
    [&] { return a.errors.count(botmesh::errc::lease_lost) == 1; }));
  CHECK(a.errors.all()[0].what.find("settle") != std::string::npos);
  a.provider->inject("x", "rápido");
  REQUIRE(a.provider->wait_for_sent(1, 5s));
  CHECK(texts(*a.provider) == std::vector<std::string>{"ok rápido"});
}

TEST_CASE("a step that ignores its stop token past settle does not keep the "
          "chat from the other replicas, and what waits behind it here is "
          "bounded by turn_wait") {
  botmesh::memory_coordination_hub hub;
  auto store = std::make_shared<botmesh::memory_store>();
  std::promise<void> go;
  auto released = go.get_future().share();
  std::atomic<bool> hung{false};
  botmesh::coordination_options co{.turn_wait = "3s", .settle = "200ms"};
  std::shared_ptr<ticket_counter> tickets;
  replica a{hub, store, "a", co, "600ms", [&](auto c) {
              return tickets = std::make_shared<ticket_counter>(c);
            }};
  replica b{hub, store, "b", co, "600ms"};
  a.bot->on_message([&](botmesh::context& c) {
    if (c.text() == "cuelga") {
      hung = true;
      released.wait(); // deaf to its stop token
      c.reply("tarde"); // fenced: its turn was cut
      return;
    }
    c.reply("a " + c.text());
  });
  b.bot->on_message([&](botmesh::context& c) { c.reply("b " + c.text()); });
  test::opener step{go};
  a.bot->start();
  b.bot->start();
  a.provider->inject("x", "cuelga");
  REQUIRE(test::eventually([&] { return hung.load(); }));
  // Behind the hung step on A: A is granted the chat's next turn (the cut
  // released the last one), which cannot start while the step runs.
  a.provider->inject("x", "uno");
  REQUIRE(test::eventually([&] { return tickets->entered.load() == 2; }));
  b.provider->inject("x", "dos");
  // B answers while the step still hangs: A gave the turn back (after a
  // grace for the step to stop) instead of holding it, renewed, for as
  // long as the step runs.
  CHECK(b.provider->wait_for_sent(1, 8s));
  CHECK(texts(*b.provider) == std::vector<std::string>{"b dos"});
  // "uno" waited for the step on A at most turn_wait, then failed with an
  // error that says why.
  REQUIRE(test::eventually([&] {
    return a.errors.count(botmesh::errc::coordination_unavailable) == 1;
  }));
  for (auto& e : a.errors.all())
    if (e.code == botmesh::errc::coordination_unavailable)
      CHECK(e.what.find("previous step still runs") != std::string::npos);
  CHECK(a.provider->sent().empty());
  step.open();
  // The step returns; its reply is refused: its turn was cut by settle.
  CHECK(test::eventually(
    [&] { return a.errors.count(botmesh::errc::lease_lost) == 1; }));
  // Once the step returned, the chat runs on A again.
  a.provider->inject("x", "tres");
  CHECK(a.provider->wait_for_sent(1, 5s));
  CHECK(texts(*a.provider) == std::vector<std::string>{"a tres"});
}

TEST_CASE("a step cut by settle that stops at once keeps the chat's order: "
          "what waited behind it on this replica still goes first") {
  botmesh::memory_coordination_hub hub;
  auto store = std::make_shared<botmesh::memory_store>();
  std::mutex mtx;
  std::vector<std::string> order;
  std::atomic<bool> started{false};
  botmesh::coordination_options co{.settle = "200ms"};
  std::shared_ptr<ticket_counter> tickets;
  replica a{hub, store, "a", co, "600ms", [&](auto c) {
              return tickets = std::make_shared<ticket_counter>(c);
            }};
  replica b{hub, store, "b", co, "600ms"};
  auto note = [&](const std::string& what) {
    std::lock_guard guard{mtx};
    order.push_back(what);
  };
  a.bot->on_message([&](botmesh::context& c) {
    if (c.text() == "lento") {
      started = true;
      while (!c.stop_token().stop_requested())
        std::this_thread::sleep_for(1ms);
      return;
    }
    note("a " + c.text());
  });
  b.bot->on_message([&](botmesh::context& c) { note("b " + c.text()); });
  a.bot->start();
  b.bot->start();
  a.provider->inject("x", "lento");
  REQUIRE(test::eventually([&] { return started.load(); }));
  a.provider->inject("x", "uno");
  REQUIRE(test::eventually([&] { return tickets->entered.load() == 2; }));
  b.provider->inject("x", "dos");
  REQUIRE(test::eventually([&] {
    std::lock_guard guard{mtx};
    return order.size() == 2;
  }));
  CHECK(order == std::vector<std::string>{"a uno", "b dos"});
  CHECK(a.errors.count(botmesh::errc::coordination_unavailable) == 0);
}

TEST_CASE("stress: steps cut by settle while they send: none of their sends "
          "lands after the cut, and each cut conversation is dropped") {
  // Many conversations cut at once while their steps keep sending: the cut
  // (the lease actor) and the sends (handler threads) race on the turn's
  // state. A send that landed after the cut would show up after the chat's
  // next answer; a conversation kept after a cut would take "hola" as its
  // answer. Also a target for scripts/sanitize (ThreadSanitizer).
  botmesh::memory_coordination_hub hub;
  auto store = std::make_shared<botmesh::memory_store>();
  replica a{hub, store, "a", {.settle = "60ms"}, "600ms"};
  botmesh::flow f{"pedido"};
  f.hears({"pedido"}).ask("producto", "¿Producto?",
                          [](botmesh::flow_context& c, const botmesh::answer&) {
                            for (;;) { // until the cut makes send throw
                              c.send("tick");
                              std::this_thread::sleep_for(200us);
                            }
                          });
  a.bot->add_flow(f);
  a.bot->on_message([](botmesh::context& c) { c.reply("eco " + c.text()); });
  a.bot->start();
  constexpr int chats = 40;
  for (int i = 0; i < chats; ++i) {
    auto chat = "s" + std::to_string(i);
    a.provider->inject(chat, "pedido");
    a.provider->inject(chat, "lento");
    a.provider->inject(chat, "hola");
  }
  REQUIRE(test::eventually(
    [&] {
      for (int i = 0; i < chats; ++i) {
        auto m = a.provider->sent_to("s" + std::to_string(i));
        if (m.empty() || m.back().text != "eco hola")
          return false;
      }
      return true;
    },
    60s));
  for (int i = 0; i < chats; ++i) {
    auto m = a.provider->sent_to("s" + std::to_string(i));
    REQUIRE(m.size() >= 3);
    CHECK(m.front().text == "¿Producto?");
    CHECK(m[1].text == "tick");
    // Everything between the question and the answer to "hola" is a tick;
    // nothing after it.
    for (std::size_t k = 1; k + 1 < m.size(); ++k)
      CHECK(m[k].text == "tick");
    CHECK(m.back().text == "eco hola");
  }
  CHECK(a.errors.count(botmesh::errc::lease_lost) == chats);
  std::this_thread::sleep_for(100ms); // a late send would land now
  for (int i = 0; i < chats; ++i)
    CHECK(a.provider->sent_to("s" + std::to_string(i)).back().text
          == "eco hola");
}

namespace {

struct exclusive_replica {
  std::shared_ptr<botmesh::testing_provider> provider;
  std::shared_ptr<botmesh::memory_coordinator> coord;
  std::unique_ptr<botmesh::bot> bot;
  std::mutex mtx;
  std::vector<std::string> events;

  // `wrap`, when given, stands between the bot and its coordinator.
  using wrapper = std::function<std::shared_ptr<botmesh::coordinator>(
    std::shared_ptr<botmesh::coordinator>)>;

  exclusive_replica(botmesh::memory_coordination_hub& hub, std::string id,
                    botmesh::duration provider_down = "1m",
                    botmesh::testing_provider::options po = {},
                    wrapper wrap = {}) {
    po.id = "wa";
    po.capabilities = {.exclusive_session = true};
    provider = std::make_shared<botmesh::testing_provider>(std::move(po));
    coord = std::make_shared<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = std::move(id),
                                               .lease = "1s"});
    // A lease of 1s, not less: under load (CI on 2 cores) renewals every
    // lease/3 must not come late enough to lose and re-win the leadership,
    // which would start the transport twice.
    botmesh::coordination_options co;
    co.coordinator = wrap ? wrap(coord) : coord;
    co.provider_down = provider_down;
    // Workers to spare: a test may hold one inside the lease actor.
    bot = std::make_unique<botmesh::bot>(botmesh::bot_options{
      .provider = provider, .scheduler_threads = 4, .coordination = co});
    bot->on<botmesh::events::leader>([this](const botmesh::events::leader& e) {
      std::lock_guard guard{mtx};
      events.push_back("leader " + e.name);
    });
    bot->on<botmesh::events::follower>(
      [this](const botmesh::events::follower& e) {
        std::lock_guard guard{mtx};
        events.push_back("follower " + e.reason);
      });
  }

  // The bot goes first: stopping it raises events into `events`.
  ~exclusive_replica() {
    bot.reset();
  }

  bool saw(const std::string& e) {
    std::lock_guard guard{mtx};
    return std::find(events.begin(), events.end(), e) != events.end();
  }

  bool saw_prefix(const std::string& p) {
    std::lock_guard guard{mtx};
    return std::any_of(events.begin(), events.end(),
                       [&](auto& e) { return e.rfind(p, 0) == 0; });
  }
};

// When transports start and stop, across replicas (thread-safe).
struct transport_log {
  std::mutex mtx;
  std::vector<std::string> lines;

  void add(std::string line) {
    std::lock_guard guard{mtx};
    lines.push_back(std::move(line));
  }

  std::vector<std::string> get() {
    std::lock_guard guard{mtx};
    return lines;
  }

  // Position of the first `line` (lines.size() when absent).
  std::size_t first(const std::string& line) {
    std::lock_guard guard{mtx};
    return static_cast<std::size_t>(
      std::find(lines.begin(), lines.end(), line) - lines.begin());
  }

  bool has(const std::string& line) {
    std::lock_guard guard{mtx};
    return std::find(lines.begin(), lines.end(), line) != lines.end();
  }
};

} // namespace

TEST_CASE("an exclusive transport starts on one replica, the standby refuses "
          "sends and takes over when the leader stops") {
  botmesh::memory_coordination_hub hub;
  exclusive_replica a{hub, "a"};
  a.bot->start();
  REQUIRE(a.bot->ready(5s));
  exclusive_replica b{hub, "b"};
  b.bot->start();
  REQUIRE(test::eventually([&] { return b.saw("follower standby"); }));
  CHECK(test::eventually([&] { return a.saw("leader provider:wa"); }));
  CHECK(a.provider->starts() == 1);
  CHECK(b.provider->starts() == 0);
  CHECK_FALSE(b.bot->ready(50ms));
  CHECK_THROWS_AS(b.bot->send("x", "hola"), botmesh::provider_not_leader_error);
  CHECK_NOTHROW(a.bot->send("x", "hola"));
  a.bot->stop(); // hands the leadership on
  REQUIRE(b.bot->ready(5s));
  CHECK(test::eventually([&] { return b.saw("leader provider:wa"); }));
  CHECK(b.provider->starts() == 1);
  CHECK_NOTHROW(b.bot->send("x", "hola"));
}

TEST_CASE("a transport's stop waits for the start before it: a replica that "
          "lost the leadership while its transport started is left stopped") {
  botmesh::memory_coordination_hub hub;
  transport_log log;
  std::atomic<bool> in_start{false};
  std::atomic<bool> let_start{false};
  botmesh::testing_provider::options po;
  po.on_start = [&] {
    log.add("start+");
    in_start = true;
    test::eventually([&] { return let_start.load(); }, 10s);
    log.add("start-");
  };
  po.on_stop = [&] {
    log.add("stop+");
    log.add("stop-");
  };
  exclusive_replica a{hub, "a", "1m", po};
  a.bot->start();
  REQUIRE(test::eventually([&] { return in_start.load(); }));
  // The leadership is lost (after a lease) while the start still runs.
  a.coord->crash();
  REQUIRE(test::eventually(
    [&] {
      try {
        a.bot->send("x", "hola");
        return false;
      } catch (const botmesh::provider_not_leader_error&) {
        return true;
      } catch (const botmesh::error&) {
        return false; // leading still: its transport is not open yet
      }
    },
    10s));
  std::this_thread::sleep_for(300ms); // (room for a stop run out of order)
  let_start = true;
  REQUIRE(test::eventually([&] { return log.get().size() >= 4; }));
  auto lines = log.get();
  CHECK(lines[0] == "start+");
  CHECK(lines[1] == "start-");
  CHECK(lines[2] == "stop+");
  CHECK(lines[3] == "stop-");
  // Its follower event comes after the stop, on the transport's thread.
  CHECK(test::eventually([&] { return a.saw("follower lost"); }));
  CHECK(test::eventually([&] {
    return a.provider->state() == botmesh::provider_state::closed;
  }));
}

TEST_CASE("a leader that stops hands its transport on only once it stopped: "
          "never two running at once") {
  botmesh::memory_coordination_hub hub;
  transport_log log;
  botmesh::testing_provider::options pa;
  pa.on_stop = [&] {
    log.add("a stop+");
    // (Well within the bound on a stop: a lease, 1 s here.)
    std::this_thread::sleep_for(150ms);
    log.add("a stop-");
  };
  botmesh::testing_provider::options pb;
  pb.on_start = [&] { log.add("b start"); };
  exclusive_replica a{hub, "a", "1m", pa};
  a.bot->start();
  REQUIRE(a.bot->ready(5s));
  exclusive_replica b{hub, "b", "1m", pb};
  b.bot->start();
  REQUIRE(test::eventually([&] { return b.saw("follower standby"); }));
  a.bot->stop();
  REQUIRE(b.bot->ready(5s));
  CHECK(log.first("a stop-") < log.first("b start"));
  CHECK(log.has("b start"));
}

TEST_CASE("a dead leader's transport is taken over after its lease") {
  botmesh::memory_coordination_hub hub;
  exclusive_replica a{hub, "a"};
  exclusive_replica b{hub, "b"};
  a.bot->start();
  REQUIRE(a.bot->ready(5s));
  b.bot->start();
  REQUIRE(test::eventually([&] { return b.saw("follower standby"); }));
  a.coord->crash();
  REQUIRE(b.bot->ready(5s));
  CHECK(b.provider->starts() == 1);
}

TEST_CASE("a leader whose transport stays closed for provider_down yields") {
  botmesh::memory_coordination_hub hub;
  exclusive_replica a{hub, "a", "200ms"};
  exclusive_replica b{hub, "b", "200ms"};
  a.bot->start();
  REQUIRE(a.bot->ready(5s));
  b.bot->start();
  REQUIRE(test::eventually([&] { return b.saw("follower standby"); }));
  a.provider->set_state(botmesh::provider_state::closed); // session lost
  REQUIRE(test::eventually([&] { return a.saw("follower provider_down"); }));
  REQUIRE(b.bot->ready(5s));
  CHECK(test::eventually([&] { return b.saw("leader provider:wa"); }));
}

TEST_CASE("a leader whose transport fails to start yields at once, and a "
          "standby starts it") {
  botmesh::memory_coordination_hub hub;
  std::atomic<int> tries{0};
  botmesh::testing_provider::options pa;
  pa.on_start = [&] {
    ++tries;
    throw botmesh::error(botmesh::errc::provider_error, "cannot listen");
  };
  // provider_down is a minute: only the failed start makes A step down.
  exclusive_replica a{hub, "a", "1m", pa};
  a.bot->start();
  REQUIRE(test::eventually([&] { return tries.load() == 1; }));
  exclusive_replica b{hub, "b", "1m"};
  b.bot->start();
  REQUIRE(b.bot->ready(10s));
  // Events reach their listeners on the handler pool, a moment later.
  CHECK(test::eventually([&] { return a.saw("follower start_failed"); }));
  CHECK(test::eventually([&] { return b.saw("leader provider:wa"); }));
  // A never said it leads with its transport started (before, its leader
  // event came right after the failed start).
  CHECK_FALSE(a.saw("leader provider:wa"));
}

TEST_CASE("a leader whose transport lost its platform and keeps reconnecting "
          "for provider_down yields") {
  botmesh::memory_coordination_hub hub;
  exclusive_replica a{hub, "a", "200ms"};
  exclusive_replica b{hub, "b", "200ms"};
  a.bot->start();
  REQUIRE(a.bot->ready(5s));
  b.bot->start();
  REQUIRE(test::eventually([&] { return b.saw("follower standby"); }));
  // A poller that cannot reach the platform retries, saying "connecting".
  a.provider->set_state(botmesh::provider_state::connecting);
  REQUIRE(test::eventually([&] { return a.saw("follower provider_down"); }));
  REQUIRE(b.bot->ready(5s));
  CHECK(test::eventually([&] { return b.saw("leader provider:wa"); }));
}

namespace {

// Holds the lease actor inside a renewal once `stall` is set, as a freeze of
// the process would hold it: the leadership runs out in the hub, and nothing
// has cleared the replica's "leading" flag yet.
class stalling_renewals final : public botmesh::forwarding_coordinator {
 public:
  using forwarding_coordinator::forwarding_coordinator;
  std::atomic<bool> stall{false}, stalled{false}, go{false};

  void renew(botmesh::renewal r,
             completion<botmesh::renewal_result> done) override {
    if (stall.load()) {
      stalled = true;
      test::eventually([&] { return go.load(); }, 30s);
    }
    c_->renew(std::move(r), std::move(done));
  }
};

} // namespace

TEST_CASE("a message an exclusive transport hands on after its replica's "
          "leadership lapsed is refused, for the replica that leads now") {
  botmesh::memory_coordination_hub hub;
  std::shared_ptr<stalling_renewals> stalls;
  exclusive_replica a{hub, "a", "1m", {}, [&](auto c) {
                        stalls = std::make_shared<stalling_renewals>(c);
                        return stalls;
                      }};
  a.bot->start();
  REQUIRE(a.bot->ready(5s));
  exclusive_replica b{hub, "b"};
  b.bot->start();
  REQUIRE(test::eventually([&] { return b.saw("follower standby"); }));
  // The lease actor goes on before the bots stop, also after a failed REQUIRE.
  std::shared_ptr<void> thaw{nullptr, [&](void*) { stalls->go = true; }};
  stalls->stall = true;
  REQUIRE(test::eventually([&] { return stalls->stalled.load(); }));
  // The hub let A's leadership go after its lease; B leads.
  REQUIRE(b.bot->ready(10s));
  // A's lease actor has not run since: A still believes it leads, but its
  // leadership's validity ran out, and it says it is not ready (before, it
  // did while B led).
  CHECK_FALSE(a.bot->ready(0ms));
  // A thread of A's transport (a poller whose getUpdates answered as the
  // process thawed) hands an update on.
  std::atomic<int> code{-1};
  botmesh::delivery_callbacks cb;
  cb.accepted = [&](botmesh::errc c) { code = static_cast<int>(c); };
  a.provider->inject(botmesh::inbound_message{.chat = "x", .text = "hola"},
                     std::move(cb));
  REQUIRE(test::eventually([&] { return code.load() != -1; }));
  auto got = static_cast<botmesh::errc>(code.load());
  CHECK(got == botmesh::errc::provider_not_leader);
  CHECK(botmesh::retry_later(got));
  CHECK(a.bot->stats().refused_not_leader == 1);
  // Nor can A send outside a turn: its leadership lapsed.
  CHECK_THROWS_AS(a.bot->send("x", "hola"), botmesh::provider_not_leader_error);
  stalls->go = true; // thawed: A learns it lost
  CHECK(test::eventually([&] { return a.saw("follower lost"); }, 10s));
  // Said once: the renewals after it do not add a "standby" (they did).
  std::this_thread::sleep_for(1s); // three renewals
  CHECK_FALSE(a.saw("follower standby"));
}

TEST_CASE("with coordination the scheduler's leadership uses the coordinator") {
  botmesh::memory_coordination_hub hub;
  auto store = std::make_shared<botmesh::memory_store>();
  std::atomic<int> ticks{0};
  replica a{hub, store, "a"};
  a.bot->every("1h", {.id = "report"}, [](const botmesh::scheduled_run&) {});
  a.bot->every(10ms, [&] { ++ticks; }); // proves the scheduler has ticked
  a.bot->start();
  REQUIRE(test::eventually([&] { return ticks.load() > 0; }));
  botmesh::memory_coordinator other{hub, {.replica_id = "z"}};
  CHECK_FALSE(botmesh::blocking_coordinator{other}
                .lead(botmesh::task_namespace("", "test", "")
                      + ":scheduler:leader")
                .has_value());
}

namespace {

// Records the names each renewal batch asks to lead.
class renewal_recorder final : public botmesh::forwarding_coordinator {
 public:
  using forwarding_coordinator::forwarding_coordinator;

  void renew(botmesh::renewal r,
             completion<botmesh::renewal_result> done) override {
    {
      std::lock_guard guard{mtx_};
      batches_.push_back(r.leads);
    }
    c_->renew(std::move(r), std::move(done));
  }

  std::vector<std::vector<std::string>> batches() const {
    std::lock_guard guard{mtx_};
    return batches_;
  }

 private:
  mutable std::mutex mtx_;
  std::vector<std::vector<std::string>> batches_;
};

} // namespace

TEST_CASE("with coordination the scheduler's leadership is renewed in the "
          "lease actor's batch, and handed on when the bot stops") {
  botmesh::memory_coordination_hub hub;
  auto rec = std::make_shared<renewal_recorder>(
    std::make_shared<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = "a",
                                               .lease = "300ms"}));
  auto provider = std::make_shared<botmesh::testing_provider>();
  botmesh::coordination_options co;
  co.coordinator = rec;
  std::atomic<int> ticks{0};
  botmesh::bot b{{.provider = provider, .coordination = co}};
  b.every(10ms, [&] { ++ticks; });
  b.start();
  auto name = botmesh::task_namespace("", "test", "") + ":scheduler:leader";
  botmesh::memory_coordinator other{hub, {.replica_id = "z"}};
  // Several leases: the leadership stays with the bot all along.
  for (int i = 0; i < 4; ++i) {
    std::this_thread::sleep_for(300ms);
    CHECK_FALSE(botmesh::blocking_coordinator{other}.lead(name).has_value());
  }
  CHECK(ticks.load() > 0);
  // After its first election every batch renews it with the heartbeat:
  // the scheduler makes no round trip of its own.
  auto batches = rec->batches();
  auto first = std::find_if(batches.begin(), batches.end(), [&](auto& b) {
    return std::find(b.begin(), b.end(), name) != b.end();
  });
  REQUIRE(first != batches.end());
  auto renewing = std::count_if(first, batches.end(), [&](auto& b) {
    return b == std::vector<std::string>{name};
  });
  CHECK(renewing == batches.end() - first);
  CHECK(batches.end() - first >= 8); // every lease/3 for 1.2 s
  b.stop(); // gives it up: another replica leads at once
  CHECK(botmesh::blocking_coordinator{other}.lead(name).has_value());
}

TEST_CASE("a flow timer of a conversation whose chat moved to another replica "
          "is discarded") {
  botmesh::memory_coordination_hub hub;
  auto store = std::make_shared<botmesh::memory_store>();
  std::atomic<int> idle_fired{0};
  replica a{hub, store, "a"};
  replica b{hub, store, "b"};
  a.bot->conversation("vigila", {"vigila"}, [&](botmesh::flow_context& c)
                                                -> botmesh::flow_task {
    c.idle("150ms", [&](botmesh::flow_context& c2) {
      ++idle_fired;
      c2.send("¿Sigues ahí?");
    });
    co_await c.ask("Dime algo");
  });
  b.bot->on_message([](botmesh::context& c) { c.reply("b: " + c.text()); });
  a.bot->start();
  b.bot->start();
  a.provider->inject("x", "vigila");
  REQUIRE(a.provider->wait_for_sent(1, 5s));
  b.provider->inject("x", "hola"); // the chat moves to b
  REQUIRE(b.provider->wait_for_sent(1, 5s));
  // a's idle timer fires later: with the turn it sees b held the chat, so
  // its copy of the conversation is stale and the timer does nothing.
  std::this_thread::sleep_for(400ms);
  CHECK(idle_fired.load() == 0);
  CHECK(a.provider->sent().size() == 1);
  CHECK(a.bot->stats().conversations == 0);
}

TEST_CASE("the leader event of an exclusive transport comes after its start "
          "returned, and a loss's follower event after its stop") {
  // One thread runs the transport's switches and these events, in order:
  // before, each was a job of its own on the handler pool, and the event
  // could run beside, or before, the switch it follows.
  botmesh::memory_coordination_hub hub;
  transport_log log;
  botmesh::testing_provider::options po;
  po.on_start = [&] {
    std::this_thread::sleep_for(200ms); // a transport that connects slowly
    log.add("start");
  };
  po.on_stop = [&] {
    std::this_thread::sleep_for(200ms);
    log.add("stop");
  };
  exclusive_replica a{hub, "a", "1m", po};
  a.bot->on<botmesh::events::leader>(
    [&](const botmesh::events::leader&) { log.add("leader"); });
  a.bot->on<botmesh::events::follower>(
    [&](const botmesh::events::follower& e) { log.add("follower " + e.reason); });
  a.bot->start();
  REQUIRE(test::eventually([&] { return log.has("leader"); }, 10s));
  a.coord->crash(); // the leadership is lost after a lease
  REQUIRE(test::eventually([&] { return log.has("follower lost"); }, 10s));
  auto lines = log.get();
  INFO(fmt::format("{}", fmt::join(lines, ", ")));
  CHECK(lines
        == std::vector<std::string>{"start", "leader", "stop", "follower lost"});
}

TEST_CASE("stop past its bound refuses a granted turn still waiting for a "
          "handler thread") {
  botmesh::memory_coordination_hub hub;
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  std::atomic<bool> bob_ran{false};
  std::latch running{1};
  botmesh::coordination_options co;
  auto counter = std::make_shared<ticket_counter>(
    std::make_shared<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = "a"}));
  co.coordinator = counter;
  botmesh::bot b{{.provider = p, .handler_threads = 1,
                  .stop_timeout = 500ms, .coordination = co}};
  errors.attach(b);
  b.on_message([&](botmesh::context& c) {
    if (c.text() == "slow") {
      running.count_down();
      while (!c.stop_token().stop_requested())
        std::this_thread::sleep_for(1ms);
      return;
    }
    bob_ran = true;
  });
  b.start();
  p->inject("ana", "slow");
  running.wait();
  // bob's turn is granted at once (nobody holds it); its step waits for the
  // one handler thread, which ana's keeps until the stop's bound.
  p->inject("bob", "queued");
  REQUIRE(test::eventually([&] { return counter->entered == 2; }));
  b.stop(); // drains for 500 ms first: bob's step is queued by then
  CHECK_FALSE(bob_ran.load());
  REQUIRE(test::eventually(
    [&] { return errors.count(botmesh::errc::stopped) == 1; }));
  auto all = errors.all();
  REQUIRE(all.size() == 1);
  REQUIRE(all[0].message);
  CHECK(all[0].message->text == "queued");
  CHECK(b.stats().refused_stopped == 1);
}
