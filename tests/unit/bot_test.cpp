#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <latch>
#include <map>
#include <mutex>
#include <set>

#include <caf/all.hpp>

#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/runtime/core/caf_error.hpp>
#include <botmesh/stores/memory_coordinator.hpp>
#include <botmesh/stores/memory_durable_backend.hpp>

#include "test_util.hpp"

using namespace std::chrono_literals;
using botmesh::errc;

namespace {

std::shared_ptr<botmesh::testing_provider> make_provider() {
  return std::make_shared<botmesh::testing_provider>();
}

std::vector<std::string> texts(const std::vector<botmesh::outgoing_message>& v) {
  std::vector<std::string> out;
  for (auto& m : v)
    out.push_back(m.text);
  return out;
}

} // namespace

TEST_CASE("keyword, pattern and catch-all handlers route in registration order") {
  auto p = make_provider();
  botmesh::bot b{{.provider = p}};
  b.hears({"hola", "buenas"}, [](botmesh::context& c) { c.reply("¡Hola!"); });
  b.hears(botmesh::pattern{R"(pedido (\d+))"}, [](botmesh::context& c) {
    c.reply("pedido " + c.matches().at(1));
  });
  b.on_message([](botmesh::context& c) { c.reply("eco: " + c.text()); });
  b.start();
  p->inject("ana", "  HOLA ");
  p->inject("ana", "mi pedido 42 por favor");
  p->inject("ana", "buenas");
  p->inject("ana", "hola que tal"); // not the keyword alone: catch-all
  REQUIRE(p->wait_for_sent(4, 5s));
  CHECK(texts(p->sent_to("ana"))
        == std::vector<std::string>{"¡Hola!", "pedido 42", "¡Hola!",
                                    "eco: hola que tal"});
  // Stamped ids: provider, a random prefix of this bot instance, a counter.
  auto first = p->sent().at(0).reply_to;
  CHECK(first.starts_with("test-"));
  CHECK(first.ends_with("-1"));
  CHECK(first.size() == std::string{"test-"}.size() + 16 + 2);
  // Another bot (another process, or this one restarted) stamps other ids.
  auto p2 = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b2{{.provider = p2}};
  b2.on_message([](botmesh::context& c) { c.reply("x"); });
  b2.start();
  p2->inject("ana", "hola");
  REQUIRE(p2->wait_for_sent(1, 5s));
  CHECK(p2->sent().at(0).reply_to.ends_with("-1"));
  CHECK(p2->sent().at(0).reply_to != first);
}

TEST_CASE("invalid inbound messages are refused naming the field and nothing "
          "valid is lost") {
  auto p = make_provider();
  test::error_log errors;
  botmesh::bot b{{.provider = p, .limits = {.max_text_bytes = 100}}};
  errors.attach(b);
  b.on_message([](botmesh::context& c) { c.reply("ok " + c.text()); });
  b.start();
  p->inject("ana", "uno");
  p->inject("", "sin chat");
  p->inject("ana", std::string(101, 'x'));
  p->inject("ana", "bad \xff utf8");
  p->inject("ana", "dos");
  REQUIRE(p->wait_for_sent(2, 5s));
  REQUIRE(test::eventually([&] { return errors.count(errc::invalid_argument) == 3; }));
  auto all = errors.all();
  CHECK(all[0].what.find("\"chat\"") != std::string::npos);
  CHECK_FALSE(all[0].message->text.empty());
  CHECK(all[1].what.find("over the limit of 100 bytes") != std::string::npos);
  CHECK(all[1].key == "test:ana");
  CHECK(all[2].what.find("not valid UTF-8") != std::string::npos);
  CHECK(texts(p->sent_to("ana")) == std::vector<std::string>{"ok uno", "ok dos"});
  // A turn counts as handled after its handler returned, just after the reply.
  REQUIRE(test::eventually([&] { return b.stats().handled == 2; }));
  auto st = b.stats();
  CHECK(st.refused_invalid == 3);
  CHECK(st.received == 2);
}

