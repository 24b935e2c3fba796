// The bot as a typed actor in an application's actor system (issue 15):
// requests answered once accepted, refusals as botmesh errors, duplicates,
// subscriptions to outgoing messages and events, dead subscribers, stop.

#include <doctest/doctest.h>

#include <atomic>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include <caf/all.hpp>

#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/runtime/core/caf_error.hpp>
#include <botmesh/stores/memory_coordinator.hpp>
#include <botmesh/stores/memory_durable_backend.hpp>

#include "gated_backend.hpp"
#include "test_util.hpp"

using namespace std::chrono_literals;
using botmesh::errc;

namespace {

caf::actor_system_config& configured(caf::actor_system_config& cfg) {
  botmesh::configure_actor_system(cfg);
  return cfg;
}

// An application's actor system, set up as the README says.
struct app {
  caf::actor_system_config cfg;
  caf::actor_system sys{configured(cfg)};
};

botmesh::inbound_message msg(std::string chat, std::string text,
                             std::string id = {}) {
  botmesh::inbound_message m;
  m.chat = chat;
  m.sender = std::move(chat);
  m.text = std::move(text);
  m.id = std::move(id);
  return m;
}

// A request through the typed interface, waited for by a scoped actor.
caf::expected<botmesh::delivery_receipt>
deliver(caf::scoped_actor& self, const botmesh::bot& b,
        botmesh::inbound_message m) {
  caf::expected<botmesh::delivery_receipt> out{caf::error{}};
  self->request(b.actor(), 5s, std::move(m))
    .receive([&](botmesh::delivery_receipt& r) { out = std::move(r); },
             [&](caf::error& e) { out = std::move(e); });
  return out;
}

botmesh::durability_options
durable(std::shared_ptr<botmesh::durable_backend> backend) {
  return botmesh::durability_options{
    .backend = std::move(backend), .instance_id = "r1", .lease = "300ms"};
}

bool subscribe(caf::scoped_actor& self, const botmesh::bot& b,
               const caf::actor& who,
               std::uint32_t topics = botmesh::topics::all) {
  bool fresh = false;
  self->request(b.actor(), 5s, botmesh::subscribe_atom::value, who, topics)
    .receive([&](bool r) { fresh = r; },
             [&](caf::error& e) { FAIL(to_string(e)); });
  return fresh;
}

} // namespace

TEST_CASE("an application actor's request is answered once the bot accepted "
          "the message, with the id the bot stamped") {
  app a;
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{a.sys, {.provider = p}};
  b.on_message([](botmesh::context& c) { c.reply("re " + c.text()); });
  b.start();
  struct answer {
    botmesh::delivery_receipt receipt;
    std::uint64_t received_then = 0; // the bot's counter when it came
  };
  std::promise<answer> got;
  // An event-based actor of the application: request(...).then(...).
  a.sys.spawn([&, bot = b.actor()](caf::event_based_actor* self) {
    self->request(bot, 5s, msg("ana", "hola"))
      .then(
        [&](const botmesh::delivery_receipt& r) {
          got.set_value(answer{r, b.stats().received});
        },
        [&](caf::error& e) {
          got.set_exception(std::make_exception_ptr(
            std::runtime_error(a.sys.render(e))));
        });
  });
  auto f = got.get_future();
  REQUIRE(f.wait_for(5s) == std::future_status::ready);
  auto r = f.get();
  // Counted before the answer left.
  CHECK(r.received_then == 1);
  CHECK_FALSE(r.receipt.duplicate);
  CHECK(r.receipt.id.starts_with("test-"));
  REQUIRE(p->wait_for_sent(1, 5s));
  // The reply answers the id the receipt gave.
  CHECK(p->sent()[0].reply_to == r.receipt.id);
  CHECK(p->sent()[0].text == "re hola");
}

TEST_CASE("with durability the bot's actor answers only after the journal "
          "write landed") {
  app a;
  auto backend = std::make_shared<test::gated_backend>();
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{a.sys, {.provider = p, .durability = durable(backend)}};
  b.on_message([](botmesh::context& c) { c.reply("ok"); });
  b.start();
  std::promise<botmesh::delivery_receipt> got;
  a.sys.spawn([&, bot = b.actor()](caf::event_based_actor* self) {
    self->request(bot, 10s, msg("ana", "hola", "m1"))
      .then([&](const botmesh::delivery_receipt& r) { got.set_value(r); },
            [&](caf::error& e) {
              got.set_exception(std::make_exception_ptr(
                std::runtime_error(a.sys.render(e))));
            });
  });
  // The write is held by the backend: the request reached the bot, which
  // has not accepted it yet.
  REQUIRE(test::eventually([&] {
    std::lock_guard guard{backend->mtx};
    return backend->held.size() == 1;
  }));
  auto f = got.get_future();
  CHECK(f.wait_for(0s) != std::future_status::ready);
  CHECK(b.stats().received == 0);
  backend->open();
  REQUIRE(f.wait_for(5s) == std::future_status::ready);
  auto r = f.get();
  CHECK(r.id == "m1");
  CHECK_FALSE(r.duplicate);
  CHECK(b.stats().received == 1);
  REQUIRE(p->wait_for_sent(1, 5s));
}

