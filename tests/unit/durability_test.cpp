// Durable processing in the bot: inbound dedupe, the journal's acks, the
// reprocessing of what a dead replica held, and the outbox.

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <latch>
#include <mutex>
#include <thread>

#include <caf/all.hpp>

#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/stores/memory_coordinator.hpp>
#include <botmesh/stores/memory_durable_backend.hpp>

#include "gated_backend.hpp"
#include "handover/recording_store.hpp"
#include "test_util.hpp"

using namespace std::chrono_literals;
using botmesh::errc;

namespace {

botmesh::inbound_message msg(std::string chat, std::string id,
                             std::string text) {
  botmesh::inbound_message m;
  m.chat = chat;
  m.sender = std::move(chat);
  m.id = std::move(id);
  m.text = std::move(text);
  return m;
}

// Delivers `m` and waits for the bot's answer to the provider: the code it
// accepted or refused the message with.
errc acceptance(botmesh::testing_provider& p, botmesh::inbound_message m) {
  std::atomic<int> code{-1};
  p.inject(std::move(m),
           {.accepted = [&](errc e) { code = static_cast<int>(e); },
            .turn_ended = {}});
  REQUIRE(test::eventually([&] { return code != -1; }));
  return static_cast<errc>(code.load());
}

botmesh::durability_options durable(std::shared_ptr<botmesh::durable_backend> b,
                                    std::string id = "r1") {
  return botmesh::durability_options{.backend = std::move(b),
                                     .instance_id = std::move(id),
                                     .lease = "300ms"};
}

// One replica on `hub` whose steps are cut by settle after 200 ms (lease
// 600 ms).
botmesh::coordination_options cut_by_settle(
  botmesh::memory_coordination_hub& hub) {
  botmesh::coordination_options co;
  co.coordinator = std::make_shared<botmesh::memory_coordinator>(
    hub, botmesh::memory_coordinator_options{.replica_id = "r",
                                             .lease = "600ms"});
  co.settle = "200ms";
  return co;
}

// Records a message in `b` as held by a replica that never beats (dead).
void orphan(botmesh::durable_backend& b, const botmesh::inbound_message& m) {
  botmesh::journal_record rec;
  auto key = botmesh::chat_key("test", m.chat);
  rec.id = botmesh::journal_id(key, m.id);
  rec.key = key;
  auto full = m;
  full.provider = "test";
  full.timestamp = botmesh::clock::system().now();
  rec.message = botmesh::to_json(full);
  std::promise<botmesh::journal_put> p;
  b.record(rec, "dead/0", std::chrono::hours(1),
           [&](botmesh::journal_put v, std::exception_ptr) { p.set_value(v); });
  REQUIRE(p.get_future().get() == botmesh::journal_put::recorded);
}

// A handler: "lento" counts `entered` down and runs until the stop gives up
// on it (the chat's later messages stay queued); any other text goes to
// `seen`, after `prefix`.
std::function<void(botmesh::context&)>
slow_until_stop(std::latch& entered, std::mutex& mtx,
                std::vector<std::string>& seen, std::string prefix = {}) {
  return [&entered, &mtx, &seen, prefix](botmesh::context& c) {
    if (c.text() == "lento") {
      entered.count_down();
      while (!c.stop_token().stop_requested())
        std::this_thread::sleep_for(1ms);
      return;
    }
    std::lock_guard guard{mtx};
    seen.push_back(prefix + c.text());
  };
}

std::vector<std::string> texts(const botmesh::testing_provider& p) {
  std::vector<std::string> out;
  for (auto& m : p.sent())
    out.push_back(m.text);
  return out;
}

} // namespace

TEST_CASE("without durability a redelivered platform message is dropped as a "
          "duplicate and counted") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p}};
  std::atomic<int> handled{0};
  b.on_message([&](botmesh::context& c) {
    ++handled;
    c.reply("ok " + c.text());
  });
  b.start();
  std::vector<botmesh::turn_outcome> ends;
  std::mutex mtx;
  for (int i = 0; i < 3; ++i)
    p->inject(msg("ana", "wamid.1", "hola"),
              {.accepted = [](errc e) { CHECK(e == errc::none); },
               .turn_ended = [&](botmesh::turn_outcome o) {
                 std::lock_guard guard{mtx};
                 ends.push_back(o);
               }});
  p->inject(msg("ana", "wamid.2", "otra"));
  // Ids the bot assigns itself are never duplicates.
  p->inject("ana", "sin id");
  p->inject("ana", "sin id");
  REQUIRE(p->wait_for_sent(4, 5s));
  b.stop();
  CHECK(handled == 4);
  CHECK(b.stats().duplicates == 2);
  CHECK(b.stats().received == 4);
  std::lock_guard guard{mtx};
  CHECK(std::count(ends.begin(), ends.end(), botmesh::turn_outcome::duplicate)
        == 2);
  CHECK(std::count(ends.begin(), ends.end(), botmesh::turn_outcome::handled)
        == 1);
}

TEST_CASE("without durability the same id in two chats is not a duplicate, "
          "and an id is forgotten after the retry window") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .retry_window = "50ms"}};
  b.on_message([&](botmesh::context& c) { c.reply(c.text()); });
  b.start();
  p->inject(msg("ana", "7", "a"));
  p->inject(msg("eva", "7", "b"));
  REQUIRE(p->wait_for_sent(2, 5s));
  std::this_thread::sleep_for(100ms); // past the window
  p->inject(msg("ana", "7", "c"));
  REQUIRE(p->wait_for_sent(3, 5s));
  CHECK(b.stats().duplicates == 0);
}

TEST_CASE("without durability an edit is not taken for a message whose id "
          "spells the edit's delivery, and its redelivery still is") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p}};
  b.on_message([&](botmesh::context& c) { c.reply(c.text()); });
  b.start();
  // A custom provider's id holding the edit separator: message "a~b", and
  // message "a" edited as "b". Each is a delivery of its own.
  p->inject(msg("ana", "a~b", "one"));
  auto edit = msg("ana", "a", "two");
  edit.edited = true;
  edit.edit_id = "b";
  p->inject(edit);
  REQUIRE(p->wait_for_sent(2, 5s));
  p->inject(edit); // a redelivery of the edit is still one
  p->inject(msg("ana", "a~b", "one"));
  p->inject(msg("ana", "end", "end"));
  REQUIRE(p->wait_for_sent(3, 5s));
  b.stop();
  CHECK(texts(*p) == std::vector<std::string>{"one", "two", "end"});
  CHECK(b.stats().duplicates == 2);
}

TEST_CASE("a bot_id that is not UTF-8 is refused, naming it (it would make "
          "every metrics scrape invalid)") {
  auto p = std::make_shared<botmesh::testing_provider>();
  try {
    botmesh::bot b{{.provider = p, .bot_id = "caf\xe9"}};
    FAIL("accepted");
  } catch (const botmesh::invalid_argument_error& e) {
    CHECK(e.field() == "bot_id");
  }
  CHECK_NOTHROW(botmesh::bot{{.provider = p, .bot_id = "café"}});
}

TEST_CASE("a provider retry window over 100 years is refused, naming it") {
  botmesh::testing_provider::options o;
  o.capabilities.retry_window = std::chrono::milliseconds::max();
  auto p = std::make_shared<botmesh::testing_provider>(o);
  try {
    botmesh::bot b{{.provider = p}};
    FAIL("accepted");
  } catch (const botmesh::invalid_argument_error& e) {
    CHECK(e.field() == "retry_window");
    CHECK(std::string{e.what()}.find("over 100 years") != std::string::npos);
  }
}

TEST_CASE("with durability the provider hears a message was accepted only "
          "after its journal write landed") {
  auto backend = std::make_shared<test::gated_backend>();
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .durability = durable(backend)}};
  b.on_message([&](botmesh::context& c) { c.reply("ok"); });
  b.start();
  std::atomic<int> accepted{0};
  p->inject(msg("ana", "m1", "hola"),
            {.accepted = [&](errc e) {
               CHECK(e == errc::none);
               ++accepted;
             },
             .turn_ended = {}});
  // Not journaled yet: not accepted, not handled.
  CHECK(accepted == 0);
  CHECK(b.stats().received == 0);
  CHECK(p->sent().empty());
  backend->open();
  REQUIRE(p->wait_for_sent(1, 5s));
  CHECK(accepted == 1);
  CHECK(b.stats().received == 1);
}

TEST_CASE("with durability a failed journal write refuses the message with "
          "store_error so the platform retries") {
  auto backend = std::make_shared<test::gated_backend>();
  backend->open();
  backend->fail_records = true;
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p, .durability = durable(backend)}};
  errors.attach(b);
  b.on_message([&](botmesh::context& c) { c.reply("ok"); });
  b.start();
  CHECK(acceptance(*p, msg("ana", "m1", "hola")) == errc::store_error);
  REQUIRE(test::eventually([&] { return errors.count(errc::store_error) == 1; }));
  CHECK(errors.all()[0].what.find("simulated journal failure")
        != std::string::npos);
  CHECK(b.stats().journal_errors == 1);
  CHECK(b.stats().received == 0);
  // The retry, once the journal works again, is handled.
  backend->fail_records = false;
  p->inject(msg("ana", "m1", "hola"));
  REQUIRE(p->wait_for_sent(1, 5s));
}

TEST_CASE("with durability a bot whose first beat failed refuses messages "
          "until a beat lands: no record is held without a heartbeat") {
  auto backend = std::make_shared<test::gated_backend>();
  backend->open();
  backend->fail_beats = true;
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p, .durability = test::durable_over(backend)}};
  errors.attach(b);
  b.on_message([&](botmesh::context& c) { c.reply("ok"); });
  b.start();
  CHECK(acceptance(*p, msg("ana", "m1", "hola")) == errc::store_error);
  // (Error events reach listeners through the handler pool: waited for.)
  CHECK(test::eventually([&] {
    for (auto& e : errors.all())
      if (e.code == errc::store_error
          && e.what.find("no heartbeat") != std::string::npos)
        return true;
    return false;
  }));
  CHECK(backend->inner.size() == 0); // nothing recorded
  // A beat lands (every 100 ms here): the platform's retry is handled.
  backend->fail_beats = false;
  REQUIRE(test::eventually([&] {
    auto c = std::make_shared<std::atomic<int>>(-1);
    p->inject(msg("ana", "m1", "hola"),
              {.accepted = [c](errc e) { *c = static_cast<int>(e); },
               .turn_ended = {}});
    test::eventually([&] { return *c != -1; });
    return *c == static_cast<int>(errc::none);
  }));
  REQUIRE(p->wait_for_sent(1, 5s));
  b.stop();
}

TEST_CASE("with a shared durable backend the same platform id delivered to "
          "two replicas at once is handled once") {
  botmesh::memory_coordination_hub hub;
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  auto store = std::make_shared<botmesh::memory_store>();
  struct replica {
    std::shared_ptr<botmesh::testing_provider> p =
      std::make_shared<botmesh::testing_provider>();
    std::unique_ptr<botmesh::bot> b;
    std::atomic<int> handled{0};
  };
  replica r[2];
  for (int i = 0; i < 2; ++i) {
    botmesh::coordination_options co;
    co.coordinator = std::make_shared<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = "r" + std::to_string(i)});
    r[i].b = std::make_unique<botmesh::bot>(botmesh::bot_options{
      .provider = r[i].p, .store = store, .coordination = co,
      .durability = durable(backend, "r" + std::to_string(i))});
    r[i].b->on_message([&r, i](botmesh::context& c) {
      ++r[i].handled;
      c.reply("ok " + c.text());
    });
    r[i].b->start();
  }
  constexpr int n = 50;
  std::latch go{2};
  std::vector<std::thread> ts;
  for (int i = 0; i < 2; ++i)
    ts.emplace_back([&, i] {
      go.arrive_and_wait();
      for (int k = 0; k < n; ++k)
        r[i].p->inject(msg("c" + std::to_string(k % 5), "id" + std::to_string(k),
                           std::to_string(k)));
    });
  for (auto& t : ts)
    t.join();
  REQUIRE(test::eventually(
    [&] { return r[0].handled + r[1].handled == n; }));
  for (auto& x : r)
    x.b->stop();
  CHECK(r[0].handled + r[1].handled == n);
  CHECK(r[0].b->stats().duplicates + r[1].b->stats().duplicates == n);
  CHECK(r[0].p->sent().size() + r[1].p->sent().size() == n);
}