TEST_CASE("a chat over its pending bound refuses with an overloaded error and a "
          "counter") {
  auto p = make_provider();
  test::error_log errors;
  std::latch release{1};
  std::atomic<int> started{0};
  botmesh::bot b{{.provider = p, .max_pending_per_chat = 3}};
  errors.attach(b);
  b.on_message([&](botmesh::context& c) {
    if (c.message().chat == "busy" && started++ == 0)
      release.wait();
    c.reply(c.text());
  });
  b.start();
  // The blocked handler is let go whatever happens below (a failed check
  // must not leave the bot's stop waiting for it).
  struct let_go {
    std::latch& l;
    bool done = false;
    ~let_go() {
      if (!done)
        l.count_down();
    }
  } guard{release};
  for (int i = 1; i <= 6; ++i)
    p->inject("busy", std::to_string(i));
  // 1 runs (blocked), 2..4 wait, 5 and 6 exceed the bound.
  REQUIRE(test::eventually([&] { return errors.count(errc::overloaded) == 2; }));
  // Other chats are not held up by the blocked one.
  p->inject("libre", "x");
  REQUIRE(p->wait_for_sent(1, 5s));
  CHECK(p->sent().at(0).chat == "libre");
  guard.done = true;
  release.count_down();
  REQUIRE(p->wait_for_sent(5, 5s));
  CHECK(texts(p->sent_to("busy")) == std::vector<std::string>{"1", "2", "3", "4"});
  auto refused = errors.all();
  CHECK(refused.at(0).message->text == "5");
  CHECK(refused.at(1).message->text == "6");
  CHECK(refused.at(0).what.find("max_pending_per_chat") != std::string::npos);
  CHECK(b.stats().refused_overload == 2);
}

TEST_CASE("a handler that throws raises handler_failed and its chat goes on") {
  auto p = make_provider();
  test::error_log errors;
  botmesh::bot b{{.provider = p}};
  errors.attach(b);
  b.hears("boom", [](botmesh::context&) -> void {
    throw std::runtime_error("kaput");
  });
  b.on_message([](botmesh::context& c) { c.reply("ok"); });
  b.start();
  p->inject("ana", "boom");
  p->inject("ana", "after");
  REQUIRE(p->wait_for_sent(1, 5s));
  REQUIRE(errors.count(errc::handler_failed) == 1);
  CHECK(errors.all()[0].what.find("kaput") != std::string::npos);
  CHECK(b.stats().handler_errors == 1);
}

TEST_CASE("a failing provider send is reported and counted") {
  auto p = make_provider();
  test::error_log errors;
  botmesh::bot b{{.provider = p}};
  errors.attach(b);
  b.on_message([](botmesh::context& c) { c.reply("x"); });
  b.start();
  p->fail_sends(true);
  p->inject("ana", "hola");
  REQUIRE(test::eventually([&] { return errors.count(errc::handler_failed) == 1; }));
  CHECK(errors.all()[0].what.find("simulated") != std::string::npos);
  CHECK(b.stats().send_errors == 1);
  p->fail_sends(false);
  b.send("ana", "directo");
  CHECK(p->sent_to("ana").size() == 1);
  // A closed transport refuses sends with provider_error.
  p->set_state(botmesh::provider_state::closed);
  try {
    b.send("ana", "x");
    FAIL("sent through a closed transport");
  } catch (const botmesh::error& e) {
    CHECK(e.code() == errc::provider_error);
    CHECK(std::string{e.what()}.find("closed") != std::string::npos);
  }
  p->set_state(botmesh::provider_state::open);
  CHECK_THROWS_AS(b.send("", "x"), botmesh::invalid_argument_error);
}

TEST_CASE("stop drains in-flight turns before returning") {
  auto p = make_provider();
  botmesh::bot b{{.provider = p}};
  b.on_message([](botmesh::context& c) {
    std::this_thread::sleep_for(5ms);
    c.reply(c.text());
  });
  b.start();
  for (int i = 0; i < 20; ++i)
    p->inject("ana", std::to_string(i));
  b.stop();
  CHECK(b.stats().handled == 20);
  CHECK(p->sent().size() == 20);
  CHECK_THROWS_AS(p->inject("ana", "late"), botmesh::error);
  b.stop(); // idempotent
}