TEST_CASE("with durability a failed journal write comes back as a "
          "store_error the application can retry") {
  app a;
  auto backend = std::make_shared<test::gated_backend>();
  backend->open();
  backend->fail_records = true;
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{a.sys, {.provider = p, .durability = durable(backend)}};
  b.on<botmesh::events::error>([](const botmesh::events::error&) {});
  b.on_message([](botmesh::context& c) { c.reply("ok"); });
  b.start();
  caf::scoped_actor self{a.sys};
  auto r = deliver(self, b, msg("ana", "hola", "m1"));
  REQUIRE_FALSE(r);
  CHECK(botmesh::code_of(r.error()) == errc::store_error);
  CHECK(botmesh::retry_later(botmesh::code_of(r.error())));
  backend->fail_records = false;
  auto again = deliver(self, b, msg("ana", "hola", "m1"));
  REQUIRE(again);
  CHECK(again->id == "m1");
  REQUIRE(p->wait_for_sent(1, 5s));
}

TEST_CASE("with durability a message held behind a failed journal write "
          "answers its actor with the id the bot stamped, and runs after "
          "the retry") {
  app a;
  auto backend = std::make_shared<test::gated_backend>();
  backend->open();
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{a.sys, {.provider = p, .durability = durable(backend)}};
  b.on<botmesh::events::error>([](const botmesh::events::error&) {});
  b.on_message([](botmesh::context& c) { c.reply(c.text()); });
  b.start();
  caf::scoped_actor self{a.sys};
  std::optional<caf::expected<botmesh::delivery_receipt>> held;
  {
    // No beat comes meanwhile: dos is recorded under the generation m1's
    // write failed in, and left to the claim that retires it.
    test::gated_backend::beats_pause pause{*backend};
    backend->fail_next_records = 1;
    auto first = deliver(self, b, msg("ana", "uno", "m1"));
    REQUIRE_FALSE(first);
    CHECK(botmesh::code_of(first.error()) == errc::store_error);
    held = deliver(self, b, msg("ana", "dos")); // no id: the bot stamps one
    REQUIRE(*held);
    CHECK((**held).id.starts_with("test-"));
    CHECK(p->sent().empty()); // held behind m1
    auto again = deliver(self, b, msg("ana", "uno", "m1"));
    REQUIRE(again);
    REQUIRE(p->wait_for_sent(1, 5s));
  }
  REQUIRE(p->wait_for_sent(2, 5s));
  auto sent = p->sent();
  REQUIRE(sent.size() == 2);
  CHECK(sent[0].text == "uno");
  CHECK(sent[1].text == "dos");
  CHECK(sent[1].reply_to == (**held).id);
}

TEST_CASE("a refused message comes back as a botmesh error naming the field, "
          "runs no handler and counts as refused") {
  app a;
  auto p = std::make_shared<botmesh::testing_provider>();
  std::atomic<int> handled{0};
  test::error_log errors;
  botmesh::bot b{a.sys, {.provider = p, .limits = {.max_text_bytes = 100}}};
  errors.attach(b);
  b.on_message([&](botmesh::context& c) {
    ++handled;
    c.reply("ok " + c.text());
  });
  b.start();
  caf::scoped_actor self{a.sys};
  auto no_chat = deliver(self, b, msg("", "sin chat"));
  REQUIRE_FALSE(no_chat);
  CHECK(no_chat.error().category() == botmesh::error_category::value);
  CHECK(botmesh::code_of(no_chat.error()) == errc::invalid_argument);
  CHECK(botmesh::what_of(no_chat.error()).find("\"chat\"")
        != std::string::npos);
  // Rendered by name: configure_actor_system registered the category.
  CHECK(a.sys.render(no_chat.error())
          .starts_with("botmesh.invalid_argument: "));
  auto too_long = deliver(self, b, msg("ana", std::string(101, 'x')));
  REQUIRE_FALSE(too_long);
  CHECK(botmesh::code_of(too_long.error()) == errc::invalid_argument);
  CHECK(botmesh::what_of(too_long.error()).find("text is 101 bytes")
        != std::string::npos);
  // The same refusals raised their error events (on the handler pool).
  CHECK(test::eventually([&] { return errors.count(errc::invalid_argument) == 2; }));
  auto ok = deliver(self, b, msg("ana", "uno"));
  REQUIRE(ok);
  REQUIRE(p->wait_for_sent(1, 5s));
  b.stop(); // every accepted turn ended
  CHECK(handled == 1);
  CHECK(p->sent().size() == 1);
  auto st = b.stats();
  CHECK(st.refused_invalid == 2);
  CHECK(st.received == 1);
}