TEST_CASE("with durability the records of a dead replica are claimed and "
          "handled by a live one, in arrival order, and then confirmed") {
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  for (auto [id, text] : {std::pair{"m1", "uno"}, {"m2", "dos"}, {"m3", "tres"}})
    orphan(*backend, msg("ana", id, text));
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .durability = durable(backend)}};
  b.on_message([&](botmesh::context& c) { c.reply(c.text()); });
  b.start();
  REQUIRE(p->wait_for_sent(3, 5s));
  CHECK(texts(*p) == std::vector<std::string>{"uno", "dos", "tres"});
  CHECK(b.stats().reprocessed == 3);
  // Confirmed: a redelivery is a duplicate, and nobody claims them again.
  p->inject(msg("ana", "m2", "dos"));
  REQUIRE(test::eventually([&] { return b.stats().duplicates == 1; }));
  b.stop();
  std::promise<botmesh::durable_backend::claim_result> pr;
  backend->beat_and_claim("other/1", 1s, 100, 5,
                          [&](auto r, std::exception_ptr) { pr.set_value(r); });
  CHECK(pr.get_future().get().records.empty());
  CHECK(texts(*p).size() == 3);
}

// A provider that is slow to start: sends before its start returned fail.
class slow_start_provider final : public botmesh::provider {
 public:
  std::shared_ptr<botmesh::testing_provider> inner =
    std::make_shared<botmesh::testing_provider>();
  std::string id() const override { return inner->id(); }
  botmesh::provider_state state() const override { return inner->state(); }
  void start(botmesh::provider_host& host) override {
    std::this_thread::sleep_for(200ms);
    inner->start(host);
  }
  void stop() override { inner->stop(); }
  void send(const botmesh::outgoing_message& m) override { inner->send(m); }
};

TEST_CASE("with durability the records taken over at start are handled only "
          "once the provider can send") {
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  orphan(*backend, msg("ana", "m1", "uno"));
  orphan(*backend, msg("bea", "m2", "dos"));
  auto p = std::make_shared<slow_start_provider>();
  botmesh::bot b{{.provider = p, .durability = durable(backend)}};
  test::error_log errors;
  errors.attach(b);
  b.on_message([&](botmesh::context& c) { c.reply(c.text()); });
  b.start();
  REQUIRE(p->inner->wait_for_sent(2, 5s));
  b.stop();
  CHECK(errors.all().empty());
  CHECK(b.stats().reprocessed == 2);
}

// A provider whose transport fails to start.
class failing_start_provider final : public botmesh::provider {
 public:
  std::string id() const override { return "test"; }
  botmesh::provider_state state() const override {
    return botmesh::provider_state::closed;
  }
  void start(botmesh::provider_host&) override {
    throw botmesh::error(errc::provider_error, "cannot bind");
  }
  void stop() override {}
  void send(const botmesh::outgoing_message&) override {
    throw botmesh::error(errc::provider_error, "transport is closed");
  }
};

TEST_CASE("a transport that fails to start fails start(), takes no record "
          "over, and the bot still stops") {
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  orphan(*backend, msg("ana", "m1", "uno"));
  auto p = std::make_shared<failing_start_provider>();
  botmesh::bot b{{.provider = p, .durability = durable(backend)}};
  b.on_message([&](botmesh::context& c) { c.reply(c.text()); });
  CHECK_THROWS_WITH(b.start(), doctest::Contains("cannot bind"));
  std::this_thread::sleep_for(300ms); // three beat periods
  CHECK(b.stats().reprocessed == 0);
  b.stop();
  // Still there for a replica whose transport works.
  std::promise<botmesh::durable_backend::claim_result> pr;
  backend->beat_and_claim("other/1", 1s, 100, 5,
                          [&](auto r, std::exception_ptr) { pr.set_value(r); });
  CHECK(pr.get_future().get().records.size() == 1);
}

TEST_CASE("with durability the standby of an exclusive transport takes no "
          "records over until it leads") {
  botmesh::memory_coordination_hub hub;
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  struct replica {
    std::shared_ptr<botmesh::testing_provider> p;
    std::unique_ptr<botmesh::bot> b;
    test::error_log errors;
  };
  auto make = [&](replica& r, std::string id, bool durable_on) {
    r.p = std::make_shared<botmesh::testing_provider>(
      botmesh::testing_provider::options{
        .id = "wa", .capabilities = {.exclusive_session = true}});
    botmesh::coordination_options co;
    co.coordinator = std::make_shared<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = id, .lease = "1s"});
    botmesh::bot_options o{.provider = r.p, .coordination = co};
    if (durable_on)
      o.durability = durable(backend, id);
    r.b = std::make_unique<botmesh::bot>(std::move(o));
    r.errors.attach(*r.b);
    r.b->on_message([](botmesh::context& c) { c.reply(c.text()); });
    r.b->start();
  };
  // The leader has no durability: what is orphaned below is left to the
  // standby, which must not take it while it cannot send.
  replica a, b;
  make(a, "a", false);
  REQUIRE(a.b->ready(5s));
  orphan(*backend, msg("ana", "m1", "uno"));
  orphan(*backend, msg("ana", "m2", "dos"));
  make(b, "b", true);
  // Several of the standby's beats (every 100 ms) pass: none takes them.
  std::this_thread::sleep_for(500ms);
  CHECK(b.b->stats().reprocessed == 0);
  CHECK(b.p->sent().empty());
  CHECK(b.errors.all().empty());
  a.b->stop(); // the standby leads, then takes them over and answers
  REQUIRE(b.b->ready(5s));
  REQUIRE(b.p->wait_for_sent(2, 5s));
  CHECK(texts(*b.p) == std::vector<std::string>{"uno", "dos"});
  CHECK(b.errors.all().empty());
  b.b->stop();
}

namespace {

struct replayed {
  std::vector<std::string> sent;
  botmesh::bot_stats stats;
  std::size_t store_errors = 0;
};

// A bot over `backend` whose turn sends "primero", is lost on its first run
// (a store error after that send) and sends "primero", "segundo" when its
// record is replayed; `first_run` runs before the first send.
replayed lose_then_replay(std::shared_ptr<botmesh::durable_backend> backend,
                          std::function<void()> first_run = {}) {
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p, .durability = durable(std::move(backend))}};
  errors.attach(b);
  std::atomic<int> runs{0};
  b.on_message([&](botmesh::context& c) {
    bool first = ++runs == 1;
    if (first && first_run)
      first_run();
    c.reply("primero");
    if (first)
      throw botmesh::error(errc::store_error, "simulated checkpoint failure");
    c.reply("segundo");
  });
  b.start();
  p->inject(msg("ana", "m1", "hola"));
  REQUIRE(p->wait_for_sent(2, 5s));
  REQUIRE(test::eventually([&] { return runs == 2; }));
  b.stop();
  return {texts(*p), b.stats(), errors.count(errc::store_error)};
}

} // namespace

TEST_CASE("with durability a turn whose effect was lost releases its record: "
          "it is handled again and the replayed step does not send twice") {
  auto r = lose_then_replay(std::make_shared<botmesh::memory_durable_backend>());
  CHECK(r.sent == std::vector<std::string>{"primero", "segundo"});
  CHECK(r.stats.outbox_skipped == 1);
  CHECK(r.stats.reprocessed == 1);
  CHECK(r.store_errors == 1);
}

TEST_CASE("with durability a release that failed leaves no record stuck: "
          "once the backend is back the message is handled again") {
  auto g = std::make_shared<test::gated_backend>();
  g->open();
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p, .durability = test::durable_over(g)}};
  errors.attach(b);
  std::atomic<int> runs{0};
  b.on_message([&](botmesh::context& c) {
    if (++runs == 1) {
      g->fail_settles = 1; // the release of this lost turn fails too
      throw botmesh::error(errc::store_error, "simulated checkpoint failure");
    }
    c.reply("hecho");
  });
  b.start();
  p->inject(msg("ana", "m1", "hola"));
  REQUIRE(p->wait_for_sent(1, 5s));
  REQUIRE(test::eventually([&] { return errors.count(errc::store_error) == 2; }));
  b.stop();
  CHECK(runs == 2);
  CHECK(texts(*p) == std::vector<std::string>{"hecho"});
}

TEST_CASE("with durability a claim whose reply was lost leaves no record "
          "stuck: the claimed records are handled") {
  auto g = std::make_shared<test::gated_backend>();
  g->open();
  for (auto [id, text] : {std::pair{"m1", "uno"}, {"m2", "dos"}})
    orphan(g->inner, msg("ana", id, text));
  g->lose_claim_replies = true;
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p, .durability = test::durable_over(g)}};
  errors.attach(b);
  b.on_message([&](botmesh::context& c) { c.reply(c.text()); });
  b.start();
  REQUIRE(p->wait_for_sent(2, 5s));
  // In order, once each.
  CHECK(texts(*p) == std::vector<std::string>{"uno", "dos"});
  CHECK(errors.count(errc::timeout) == 1);
  b.stop();
  CHECK(texts(*p).size() == 2);
}

TEST_CASE("with durability a record given up in a claim whose reply was "
          "lost is still reported, once its holder is retired") {
  auto g = std::make_shared<test::gated_backend>();
  g->open();
  orphan(g->inner, msg("ana", "m1", "hola")); // attempt 1 of 1 spent
  g->lose_claim_replies = true; // the beat that gives it up goes unheard
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  auto d = test::durable_over(g);
  d.max_attempts = 1;
  botmesh::bot b{{.provider = p, .durability = d}};
  errors.attach(b);
  std::atomic<int> runs{0};
  b.on_message([&](botmesh::context&) { ++runs; });
  b.start();
  REQUIRE(test::eventually(
    [&] { return errors.count(errc::handler_failed) >= 1; }));
  std::this_thread::sleep_for(400ms); // more than one beat
  b.stop();
  // Confirmed once reported: not given up again by a later beat, nor by
  // another holder after the stop retired this one.
  std::promise<botmesh::durable_backend::claim_result> pc;
  g->inner.beat_and_claim("probe/0", 300ms, 10, 1,
                          [&](auto r, std::exception_ptr) { pc.set_value(r); });
  auto after = pc.get_future().get();
  CHECK(after.dropped.empty());
  CHECK(after.records.empty());
  CHECK(errors.count(errc::handler_failed) == 1);
  CHECK(errors.count(errc::timeout) == 1);
  CHECK(runs == 0);
}

TEST_CASE("with durability a first attempt's send whose outbox entry failed "
          "is not sent again by the replay: the entry is written again before "
          "the record is released") {
  auto g = std::make_shared<test::gated_backend>();
  g->open();
  // The entry of the first send, and its first rewrite, fail.
  auto r = lose_then_replay(g, [&] { g->fail_outbox = 2; });
  CHECK(r.sent == std::vector<std::string>{"primero", "segundo"});
  CHECK(r.stats.outbox_skipped == 1);
}