TEST_CASE("stop past its bound refuses queued messages and fires the stop "
          "token") {
  auto p = make_provider();
  test::error_log errors;
  std::atomic<bool> saw_stop{false};
  std::latch running{1};
  botmesh::bot b{{.provider = p, .stop_timeout = 100ms}};
  errors.attach(b);
  b.on_message([&](botmesh::context& c) {
    if (c.text() == "slow") {
      running.count_down();
      while (!c.stop_token().stop_requested())
        std::this_thread::sleep_for(1ms);
      saw_stop = true;
    }
  });
  b.start();
  p->inject("ana", "slow");
  p->inject("ana", "queued 1");
  p->inject("ana", "queued 2");
  running.wait();
  b.stop();
  CHECK(saw_stop.load());
  REQUIRE(test::eventually([&] { return errors.count(errc::stopped) == 2; }));
  // Both are refused; which first depends on whether the second was still
  // in the chat's queue or already handed to the handler thread.
  std::vector<std::string> refused;
  for (auto& e : errors.all())
    refused.push_back(e.message->text);
  std::sort(refused.begin(), refused.end());
  CHECK(refused == std::vector<std::string>{"queued 1", "queued 2"});
  CHECK(b.stats().refused_stopped == 2);
}

TEST_CASE("events message:in and message:out follow each turn") {
  auto p = make_provider();
  std::mutex mtx;
  std::vector<std::string> seen;
  botmesh::bot b{{.provider = p}};
  b.on<botmesh::events::message_in>([&](const botmesh::events::message_in& e) {
    std::lock_guard guard{mtx};
    seen.push_back("in " + e.key + " " + e.message.text);
  });
  b.on<botmesh::events::message_out>(
    [&](const botmesh::events::message_out& e) {
      std::lock_guard guard{mtx};
      seen.push_back("out " + e.message.chat + " " + e.message.text);
    });
  b.on_message([](botmesh::context& c) { c.reply("re " + c.text()); });
  b.start();
  p->inject("ana", "a");
  p->inject("ana", "b");
  REQUIRE(p->wait_for_sent(2, 5s));
  b.stop();
  std::lock_guard guard{mtx};
  CHECK(seen == std::vector<std::string>{"in test:ana a", "out ana re a",
                                         "in test:ana b", "out ana re b"});
}

TEST_CASE("the bot records chats and both directions of the log in its store") {
  auto p = make_provider();
  auto store = std::make_shared<botmesh::memory_store>();
  botmesh::bot b{{.provider = p, .store = store}};
  b.on_message([](botmesh::context& c) { c.reply("re " + c.text()); });
  b.start();
  p->inject("ana", "hola");
  REQUIRE(p->wait_for_sent(1, 5s));
  b.stop();
  auto chat = store->get_chat("test:ana");
  REQUIRE(chat);
  CHECK(chat->chat == "ana");
  auto log = store->messages("test:ana", 10);
  REQUIRE(log.size() == 2);
  CHECK(log[0].dir == botmesh::direction::in);
  CHECK(log[0].text == "hola");
  CHECK(log[1].dir == botmesh::direction::out);
  CHECK(log[1].text == "re hola");
}

TEST_CASE("an idle chat is passivated and re-spawned transparently") {
  auto p = make_provider();
  botmesh::bot b{{.provider = p, .passivate_after = 30ms}};
  b.on_message([](botmesh::context& c) { c.reply(c.text()); });
  b.start();
  p->inject("ana", "1");
  REQUIRE(p->wait_for_sent(1, 5s));
  REQUIRE(test::eventually([&] { return b.stats().passivations == 1; }));
  CHECK(b.stats().live_chats == 0);
  p->inject("ana", "2");
  REQUIRE(p->wait_for_sent(2, 5s));
  CHECK(b.stats().activations == 2);
  CHECK(texts(p->sent_to("ana")) == std::vector<std::string>{"1", "2"});
}