TEST_CASE("a redelivered platform id is answered as a duplicate and runs no "
          "second turn") {
  app a;
  auto p = std::make_shared<botmesh::testing_provider>();
  std::atomic<int> handled{0};
  botmesh::bot_options opts{.provider = p};
  SUBCASE("without durability") {}
  SUBCASE("with durability") {
    opts.durability =
      durable(std::make_shared<botmesh::memory_durable_backend>());
  }
  botmesh::bot b{a.sys, opts};
  b.on_message([&](botmesh::context& c) {
    ++handled;
    c.reply("ok");
  });
  b.start();
  caf::scoped_actor self{a.sys};
  auto first = deliver(self, b, msg("ana", "hola", "wamid.1"));
  auto second = deliver(self, b, msg("ana", "hola", "wamid.1"));
  REQUIRE(first);
  REQUIRE(second);
  CHECK(*first == botmesh::delivery_receipt{"wamid.1", false});
  CHECK(*second == botmesh::delivery_receipt{"wamid.1", true});
  REQUIRE(p->wait_for_sent(1, 5s));
  b.stop();
  CHECK(handled == 1);
  CHECK(b.stats().duplicates == 1);
  CHECK(b.stats().received == 1);
}

TEST_CASE("a subscriber gets the bot's outgoing messages and events as CAF "
          "messages, in each turn's order") {
  app a;
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{a.sys, {.provider = p}};
  b.on_message([](botmesh::context& c) { c.reply("re " + c.text()); });
  caf::scoped_actor sub{a.sys};
  // Before start(): the actor exists with the bot.
  CHECK(subscribe(sub, b, caf::actor{sub}));
  CHECK_FALSE(subscribe(sub, b, caf::actor{sub})); // already: topics replaced
  b.start();
  auto r = deliver(sub, b, msg("ana", "hola"));
  REQUIRE(r);
  std::vector<std::string> seen;
  auto next = [&] {
    sub->receive(
      [&](const botmesh::message_in_event& e) {
        CHECK(e.key == "test:ana");
        CHECK(e.message.id == r->id);
        seen.push_back("in " + e.message.text);
      },
      [&](const botmesh::outgoing_message& m) {
        CHECK(m.provider == "test");
        CHECK(m.chat == "ana");
        if (!m.reply_to.empty())
          CHECK(m.reply_to == r->id);
        seen.push_back("out " + m.text);
      },
      [&](const botmesh::events::error& e) {
        seen.push_back(std::string{"error "}
                       + std::string{botmesh::to_string(e.code)});
        CHECK(e.what.find("\"chat\"") != std::string::npos);
        REQUIRE(e.message.has_value());
        CHECK(e.message->text == "sin chat");
      },
      caf::after(10s) >> [&] { seen.push_back("timeout"); });
  };
  next();
  next();
  CHECK(seen == std::vector<std::string>{"in hola", "out re hola"});
  // A refusal is an error event too; bot.send() is an outgoing message.
  REQUIRE_FALSE(deliver(sub, b, msg("", "sin chat")));
  next();
  b.send("ana", "aviso");
  next();
  CHECK(seen
        == std::vector<std::string>{"in hola", "out re hola",
                                    "error invalid_argument", "out aviso"});
}