TEST_CASE("with durability a send that timed out is made again by the "
          "replay, not skipped as sent") {
  for (bool first_attempt_ahead : {true, false}) {
    CAPTURE(first_attempt_ahead);
    auto g = std::make_shared<test::gated_backend>();
    g->open();
    if (!first_attempt_ahead) {
      // A record taken over (second attempt): its sends wait for the
      // outbox's verdict.
      orphan(g->inner, msg("ana", "m1", "hola"));
    }
    auto p = std::make_shared<botmesh::testing_provider>();
    test::error_log errors;
    botmesh::bot b{{.provider = p, .durability = test::durable_over(g)}};
    errors.attach(b);
    std::atomic<int> runs{0};
    b.on_message([&](botmesh::context& c) {
      bool first = ++runs == 1;
      p->fail_sends(first, errc::timeout); // the platform did not answer
      c.reply("respuesta");
    });
    b.start();
    if (first_attempt_ahead)
      p->inject(msg("ana", "m1", "hola"));
    REQUIRE(p->wait_for_sent(1, 5s));
    CHECK(runs == 2);
    CHECK(texts(*p) == std::vector<std::string>{"respuesta"});
    CHECK(b.stats().outbox_skipped == 0);
    CHECK(errors.count(errc::timeout) >= 1);
    b.stop();
  }
}

TEST_CASE("with durability a replay that restarts at a checkpoint its first "
          "attempt wrote mid-turn makes the send that attempt did not make") {
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .durability = durable(backend)}};
  // The platform answers again once the timeout was reported.
  b.on<botmesh::events::error>([&](const botmesh::events::error& e) {
    if (e.code == errc::timeout)
      p->fail_sends(false);
  });
  std::atomic<int> greetings{0};
  botmesh::flow f{"pedido"};
  f.hears({"pedido"})
    .step("saludo",
          [&](botmesh::flow_context& c) -> botmesh::flow_task {
            c.send("Hola");
            if (++greetings == 1)
              p->fail_sends(true, errc::timeout); // the question's send
            co_return;
          })
    .ask("cantidad", "¿Cantidad?",
         [](botmesh::flow_context&, const botmesh::answer&) {})
    .persistent();
  b.add_flow(std::move(f));
  b.start();
  // "Hola" goes out; "cantidad" begins (its checkpoint lands), and its
  // question times out: the record is released and handled again, from
  // that checkpoint. The question is the replay's first send; the first
  // attempt's first send was "Hola".
  p->inject(msg("ana", "m1", "pedido"));
  REQUIRE(p->wait_for_sent(2, 10s));
  CHECK(texts(*p) == std::vector<std::string>{"Hola", "¿Cantidad?"});
  CHECK(b.stats().outbox_skipped == 0);
  CHECK(b.stats().reprocessed == 1);
  CHECK(greetings.load() == 1);
  b.stop();
}

namespace {

// What the outbox says, now, to send `send_id` of chat `key` under `fence`
// (the call takes the send when it is new).
botmesh::outbox_verdict outbox_verdict_of(botmesh::durable_backend& b,
                                          const std::string& send_id,
                                          const std::string& key,
                                          std::uint64_t fence = 0) {
  std::promise<botmesh::outbox_verdict> p;
  b.outbox_claim(send_id, key, fence, "test", 1h,
                 [&](botmesh::outbox_verdict v, std::exception_ptr) {
                   p.set_value(v);
                 });
  return p.get_future().get();
}

} // namespace

namespace {

struct lost_reply_replay {
  std::vector<std::string> sent;
  botmesh::bot_stats stats;
  int runs = 0;
  std::size_t timeouts = 0;
};

// A record taken over (its sends wait for the outbox's verdict) whose first
// outbox check runs but loses its reply; `earlier_sent`: the replica that
// died had made that send already. Returns once the failed turn and its
// replay ran.
lost_reply_replay replay_after_lost_outbox_reply(bool earlier_sent) {
  auto g = std::make_shared<test::gated_backend>();
  g->open();
  orphan(g->inner, msg("ana", "m1", "hola"));
  if (earlier_sent) {
    auto id = botmesh::journal_id("test:ana", "m1");
    REQUIRE(outbox_verdict_of(g->inner, id + "/0", "test:ana")
            == botmesh::outbox_verdict::send);
  }
  g->lose_outbox_replies = 1;
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p, .durability = test::durable_over(g)}};
  errors.attach(b);
  std::atomic<int> runs{0};
  b.on_message([&](botmesh::context& c) {
    ++runs;
    c.reply("respuesta");
  });
  b.start();
  // The failed turn and its replay.
  REQUIRE(test::eventually([&] { return b.stats().handled == 2; }));
  b.stop();
  return {texts(*p), b.stats(), runs.load(), errors.count(errc::timeout)};
}

} // namespace

TEST_CASE("with durability a replayed send whose outbox check lost its reply "
          "is made by the next attempt, not skipped as sent") {
  // The check ran (the entry was written) but its answer never came: the
  // send was not made, so what that attempt wrote must not count as sent.
  auto r = replay_after_lost_outbox_reply(false);
  CHECK(r.runs == 2);
  CHECK(r.sent == std::vector<std::string>{"respuesta"});
  CHECK(r.stats.outbox_skipped == 0);
  CHECK(r.timeouts == 1);
}

TEST_CASE("with durability a lost outbox reply takes back only its own "
          "attempt's entry: an earlier attempt's send is not made twice") {
  auto r = replay_after_lost_outbox_reply(true);
  CHECK(r.runs == 2);
  CHECK(r.sent.empty());
  CHECK(r.stats.outbox_skipped == 1);
  CHECK(r.timeouts == 1);
}

TEST_CASE("with durability a message refused because the bot stops is "
          "released and handled by the next replica") {
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  std::vector<std::string> seen;
  std::mutex mtx;
  {
    auto p = std::make_shared<botmesh::testing_provider>();
    botmesh::bot b{{.provider = p, .stop_timeout = "50ms",
                    .durability = durable(backend, "first")}};
    std::latch entered{1};
    b.on_message(slow_until_stop(entered, mtx, seen, "first "));
    b.start();
    p->inject(msg("ana", "m1", "lento"));
    entered.wait();
    p->inject(msg("ana", "m2", "dos"));
    p->inject(msg("ana", "m3", "tres"));
    REQUIRE(test::eventually([&] { return b.stats().received == 3; }));
    b.stop();
    CHECK(b.stats().refused_stopped == 2);
  }
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .durability = durable(backend, "second")}};
  b.on_message([&](botmesh::context& c) {
    std::lock_guard guard{mtx};
    seen.push_back("second " + c.text());
  });
  b.start();
  REQUIRE(test::eventually([&] {
    std::lock_guard guard{mtx};
    return seen.size() == 2;
  }));
  std::lock_guard guard{mtx};
  CHECK(seen == std::vector<std::string>{"second dos", "second tres"});
}

TEST_CASE("with durability a message refused at every stop keeps its "
          "attempts: restarts alone never give it up") {
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  std::mutex mtx;
  std::vector<std::string> seen;
  auto options = [&](std::string id) {
    auto d = durable(backend, std::move(id));
    d.max_attempts = 2;
    return d;
  };
  // Two replicas in turn, each stopped while "dos" waits behind a step
  // that runs until the stop: the stop refuses it. The first gets a
  // second "lento" refused too, which the second takes over ahead of
  // "dos" (records are taken in arrival order).
  for (int round = 0; round < 2; ++round) {
    auto p = std::make_shared<botmesh::testing_provider>();
    botmesh::bot b{{.provider = p, .stop_timeout = "50ms",
                    .durability = options("r" + std::to_string(round))}};
    std::latch entered{1};
    b.on_message(slow_until_stop(entered, mtx, seen));
    b.start();
    if (round == 0) {
      p->inject(msg("ana", "m1", "lento"));
      entered.wait();
      p->inject(msg("ana", "m2", "lento"));
      p->inject(msg("ana", "m3", "dos"));
      REQUIRE(test::eventually([&] { return b.stats().received == 3; }));
    } else {
      entered.wait(); // m2, taken over
      REQUIRE(test::eventually([&] { return b.stats().reprocessed == 2; }));
    }
    b.stop();
    CHECK(b.stats().refused_stopped == (round == 0 ? 2 : 1));
  }
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .durability = options("last")}};
  test::error_log errors;
  errors.attach(b);
  b.on_message([&](botmesh::context& c) {
    std::lock_guard guard{mtx};
    seen.push_back(c.text());
  });
  b.start();
  bool handled = test::eventually([&] {
    std::lock_guard guard{mtx};
    return seen.size() == 1;
  });
  b.stop();
  CHECK(handled);
  CHECK(errors.count(errc::handler_failed) == 0); // not given up
  std::lock_guard guard{mtx};
  CHECK(seen == std::vector<std::string>{"dos"});
}


TEST_CASE("with durability a replayed send under a fence lower than the "
          "chat's last is refused as superseded and nothing is sent") {
  botmesh::memory_coordination_hub hub;
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  // A later holder of the chat already sent under fence 1000.
  REQUIRE(outbox_verdict_of(*backend, "other", "test:ana", 1000)
          == botmesh::outbox_verdict::send);
  // The message was taken by a replica that died: here it is replayed
  // (attempt 2), so each send waits for the outbox's verdict.
  orphan(*backend, msg("ana", "m1", "hola"));
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::coordination_options co;
  co.coordinator = std::make_shared<botmesh::memory_coordinator>(
    hub, botmesh::memory_coordinator_options{.replica_id = "r"});
  auto d = durable(backend);
  d.max_attempts = 3;
  botmesh::bot b{{.provider = p, .coordination = co, .durability = d}};
  errors.attach(b);
  b.on_message([&](botmesh::context& c) { c.reply("tarde"); });
  b.start();
  // Refused, released, tried again, refused, given up.
  REQUIRE(test::eventually([&] { return errors.count(errc::handler_failed) == 1; }));
  b.stop();
  CHECK(p->sent().empty());
  CHECK(errors.count(errc::lease_lost) == 2);
  bool superseded = false, gave_up = false;
  for (auto& e : errors.all()) {
    superseded |= e.what.find("superseded") != std::string::npos;
    gave_up |= e.what.find("given up after 3 attempts") != std::string::npos;
  }
  CHECK(superseded);
  CHECK(gave_up);
}

TEST_CASE("with durability a send written ahead under a fence lower than "
          "the chat's last is still recorded: a replay skips it") {
  botmesh::memory_coordination_hub hub;
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  // A later holder of the chat sent under fence 1000 (as when this
  // entry's first write failed and is written again after the chat moved
  // on).
  REQUIRE(outbox_verdict_of(*backend, "other", "test:ana", 1000)
          == botmesh::outbox_verdict::send);
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::coordination_options co;
  co.coordinator = std::make_shared<botmesh::memory_coordinator>(
    hub, botmesh::memory_coordinator_options{.replica_id = "r"});
  botmesh::bot b{{.provider = p, .coordination = co,
                  .durability = durable(backend)}};
  errors.attach(b);
  b.on_message([&](botmesh::context& c) { c.reply("uno"); });
  b.start();
  p->inject(msg("ana", "m1", "hola"));
  REQUIRE(p->wait_for_sent(1, 5s)); // sent ahead of its entry's verdict
  REQUIRE(test::eventually([&] { return errors.count(errc::lease_lost) == 1; }));
  b.stop();
  // The entry is there: a replay (under any fence) skips the send.
  CHECK(outbox_verdict_of(*backend, botmesh::journal_id("test:ana", "m1") + "/0",
                          "test:ana", 2000)
        == botmesh::outbox_verdict::duplicate);
}

TEST_CASE("with durability a first attempt writes its outbox entries ahead "
          "of its sends: a replay skips them") {
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .durability = durable(backend)}};
  b.on_message([&](botmesh::context& c) { c.reply("uno"); });
  b.start();
  p->inject(msg("ana", "m1", "hola"));
  REQUIRE(p->wait_for_sent(1, 5s));
  b.stop();
  CHECK(outbox_verdict_of(*backend, botmesh::journal_id("test:ana", "m1") + "/0",
                          "test:ana")
        == botmesh::outbox_verdict::duplicate);
}