TEST_CASE("a bot embeds in an application's actor system and takes messages "
          "from its actors") {
  caf::actor_system_config cfg;
  botmesh::configure_actor_system(cfg);
  caf::actor_system sys{cfg};
  auto p = make_provider();
  {
    botmesh::bot b{sys, {.provider = p}};
    b.on_message([](botmesh::context& c) { c.reply("re " + c.text()); });
    b.start();
    CHECK(&b.system() == &sys);
    botmesh::inbound_message m;
    m.chat = "from-caf";
    m.id = "x1";
    m.text = "hola";
    caf::scoped_actor self{sys};
    std::string id;
    self->request(b.actor(), 5s, m)
      .receive([&](const botmesh::delivery_receipt& r) { id = r.id; },
               [&](caf::error& e) { FAIL(sys.render(e)); });
    CHECK(id == "x1");
    REQUIRE(p->wait_for_sent(1, 5s));
    CHECK(p->sent()[0].chat == "from-caf");
    CHECK(sys.render(botmesh::make_error(errc::lease_lost, "superseded"))
          == "botmesh.lease_lost: superseded");
  }
  // The application's system outlives the bot and keeps working.
  auto inc = sys.spawn([]() -> caf::behavior {
    return {[](int x) { return x + 1; }};
  });
  caf::scoped_actor self{sys};
  int result = 0;
  self->request(inc, 5s, 41).receive([&](int r) { result = r; },
                                     [&](caf::error&) { result = -1; });
  CHECK(result == 42);
}

TEST_CASE("a bot destroyed in an application's actor system leaves none "
          "of its actors behind") {
  // Its router and chat actors refer to the bot: one still running once
  // the destructor returned (a timer or a sweep queued ahead of its exit)
  // would run into freed memory.
  caf::actor_system_config cfg;
  botmesh::configure_actor_system(cfg);
  caf::actor_system sys{cfg};
  auto before = sys.registry().running();
  botmesh::memory_coordination_hub hub;
  // Plain, then coordinated (a lease actor), then also durable (a journal
  // actor) with a scheduled task (its actors).
  for (int round = 0; round < 3; ++round) {
    auto p = make_provider();
    botmesh::bot_options o{.provider = p, .passivate_after = "10ms"};
    if (round >= 1) {
      botmesh::coordination_options co;
      co.coordinator = std::make_shared<botmesh::memory_coordinator>(
        hub, botmesh::memory_coordinator_options{.replica_id = "a",
                                                 .lease = "1s"});
      o.coordination = co;
    }
    if (round == 2)
      o.durability = botmesh::durability_options{
        .backend = std::make_shared<botmesh::memory_durable_backend>(),
        .instance_id = "r1",
        .lease = "300ms"};
    {
      botmesh::bot b{sys, std::move(o)};
      if (round == 2)
        b.every(5ms, [] {});
      b.on_message([](botmesh::context& c) { c.reply("ok"); });
      b.start();
      for (int i = 0; i < 200; ++i)
        p->inject("chat-" + std::to_string(i), "hola");
      REQUIRE(p->wait_for_sent(200, 10s));
    }
    CAPTURE(round);
    CHECK(sys.registry().running() == before);
  }
}

TEST_CASE("a normal exit sent to the router ends nothing, and the bot "
          "still stops") {
  auto p = make_provider();
  std::atomic<int> handled{0};
  auto b = std::make_unique<botmesh::bot>(botmesh::bot_options{.provider = p});
  b->on_message([&](botmesh::context&) { ++handled; });
  b->start();
  p->inject("ana", "uno");
  REQUIRE(test::eventually([&] { return handled.load() == 1; }));
  // What an actor linked to the router sends when it ends normally. Before,
  // the router passed it on to its chats (which ignore it) and waited for
  // them for good: later messages were refused and the stop hung.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  caf::anon_send_exit(b->router(), caf::exit_reason::normal);
#pragma GCC diagnostic pop
  p->inject("ana", "dos");
  CHECK(test::eventually([&] { return handled.load() == 2; }));
  test::reset_or_abort(b, 30s, "the bot's destructor hangs after a normal "
                               "exit sent to its router");
}