TEST_CASE("a subscriber hears only its topics, and the coordination events "
          "of an exclusive transport") {
  app a;
  botmesh::memory_coordination_hub hub;
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::coordination_options co;
  co.coordinator = std::make_shared<botmesh::memory_coordinator>(
    hub, botmesh::memory_coordinator_options{.replica_id = "a", .lease = "1s"});
  co.session = botmesh::provider_session::leader;
  botmesh::bot b{a.sys, {.provider = p, .coordination = co}};
  b.on_message([](botmesh::context& c) { c.reply("re " + c.text()); });
  caf::scoped_actor control{a.sys};
  caf::scoped_actor coord_only{a.sys};
  caf::scoped_actor outgoing_only{a.sys};
  // Subscribed first, so the bot sends to it first: by the time the other
  // subscriber has an outgoing message, this one would have it too.
  CHECK(subscribe(control, b, caf::actor{coord_only},
                  botmesh::topics::coordination));
  CHECK(subscribe(control, b, caf::actor{outgoing_only},
                  botmesh::topics::outgoing));
  b.start();
  std::string leader;
  coord_only->receive(
    [&](const botmesh::events::leader& e) { leader = e.name; },
    caf::after(10s) >> [&] { leader = "timeout"; });
  CHECK(leader == "provider:test");
  REQUIRE(b.ready(5s));
  REQUIRE(deliver(control, b, msg("ana", "hola")));
  std::string out;
  outgoing_only->receive(
    [&](const botmesh::outgoing_message& m) { out = m.text; },
    caf::after(10s) >> [&] { out = "timeout"; });
  CHECK(out == "re hola");
  // Neither the outgoing message nor the message_in event reached the
  // coordination subscriber.
  bool other = false;
  coord_only->receive(
    [&](const botmesh::outgoing_message&) { other = true; },
    [&](const botmesh::message_in_event&) { other = true; },
    caf::after(0s) >> [] {});
  CHECK_FALSE(other);
}

TEST_CASE("a subscriber that exits is dropped and the bot goes on without "
          "errors") {
  app a;
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{a.sys, {.provider = p}};
  errors.attach(b);
  b.on_message([](botmesh::context& c) { c.reply("re " + c.text()); });
  b.start();
  auto gone = a.sys.spawn([]() -> caf::behavior {
    return {[](const botmesh::outgoing_message&) {}};
  });
  caf::scoped_actor self{a.sys};
  caf::scoped_actor live{a.sys};
  CHECK(subscribe(self, b, gone, botmesh::topics::outgoing));
  CHECK(subscribe(self, b, caf::actor{live}, botmesh::topics::outgoing));
  self->monitor(gone);
  caf::anon_send_exit(gone, caf::exit_reason::kill);
  bool down = false;
  self->receive([&](const caf::down_msg&) { down = true; },
                caf::after(10s) >> [] {});
  REQUIRE(down);
  // Once the bot saw it exit, it no longer counts it as subscribed: a new
  // subscription of that handle is new again (and dropped again at once).
  CHECK(test::eventually([&] { return subscribe(self, b, gone); }));
  // The bot goes on: the live subscriber gets its message, nothing failed.
  REQUIRE(deliver(self, b, msg("ana", "hola")));
  std::string out;
  live->receive([&](const botmesh::outgoing_message& m) { out = m.text; },
                caf::after(10s) >> [&] { out = "timeout"; });
  CHECK(out == "re hola");
  b.stop();
  CHECK(errors.all().empty());
}

TEST_CASE("subscribing needs an actor and a topic, unsubscribing stops the "
          "messages") {
  app a;
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{a.sys, {.provider = p}};
  b.on_message([](botmesh::context& c) { c.reply("re " + c.text()); });
  b.start();
  caf::scoped_actor self{a.sys};
  caf::error err;
  self->request(b.actor(), 5s, botmesh::subscribe_atom::value, caf::actor{})
    .receive([](bool) {}, [&](caf::error& e) { err = std::move(e); });
  CHECK(botmesh::code_of(err) == errc::invalid_argument);
  CHECK(botmesh::what_of(err).find("\"who\"") != std::string::npos);
  self->request(b.actor(), 5s, botmesh::subscribe_atom::value,
                caf::actor{self}, std::uint32_t{0})
    .receive([](bool) {}, [&](caf::error& e) { err = std::move(e); });
  CHECK(botmesh::code_of(err) == errc::invalid_argument);
  CHECK(botmesh::what_of(err).find("\"topics\"") != std::string::npos);
  caf::scoped_actor sub{a.sys};
  CHECK(subscribe(self, b, caf::actor{sub}, botmesh::topics::outgoing));
  bool was = false;
  self->request(b.actor(), 5s, botmesh::unsubscribe_atom::value,
                caf::actor{sub})
    .receive([&](bool r) { was = r; }, [](caf::error&) {});
  CHECK(was);
  self->request(b.actor(), 5s, botmesh::unsubscribe_atom::value,
                caf::actor{sub})
    .receive([&](bool r) { was = r; }, [](caf::error&) {});
  CHECK_FALSE(was);
  REQUIRE(deliver(self, b, msg("ana", "hola")));
  REQUIRE(p->wait_for_sent(1, 5s));
  b.stop(); // the turn and its events are over
  // The fan-out of the reply (if any) came before the bot's answer to this
  // request: the bot handles its messages in order.
  self->request(b.actor(), 5s, botmesh::unsubscribe_atom::value,
                caf::actor{sub})
    .receive([](bool) {}, [](caf::error&) {});
  bool got = false;
  sub->receive([&](const botmesh::outgoing_message&) { got = true; },
               caf::after(0s) >> [] {});
  CHECK_FALSE(got);
}