TEST_CASE("with durability a replayed message whose id spells another "
          "message's flow send is not skipped as that send's duplicate") {
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  // Message "m" of the chat made the first send of step "s" of flow "f",
  // kept in the outbox.
  auto flow_send = botmesh::journal_id("test:ana", "m") + "/3:f\x1fs/0";
  REQUIRE(outbox_verdict_of(*backend, flow_send, "test:ana")
          == botmesh::outbox_verdict::send);
  // A custom provider's message whose id spells that send as its own first
  // one, left by a replica that died: taken over, its sends wait for the
  // outbox's verdict.
  orphan(*backend, msg("ana", "m/3:f\x1fs", "hola"));
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .durability = durable(backend)}};
  b.on_message([](botmesh::context& c) { c.reply("respuesta"); });
  b.start();
  REQUIRE(p->wait_for_sent(1, 5s));
  b.stop();
  CHECK(texts(*p) == std::vector<std::string>{"respuesta"});
  CHECK(b.stats().outbox_skipped == 0);
  // Kept under an id of its own.
  CHECK(outbox_verdict_of(*backend, "test:ana#m\\/3:f\x1fs/0", "test:ana")
        == botmesh::outbox_verdict::duplicate);
}

TEST_CASE("with durability a first attempt after its heartbeat lapsed waits "
          "for the outbox: what a replica that took the record over sent is "
          "not sent again") {
  auto g = std::make_shared<test::gated_backend>();
  g->open();
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p, .durability = test::durable_over(g)}};
  errors.attach(b);
  std::promise<void> started;
  std::promise<void> go;
  auto resume = go.get_future().share();
  std::atomic<int> runs{0};
  b.on_message([&](botmesh::context& c) {
    if (++runs > 1)
      return;
    started.set_value();
    resume.wait(); // frozen, as far as the journal can tell
    c.reply("uno");
  });
  b.start();
  p->inject(msg("ana", "m1", "hola"));
  started.get_future().wait();
  g->fail_beats = true;
  std::this_thread::sleep_for(700ms); // past the 300 ms lease: it lapsed
  // Another replica takes the record over (attempt 2) and sends the reply.
  auto id = botmesh::journal_id("test:ana", "m1");
  std::promise<botmesh::durable_backend::claim_result> pc;
  g->inner.beat_and_claim("other/0", 300ms, 10, 5,
                          [&](auto r, std::exception_ptr) { pc.set_value(r); });
  auto taken = pc.get_future().get();
  REQUIRE(taken.records.size() == 1);
  CHECK(taken.records[0].attempts == 2);
  std::promise<botmesh::outbox_verdict> pv;
  g->inner.outbox_claim(id + "/0", "test:ana", 0, "other", 1h,
                        [&](auto v, std::exception_ptr) { pv.set_value(v); });
  REQUIRE(pv.get_future().get() == botmesh::outbox_verdict::send);
  std::promise<bool> pk;
  g->inner.confirm(id, "other/0", [&](bool ok, std::exception_ptr) {
    pk.set_value(ok);
  });
  REQUIRE(pk.get_future().get());
  g->fail_beats = false;
  go.set_value();
  REQUIRE(test::eventually([&] { return b.stats().handled == 1; }));
  // Its confirm found the record no longer held here: said, not ignored.
  REQUIRE(test::eventually(
    [&] { return errors.count(errc::lease_lost) == 1; }));
  for (auto& e : errors.all())
    if (e.code == errc::lease_lost)
      CHECK(e.what.find("journal record " + id + " was no longer held")
            != std::string::npos);
  b.stop();
  CHECK(p->sent().empty());
}

TEST_CASE("a start() that fails after it spawned its actors gives them "
          "back: the bot can be destroyed, and it was not started") {
  botmesh::memory_coordination_hub hub;
  auto g = std::make_shared<test::gated_backend>();
  g->open();
  g->fail_start = true;
  auto p = std::make_shared<botmesh::testing_provider>();
  auto b = std::make_unique<botmesh::bot>(botmesh::bot_options{
    .provider = p, .coordination = cut_by_settle(hub),
    .durability = test::durable_over(g)});
  try {
    b->start();
    FAIL("a backend that cannot start started");
  } catch (const botmesh::error& e) {
    CHECK(std::string{e.what()}.find("cannot open its file")
          != std::string::npos);
  }
  CHECK(p->starts() == 0);
  // Before, the actors it had spawned lived on (the lease actor renewing
  // its heartbeat for good), and the bot's own actor system waited for
  // them in the destructor: the process hung. (Destroyed on this thread: a
  // watchdog ends the process if it hangs.)
  test::reset_or_abort(b, 20s, "the bot's destructor hangs after a failed start()");
}

TEST_CASE("a bot, or a scheduler, made on one thread is destroyed on "
          "another") {
  // CAF 0.17 kept a reference to the owned system's logger in a
  // thread-local of the thread that made it, and the system's destructor
  // waited for the logger's: the destructor hung for good.
  auto p = std::make_shared<botmesh::testing_provider>();
  auto b = std::make_unique<botmesh::bot>(botmesh::bot_options{.provider = p});
  b->start();
  auto s = std::make_unique<botmesh::scheduler>(botmesh::scheduler_options{});
  std::atomic<bool> gone{false};
  std::thread destroy{[&] {
    b.reset();
    s.reset();
    gone = true;
  }};
  bool in_time = test::eventually([&] { return gone.load(); }, 20s);
  if (!in_time) {
    std::fputs("a bot destroyed on another thread hangs\n", stderr);
    std::abort(); // (its thread cannot be joined)
  }
  destroy.join();
}

TEST_CASE("a stop() that comes before start() is kept: the bot does not "
          "start, and run() says why") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p}};
  b.stop(); // (a SIGTERM during start-up, a stop racing run())
  CHECK_THROWS_AS(b.start(), botmesh::error);
  CHECK_THROWS_AS(b.run(), botmesh::error);
  CHECK(p->starts() == 0);
}

TEST_CASE("durability options are checked when the bot is built") {
  auto p = std::make_shared<botmesh::testing_provider>();
  auto field = [&](botmesh::durability_options d) -> std::string {
    try {
      botmesh::bot b{{.provider = p, .durability = d}};
    } catch (const botmesh::invalid_argument_error& e) {
      return e.field();
    }
    return {};
  };
  CHECK(field({}) == "durability.backend");
  auto ok = durable(std::make_shared<botmesh::memory_durable_backend>());
  auto d = ok;
  d.max_attempts = 0;
  CHECK(field(d) == "durability.max_attempts");
  d = ok;
  d.lease = "1ms";
  CHECK(field(d) == "durability.lease");
  CHECK(field(ok).empty());
}

namespace {

// A message whose journal write reports a timeout (`arm`, called once the
// bot runs, makes the backend do that), then the platform's retry: the
// first is refused with `timeout`, the retry is a duplicate, and the record
// is handled once, by a beat. `refused` runs between the two.
void timed_out_write_handled_once(std::shared_ptr<botmesh::durable_backend> backend,
                                  const std::function<void()>& arm,
                                  const std::function<void()>& refused) {
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p, .durability = durable(std::move(backend))}};
  errors.attach(b);
  std::atomic<int> handled{0};
  b.on_message([&](botmesh::context& c) {
    ++handled;
    c.reply("ok " + c.text());
  });
  b.start();
  arm();
  CHECK(acceptance(*p, msg("ana", "m1", "hola")) == errc::timeout);
  refused();
  // The platform retries: already journaled, so a duplicate...
  p->inject(msg("ana", "m1", "hola"));
  REQUIRE(test::eventually([&] { return b.stats().duplicates == 1; }));
  // ...and the record is handled by a beat, once.
  REQUIRE(p->wait_for_sent(1, 5s));
  b.stop();
  CHECK(handled == 1);
  CHECK(texts(*p) == std::vector<std::string>{"ok hola"});
  CHECK(b.stats().reprocessed == 1);
  CHECK(errors.count(errc::timeout) == 1);
}

} // namespace

TEST_CASE("with durability a journal write whose reply was lost is handled "
          "once: the record is freed and claimed, the platform's retry is a "
          "duplicate") {
  auto backend = std::make_shared<test::gated_backend>();
  backend->open();
  timed_out_write_handled_once(
    backend, [&] { backend->lose_record_replies = true; },
    [&] { backend->lose_record_replies = false; });
}

namespace {

// A bot over `backend` whose handler records the texts it sees.
struct recording_bot {
  std::shared_ptr<botmesh::testing_provider> p =
    std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  std::mutex mtx;
  std::vector<std::string> seen;
  std::function<void()> on_espera; // runs for "espera", which is not recorded
  botmesh::bot b;

  // Over `backend` (opened here), with lease `lease`.
  recording_bot(const std::shared_ptr<test::gated_backend>& backend,
                const char* lease)
    : recording_bot(with_lease(backend, lease)) {
    // nop
  }

  static botmesh::durability_options with_lease(
    const std::shared_ptr<test::gated_backend>& backend, const char* lease) {
    backend->open();
    auto d = durable(backend);
    d.lease = lease;
    return d;
  }

  explicit recording_bot(botmesh::durability_options d)
    : b{{.provider = p, .durability = std::move(d)}} {
    errors.attach(b);
    b.on_message([this](botmesh::context& c) {
      if (c.text() == "espera" && on_espera) {
        on_espera();
        return;
      }
      std::lock_guard guard{mtx};
      seen.push_back(c.text());
    });
  }

  std::vector<std::string> texts() {
    std::lock_guard guard{mtx};
    return seen;
  }

  bool wait_seen(std::size_t n) {
    return test::eventually([&] { return texts().size() >= n; });
  }

  // The texts of chat "ana" ("otra" is another chat's).
  std::vector<std::string> ana() {
    auto all = texts();
    std::erase(all, std::string{"otra"});
    return all;
  }
};

} // namespace

TEST_CASE("with durability a chat's next message does not overtake one whose "
          "journal write lost its reply: it is accepted and parked until a "
          "beat took that record over") {
  auto backend = std::make_shared<test::gated_backend>();
  // A beat every 333 ms: m1 is taken over long before the 2 s bound.
  recording_bot r{backend, "1s"};
  r.b.start();
  backend->lose_record_replies = true;
  CHECK(acceptance(*r.p, msg("ana", "m1", "uno")) == errc::timeout);
  backend->lose_record_replies = false;
  // The chat's next message is taken (no refusal: a poller would stop its
  // whole batch there); another chat runs at once.
  CHECK(acceptance(*r.p, msg("ana", "m2", "dos")) == errc::none);
  CHECK(acceptance(*r.p, msg("eva", "e1", "otra")) == errc::none);
  // The platform's retry of m1: recorded already, a duplicate.
  CHECK(acceptance(*r.p, msg("ana", "m1", "uno")) == errc::none);
  REQUIRE(r.wait_seen(3));
  r.b.stop();
  CHECK(r.ana() == std::vector<std::string>{"uno", "dos"});
  // m1 taken over; m2 too when it was written under the generation m1's
  // record waits in (before the next beat), else parked here.
  CHECK(r.b.stats().reprocessed >= 1);
  CHECK(r.b.stats().duplicates == 1);
  CHECK(r.errors.count(errc::timeout) == 1); // the lost reply, nothing else
  CHECK(r.errors.all().size() == 1);
}

TEST_CASE("with durability a retry written anew of a message whose journal "
          "write failed runs in its place, ahead of the chat's messages "
          "parked behind it") {
  auto backend = std::make_shared<test::gated_backend>();
  // A lease of 6 s: no beat settles the failed write while the test runs.
  recording_bot r{backend, "6s"};
  r.b.start();
  CHECK(acceptance(*r.p, msg("ana", "m0", "cero")) == errc::none);
  REQUIRE(r.wait_seen(1));
  backend->fail_next_records = 1;
  CHECK(acceptance(*r.p, msg("ana", "m1", "uno")) == errc::store_error);
  // The next generation's first beat was answered: what comes now is
  // written under it, parked here (the beat after retires the first
  // generation, and looks for m1).
  REQUIRE(test::eventually([&] { return backend->beats_of_generation(1, true) >= 1; }));
  CHECK(acceptance(*r.p, msg("ana", "m2", "dos")) == errc::none);
  CHECK(acceptance(*r.p, msg("ana", "m3", "tres")) == errc::none);
  CHECK(acceptance(*r.p, msg("eva", "e1", "otra")) == errc::none);
  REQUIRE(r.wait_seen(2));
  std::this_thread::sleep_for(200ms);
  CHECK(r.ana() == std::vector<std::string>{"cero"}); // dos and tres wait
  // Written anew: the first write had not landed.
  CHECK(acceptance(*r.p, msg("ana", "m1", "uno")) == errc::none);
  REQUIRE(r.wait_seen(5));
  r.b.stop();
  CHECK(r.ana() == std::vector<std::string>{"cero", "uno", "dos", "tres"});
  CHECK(r.b.stats().reprocessed == 0);
}