TEST_CASE("two messages whose chat and id join alike are both handled, not "
          "one taken for the other's duplicate") {
  auto p = make_provider();
  std::atomic<int> handled{0};
  botmesh::bot b{{.provider = p}};
  b.on_message([&](botmesh::context&) { ++handled; });
  b.start();
  // A custom provider's chat ids and message ids may hold the separator:
  // "a#b" + "c" and "a" + "b#c" joined as one journal id before.
  botmesh::inbound_message m1;
  m1.chat = "a#b";
  m1.id = "c";
  m1.text = "uno";
  botmesh::inbound_message m2;
  m2.chat = "a";
  m2.id = "b#c";
  m2.text = "dos";
  p->inject(m1);
  p->inject(m2);
  CHECK(test::eventually([&] { return handled.load() == 2; }));
  CHECK(b.stats().duplicates == 0);
  p->inject(m2); // a true duplicate still is one
  CHECK(test::eventually([&] { return b.stats().duplicates == 1; }));
  CHECK(handled.load() == 2);
  b.stop();
}

TEST_CASE("bot options are checked when the bot is created") {
  try {
    botmesh::bot b{botmesh::bot_options{}};
    FAIL("a bot without provider was created");
  } catch (const botmesh::invalid_argument_error& e) {
    CHECK(e.field() == "provider");
  }
  CHECK_THROWS_AS((botmesh::bot{{.provider = make_provider(),
                                 .max_pending_per_chat = 0}}),
                  botmesh::invalid_argument_error);
  auto p = make_provider();
  botmesh::bot b{{.provider = p}};
  b.start();
  CHECK_THROWS_AS(b.on_message([](botmesh::context&) {}),
                  botmesh::invalid_argument_error);
}

TEST_CASE("a bot's scheduled tasks run while it runs and pause when it stops") {
  auto p = make_provider();
  auto store = std::make_shared<botmesh::memory_schedule_store>();
  std::atomic<int> beats{0};
  botmesh::bot b{{.provider = p, .scheduler = {.store = store, .tick = "20ms"}}};
  b.every(10ms, [&] { ++beats; });
  auto durable = b.every("1h", {.id = "informe"},
                         [](const botmesh::scheduled_run&) {});
  // Durable ids get the bot's namespace: bot id (empty), provider id and
  // connection id (empty).
  CHECK(store->get(":test::informe").has_value());
  CHECK(durable.id() == "informe");
  b.start();
  REQUIRE(test::eventually([&] { return beats.load() >= 3; }));
  b.stop();
  auto after_stop = beats.load();
  std::this_thread::sleep_for(50ms);
  CHECK(beats.load() == after_stop);
  CHECK(b.forget_task("informe"));
  CHECK(store->get(":test::informe")->deleted);
}

