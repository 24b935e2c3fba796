#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <thread>

#include <botmesh/runtime/core/checkpoint.hpp>
#include <botmesh/runtime/internal/flow_engine.hpp>
#include <botmesh/stores/forwarding_coordinator.hpp>
#include <botmesh/stores/memory_coordinator.hpp>
#include <botmesh/stores/memory_durable_backend.hpp>
#include <botmesh/stores/memory_store.hpp>

#include "handover/handover_suite.hpp"
#include "test_util.hpp"

namespace {

// The handover suite on one process: replicas on a memory hub (keeping
// up to `MaxIdle` idle chats), sharing a memory store.
template <std::size_t MaxIdle>
struct hub_env {
  botmesh::memory_coordination_hub hub{{.max_idle_keys = MaxIdle}};
  std::shared_ptr<test::recording_store> store =
    std::make_shared<test::recording_store>(
      std::make_shared<botmesh::memory_store>());

  std::shared_ptr<botmesh::coordinator> coordinator(std::string id) {
    return std::make_shared<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = std::move(id)});
  }

  void corrupt(const std::string&) {
    store->corrupt_reads = true; // the next read of a stored checkpoint
  }
};

using memory_env = hub_env<botmesh::memory_hub_options{}.max_idle_keys>;
// A hub that forgets every idle chat at once: each turn's previous holder
// is unknown, as after a chat key expired in Redis.
using forgetful_env = hub_env<0>;

std::string field_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const botmesh::invalid_argument_error& e) {
    return e.field();
  }
  return "(nothing thrown)";
}

} // namespace

BOTMESH_HANDOVER_SUITE(memory_env)

TEST_CASE("an ephemeral checkpoint expires ttl after its write and never "
          "before its wait's timeout") {
  using namespace std::chrono_literals;
  auto t = botmesh::from_unix_ms(1'000'000);
  CHECK(botmesh::internal::ephemeral_expiry(t, 5min, 0ms) == t + 5min);
  CHECK(botmesh::internal::ephemeral_expiry(t, 5min, 2min) == t + 5min);
  CHECK(botmesh::internal::ephemeral_expiry(t, 5min, 20min) == t + 20min + 10s);
}

TEST_CASE("plain JSON state: no binary values and no non-finite numbers") {
  using nlohmann::json;
  CHECK(botmesh::internal::is_plain_json(
    json::parse(R"({"a":[1,2.5,"x",null,true,{"b":{}}]})")));
  CHECK_FALSE(botmesh::internal::is_plain_json(
    json{{"a", json::array({json::binary({1, 2})})}}));
  CHECK_FALSE(botmesh::internal::is_plain_json(
    json{{"n", std::numeric_limits<double>::quiet_NaN()}}));
  CHECK_FALSE(botmesh::internal::is_plain_json(
    json{{"n", std::numeric_limits<double>::infinity()}}));
}

TEST_CASE("a waiting marker round-trips in the checkpoint encoding, older "
          "encodings without it read as checkpoints") {
  botmesh::flow_checkpoint cp;
  cp.key = "test:x";
  cp.flow = "saludo";
  cp.step = "conversation";
  cp.marker = true;
  cp.ephemeral = true;
  cp.expires_at = botmesh::from_unix_ms(5000);
  auto json = botmesh::to_json(cp);
  CHECK(json.find("\"marker\":true") != std::string::npos);
  CHECK(botmesh::checkpoint_from_json(json) == cp);
  cp.marker = false;
  json = botmesh::to_json(cp);
  CHECK(json.find("marker") == std::string::npos);
  CHECK_FALSE(botmesh::checkpoint_from_json(json).marker);
  auto bad = botmesh::to_json(cp);
  bad.insert(bad.size() - 1, ",\"marker\":3");
  try {
    botmesh::checkpoint_from_json(bad);
    FAIL("a mistyped marker was accepted");
  } catch (const botmesh::error& e) {
    CHECK(e.code() == botmesh::errc::corrupted_record);
    CHECK(std::string{e.what()}.find("marker") != std::string::npos);
  }
}