TEST_CASE("the listeners of a refusal of what an application's actor "
          "delivered never run on a CAF worker") {
  // One worker: a listener that blocked it would hold every actor.
  caf::actor_system_config cfg;
  botmesh::configure_actor_system(cfg);
  cfg.set("scheduler.max-threads", 1);
  caf::actor_system sys{cfg};
  auto p = std::make_shared<botmesh::testing_provider>();
  std::atomic<int> handled{0};
  std::atomic<bool> listener_ran{false}, go{false};
  botmesh::bot b{sys, {.provider = p}};
  b.on_message([&](botmesh::context&) { ++handled; });
  b.on<botmesh::events::error>([&](const botmesh::events::error&) {
    listener_ran = true;
    test::eventually([&] { return go.load(); }, 30s); // a slow listener
  });
  // The listener goes on before the bot stops, also after a failed REQUIRE.
  std::shared_ptr<void> release{nullptr, [&](void*) { go = true; }};
  caf::scoped_actor self{sys};
  // Before start(): refused, and no listener runs (it would have run on
  // the bot actor's worker, while listeners may still be registered).
  auto early = deliver(self, b, msg("ana", "antes"));
  REQUIRE_FALSE(early);
  CHECK(botmesh::code_of(early.error()) == errc::stopped);
  CHECK_FALSE(listener_ran.load());
  b.start();
  auto refused = deliver(self, b, msg("", "sin chat"));
  REQUIRE_FALSE(refused);
  REQUIRE(test::eventually([&] { return listener_ran.load(); }));
  // The listener still runs: the only CAF worker is free all the same, so
  // the next message gets through the router and its chat actor.
  REQUIRE(deliver(self, b, msg("ana", "uno")));
  CHECK(test::eventually([&] { return handled.load() == 1; }, 5s));
  go = true;
  b.stop();
}

TEST_CASE("requests before start() and after stop() are refused as stopped, "
          "once the bot is destroyed its actor is gone") {
  app a;
  auto p = std::make_shared<botmesh::testing_provider>();
  caf::scoped_actor self{a.sys};
  botmesh::bot_actor handle;
  {
    botmesh::bot b{a.sys, {.provider = p}};
    std::atomic<int> handled{0};
    b.on_message([&](botmesh::context&) { ++handled; });
    b.on<botmesh::events::error>([](const botmesh::events::error&) {});
    handle = b.actor();
    auto early = deliver(self, b, msg("ana", "antes"));
    REQUIRE_FALSE(early);
    CHECK(botmesh::code_of(early.error()) == errc::stopped);
    b.start();
    REQUIRE(deliver(self, b, msg("ana", "durante")));
    b.stop();
    auto late = deliver(self, b, msg("ana", "después"));
    REQUIRE_FALSE(late);
    CHECK(botmesh::code_of(late.error()) == errc::stopped);
    CHECK(a.sys.render(late.error()).starts_with("botmesh.stopped: "));
    CHECK(handled == 1);
    CHECK(b.stats().refused_stopped == 2);
  }
  caf::error err;
  self->request(handle, 5s, msg("ana", "sin bot"))
    .receive([](const botmesh::delivery_receipt&) {},
             [&](caf::error& e) { err = std::move(e); });
  CHECK(err == caf::sec::request_receiver_down);
}

TEST_CASE("a bare inbound_message sent to the router is not taken: only the "
          "bot's validated intake reaches the handlers") {
  app a;
  auto p = std::make_shared<botmesh::testing_provider>();
  std::atomic<int> handled{0};
  botmesh::bot b{a.sys, {.provider = p}};
  b.on_message([&](botmesh::context&) { ++handled; });
  b.start();
  caf::scoped_actor self{a.sys};
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  auto router = b.router();
#pragma GCC diagnostic pop
  caf::error err;
  self->request(router, 5s, msg("", "sin chat"))
    .receive([](bool) {},
             [&](caf::error& e) { err = std::move(e); });
  CHECK(err == caf::sec::unexpected_message);
  b.stop();
  CHECK(handled == 0);
  CHECK(b.stats().received == 0);
}