TEST_CASE("two bots with the same provider on one schedule store collide "
          "neither on task ids nor on the leader lease") {
  // The lease provider records which owner took which lease.
  struct recording_lease final : botmesh::lease_provider {
    botmesh::memory_lease_provider inner;
    std::mutex mtx;
    std::map<std::string, std::set<std::string>> taken; // owner -> names
    std::optional<std::uint64_t> try_acquire(std::string_view name,
                                             std::string_view owner,
                                             botmesh::time_point now,
                                             std::chrono::milliseconds ttl) override {
      auto r = inner.try_acquire(name, owner, now, ttl);
      if (r) {
        std::lock_guard guard{mtx};
        taken[std::string{owner}].insert(std::string{name});
      }
      return r;
    }
    void release(std::string_view name, std::string_view owner) override {
      inner.release(name, owner);
    }
    std::set<std::string> names_of(const std::string& owner) {
      std::lock_guard guard{mtx};
      return taken[owner];
    }
  };
  auto store = std::make_shared<botmesh::memory_schedule_store>();
  auto lease = std::make_shared<recording_lease>();
  auto make = [&](std::string bot_id, std::string owner) {
    return std::make_unique<botmesh::bot>(botmesh::bot_options{
      .provider = make_provider(),
      .scheduler = {.store = store, .lease = lease, .owner = std::move(owner),
                    .tick = "10ms", .leader_ttl = "5s"},
      .bot_id = std::move(bot_id)});
  };
  auto shop = make("shop", "owner-shop");
  auto news = make("news", "owner-news");
  std::atomic<int> shop_runs{0};
  std::atomic<int> news_runs{0};
  shop->delay(0ms, {.id = "informe", .missed = botmesh::missed_policy::run_once},
              [&](const botmesh::scheduled_run& r) {
                CHECK(r.task_id == "informe");
                ++shop_runs;
              });
  news->delay(0ms, {.id = "informe", .missed = botmesh::missed_policy::run_once},
              [&](const botmesh::scheduled_run&) { ++news_runs; });
  auto shop_ns = botmesh::task_namespace("shop", "test", "");
  auto news_ns = botmesh::task_namespace("news", "test", "");
  CHECK(shop_ns == "shop:test:");
  REQUIRE(store->get(shop_ns + ":informe"));
  REQUIRE(store->get(news_ns + ":informe"));
  CHECK(store->list().size() == 2);
  shop->start();
  news->start();
  // Both one-shots run, each in its own bot: one row each.
  REQUIRE(test::eventually([&] { return shop_runs == 1 && news_runs == 1; }));
  REQUIRE(test::eventually([&] {
    return store->get(shop_ns + ":informe")->done
           && store->get(news_ns + ":informe")->done;
  }));
  // Each bot leads its own scheduler, under its own lease name.
  CHECK(lease->names_of("owner-shop")
        == std::set<std::string>{shop_ns + ":scheduler:leader"});
  CHECK(lease->names_of("owner-news")
        == std::set<std::string>{news_ns + ":scheduler:leader"});
  shop->stop();
  news->stop();
  CHECK(shop_runs == 1);
  CHECK(news_runs == 1);
}

TEST_CASE("the task namespace keeps bot id, provider and connection apart") {
  using botmesh::task_namespace;
  CHECK(task_namespace("shop", "telegram", "123") == "shop:telegram:123");
  // A ':' inside a part cannot make two triples meet.
  CHECK(task_namespace("a:b", "c", "") != task_namespace("a", "b:c", ""));
  CHECK(task_namespace("a:b", "c", "") == "a%3Ab:c:");
  CHECK(task_namespace("a%3Ab", "c", "") == "a%253Ab:c:");
  CHECK(task_namespace("", "test", "") == ":test:");
  // The provider's connection id is part of it.
  botmesh::testing_provider p{{.id = "wa", .connection_id = "555"}};
  CHECK(p.connection_id() == "555");
}

TEST_CASE("run() drains and returns 0 on SIGTERM, and a bot runs only once") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p}};
  std::atomic<bool> in_handler{false};
  std::atomic<bool> finished{false};
  b.on_message([&](botmesh::context& c) {
    in_handler = true;
    std::this_thread::sleep_for(300ms); // still running when SIGTERM comes
    c.reply("done " + c.text());
    finished = true;
  });
  std::atomic<int> rc{-1};
  std::thread runner{[&] { rc = b.run(); }};
  REQUIRE(b.ready(5s));
  p->inject("x", "slow");
  REQUIRE(test::eventually([&] { return in_handler.load(); }));
  std::raise(SIGTERM); // the handler run() installed takes it
  runner.join();
  CHECK(rc == 0);
  // The turn in progress was drained, not cut.
  CHECK(finished);
  REQUIRE(p->sent().size() == 1);
  CHECK(p->sent()[0].text == "done slow");
  CHECK_THROWS_AS(b.run(), botmesh::error);
  botmesh::bot other{{.provider = std::make_shared<botmesh::testing_provider>()}};
  other.start();
  other.stop();
  CHECK_THROWS_AS(other.run(), botmesh::error);
}