TEST_CASE("with durability a retry written anew of a message whose journal "
          "write failed runs ahead of the chat's next message left to the "
          "claim") {
  auto backend = std::make_shared<test::gated_backend>();
  recording_bot r{backend, "1s"};
  r.b.start();
  // No beat comes between: m2 is written under the generation the failed
  // write was in, and left to the claim that retires it.
  {
    test::gated_backend::beats_pause pause{*backend};
    backend->fail_next_records = 1;
    CHECK(acceptance(*r.p, msg("ana", "m1", "uno")) == errc::store_error);
    CHECK(acceptance(*r.p, msg("ana", "m2", "dos")) == errc::none);
    CHECK(acceptance(*r.p, msg("ana", "m1", "uno")) == errc::none);
    REQUIRE(r.wait_seen(1));
  }
  REQUIRE(r.wait_seen(2));
  r.b.stop();
  CHECK(r.ana() == std::vector<std::string>{"uno", "dos"});
  CHECK(r.b.stats().reprocessed == 1); // dos, taken over
}

TEST_CASE("with durability two failed messages of a chat, retried in "
          "reverse order, run in their first order, and what came after "
          "them runs last") {
  auto backend = std::make_shared<test::gated_backend>();
  recording_bot r{backend, "1s"};
  r.b.start();
  {
    // All under one generation: the retries and tres are left to the
    // claim that retires it, except uno's, which waits for nothing.
    test::gated_backend::beats_pause pause{*backend};
    backend->fail_next_records = 2;
    CHECK(acceptance(*r.p, msg("ana", "m1", "uno")) == errc::store_error);
    CHECK(acceptance(*r.p, msg("ana", "m2", "dos")) == errc::store_error);
    CHECK(acceptance(*r.p, msg("ana", "m3", "tres")) == errc::none);
    CHECK(acceptance(*r.p, msg("ana", "m2", "dos")) == errc::none);
    CHECK(acceptance(*r.p, msg("ana", "m1", "uno")) == errc::none);
    CHECK(r.wait_seen(1));
    CHECK(r.ana() == std::vector<std::string>{"uno"});
  }
  REQUIRE(r.wait_seen(3));
  r.b.stop();
  // dos's record was written after tres's: the claim brings tres first,
  // and it waits in its place.
  CHECK(r.ana() == std::vector<std::string>{"uno", "dos", "tres"});
  CHECK(r.b.stats().reprocessed == 2);
}

TEST_CASE("with durability a message whose failed journal write is never "
          "retried holds its chat back only until a claim shows it was not "
          "recorded") {
  auto backend = std::make_shared<test::gated_backend>();
  recording_bot r{backend, "300ms"};
  r.b.start();
  backend->fail_next_records = 1;
  CHECK(acceptance(*r.p, msg("ana", "m1", "uno")) == errc::store_error);
  CHECK(acceptance(*r.p, msg("ana", "m2", "dos")) == errc::none);
  REQUIRE(r.wait_seen(1));
  r.b.stop();
  CHECK(r.ana() == std::vector<std::string>{"dos"});
  // Only the failed write is reported: the claim settled the wait before
  // its bound.
  CHECK(r.errors.count(errc::store_error) == 1);
  CHECK(r.errors.all().size() == 1);
}

TEST_CASE("with durability a chat waits for a record whose write lost its "
          "reply at most two leases: then its parked messages run and an "
          "error event names the record they may overtake") {
  auto backend = std::make_shared<test::gated_backend>();
  recording_bot r{backend, "300ms"};
  // Another chat's step keeps the first generation open: the record whose
  // reply was lost stays held by it, and no beat takes it over.
  std::promise<void> go;
  auto go_f = go.get_future().share();
  test::opener release_handler{go};
  r.on_espera = [&] { go_f.wait(); };
  r.b.start();
  CHECK(acceptance(*r.p, msg("eva", "e1", "espera")) == errc::none);
  backend->lose_record_replies = true;
  CHECK(acceptance(*r.p, msg("ana", "m1", "uno")) == errc::timeout);
  backend->lose_record_replies = false;
  // Written under the next generation (its second beat shows it is the
  // current one): parked here, not left to the claim.
  REQUIRE(test::eventually([&] { return backend->beats_of_generation(1) >= 2; }));
  CHECK(acceptance(*r.p, msg("ana", "m2", "dos")) == errc::none);
  REQUIRE(r.wait_seen(1));
  CHECK(r.ana() == std::vector<std::string>{"dos"});
  REQUIRE(test::eventually([&] { return r.errors.count(errc::store_error) == 1; }));
  auto overtaken = r.errors.all();
  std::erase_if(overtaken, [](auto& e) { return e.code != errc::store_error; });
  CHECK(overtaken.at(0).what.find("its later messages run now") != std::string::npos);
  CHECK(overtaken.at(0).what.find("m1") != std::string::npos);
  CHECK(overtaken.at(0).key == "test:ana");
  // Once the step ends, its generation is retired and m1 is taken over.
  release_handler.open();
  REQUIRE(r.wait_seen(2));
  r.b.stop();
  CHECK(r.ana() == std::vector<std::string>{"dos", "uno"});
}

TEST_CASE("with durability a redelivery of a parked message whose journal "
          "write fails does not hold its chat back behind itself") {
  auto backend = std::make_shared<test::gated_backend>();
  recording_bot r{backend, "3s"}; // a beat a second
  r.b.start();
  backend->fail_next_records = 1;
  CHECK(acceptance(*r.p, msg("ana", "m1", "uno")) == errc::store_error);
  // Parked under the next generation, with no beat to settle anything.
  REQUIRE(test::eventually(
    [&] { return backend->beats_of_generation(1, true) >= 1; }));
  {
    test::gated_backend::beats_pause pause{*backend};
    CHECK(acceptance(*r.p, msg("ana", "m2", "dos")) == errc::none);
    backend->lose_record_replies = true;
    CHECK(acceptance(*r.p, msg("ana", "m2", "dos")) == errc::timeout);
    backend->lose_record_replies = false;
    CHECK(acceptance(*r.p, msg("ana", "m1", "uno")) == errc::none);
    CHECK(acceptance(*r.p, msg("ana", "m3", "tres")) == errc::none);
    CHECK(r.wait_seen(3));
  }
  r.b.stop();
  CHECK(r.ana() == std::vector<std::string>{"uno", "dos", "tres"});
}

TEST_CASE("with durability a message whose journal write failed under two "
          "generations is waited for until both were retired, and what is "
          "taken over meanwhile waits behind it") {
  auto backend = std::make_shared<test::gated_backend>();
  recording_bot r{backend, "3s"}; // a beat a second, the bound 6 s
  // Another chat's step keeps the first generation open.
  std::promise<void> go;
  auto go_f = go.get_future().share();
  test::opener release_handler{go};
  r.on_espera = [&] { go_f.wait(); };
  r.b.start();
  CHECK(acceptance(*r.p, msg("eva", "e1", "espera")) == errc::none);
  // m1 lands under generation 0, its reply lost...
  backend->lose_record_replies = true;
  CHECK(acceptance(*r.p, msg("ana", "m1", "uno")) == errc::timeout);
  backend->lose_record_replies = false;
  // ...and its retry fails under generation 1.
  REQUIRE(test::eventually(
    [&] { return backend->beats_of_generation(1, true) >= 1; }));
  backend->fail_next_records = 1;
  CHECK(acceptance(*r.p, msg("ana", "m1", "uno")) == errc::store_error);
  CHECK(acceptance(*r.p, msg("ana", "m2", "dos")) == errc::none);
  // Generation 1 is retired and claimed from (m2 taken over if it was
  // written under it); m1 is still held by generation 0.
  REQUIRE(test::eventually(
    [&] { return backend->beats_of_generation(2, true) >= 2; }));
  CHECK(r.ana().empty());
  release_handler.open();
  REQUIRE(r.wait_seen(2));
  r.b.stop();
  CHECK(r.ana() == std::vector<std::string>{"uno", "dos"});
  CHECK(r.errors.count(errc::store_error) == 1); // the retry; no bound
}

TEST_CASE("with durability a message parked behind a failed journal write "
          "when the bot stops is given back and handled by the next "
          "replica") {
  auto backend = std::make_shared<test::gated_backend>();
  backend->open();
  auto d = durable(backend);
  d.lease = "6s";
  {
    recording_bot r{d};
    r.b.start();
    backend->fail_next_records = 1;
    CHECK(acceptance(*r.p, msg("ana", "m1", "uno")) == errc::store_error);
    // Written under the next generation: parked here.
    REQUIRE(test::eventually([&] { return backend->beats_of_generation(1, true) >= 1; }));
    CHECK(acceptance(*r.p, msg("ana", "m2", "dos")) == errc::none);
    std::this_thread::sleep_for(100ms);
    CHECK(r.texts().empty());
    r.b.stop();
    CHECK(r.texts().empty());
    CHECK(r.b.stats().refused_stopped == 1);
    // Given back before its holder was retired: no other replica's claim
    // can take it first and spend an attempt.
    std::lock_guard guard{backend->mtx};
    auto& calls = backend->calls;
    auto given_back = std::find_if(calls.begin(), calls.end(), [](auto& c) {
      return c.starts_with("release test:ana#m2 ") && c.ends_with("~1");
    });
    auto retired = std::find_if(calls.begin(), calls.end(), [](auto& c) {
      return c.starts_with("retire ") && c.ends_with("~1");
    });
    REQUIRE(given_back != calls.end());
    REQUIRE(retired != calls.end());
    CHECK(given_back < retired);
  }
  auto next = d;
  next.instance_id = "r2";
  recording_bot r{next};
  r.b.start();
  REQUIRE(r.wait_seen(1));
  r.b.stop();
  CHECK(r.texts() == std::vector<std::string>{"dos"});
}

TEST_CASE("with durability a redelivery whose journal write fails does not "
          "free the first delivery's record while its turn runs") {
  auto backend = std::make_shared<test::gated_backend>();
  backend->open();
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .durability = durable(backend)}};
  std::atomic<int> handled{0};
  std::promise<void> go;
  auto go_f = go.get_future().share();
  test::opener release_handler{go};
  b.on_message([&](botmesh::context& c) {
    if (++handled == 1)
      go_f.wait();
    c.reply("ok " + c.text());
  });
  b.start();
  p->inject(msg("ana", "m1", "hola"));
  REQUIRE(test::eventually([&] { return handled == 1; }));
  // The platform sends it again; that write lands (a duplicate) but its
  // reply is lost.
  backend->lose_record_replies = true;
  CHECK(acceptance(*p, msg("ana", "m1", "hola")) == errc::timeout);
  backend->lose_record_replies = false;
  // Several beats (the lease is 300 ms) while the first turn still runs:
  // none may take the record over.
  std::this_thread::sleep_for(1s);
  release_handler.open();
  REQUIRE(p->wait_for_sent(1, 5s));
  std::this_thread::sleep_for(500ms);
  b.stop();
  CHECK(handled == 1);
  CHECK(b.stats().reprocessed == 0);
  CHECK(texts(*p) == std::vector<std::string>{"ok hola"});
}