TEST_CASE("handover options are checked when the bot is made, naming the "
          "field") {
  botmesh::memory_coordination_hub hub;
  auto make = [&](botmesh::handover_options h) {
    botmesh::coordination_options co;
    co.coordinator = std::make_shared<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = "a"});
    co.handover = std::move(h);
    botmesh::bot b{{.provider = std::make_shared<botmesh::testing_provider>(),
                    .coordination = co}};
  };
  CHECK(field_of([&] { make({.ttl = botmesh::duration{"0ms"}}); })
        == "handover.ttl");
  CHECK(field_of([&] { make({.max_answer_bytes = 0}); })
        == "handover.max_answer_bytes");
  CHECK(field_of([&] { make({.fallback = botmesh::handover_function{}}); })
        == "handover.fallback");
  CHECK(field_of([&] { make({}); }) == "(nothing thrown)");
}

TEST_CASE("coordination durations of zero are refused when the bot is made, "
          "naming the field") {
  botmesh::memory_coordination_hub hub;
  auto make = [&](auto change) {
    botmesh::coordination_options co;
    co.coordinator = std::make_shared<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = "a"});
    change(co);
    botmesh::bot b{{.provider = std::make_shared<botmesh::testing_provider>(),
                    .coordination = co}};
  };
  using co_t = botmesh::coordination_options;
  CHECK(field_of([&] { make([](co_t& c) { c.turn_wait = "0ms"; }); })
        == "coordination.turn_wait");
  CHECK(field_of([&] { make([](co_t& c) { c.settle = "0s"; }); })
        == "coordination.settle");
  CHECK(field_of([&] { make([](co_t& c) { c.max_poll = "0"; }); })
        == "coordination.max_poll");
  CHECK(field_of([&] { make([](co_t& c) { c.provider_down = "0ms"; }); })
        == "coordination.provider_down");
  CHECK(field_of([&] { make([](co_t&) {}); }) == "(nothing thrown)");
}

namespace {

botmesh::inbound_message message(std::string id, std::string text) {
  botmesh::inbound_message m;
  m.chat = "x";
  m.sender = "x";
  m.id = std::move(id);
  m.text = std::move(text);
  return m;
}

} // namespace

TEST_CASE("with durability a step cut by settle whose answer landed in the "
          "checkpoint confirms its record, one too large to embed releases "
          "it and the message is handled again") {
  using namespace test::handover;
  bool large = false;
  SUBCASE("embedded answer") {
    large = false;
  }
  SUBCASE("answer over max_answer_bytes") {
    large = true;
  }
  memory_env env;
  std::atomic<bool> slow{true};
  auto backend = std::make_shared<botmesh::memory_durable_backend>();
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::coordination_options co;
  co.coordinator = env.coordinator("r");
  co.settle = "300ms";
  co.handover = forward();
  co.handover.max_answer_bytes = 256;
  botmesh::bot b{{.provider = p, .store = env.store, .coordination = co,
                  .durability = botmesh::durability_options{
                    .backend = backend, .instance_id = "r", .lease = "300ms"}}};
  test::error_log errors;
  errors.attach(b);
  b.add_flow(order_flow(false, &slow));
  b.start();
  p->inject(message("m1", "pedido"));
  REQUIRE(p->wait_for_sent(1, 10s));
  REQUIRE(waiting_at(env, "producto"));
  auto answer = large ? std::string(400, 'c') : std::string{"café"};
  p->inject(message("m2", answer));
  REQUIRE(test::eventually(
    [&] { return errors.count(botmesh::errc::lease_lost) >= 1; }));
  if (large) {
    // Not kept by any checkpoint: released, handled again, and this time
    // it answers the product.
    REQUIRE(p->wait_for_sent(2, 10s));
    CHECK(texts(*p).back() == "¿Cantidad?");
    CHECK(b.stats().reprocessed == 1);
    return;
  }
  p->inject(message("m3", "3"));
  REQUIRE(p->wait_for_sent(2, 10s));
  CHECK(texts(*p).back() == "¿Dirección?");
  p->inject(message("m4", "Calle 1"));
  REQUIRE(p->wait_for_sent(3, 10s));
  CHECK(texts(*p).back() == "3 x café a Calle 1");
  b.stop();
  CHECK(b.stats().reprocessed == 0);
  CHECK(texts(*p).size() == 3);
}