TEST_CASE("a handler that stops its own bot: stop() returns at once, run() "
          "returns, and what came after is refused") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .stop_timeout = "2s"}};
  std::atomic<bool> returned{false};
  b.command("apagar", [&](botmesh::context& c) {
    c.reply("adiós");
    b.stop(); // waits for this very handler: must not
    returned = true;
  });
  b.on_message([&](botmesh::context& c) { c.reply("eco " + c.text()); });
  std::atomic<int> rc{-1};
  std::thread runner{[&] { rc = b.run(); }};
  REQUIRE(b.ready(5s));
  p->inject("x", "/apagar");
  // Before, the handler waited for the pool it runs on: run() never
  // returned.
  REQUIRE(test::eventually([&] { return rc.load() == 0; }, 10s));
  runner.join();
  CHECK(returned);
  REQUIRE(p->sent().size() == 1);
  CHECK(p->sent()[0].text == "adiós");
  CHECK_THROWS_AS(p->inject("x", "hola"), botmesh::error);
  CHECK(p->sent().size() == 1);
  b.stop(); // idempotent, from another thread
}

TEST_CASE("a scheduled task that stops its own bot ends the stop") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p}};
  std::atomic<bool> returned{false};
  b.start();
  b.delay("10ms", [&] {
    b.stop();
    returned = true;
  });
  REQUIRE(test::eventually([&] { return returned.load(); }, 10s));
  b.stop(); // waits for the stop the task began
  CHECK_THROWS_AS(p->inject("x", "hola"), botmesh::error);
}

TEST_CASE("a start() whose transport cannot start leaves the bot not "
          "started, and start() again tries again") {
  std::atomic<int> attempts{0};
  auto p = std::make_shared<botmesh::testing_provider>(
    botmesh::testing_provider::options{.on_start = [&] {
      if (attempts++ == 0)
        throw botmesh::error(errc::provider_error, "port 8443 is in use");
    }});
  botmesh::bot b{{.provider = p}};
  std::atomic<int> handled{0};
  b.on_message([&](botmesh::context&) { ++handled; });
  CHECK_THROWS_WITH(b.start(), doctest::Contains("port 8443 is in use"));
  CHECK_FALSE(b.ready(0ms));
  // Before, the first start() had marked the bot started: this one
  // returned at once, and the transport never started.
  b.start();
  CHECK(attempts.load() == 2);
  REQUIRE(b.ready(5s));
  p->inject("c", "hola");
  CHECK(test::eventually([&] { return handled.load() == 1; }));
  b.stop();
}

TEST_CASE("a start() that fails in an application's actor system leaves "
          "none of the actors it spawned behind") {
  caf::actor_system_config cfg;
  botmesh::configure_actor_system(cfg);
  caf::actor_system sys{cfg};
  std::atomic<int> attempts{0};
  auto p = std::make_shared<botmesh::testing_provider>(
    botmesh::testing_provider::options{.on_start = [&] {
      if (attempts++ == 0)
        throw botmesh::error(errc::provider_error, "port 8443 is in use");
    }});
  botmesh::bot b{sys, {.provider = p}};
  std::atomic<int> handled{0};
  b.on_message([&](botmesh::context&) { ++handled; });
  auto before = sys.registry().running();
  CHECK_THROWS(b.start());
  // Before, the router was only told to exit: a start() made again at once
  // met it still running, beside the new one.
  CHECK(sys.registry().running() == before);
  b.start();
  p->inject("c", "hola");
  CHECK(test::eventually([&] { return handled.load() == 1; }));
  b.stop();
}

TEST_CASE("a transport whose stop() throws does not keep the bot from "
          "stopping and going") {
  std::atomic<bool> thrown{false};
  auto p = std::make_shared<botmesh::testing_provider>(
    botmesh::testing_provider::options{.on_stop = [&] {
      if (!thrown.exchange(true))
        throw std::runtime_error("the socket is gone already");
    }});
  auto b = std::make_unique<botmesh::bot>(botmesh::bot_options{.provider = p});
  b->start();
  REQUIRE(b->ready(5s));
  // Before, the throw left the router running and the bot stopped for
  // good: its own actor system waited for the router in the destructor.
  CHECK_NOTHROW(b->stop());
  CHECK(thrown.load());
  test::reset_or_abort(b, 20s, "the bot's destructor hangs after a throwing stop()");
}