TEST_CASE("with durability a step cut by settle releases its record: it is "
          "handled again, and what the cut step sent is not sent twice") {
  botmesh::memory_coordination_hub hub;
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  auto co = cut_by_settle(hub);
  botmesh::bot b{{.provider = p, .coordination = co,
                  .durability = durable(backend)}};
  errors.attach(b);
  std::atomic<int> runs{0};
  b.on_message([&](botmesh::context& c) {
    c.reply("recibido");
    if (++runs == 1) {
      // The first run outlives settle: cut, and its last send is fenced.
      while (!c.stop_token().stop_requested())
        std::this_thread::sleep_for(1ms);
      c.reply("tarde");
      return;
    }
    c.reply("hecho");
  });
  b.start();
  p->inject(msg("ana", "m1", "hola"));
  REQUIRE(p->wait_for_sent(2, 10s));
  REQUIRE(test::eventually([&] { return runs == 2; }));
  b.stop();
  CHECK(texts(*p) == std::vector<std::string>{"recibido", "hecho"});
  CHECK(b.stats().outbox_skipped == 1);
  CHECK(b.stats().reprocessed == 1);
  CHECK(errors.count(errc::lease_lost) >= 1);
}

TEST_CASE("with durability a bot's heartbeat is in the backend before it "
          "records anything: another replica never takes its fresh records "
          "for a dead one's") {
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  auto p = std::make_shared<botmesh::testing_provider>();
  auto d = durable(backend);
  d.lease = "10s"; // no second beat during the test
  botmesh::bot b{{.provider = p, .durability = d}};
  std::latch entered{1}, go_on{1};
  b.on_message([&](botmesh::context& c) {
    entered.count_down();
    go_on.wait();
    c.reply("ok");
  });
  b.start();
  p->inject(msg("ana", "m1", "hola"));
  entered.wait();
  std::promise<botmesh::durable_backend::claim_result> pr;
  backend->beat_and_claim("other/1", 10s, 100, 5,
                          [&](auto r, std::exception_ptr) { pr.set_value(r); });
  CHECK(pr.get_future().get().records.empty());
  go_on.count_down();
  REQUIRE(p->wait_for_sent(1, 5s));
  b.stop();
  CHECK(b.stats().reprocessed == 0);
}

TEST_CASE("with durability a journal record whose message cannot be decoded "
          "is reported by id and dropped, the chat's other records go on") {
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  botmesh::journal_record bad;
  bad.id = "test:ana#roto";
  bad.key = "test:ana";
  bad.message = "{\"id\": 7"; // truncated JSON
  std::promise<botmesh::journal_put> p1;
  backend->record(bad, "dead/0", 1h,
                  [&](auto v, std::exception_ptr) { p1.set_value(v); });
  REQUIRE(p1.get_future().get() == botmesh::journal_put::recorded);
  orphan(*backend, msg("ana", "m2", "sigue"));
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p, .durability = durable(backend)}};
  errors.attach(b);
  b.on_message([&](botmesh::context& c) { c.reply(c.text()); });
  b.start();
  REQUIRE(p->wait_for_sent(1, 5s));
  REQUIRE(test::eventually(
    [&] { return errors.count(errc::corrupted_record) == 1; }));
  b.stop();
  CHECK(texts(*p) == std::vector<std::string>{"sigue"});
  CHECK(errors.all()[0].what.find("test:ana#roto") != std::string::npos);
  // Dropped for good: a redelivery of it is a duplicate, nobody claims it.
  std::promise<botmesh::durable_backend::claim_result> pr;
  backend->beat_and_claim("other/1", 1s, 100, 5,
                          [&](auto r, std::exception_ptr) { pr.set_value(r); });
  CHECK(pr.get_future().get().records.empty());
}

TEST_CASE("a message the bot could not record in the chat's log is not "
          "handled: an error event names it, with durability it is handled "
          "again once the store answers") {
  auto store = std::make_shared<test::recording_store>(
    std::make_shared<botmesh::memory_store>());
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  std::shared_ptr<botmesh::memory_durable_backend> backend;
  bool with_durability = false;
  SUBCASE("without durability") {
    with_durability = false;
  }
  SUBCASE("with durability") {
    with_durability = true;
    backend = std::make_shared<botmesh::memory_durable_backend>();
  }
  botmesh::bot_options o{.provider = p, .store = store};
  if (with_durability)
    o.durability = durable(backend);
  botmesh::bot b{std::move(o)};
  errors.attach(b);
  std::atomic<int> runs{0};
  b.on_message([&](botmesh::context& c) {
    ++runs;
    c.reply("eco: " + c.text());
  });
  b.start();
  store->fail_log = 1; // the next append fails, later ones land
  p->inject(msg("ana", "m1", "hola"));
  REQUIRE(test::eventually(
    [&] { return errors.count(errc::store_error) == 1; }));
  auto all = errors.all();
  CHECK(all.at(0).what.find("recording message m1 failed, so it is not "
                            "handled")
        != std::string::npos);
  if (with_durability) {
    // Released and handled again: answered once, logged once.
    REQUIRE(p->wait_for_sent(1, 10s));
    CHECK(texts(*p) == std::vector<std::string>{"eco: hola"});
    CHECK(runs.load() == 1);
    CHECK(b.stats().reprocessed == 1);
  } else {
    p->inject(msg("ana", "m2", "otra"));
    REQUIRE(p->wait_for_sent(1, 5s));
    CHECK(texts(*p) == std::vector<std::string>{"eco: otra"});
    CHECK(runs.load() == 1);
    // Counted once the turn ends, just after its reply.
    CHECK(test::eventually([&] { return b.stats().handled == 1; }));
  }
  b.stop();
  auto logged = store->messages("test:ana", 10);
  std::size_t in = 0;
  for (auto& m : logged)
    in += m.dir == botmesh::direction::in ? 1 : 0;
  CHECK(in == 1); // the message answered is the one logged
}

TEST_CASE("a store that throws something not a std::exception while a "
          "message is recorded: an error event, and the chat goes on, with "
          "and without coordination") {
  auto store = std::make_shared<test::recording_store>(
    std::make_shared<botmesh::memory_store>());
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot_options o{.provider = p, .store = store};
  botmesh::memory_coordination_hub hub;
  SUBCASE("without coordination") {}
  SUBCASE("with coordination") {
    botmesh::coordination_options co;
    co.coordinator = std::make_shared<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = "r"});
    o.coordination = co;
  }
  botmesh::bot b{std::move(o)};
  errors.attach(b);
  b.on_message([&](botmesh::context& c) { c.reply("eco: " + c.text()); });
  b.start();
  store->fail_log_oddly = true;
  store->fail_log = 1;
  p->inject(msg("ana", "m1", "hola"));
  REQUIRE(test::eventually(
    [&] { return errors.count(errc::store_error) == 1; }));
  CHECK(errors.all().at(0).what.find("recording message m1 failed, so it is "
                                     "not handled: unknown error")
        != std::string::npos);
  p->inject(msg("ana", "m2", "otra"));
  REQUIRE(p->wait_for_sent(1, 5s));
  CHECK(texts(*p) == std::vector<std::string>{"eco: otra"});
  b.stop();
}

namespace {

// What another replica's beat takes over from `b` right now (holder
// "other/0", lease `lease`).
botmesh::durable_backend::claim_result claim_as_other(
  botmesh::durable_backend& b, std::chrono::milliseconds lease = 3s) {
  std::promise<botmesh::durable_backend::claim_result> p;
  b.beat_and_claim("other/0", lease, 10, 5,
                   [&](botmesh::durable_backend::claim_result r,
                       std::exception_ptr) { p.set_value(std::move(r)); });
  return p.get_future().get();
}

} // namespace

TEST_CASE("with durability a stopping bot takes no record over: what a dead "
          "replica held is left, unattempted, to the live ones") {
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  auto p = std::make_shared<botmesh::testing_provider>();
  // Beats every 100 ms; the drain lasts its whole bound (the handler below
  // waits for its stop token), several beats long.
  botmesh::bot b{{.provider = p, .stop_timeout = "800ms",
                  .durability = durable(backend)}};
  std::latch entered{1};
  std::atomic<int> handled{0};
  b.on_message([&](botmesh::context& c) {
    if (c.text() == "lento") {
      entered.count_down();
      while (!c.stop_token().stop_requested())
        std::this_thread::sleep_for(1ms);
      return;
    }
    if (c.text() == "dos")
      ++handled;
  });
  b.start();
  p->inject(msg("ana", "m1", "lento"));
  entered.wait();
  std::thread stopper{[&] { b.stop(); }};
  // Stopping: a delivery is refused from here.
  int probe = 0;
  bool stopping = test::eventually([&] {
    p->inject(msg("eva", "probe-" + std::to_string(++probe), "tarde"));
    return b.stats().refused_stopped > 0;
  });
  orphan(*backend, msg("bea", "m2", "dos"));
  stopper.join();
  REQUIRE(stopping);
  CHECK(b.stats().reprocessed == 0);
  CHECK(handled == 0);
  // The next replica takes it as its second holder (the dead one was the
  // first): the stopping one spent no attempt. (A probe journaled just as
  // intake closed is refused and left to it too: not counted here.)
  auto taken = claim_as_other(*backend);
  std::erase_if(taken.records, [](const botmesh::journal_record& r) {
    return r.key == botmesh::chat_key("test", "eva");
  });
  REQUIRE(taken.records.size() == 1);
  CHECK(taken.records[0].id
        == botmesh::journal_id(botmesh::chat_key("test", "bea"), "m2"));
  CHECK(taken.records[0].attempts == 2);
}

TEST_CASE("with durability a handler that outlives stop() waits for the "
          "outbox's verdict once the heartbeat is retired: what the replica "
          "that took its record over sent is not sent again") {
  auto g = std::make_shared<test::gated_backend>();
  g->open();
  auto p = std::make_shared<botmesh::testing_provider>();
  auto d = durable(g);
  d.lease = "3s"; // beats every second, each believed for 2.7 s
  botmesh::bot b{{.provider = p, .stop_timeout = "50ms", .durability = d}};
  std::atomic<int> runs{0};
  std::promise<void> started, go;
  auto resume = go.get_future().share();
  b.on_message([&](botmesh::context& c) {
    if (++runs == 1)
      started.set_value();
    resume.wait(); // ignores its stop token
    c.reply("uno");
  });
  b.start();
  p->inject(msg("ana", "m1", "hola"));
  started.get_future().wait();
  std::thread stopper{[&] { b.stop(); }}; // returns once the handler did
  // Claimable as soon as the retire landed, long before the heartbeat
  // would lapse.
  botmesh::durable_backend::claim_result taken;
  bool taken_over = test::eventually(
    [&] {
      taken = claim_as_other(g->inner);
      return !taken.records.empty();
    },
    2s);
  std::optional<botmesh::outbox_verdict> v;
  if (taken_over) // the other replica's replay sends the reply
    v = outbox_verdict_of(g->inner, taken.records[0].id + "/0",
                          taken.records[0].key);
  go.set_value();
  stopper.join();
  REQUIRE(taken_over);
  CHECK(taken.records[0].attempts == 2);
  REQUIRE(v.has_value());
  CHECK(*v == botmesh::outbox_verdict::send);
  // Written ahead (as while the heartbeat held), "uno" went out twice.
  CHECK(p->sent().empty());
  CHECK(b.stats().outbox_skipped == 1);
}

TEST_CASE("with durability a stop writes the outbox entry of a send whose "
          "entry write failed before its record can be taken over: the "
          "record is settled, not sent again elsewhere") {
  auto g = std::make_shared<test::gated_backend>();
  g->open();
  g->fail_outbox = 1; // the entry written ahead of "uno" fails
  auto p = std::make_shared<botmesh::testing_provider>();
  auto d = durable(g);
  d.lease = "30s"; // no beat writes it again before the stop
  test::error_log errors;
  botmesh::bot b{{.provider = p, .durability = d}};
  errors.attach(b);
  b.on_message([&](botmesh::context& c) { c.reply("uno"); });
  b.start();
  p->inject(msg("ana", "m1", "hola"));
  REQUIRE(p->wait_for_sent(1, 5s));
  REQUIRE(test::eventually([&] { return errors.count(errc::store_error) == 1; }));
  b.stop();
  // Before, the retire left the record held with its entry unwritten: the
  // next replica claimed it, the outbox said send, and "uno" went out again.
  CHECK(claim_as_other(g->inner).records.empty());
  auto key = botmesh::chat_key("test", "ana");
  CHECK(outbox_verdict_of(g->inner, botmesh::journal_id(key, "m1") + "/0", key)
        == botmesh::outbox_verdict::duplicate);
  CHECK(texts(*p) == std::vector<std::string>{"uno"});
}