namespace {

// Rewrites what each release hands over, as a fault between the replicas.
class rewriting_coordinator final : public botmesh::forwarding_coordinator {
 public:
  using rewrite_fn = std::function<std::string(std::string_view)>;

  rewriting_coordinator(std::shared_ptr<botmesh::coordinator> c,
                        std::shared_ptr<rewrite_fn> fn)
    : forwarding_coordinator(std::move(c)), fn_(std::move(fn)) {
    // nop
  }

  void release(botmesh::turn_ref t, std::string_view handoff,
               completion<botmesh::release_result> done) override {
    auto out = *fn_ ? (*fn_)(handoff) : std::string{handoff};
    forwarding_coordinator::release(std::move(t), out, std::move(done));
  }

 private:
  std::shared_ptr<rewrite_fn> fn_;
};

struct rewriting_env : memory_env {
  std::shared_ptr<rewriting_coordinator::rewrite_fn> rewrite =
    std::make_shared<rewriting_coordinator::rewrite_fn>();

  std::shared_ptr<botmesh::coordinator> coordinator(std::string id) {
    return std::make_shared<rewriting_coordinator>(
      memory_env::coordinator(std::move(id)), rewrite);
  }
};

// A handed checkpoint changed by `fn` (the payload is "1" and its JSON).
rewriting_coordinator::rewrite_fn
change_checkpoint(std::function<void(botmesh::flow_checkpoint&)> fn) {
  return [fn](std::string_view h) -> std::string {
    if (h.size() < 2 || h[0] != '1')
      return std::string{h};
    auto cp = botmesh::checkpoint_from_json(h.substr(1));
    fn(cp);
    return "1" + botmesh::to_json(cp);
  };
}

} // namespace

TEST_CASE("a handover message that cannot be used (garbled, or an ephemeral "
          "checkpoint about to expire) is ignored: the taker reads the "
          "store") {
  using namespace test::handover;
  rewriting_env env;
  SUBCASE("garbled JSON") {
    *env.rewrite = [](std::string_view) { return std::string{"1{\"v\":"}; };
  }
  SUBCASE("an unknown kind") {
    *env.rewrite = [](std::string_view) { return std::string{"2"}; };
  }
  SUBCASE("an ephemeral checkpoint expiring within a second") {
    *env.rewrite = change_checkpoint([](botmesh::flow_checkpoint& cp) {
      cp.expires_at = botmesh::clock::system().now() + 500ms;
    });
  }
  gated_pair p{env, forward()};
  auto &a = p.a, &b = p.b;
  auto& gate = p.gate_a;
  REQUIRE(a.say("pedido", 1));
  auto reads = env.store->checkpoint_reads.load();
  REQUIRE(relay(a, gate, "café", 2, b, "3", 1));
  CHECK(b.last() == "¿Dirección?");
  CHECK(env.store->checkpoint_reads.load() > reads);
  CHECK(b.error_count() == 0);
}

namespace {

// a hands b an older revision than it wrote; b (with `b_options`) must
// refuse it as superseded before sending anything of the stale position.
void stale_hand_is_superseded(const botmesh::handover_options& b_options) {
  using namespace test::handover;
  rewriting_env env;
  *env.rewrite = change_checkpoint(
    [](botmesh::flow_checkpoint& cp) { cp.revision -= 1; });
  gated_pair p{env, forward(), b_options};
  auto &a = p.a, &b = p.b;
  auto& gate = p.gate_a;
  REQUIRE(a.say("pedido", 1));
  gate.arm("café");
  REQUIRE(a.say("café", 2));
  b.provider->inject("x", "3");
  std::this_thread::sleep_for(300ms);
  gate.open = true;
  REQUIRE(eventually([&] { return b.errors_with(botmesh::errc::lease_lost) > 0; }));
  CHECK(b.error_text(botmesh::errc::lease_lost).find("superseded")
        != std::string::npos);
  CHECK(b.provider->sent().empty());
  // The store still waits at the quantity, as a left it.
  auto cp = env.store->get_checkpoint("test:x");
  REQUIRE(cp);
  CHECK(cp->step == "cantidad");
  CHECK(cp->waiting);
}

} // namespace