namespace {

// A durable backend that passes every call to a memory backend; the test
// backends below override the calls they change.
class forwarding_backend : public botmesh::durable_backend {
 public:
  botmesh::memory_durable_backend inner;

  void record(botmesh::journal_record rec, std::string_view holder,
              std::chrono::milliseconds ttl,
              completion<botmesh::journal_put> done) override {
    inner.record(std::move(rec), holder, ttl, std::move(done));
  }
  void release(std::string_view id, std::string_view holder,
               completion<bool> done) override {
    inner.release(id, holder, std::move(done));
  }
  void confirm(std::string_view id, std::string_view holder,
               completion<bool> done) override {
    inner.confirm(id, holder, std::move(done));
  }
  void beat_and_claim(std::string_view holder, std::chrono::milliseconds lease,
                      std::size_t limit, std::uint32_t max_attempts,
                      completion<claim_result> done) override {
    inner.beat_and_claim(holder, lease, limit, max_attempts, std::move(done));
  }
  void retire(std::string_view holder, completion<bool> done) override {
    inner.retire(holder, std::move(done));
  }
  void outbox_claim(std::string_view send_id, std::string_view key,
                    std::uint64_t fence, std::string_view writer,
                    std::chrono::milliseconds ttl,
                    completion<botmesh::outbox_verdict> done) override {
    inner.outbox_claim(send_id, key, fence, writer, ttl, std::move(done));
  }
  void outbox_record(std::string_view send_id, std::string_view key,
                     std::uint64_t fence, std::string_view writer,
                     std::chrono::milliseconds ttl,
                     completion<botmesh::outbox_verdict> done) override {
    inner.outbox_record(send_id, key, fence, writer, ttl, std::move(done));
  }
  void outbox_forget(std::string_view send_id, std::string_view writer,
                     completion<bool> done) override {
    inner.outbox_forget(send_id, writer, std::move(done));
  }
};

// A backend call whose reply was reported lost, held to land later: after
// the call that its failure causes, as a call on a broken connection that
// Redis reads late.
class late_call {
 public:
  std::atomic<int> landed{0};

  void hold(std::function<void()> call) {
    std::lock_guard guard{mtx_};
    call_ = std::move(call);
  }
  // Lands the held call, if any.
  void land() {
    std::function<void()> call;
    {
      std::lock_guard guard{mtx_};
      call = std::exchange(call_, {});
    }
    if (call) {
      call();
      ++landed;
    }
  }

 private:
  std::mutex mtx_;
  std::function<void()> call_;
};

// The next journal write reports a timeout at once but lands just after
// its generation was retired (it waited on a broken connection meanwhile).
class overtaken_write_backend final : public forwarding_backend {
 public:
  std::atomic<bool> overtake_next{false};
  late_call late;

  void record(botmesh::journal_record rec, std::string_view holder,
              std::chrono::milliseconds ttl,
              completion<botmesh::journal_put> done) override {
    if (overtake_next.exchange(false)) {
      late.hold([this, rec, h = std::string{holder}, ttl] {
        inner.record(rec, h, ttl,
                     [](botmesh::journal_put, std::exception_ptr) {});
      });
      return done(botmesh::journal_put::duplicate,
                  std::make_exception_ptr(botmesh::error(
                    errc::timeout, "simulated lost reply (still on its way)")));
    }
    inner.record(std::move(rec), holder, ttl, std::move(done));
  }
  void retire(std::string_view holder, completion<bool> done) override {
    inner.retire(holder,
                 [this, done = std::move(done)](bool ok, std::exception_ptr e) {
                   late.land();
                   done(ok, e);
                 });
  }
};

} // namespace

namespace {

// Confirms are answered only when the test says (a confirm on its way on
// a slow connection); retires are logged in order with those answers.
class slow_confirm_backend final : public forwarding_backend {
 public:
  std::mutex mtx;
  std::vector<std::string> log;
  std::vector<std::function<void()>> held;

  void confirm(std::string_view id, std::string_view holder,
               completion<bool> done) override {
    inner.confirm(id, holder, [this, done = std::move(done)](
                                bool ok, std::exception_ptr e) mutable {
      std::lock_guard guard{mtx};
      held.push_back([this, ok, e, done = std::move(done)] {
        {
          std::lock_guard guard{mtx};
          log.push_back("confirmed");
        }
        done(ok, e);
      });
    });
  }
  void retire(std::string_view holder, completion<bool> done) override {
    {
      std::lock_guard guard{mtx};
      log.push_back("retire");
    }
    inner.retire(holder, std::move(done));
  }
  std::size_t holding() {
    std::lock_guard guard{mtx};
    return held.size();
  }
  void answer() {
    std::vector<std::function<void()>> go;
    {
      std::lock_guard guard{mtx};
      go.swap(held);
    }
    for (auto& f : go)
      f();
  }
  std::vector<std::string> events() {
    std::lock_guard guard{mtx};
    return log;
  }
};

} // namespace

TEST_CASE("with durability a stop retires the holder only once the confirms "
          "in flight were answered") {
  auto backend = std::make_shared<slow_confirm_backend>();
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .durability = durable(backend)}};
  b.on_message([](botmesh::context& c) { c.reply("ok"); });
  b.start();
  p->inject(msg("ana", "m1", "hola"));
  REQUIRE(p->wait_for_sent(1, 5s));
  REQUIRE(test::eventually([&] { return backend->holding() == 1; }));
  auto stopping = std::async(std::launch::async, [&] { b.stop(); });
  // The stop's beat and its retire would follow at once; the retire waits.
  std::this_thread::sleep_for(500ms);
  CHECK(backend->events().empty());
  backend->answer();
  stopping.get();
  auto events = backend->events();
  REQUIRE_FALSE(events.empty());
  CHECK(events.front() == "confirmed");
  CHECK(std::count(events.begin(), events.end(), "retire") >= 1);
}

TEST_CASE("with durability a journal write whose reply failed and that lands "
          "after its generation was retired is handled once") {
  // Held by a holder that keeps beating, the record would never be handled;
  // retired with its generation, a beat takes it over and handles it.
  auto backend = std::make_shared<overtaken_write_backend>();
  timed_out_write_handled_once(
    backend, [&] { backend->overtake_next = true; },
    [&] {
      REQUIRE(test::eventually([&] { return backend->late.landed == 1; }));
    });
}

namespace {

// The next outbox entry write is held until the test fails it (a write in
// flight whose connection then breaks); everything else goes to a memory
// backend.
class held_outbox_backend final : public forwarding_backend {
 public:
  std::atomic<bool> hold_next{false};
  std::atomic<int> outbox_writes{0};

  bool holding() {
    std::lock_guard guard{mtx_};
    return static_cast<bool>(held_);
  }
  void fail_held() {
    completion<botmesh::outbox_verdict> done;
    {
      std::lock_guard guard{mtx_};
      done = std::move(held_);
      held_ = nullptr;
    }
    done(botmesh::outbox_verdict::send,
         std::make_exception_ptr(botmesh::error(
           errc::store_error, "simulated connection reset")));
  }

  // (Entries written ahead of their sends, and written again.)
  void outbox_record(std::string_view send_id, std::string_view key,
                     std::uint64_t fence, std::string_view writer,
                     std::chrono::milliseconds ttl,
                     completion<botmesh::outbox_verdict> done) override {
    if (hold_next.exchange(false)) {
      std::lock_guard guard{mtx_};
      held_ = std::move(done);
      return;
    }
    ++outbox_writes;
    inner.outbox_record(send_id, key, fence, writer, ttl, std::move(done));
  }

 private:
  std::mutex mtx_;
  completion<botmesh::outbox_verdict> held_;
};

} // namespace

TEST_CASE("with durability an outbox entry in flight at stop that then fails "
          "is written once more before the record can be taken over") {
  auto g = std::make_shared<held_outbox_backend>();
  g->hold_next = true; // the entry written ahead of "uno"
  auto p = std::make_shared<botmesh::testing_provider>();
  auto d = durable(g);
  d.lease = "30s"; // no beat writes it again
  botmesh::bot b{{.provider = p, .durability = d}};
  b.on_message([&](botmesh::context& c) { c.reply("uno"); });
  b.start();
  p->inject(msg("ana", "m1", "hola"));
  REQUIRE(p->wait_for_sent(1, 5s));
  REQUIRE(test::eventually([&] { return g->holding(); }));
  std::atomic<bool> stopped{false};
  std::thread stopper{[&] {
    b.stop();
    stopped = true;
  }};
  // The retire waits for the entry in flight.
  std::this_thread::sleep_for(100ms);
  CHECK_FALSE(stopped.load());
  g->fail_held();
  stopper.join();
  CHECK(g->outbox_writes == 1); // written once more, after the failure
  // Before, the retire went ahead once nothing was in flight: the record
  // was taken over with no entry, and the replay sent "uno" again.
  CHECK(claim_as_other(g->inner).records.empty());
  auto key = botmesh::chat_key("test", "ana");
  CHECK(outbox_verdict_of(g->inner, botmesh::journal_id(key, "m1") + "/0", key)
        == botmesh::outbox_verdict::duplicate);
  CHECK(texts(*p) == std::vector<std::string>{"uno"});
}

namespace {

// The next outbox claim runs only after the take-back that its lost reply
// causes (a call on a broken connection that Redis reads late); the
// confirms are logged beside the error events, in the order they happen,
// and a retire is noted.
class late_claim_backend final : public forwarding_backend {
 public:
  std::atomic<bool> lose_next{false};
  std::atomic<bool> retired{false}; // a retire was made
  late_call late;

  void outbox_claim(std::string_view send_id, std::string_view key,
                    std::uint64_t fence, std::string_view writer,
                    std::chrono::milliseconds ttl,
                    completion<botmesh::outbox_verdict> done) override {
    if (lose_next.exchange(false)) {
      late.hold([this, id = std::string{send_id}, k = std::string{key}, fence,
                 w = std::string{writer}, ttl] {
        inner.outbox_claim(id, k, fence, w, ttl,
                           [](botmesh::outbox_verdict, std::exception_ptr) {});
      });
      return done(botmesh::outbox_verdict::send,
                  std::make_exception_ptr(botmesh::error(
                    errc::timeout, "simulated lost reply (still on its way)")));
    }
    inner.outbox_claim(send_id, key, fence, writer, ttl, std::move(done));
  }
  void outbox_forget(std::string_view send_id, std::string_view writer,
                     completion<bool> done) override {
    inner.outbox_forget(
      send_id, writer,
      [this, done = std::move(done)](bool removed, std::exception_ptr e) {
        late.land();
        done(removed, e);
      });
  }
  void confirm(std::string_view id, std::string_view holder,
               completion<bool> done) override {
    note("confirm " + std::string{id});
    inner.confirm(id, holder, std::move(done));
  }
  void retire(std::string_view holder, completion<bool> done) override {
    inner.retire(holder, [this, done = std::move(done)](bool ok,
                                                          std::exception_ptr e) {
      retired = true;
      done(ok, e);
    });
  }

  void note(std::string what) {
    std::lock_guard guard{mtx_};
    log_.push_back(std::move(what));
  }
  std::vector<std::string> log() {
    std::lock_guard guard{mtx_};
    return log_;
  }

 private:
  std::mutex mtx_;
  std::vector<std::string> log_;
};

} // namespace