TEST_CASE("a handed checkpoint that is not the store's latest cannot write "
          "over it: the taker's first write is refused (superseded, the "
          "turn is lost) and nothing of the stale position is sent") {
  stale_hand_is_superseded(test::handover::forward());
}

TEST_CASE("a handed checkpoint that is not the store's latest, taken by a "
          "replica that does not forward, is superseded before anything of "
          "the stale position is sent") {
  // A rolling deploy: b still keeps flows in memory only.
  stale_hand_is_superseded(botmesh::handover_options{});
}

TEST_CASE("a checkpoint over 64 KiB is not handed over: the taker reads the "
          "store") {
  using namespace test::handover;
  memory_env env;
  // Before the replicas: their handlers use it until they are gone.
  turn_gate gate;
  replica a{env, "a", forward()};
  replica b{env, "b", forward()};
  a.bot->use(gate.hold());
  for (auto* r : {&a, &b}) {
    botmesh::flow f{"pedido"};
    f.hears({"pedido"})
      .ask("producto", "¿Producto?",
           [](botmesh::flow_context& c, const botmesh::answer&) {
             c.state()["notas"] = std::string(70 * 1024, 'n');
           })
      .ask("cantidad", "¿Cantidad?",
           [](botmesh::flow_context& c, const botmesh::answer& a) {
             c.send("ok " + a.text() + " "
                    + std::to_string(c.state()["notas"].get<std::string>().size()));
           });
    r->bot->add_flow(std::move(f));
    r->bot->start();
  }
  REQUIRE(a.say("pedido", 1));
  auto reads = env.store->checkpoint_reads.load();
  REQUIRE(relay(a, gate, "café", 2, b, "3", 1));
  CHECK(b.last() == "ok 3 71680");
  CHECK(env.store->checkpoint_reads.load() > reads);
  CHECK(b.error_count() == 0);
}

TEST_CASE("a waiting flow's timeout fires on its replica when the "
          "coordinator forgot who held the chat last, and a copy another "
          "replica moved past is still discarded") {
  using namespace test::handover;
  forgetful_env env;
  SUBCASE("one replica: the timeout is said") {
    replica a{env, "a"};
    a.bot->add_flow(order_flow(true, nullptr, botmesh::duration{"150ms"}));
    a.bot->start();
    REQUIRE(a.say("pedido", 1));
    REQUIRE(a.say("café", 2));
    CHECK(a.last() == "¿Cantidad?");
    REQUIRE(a.provider->wait_for_sent(3, 10s));
    CHECK(a.last() == botmesh::text("en", "core.conversation.timeout"));
    CHECK(no_checkpoint(env));
    CHECK(a.error_count() == 0);
  }
  SUBCASE("one replica, a forwarded (ephemeral) flow: the timeout is said") {
    replica a{env, "a", forward({.ttl = botmesh::duration{"100ms"}})};
    a.bot->add_flow(order_flow(false, nullptr, botmesh::duration{"300ms"}));
    a.bot->start();
    REQUIRE(a.say("pedido", 1));
    REQUIRE(a.say("café", 2));
    REQUIRE(a.provider->wait_for_sent(3, 10s));
    CHECK(a.last() == botmesh::text("en", "core.conversation.timeout"));
    CHECK(a.error_count() == 0);
  }
  SUBCASE("two replicas: the stale copy stays silent") {
    replica a{env, "a"};
    replica b{env, "b"};
    a.bot->add_flow(order_flow(true, nullptr, botmesh::duration{"400ms"}));
    b.bot->add_flow(order_flow(true));
    a.bot->start();
    b.bot->start();
    REQUIRE(a.say("pedido", 1));
    REQUIRE(a.say("café", 2));
    REQUIRE(waiting_at(env, "cantidad"));
    REQUIRE(b.say("3", 1)); // b resumes from the store and moves it on
    CHECK(b.last() == "¿Dirección?");
    REQUIRE(waiting_at(env, "direccion"));
    // a's timer turn comes and goes: its copy is discarded, unsaid.
    CHECK(eventually([&] { return a.bot->stats().conversations == 0; }));
    CHECK(a.provider->sent().size() == 2);
    REQUIRE(b.say("Calle 1", 2));
    CHECK(b.last() == "3 x café a Calle 1");
    CHECK(a.error_count() == 0);
  }
}