TEST_CASE("with durability a lost outbox claim that lands after its "
          "take-back is taken back again before the record is released") {
  auto g = std::make_shared<late_claim_backend>();
  orphan(g->inner, msg("ana", "m1", "hola")); // replayed: sends wait
  g->lose_next = true;
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .durability = durable(g)}};
  std::atomic<int> runs{0};
  b.on_message([&](botmesh::context& c) {
    ++runs;
    c.reply("respuesta");
  });
  b.start();
  REQUIRE(test::eventually([&] { return b.stats().handled == 2; }));
  b.stop();
  CHECK(g->late.landed == 1);
  CHECK(runs == 2);
  // Taken back once more at a beat: the replay sent it, once.
  CHECK(texts(*p) == std::vector<std::string>{"respuesta"});
  CHECK(b.stats().outbox_skipped == 0);
}

TEST_CASE("with durability a record given up is confirmed only after its "
          "error event's listeners ran") {
  auto g = std::make_shared<late_claim_backend>();
  orphan(g->inner, msg("ana", "m1", "hola"));
  auto p = std::make_shared<botmesh::testing_provider>();
  auto d = durable(g);
  d.max_attempts = 1;
  botmesh::bot b{{.provider = p, .durability = d}};
  b.on<botmesh::events::error>([&](const botmesh::events::error& e) {
    if (e.code != errc::handler_failed)
      return;
    std::this_thread::sleep_for(50ms); // a listener that takes a while
    g->note("event");
  });
  b.start();
  auto id = botmesh::journal_id("test:ana", "m1");
  REQUIRE(test::eventually([&] { return g->log().size() >= 2; }));
  b.stop();
  CHECK(g->log() == std::vector<std::string>{"event", "confirm " + id});
}

namespace {

// Outbox entry writes fail while `fail_writes`; the beats of a bot's first
// holder name (generation 0: no "~<gen>" suffix) fail while `fail_first`
// (its heartbeat lapses); retired holder names are logged.
class lapsing_holder_backend final : public forwarding_backend {
 public:
  std::atomic<bool> fail_writes{false};
  std::atomic<bool> fail_first{false};

  static bool first_generation(std::string_view holder) {
    return holder.find('~') == std::string_view::npos;
  }
  bool first_retired() {
    std::lock_guard guard{mtx_};
    return std::any_of(retired_.begin(), retired_.end(),
                       [](const std::string& h) { return first_generation(h); });
  }

  void outbox_record(std::string_view send_id, std::string_view key,
                     std::uint64_t fence, std::string_view writer,
                     std::chrono::milliseconds ttl,
                     completion<botmesh::outbox_verdict> done) override {
    if (fail_writes)
      return done(botmesh::outbox_verdict::send,
                  std::make_exception_ptr(botmesh::error(
                    errc::store_error, "simulated outbox write failure")));
    inner.outbox_record(send_id, key, fence, writer, ttl, std::move(done));
  }
  void beat_and_claim(std::string_view holder, std::chrono::milliseconds lease,
                      std::size_t limit, std::uint32_t max_attempts,
                      completion<claim_result> done) override {
    if (fail_first && first_generation(holder))
      return done({}, std::make_exception_ptr(botmesh::error(
                        errc::store_error, "simulated beat failure")));
    inner.beat_and_claim(holder, lease, limit, max_attempts, std::move(done));
  }
  void retire(std::string_view holder, completion<bool> done) override {
    {
      std::lock_guard guard{mtx_};
      retired_.emplace_back(holder);
    }
    inner.retire(holder, std::move(done));
  }

 private:
  std::mutex mtx_;
  std::vector<std::string> retired_;
};

} // namespace

TEST_CASE("with durability a record handled again under a later generation "
          "while its first turn's outbox entry is unwritten lets the earlier "
          "generation retire") {
  // The first turn's settle waits for its entry; the heartbeat of its
  // generation lapses, and this process takes the record over under the
  // next one. Each generation's settle is its own: before, the later turn's
  // settle replaced the earlier one, whose generation then stayed open and
  // beating (holding whatever it still held) until the process ended.
  auto g = std::make_shared<lapsing_holder_backend>();
  g->fail_writes = true; // the first attempt's entry stays unwritten
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .durability = durable(g)}};
  std::atomic<int> runs{0};
  b.on_message([&](botmesh::context& c) {
    ++runs;
    c.reply("uno");
  });
  b.start();
  p->inject(msg("ana", "m1", "hola"));
  REQUIRE(p->wait_for_sent(1, 5s));
  g->fail_first = true; // generation 0's heartbeat lapses
  // Generation 1 takes the record over (its holder looks dead).
  REQUIRE(test::eventually([&] { return runs == 2; }, 10s));
  REQUIRE(test::eventually([&] { return b.stats().handled == 2; }));
  g->fail_writes = false;
  g->fail_first = false;
  CHECK(test::eventually([&] { return g->first_retired(); }, 5s));
  b.stop();
}


TEST_CASE("with durability a lost outbox claim of a handler that outlived "
          "the retire is taken back again when it lands late") {
  // No beat comes after the retire: the second take-back (for a claim
  // that lands after the first) is made at once. Before, it waited for a
  // beat that never came, and the late claim's entry made the replay
  // elsewhere skip a send that was never made.
  auto g = std::make_shared<late_claim_backend>();
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p,
                  .stop_timeout = "50ms",
                  .durability = durable(g)}};
  std::atomic<bool> entered{false};
  std::atomic<bool> refused{false};
  b.on_message([&](botmesh::context& c) {
    entered = true;
    // Ignores its stop token: runs on past the stop's retire.
    while (!g->retired)
      std::this_thread::sleep_for(1ms);
    g->lose_next = true;
    try {
      c.reply("respuesta");
    } catch (const std::exception&) {
      refused = true;
    }
  });
  b.start();
  p->inject(msg("ana", "m1", "hola"));
  REQUIRE(test::eventually([&] { return entered.load(); }));
  b.stop();
  CHECK(refused);
  CHECK(g->late.landed == 1);
  auto key = botmesh::chat_key("test", "ana");
  // No entry: whoever handles the record again makes the send.
  CHECK(outbox_verdict_of(g->inner, botmesh::journal_id(key, "m1") + "/0", key)
        == botmesh::outbox_verdict::send);
  CHECK(texts(*p).empty());
}

TEST_CASE("with durability an answer too large to save, cut with its step, "
          "answers the question it was cut at once its record is handled "
          "again") {
  botmesh::memory_coordination_hub hub;
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  auto p = std::make_shared<botmesh::testing_provider>();
  auto co = cut_by_settle(hub);
  co.handover.flows = botmesh::handover_flows::forward;
  co.handover.max_answer_bytes = 256;
  botmesh::bot b{{.provider = p, .coordination = co,
                  .durability = durable(backend)}};
  std::atomic<bool> slow{true};
  botmesh::flow f{"pedido"};
  f.hears({"pedido"})
    .ask("producto", "¿Producto?",
         [&](botmesh::flow_context& c, const botmesh::answer&) {
           if (slow.exchange(false)) // cut by settle
             while (!c.stop_token().stop_requested())
               std::this_thread::sleep_for(1ms);
         })
    .ask("cantidad", "¿Cantidad?",
         [](botmesh::flow_context&, const botmesh::answer&) {});
  b.add_flow(std::move(f));
  b.start();
  p->inject(msg("ana", "m1", "pedido"));
  REQUIRE(p->wait_for_sent(1, 10s));
  p->inject(msg("ana", "m2", std::string(400, 'c')));
  // Not saved in the checkpoint (too large): its record, released with the
  // cut step and handled again, answers the product.
  REQUIRE(p->wait_for_sent(2, 10s));
  CHECK(texts(*p)
        == std::vector<std::string>{"¿Producto?", "¿Cantidad?"});
  CHECK(b.stats().reprocessed == 1);
  b.stop();
}

TEST_CASE("a bot that goes waits for a journal write still in flight, "
          "however long the backend takes") {
  // The application's actor system: the bot's own would wait for the
  // journal actor in the bot's destructor anyway.
  caf::actor_system_config cfg;
  botmesh::configure_actor_system(cfg);
  caf::actor_system sys{cfg};
  auto g = std::make_shared<test::gated_backend>(); // record() waits
  auto p = std::make_shared<botmesh::testing_provider>();
  auto b = std::make_unique<botmesh::bot>(
    sys, botmesh::bot_options{.provider = p, .durability = test::durable_over(g)});
  b->start();
  p->inject("ana", "hola"); // its journal write waits for the gate
  using clk = std::chrono::steady_clock;
  std::atomic<clk::rep> opened_at{0};
  // Past the 20 s the stop used to wait at most: the write's callback
  // then ran into a bot already gone.
  std::thread opener{[&] {
    std::this_thread::sleep_for(22s);
    opened_at = clk::now().time_since_epoch().count();
    g->open();
  }};
  test::reset_or_abort(b, 90s,
                       "the bot's destructor hangs after its journal write came");
  auto gone_at = clk::now().time_since_epoch().count();
  opener.join();
  // It went only once the write's callback had run.
  CHECK(opened_at.load() != 0);
  CHECK(gone_at >= opened_at.load());
}

namespace {

// One round of the test below. True when the failure's listener ran on
// the thread that reported it (the handler pool had stopped); false when
// the stop had not yet passed the journal operations it waits for before
// the chats end when the handler returned: the failure then came while the
// pool still ran, and the round shows nothing of the case.
bool listener_stop_round() {
  auto g = std::make_shared<test::gated_backend>();
  g->open();
  auto p = std::make_shared<botmesh::testing_provider>();
  auto d = durable(g);
  d.lease = "3s"; // beats every second, each believed for 2.7 s
  botmesh::bot b{{.provider = p, .stop_timeout = "50ms", .durability = d}};
  std::promise<void> started, go;
  auto resume = go.get_future().share();
  b.on_message([&](botmesh::context&) {
    started.set_value();
    resume.wait(); // ignores its stop token: outlives the journal's end
  });
  std::mutex mtx;
  std::vector<std::thread::id> ran_on;
  std::atomic<int> stops_returned{0};
  b.on<botmesh::events::error>([&](const botmesh::events::error& e) {
    if (e.code != errc::store_error)
      return;
    {
      std::lock_guard guard{mtx};
      ran_on.push_back(std::this_thread::get_id());
    }
    b.stop(); // an operator's rule: a broken journal stops the bot
    ++stops_returned;
  });
  b.start();
  p->inject(msg("ana", "m1", "hola"));
  started.get_future().wait();
  std::thread stopper{[&] {
    test::run_or_abort([&] { b.stop(); }, 60s,
                       "stop() and a listener's stop() wait for each other");
  }};
  // The retire landed, and a moment more: the stop is past the journal's
  // operations it waits for before the chats end (on a loaded machine it
  // may not be: the round then says so). The handler's confirm, made now,
  // fails once the handler pool has stopped; its error event runs on the
  // thread that reports it, which the stop waits for.
  REQUIRE(test::eventually(
    [&] { return !claim_as_other(g->inner).records.empty(); }, 5s));
  std::this_thread::sleep_for(200ms);
  g->late_settles = 1;
  go.set_value();
  stopper.join();
  // Whichever way it went: both stops returned, the listener's too.
  CHECK(stops_returned == 1);
  std::lock_guard guard{mtx};
  std::lock_guard guard2{g->mtx};
  REQUIRE(g->late_threads.size() == 1);
  REQUIRE(ran_on.size() == 1);
  return ran_on[0] == g->late_threads[0];
}

} // namespace

TEST_CASE("with durability a listener that stops the bot from a journal "
          "failure reported after the handler pool stopped does not wait "
          "for the stop that waits for it") {
  // A round whose handler returned before the stop reached the chats' end
  // is run again (it happened under ctest -j2 with a build beside it).
  bool seen = false;
  for (int round = 0; round < 5 && !seen; ++round)
    seen = listener_stop_round();
  CHECK(seen);
}