TEST_CASE("a stale flow timer's turn on another replica leaves the "
          "conversation it did not touch alive where it lives") {
  using namespace test::handover;
  memory_env env;
  replica a{env, "a"};
  replica b{env, "b"};
  // On a, an ask with a timeout answered at once: its timer is stale, and
  // still takes a turn of the chat when it fires.
  botmesh::flow quick{"rapido"};
  quick.hears({"rapido"}).ask(
    "si", "¿Sí?",
    [](botmesh::flow_context& c, const botmesh::answer&) { c.send("ok"); },
    botmesh::ask_options{.timeout = botmesh::duration{"300ms"}});
  a.bot->add_flow(quick);
  add_greeting(*b.bot);
  a.bot->start();
  b.bot->start();
  REQUIRE(a.say("rapido", 1));
  REQUIRE(a.say("vale", 2)); // a's flow ends; its timer goes on
  REQUIRE(b.say("hola", 1));
  CHECK(b.last() == "¿Cómo te llamas?");
  // a's stale timer takes the chat's turn from b and gives it back.
  std::this_thread::sleep_for(600ms);
  REQUIRE(b.say("Ana", 2));
  CHECK(b.last() == "¿De dónde eres?");
  REQUIRE(b.say("Lima", 3));
  // With nothing handed on by a's turn, b dropped its live conversation:
  // the answer was cut off as an interrupted conversation.
  CHECK(b.last() == "Hola, Ana de Lima");
  CHECK(a.provider->sent().size() == 2);
  CHECK(a.error_count() == 0);
  CHECK(b.error_count() == 0);
}

TEST_CASE("a corrupted checkpoint is cleared at its own revision: a newer "
          "checkpoint written while the reader stalled stays") {
  using namespace test::handover;
  memory_env env;
  replica a{env, "a", reading_store()};
  replica b{env, "b", reading_store()};
  auto cp = order_started_on_a(env, a, b);
  REQUIRE(cp);
  // While b's read of the damaged record stalls, another replica writes
  // the next revision.
  std::optional<std::uint64_t> newer;
  env.store->after_corrupt_read = [&] {
    auto next = *cp;
    next.step = "cantidad";
    newer = env.store->set_checkpoint_if(next, cp->revision);
  };
  env.corrupt("test:x");
  REQUIRE(b.say("café", 1));
  CHECK(b.last() == "nuevo: café");
  REQUIRE(newer);
  // Cleared unconditionally, it was gone: the writer's next write refused,
  // its conversation lost as superseded.
  auto now = env.store->get_checkpoint("test:x");
  REQUIRE(now);
  CHECK(now->revision == *newer);
  CHECK(now->step == "cantidad");
}

TEST_CASE("a notice's replica moves the marker on before it sends: the "
          "replica whose copy it was does not resume it after a turn whose "
          "holder is unknown") {
  using namespace test::handover;
  forgetful_env env;
  botmesh::handover_options h;
  h.fallback = botmesh::handover_fallback::notify;
  replica a{env, "a", h};
  replica b{env, "b", h};
  for (auto* r : {&a, &b}) {
    add_greeting(*r->bot);
    r->bot->start();
  }
  REQUIRE(a.say("hola", 1));
  auto before = waiting_at(env, "conversation");
  REQUIRE(before);
  // b's notice does not go out (as if b died after sending it, before its
  // marker went): the marker stays, at a later revision.
  b.provider->fail_sends(true);
  b.provider->inject("x", "Ana");
  REQUIRE(eventually([&] { return b.bot->stats().handled >= 1; }));
  auto after = env.store->get_checkpoint("test:x");
  REQUIRE(after);
  CHECK(after->marker);
  CHECK(after->revision > before->revision);
  // a's copy is at the old revision: dropped, and a applies the fallback.
  REQUIRE(a.say("Ana", 2));
  CHECK(a.last() == botmesh::text("en", "core.conversation.interrupted"));
  CHECK(no_checkpoint(env));
}
