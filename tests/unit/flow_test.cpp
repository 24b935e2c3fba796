#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/stores/forwarding_coordinator.hpp>
#include <botmesh/stores/memory_coordinator.hpp>

#include "test_util.hpp"

using namespace std::chrono_literals;
using botmesh::answer;
using botmesh::flow;
using botmesh::flow_context;
using botmesh::flow_task;

// Only JSON can enter a conversation's state: these do not compile.
struct not_json {};
static_assert(!std::is_constructible_v<nlohmann::json, int*>);
static_assert(!std::is_constructible_v<nlohmann::json, void (*)()>);
static_assert(!std::is_constructible_v<nlohmann::json, not_json>);

namespace {

std::vector<std::string> texts(const botmesh::testing_provider& p,
                               const std::string& chat) {
  std::vector<std::string> out;
  for (auto& m : p.sent_to(chat))
    out.push_back(m.text);
  return out;
}

// The order flow of the example, persistent: product, quantity (validated),
// confirmation inside a do step that may ask twice.
flow order_flow(std::atomic<int>* confirmed = nullptr) {
  flow f{"pedido"};
  f.hears({"pedido"})
    .ask("producto", "¿Qué producto quieres?",
         [](flow_context& c, const answer& a) {
           c.state()["producto"] = a.text();
         })
    .ask("cantidad", "¿Cuántas unidades?",
         [](flow_context& c, const answer& a) {
           c.state()["cantidad"] = std::stoi(a.text());
         },
         {.validate = [](const answer& a) -> std::optional<std::string> {
           auto t = a.text();
           if (t.empty() || t.size() > 3
               || t.find_first_not_of("0123456789") != std::string::npos
               || std::stoi(t) == 0)
             return "Escribe un número entre 1 y 999.";
           return std::nullopt;
         }})
    .step("confirmar",
          [confirmed](flow_context& c) -> flow_task {
            auto& s = c.state();
            auto a = co_await c.ask(
              "¿Confirmas " + std::to_string(s["cantidad"].get<int>()) + " x "
              + s["producto"].get<std::string>() + "? (sí/no)");
            if (a.text() != "sí") {
              c.send("Pedido cancelado.");
              co_return;
            }
            auto b = co_await c.ask("¿Dirección de entrega?");
            s["direccion"] = b.text();
            if (confirmed)
              ++*confirmed;
            c.send("Pedido confirmado para " + b.text() + ".");
          })
    .persistent();
  return f;
}

} // namespace

TEST_CASE("an ask flow validates, re-asks, keeps state and hands the chat "
          "back to the handlers at its end") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p}};
  b.add_flow(order_flow());
  b.on_message([](botmesh::context& c) { c.reply("handler: " + c.text()); });
  b.start();
  for (auto t : {"pedido", "café", "muchas", "0", "2", "sí", "Calle Mayor 1",
                 "otra cosa"})
    p->inject("ana", t);
  REQUIRE(p->wait_for_sent(10, 5s));
  CHECK(texts(*p, "ana")
        == std::vector<std::string>{
          "¿Qué producto quieres?", "¿Cuántas unidades?",
          "Escribe un número entre 1 y 999.", "¿Cuántas unidades?",
          "Escribe un número entre 1 y 999.", "¿Cuántas unidades?",
          "¿Confirmas 2 x café? (sí/no)", "¿Dirección de entrega?",
          "Pedido confirmado para Calle Mayor 1.", "handler: otra cosa"});
  CHECK(b.stats().conversations == 0);
  // A finished persistent flow clears its checkpoint.
  CHECK_FALSE(b.store().get_checkpoint("test:ana").has_value());
}

TEST_CASE("a conversation coroutine reads like a script, other chats are not "
          "captured") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p}};
  b.conversation("saludo", {"hola"}, [](flow_context& c) -> flow_task {
    auto name = co_await c.ask("¿Cómo te llamas?");
    auto city = co_await c.ask("¿De dónde eres, " + name.text() + "?");
    c.send(name.text() + " de " + city.text() + " 👋");
  });
  b.on_message([](botmesh::context& c) { c.reply("handler: " + c.text()); });
  b.start();
  p->inject("ana", "hola");
  p->inject("luis", "nada");
  p->inject("ana", "Ana");
  p->inject("ana", "Cádiz");
  REQUIRE(p->wait_for_sent(4, 5s));
  CHECK(texts(*p, "ana")
        == std::vector<std::string>{"¿Cómo te llamas?", "¿De dónde eres, Ana?",
                                    "Ana de Cádiz 👋"});
  CHECK(texts(*p, "luis") == std::vector<std::string>{"handler: nada"});
}

TEST_CASE("go_to moves between flows and steps") {
  auto p = std::make_shared<botmesh::testing_provider>();
  flow menu{"menu"};
  menu.hears({"menu"}).ask("opcion", "1) pedido 2) ayuda",
                           [](flow_context& c, const answer& a) {
                             if (a.text() == "1")
                               c.go_to("compra");
                             else
                               c.go_to("compra", "fin");
                           });
  flow compra{"compra"};
  compra.ask("producto", "¿Producto?", [](flow_context& c, const answer& a) {
    c.state()["p"] = a.text();
  }).step("fin", [](flow_context& c) -> flow_task {
    c.send(c.state().value("p", std::string{"nada"}) + ", gracias");
    co_return;
  });
  botmesh::bot b{{.provider = p}};
  b.add_flow(menu).add_flow(compra);
  b.start();
  for (auto t : {"menu", "1", "pan", "menu", "2"})
    p->inject("ana", t);
  REQUIRE(p->wait_for_sent(5, 5s));
  CHECK(texts(*p, "ana")
        == std::vector<std::string>{"1) pedido 2) ayuda", "¿Producto?",
                                    "pan, gracias", "1) pedido 2) ayuda",
                                    "nada, gracias"});
}

TEST_CASE("a wait timeout and an idle watcher act in the chat's order") {
  auto p = std::make_shared<botmesh::testing_provider>();
  flow f{"lento"};
  f.hears({"empezar"}).ask("nombre", "¿Nombre?", nullptr,
                           {.timeout = "60ms"});
  std::atomic<int> idles{0};
  botmesh::bot b{{.provider = p, .lang = "es"}};
  b.conversation("vigilado", {"vigila"}, [&](flow_context& c) -> flow_task {
    c.idle("80ms", [&](flow_context& c2) {
      ++idles;
      c2.send("¿Sigues ahí?");
      c2.end();
    });
    auto a = co_await c.ask("Dime algo");
    c.send("recibido " + a.text());
  });
  b.add_flow(f);
  b.start();
  p->inject("ana", "empezar");
  REQUIRE(p->wait_for_sent(2, 5s));
  CHECK(texts(*p, "ana")
        == std::vector<std::string>{"¿Nombre?",
                                    "Se acabó el tiempo para responder."});
  // After the timeout the answer is no longer captured by the flow.
  p->inject("luis", "vigila");
  REQUIRE(test::eventually([&] { return idles.load() == 1; }));
  REQUIRE(test::eventually([&] { return b.stats().conversations == 0; }));
  CHECK(texts(*p, "luis")
        == std::vector<std::string>{"Dime algo", "¿Sigues ahí?"});
  // The ended conversation's watcher is stale now; a new message is a new turn.
  p->inject("luis", "hola");
  std::this_thread::sleep_for(150ms);
  CHECK(idles.load() == 1);
}

namespace {

// Fails every enter while `down` (the coordinator's backend unreachable).
class failing_enters final : public botmesh::forwarding_coordinator {
 public:
  using forwarding_coordinator::forwarding_coordinator;
  std::atomic<bool> down{false};

  void enter(std::string_view key, std::uint64_t req, bool retry,
             completion<botmesh::turn_state> done) override {
    if (down.load())
      return done({}, std::make_exception_ptr(botmesh::coordination_unavailable_error(
                        "the backend is down (simulated)")));
    c_->enter(key, req, retry, std::move(done));
  }
};

} // namespace

// A bot whose chat enters fail while `coord->down`, with a flow that
// waits 2 s for a name after "empezar" (long enough for a test to take the
// backend down first, under load).
struct failing_enters_bot {
  botmesh::memory_coordination_hub hub;
  std::shared_ptr<failing_enters> coord = std::make_shared<failing_enters>(
    std::make_shared<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = "a", .lease = "2s"}));
  std::shared_ptr<botmesh::testing_provider> p =
    std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{options(coord, p)};

  failing_enters_bot() {
    flow f{"lento"};
    f.hears({"empezar"}).ask("nombre", "¿Nombre?", nullptr, {.timeout = "2s"});
    b.add_flow(f);
  }

  // Starts the bot (listeners registered) and its conversation with "ana";
  // false when the question did not go out.
  bool start() {
    b.start();
    p->inject("ana", "empezar");
    return p->wait_for_sent(1, 5s);
  }

  static botmesh::bot_options options(std::shared_ptr<failing_enters> coord,
                                      std::shared_ptr<botmesh::testing_provider> p) {
    botmesh::coordination_options co;
    co.coordinator = std::move(coord);
    co.turn_wait = "300ms";
    return {.provider = std::move(p), .coordination = co, .lang = "es"};
  }
};

TEST_CASE("a wait timeout whose turn could not be had fires once a turn "
          "can be had again") {
  failing_enters_bot fx;
  std::atomic<int> no_turn{0};
  fx.b.on<botmesh::events::error>([&](const botmesh::events::error& e) {
    if (e.what.find("a flow timer got no turn") != std::string::npos)
      ++no_turn;
  });
  REQUIRE(fx.start());
  fx.coord->down = true; // the timeout comes while no turn can be had
  REQUIRE(test::eventually([&] { return no_turn.load() >= 1; }));
  fx.coord->down = false;
  // Before, the timer was dropped with its failed turn: the conversation
  // waited for good.
  REQUIRE(fx.p->wait_for_sent(2, 10s));
  CHECK(texts(*fx.p, "ana")
        == std::vector<std::string>{"¿Nombre?",
                                    "Se acabó el tiempo para responder."});
  fx.b.stop();
}

TEST_CASE("a wait timeout that keeps getting no turn tries again after 1 s, "
          "then 2 s, then 4 s") {
  failing_enters_bot fx;
  std::mutex mtx;
  std::vector<std::string> no_turn;
  fx.b.on<botmesh::events::error>([&](const botmesh::events::error& e) {
    std::lock_guard guard{mtx};
    if (e.what.find("a flow timer got no turn") != std::string::npos)
      no_turn.push_back(e.what);
  });
  REQUIRE(fx.start());
  fx.coord->down = true; // from the timeout on, no turn can be had
  REQUIRE(test::eventually(
    [&] {
      std::lock_guard guard{mtx};
      return no_turn.size() >= 3;
    },
    15s));
  fx.b.stop();
  std::lock_guard guard{mtx};
  // Before, every second: with the coordination down, each waiting
  // conversation raised an error event a second for as long as it lasted.
  int i = 0;
  for (auto delay : {"1s", "2s", "4s"}) {
    CAPTURE(no_turn[i]);
    CHECK(no_turn[i++].find(std::string{"(tried again in "} + delay + ")")
          != std::string::npos);
  }
}

TEST_CASE("an idle watcher registered again on each pass of a loop fires "
          "once on silence, not once per pass") {
  auto p = std::make_shared<botmesh::testing_provider>();
  std::atomic<int> idles{0};
  botmesh::bot b{{.provider = p, .lang = "es"}};
  b.conversation("menu", {"menu"}, [&](flow_context& c) -> flow_task {
    for (int pass = 0; pass < 5; ++pass) {
      c.idle("1s", [&](flow_context& c2) {
        ++idles;
        c2.send("¿Sigues ahí?");
      });
      auto a = co_await c.ask("¿Qué quieres?");
      c.send("vale " + a.text());
    }
  });
  b.start();
  p->inject("ana", "menu");
  REQUIRE(p->wait_for_sent(1, 5s));
  p->inject("ana", "uno");
  REQUIRE(p->wait_for_sent(3, 5s));
  p->inject("ana", "dos");
  REQUIRE(p->wait_for_sent(5, 5s));
  // Waiting at the third pass: one watcher. There were three, re-armed
  // together by the last message, and silence sent three reminders.
  REQUIRE(test::eventually([&] { return idles.load() >= 1; }));
  std::this_thread::sleep_for(300ms);
  CHECK(idles.load() == 1);
  b.stop();
}

TEST_CASE("an idle watcher firing while a step waits keeps the go_to the step "
          "set before its ask") {
  auto p = std::make_shared<botmesh::testing_provider>();
  std::atomic<int> idles{0};
  flow f{"compra"};
  f.hears({"comprar"})
    .step("elige",
          [&](flow_context& c) -> flow_task {
            c.go_to_step("pagar");
            c.idle("100ms", [&](flow_context& c2) {
              ++idles;
              c2.send("¿Sigues ahí?");
            });
            auto a = co_await c.ask("¿Cuál?");
            c.state()["p"] = a.text();
          })
    .step("envio",
          [](flow_context& c) -> flow_task {
            c.send("envío");
            co_return;
          })
    .step("pagar", [](flow_context& c) -> flow_task {
      c.send("pagar " + c.state().value("p", std::string{}));
      co_return;
    });
  botmesh::bot b{{.provider = p, .lang = "es"}};
  b.add_flow(f);
  b.start();
  p->inject("ana", "comprar");
  REQUIRE(test::eventually([&] { return idles.load() == 1; }));
  p->inject("ana", "pan");
  REQUIRE(p->wait_for_sent(3, 5s));
  b.stop();
  // The watcher cleared the go_to, and the flow went on to "envio".
  CHECK(texts(*p, "ana")
        == std::vector<std::string>{"¿Cuál?", "¿Sigues ahí?", "pagar pan"});
}

TEST_CASE("a persistent flow resumes in another bot sharing the store: the "
          "first question's answer is taken, not asked again") {
  auto store = std::make_shared<botmesh::memory_store>();
  auto p1 = std::make_shared<botmesh::testing_provider>();
  {
    botmesh::bot a{{.provider = p1, .store = store}};
    a.add_flow(order_flow());
    a.start();
    p1->inject("ana", "pedido");
    p1->inject("ana", "té verde 🍵");
    REQUIRE(p1->wait_for_sent(2, 5s));
    REQUIRE(test::eventually([&] {
      auto cp = store->get_checkpoint("test:ana");
      return cp && cp->waiting && cp->step == "cantidad";
    }));
  }
  auto cp = store->get_checkpoint("test:ana");
  REQUIRE(cp);
  CHECK(cp->flow == "pedido");
  CHECK(cp->question == 0);
  CHECK(nlohmann::json::parse(cp->state)["producto"] == "té verde 🍵");
  auto p2 = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p2, .store = store}};
  b.add_flow(order_flow());
  b.start();
  p2->inject("ana", "3");
  REQUIRE(p2->wait_for_sent(1, 5s));
  // "3" answered "¿Cuántas unidades?" without it being asked again.
  CHECK(texts(*p2, "ana")
        == std::vector<std::string>{"¿Confirmas 3 x té verde 🍵? (sí/no)"});
}

TEST_CASE("a persistent do step waiting at a later question starts over in "
          "another bot") {
  auto store = std::make_shared<botmesh::memory_store>();
  auto p1 = std::make_shared<botmesh::testing_provider>();
  {
    botmesh::bot a{{.provider = p1, .store = store}};
    a.add_flow(order_flow());
    a.start();
    for (auto t : {"pedido", "pan", "2", "sí"})
      p1->inject("ana", t);
    REQUIRE(p1->wait_for_sent(4, 5s)); // ... "¿Dirección de entrega?"
  }
  auto cp = store->get_checkpoint("test:ana");
  REQUIRE(cp);
  CHECK(cp->step == "confirmar");
  CHECK(cp->question == 1);
  auto p2 = std::make_shared<botmesh::testing_provider>();
  std::atomic<int> confirmed{0};
  botmesh::bot b{{.provider = p2, .store = store}};
  b.add_flow(order_flow(&confirmed));
  b.start();
  p2->inject("ana", "Calle Luna 3");
  REQUIRE(p2->wait_for_sent(1, 5s));
  // The step repeats from its first question; the state survived.
  CHECK(texts(*p2, "ana")
        == std::vector<std::string>{"¿Confirmas 2 x pan? (sí/no)"});
  p2->inject("ana", "sí");
  p2->inject("ana", "Calle Luna 3");
  REQUIRE(p2->wait_for_sent(3, 5s));
  CHECK(confirmed.load() == 1);
  REQUIRE(test::eventually([&] { return !store->get_checkpoint("test:ana"); }));
}

TEST_CASE("a rejected checkpoint write ends the conversation as superseded") {
  auto store = std::make_shared<botmesh::memory_store>();
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p, .store = store}};
  errors.attach(b);
  b.add_flow(order_flow());
  b.on_message([](botmesh::context& c) { c.reply("handler"); });
  b.start();
  p->inject("ana", "pedido");
  REQUIRE(p->wait_for_sent(1, 5s));
  // The flow waits for the product (its checkpoint says so)...
  REQUIRE(test::eventually([&] {
    auto cp = store->get_checkpoint("test:ana");
    return cp && cp->waiting;
  }));
  // ...when another writer moves the checkpoint on (a replica that took the
  // chat). This bot's next write, after the answer, is refused.
  auto other = *store->get_checkpoint("test:ana");
  other.step = "cantidad";
  REQUIRE(store->set_checkpoint_if(other, other.revision));
  p->inject("ana", "café");
  REQUIRE(test::eventually([&] { return errors.count(botmesh::errc::lease_lost) == 1; }));
  CHECK(errors.all()[0].what.find("superseded") != std::string::npos);
  REQUIRE(test::eventually([&] { return b.stats().conversations == 0; }));
  // The new owner's checkpoint stays.
  CHECK(store->get_checkpoint("test:ana")->step == "cantidad");
}

TEST_CASE("a conversation superseded by the rewrite after a refused answer "
          "ends there: the chat's next message reads the store") {
  auto store = std::make_shared<botmesh::memory_store>();
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p, .store = store}};
  errors.attach(b);
  std::atomic<int> checks{0};
  flow f{"numero"};
  f.hears({"numero"})
    .ask("n", "¿Número?",
         [](flow_context& c, const answer& a) { c.send("ok " + a.text()); },
         botmesh::ask_options{
           .validate = [&](const answer&) -> std::optional<std::string> {
             if (++checks > 1)
               return std::nullopt;
             // Another writer (a replica that took the chat) moves the
             // checkpoint on between this turn's write of the answer and
             // its rewrite without it.
             auto other = *store->get_checkpoint("test:ana");
             other.saved_answer.reset();
             other.answer_ref.clear();
             REQUIRE(store->set_checkpoint_if(other, other.revision));
             return "no es un número";
           }})
    .persistent();
  b.add_flow(f);
  b.on_message([](botmesh::context& c) { c.reply("handler"); });
  b.start();
  p->inject("ana", "numero");
  REQUIRE(p->wait_for_sent(1, 5s));
  p->inject("ana", "x");
  REQUIRE(p->wait_for_sent(3, 5s)); // the refusal and the question again
  REQUIRE(test::eventually(
    [&] { return errors.count(botmesh::errc::lease_lost) == 1; }));
  // Superseded: nothing of it stays in memory to take the next message.
  REQUIRE(test::eventually([&] { return b.stats().conversations == 0; }));
  p->inject("ana", "7");
  REQUIRE(p->wait_for_sent(4, 5s));
  CHECK(texts(*p, "ana").back() == "ok 7");
}

TEST_CASE("a checkpoint of a changed flow notifies the user in the bot's "
          "language") {
  auto store = std::make_shared<botmesh::memory_store>();
  botmesh::flow_checkpoint cp;
  cp.key = "test:ana";
  cp.flow = "pedido";
  cp.step = "paso-que-ya-no-existe";
  cp.waiting = true;
  cp.fingerprint = "old";
  REQUIRE(store->set_checkpoint_if(cp, 0));
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p, .store = store, .lang = "es"}};
  errors.attach(b);
  std::mutex mtx;
  std::vector<std::string> handovers;
  b.on<botmesh::events::handover>([&](const botmesh::events::handover& e) {
    std::lock_guard guard{mtx};
    handovers.push_back(e.name + " " + e.outcome + " " + e.reason);
  });
  b.add_flow(order_flow());
  b.start();
  p->inject("ana", "hola");
  REQUIRE(p->wait_for_sent(1, 5s));
  CHECK(p->sent()[0].text == botmesh::text("es", "core.conversation.interrupted"));
  // Without coordination a changed flow is told to the user; no error.
  REQUIRE(test::eventually([&] {
    std::lock_guard guard{mtx};
    return handovers == std::vector<std::string>{"pedido notified changed"};
  }));
  CHECK(errors.all().empty());
  CHECK_FALSE(store->get_checkpoint("test:ana").has_value());
  CHECK(botmesh::text("en", "core.conversation.interrupted")
        == "The conversation was interrupted. Let's start again.");
  CHECK(botmesh::text("fr", "core.conversation.interrupted")
        == botmesh::text("en", "core.conversation.interrupted"));
}

TEST_CASE("a step that throws ends its conversation with an error event") {
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p}};
  errors.attach(b);
  b.conversation("roto", {"roto"}, [](flow_context& c) -> flow_task {
    co_await c.ask("¿Seguro?");
    throw std::runtime_error("paso roto");
  });
  b.on_message([](botmesh::context& c) { c.reply("handler"); });
  b.start();
  p->inject("ana", "roto");
  p->inject("ana", "sí");
  p->inject("ana", "después");
  REQUIRE(p->wait_for_sent(2, 5s));
  CHECK(errors.count(botmesh::errc::handler_failed) == 1);
  CHECK(errors.all()[0].what.find("paso roto") != std::string::npos);
  CHECK(texts(*p, "ana") == std::vector<std::string>{"¿Seguro?", "handler"});
}

TEST_CASE("a do step co_awaits sends and sleeps, holding the chat's turn") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p}};
  b.conversation("pausa", {"pausa"}, [](flow_context& c) -> flow_task {
    co_await c.send("uno");
    co_await c.sleep("50ms");
    co_await c.send("dos");
    auto a = co_await c.ask("¿tres?");
    c.send("fin " + a.text());
  });
  b.on_message([](botmesh::context& c) { c.reply("handler " + c.text()); });
  b.start();
  auto t0 = std::chrono::steady_clock::now();
  p->inject("ana", "pausa");
  p->inject("ana", "3"); // waits for the sleeping step, then answers
  REQUIRE(p->wait_for_sent(4, 5s));
  CHECK(std::chrono::steady_clock::now() - t0 >= 50ms);
  CHECK(texts(*p, "ana")
        == std::vector<std::string>{"uno", "dos", "¿tres?", "fin 3"});
}

namespace {

// A memory store that counts checkpoint reads, and fails the next
// checkpoint write of a conversation waiting at step `fail_wait_at` once.
class counting_store final : public botmesh::store {
 public:
  std::atomic<int> checkpoint_reads{0};
  std::atomic<int> failed_writes{0};
  std::string fail_wait_at; // set before start()
  botmesh::memory_store inner;

  void save_chat(const botmesh::chat_record& r) override { inner.save_chat(r); }
  std::optional<botmesh::chat_record> get_chat(std::string_view k) override {
    return inner.get_chat(k);
  }
  bool delete_chat(std::string_view k) override { return inner.delete_chat(k); }
  std::vector<botmesh::chat_record> list_chats() override {
    return inner.list_chats();
  }
  void save_contact(const botmesh::contact_record& r) override {
    inner.save_contact(r);
  }
  std::optional<botmesh::contact_record> get_contact(std::string_view i) override {
    return inner.get_contact(i);
  }
  bool delete_contact(std::string_view i) override {
    return inner.delete_contact(i);
  }
  std::vector<botmesh::contact_record> list_contacts() override {
    return inner.list_contacts();
  }
  std::uint64_t append_message(std::string_view k,
                               const botmesh::logged_message& m) override {
    return inner.append_message(k, m);
  }
  std::vector<botmesh::logged_message> messages(std::string_view k,
                                                std::size_t n) override {
    return inner.messages(k, n);
  }
  std::optional<botmesh::flow_checkpoint>
  get_checkpoint(std::string_view k) override {
    ++checkpoint_reads;
    return inner.get_checkpoint(k);
  }
  std::uint64_t set_checkpoint(const botmesh::flow_checkpoint& c) override {
    return inner.set_checkpoint(c);
  }
  std::optional<std::uint64_t>
  set_checkpoint_if(const botmesh::flow_checkpoint& c, std::uint64_t r) override {
    if (c.waiting && !fail_wait_at.empty() && c.step == fail_wait_at
        && failed_writes.fetch_add(1) == 0)
      throw botmesh::error(botmesh::errc::store_error,
                           "checkpoint write failed (test)");
    return inner.set_checkpoint_if(c, r);
  }
  bool clear_checkpoint_if(std::string_view k, std::uint64_t r) override {
    return inner.clear_checkpoint_if(k, r);
  }
  void clear_checkpoint(std::string_view k) override { inner.clear_checkpoint(k); }
  std::optional<std::string> get_user_data(std::string_view u, std::string_view n,
                                           std::string_view k) override {
    return inner.get_user_data(u, n, k);
  }
  void set_user_data(std::string_view u, std::string_view n, std::string_view k,
                     std::string_view v,
                     std::optional<std::chrono::milliseconds> t) override {
    inner.set_user_data(u, n, k, v, t);
  }
  bool delete_user_data(std::string_view u, std::string_view n,
                        std::string_view k) override {
    return inner.delete_user_data(u, n, k);
  }
  std::vector<std::pair<std::string, std::string>>
  list_user_data(std::string_view u, std::string_view n) override {
    return inner.list_user_data(u, n);
  }
  std::optional<botmesh::fenced_lock>
  acquire_lock_fenced(std::string_view k, std::chrono::milliseconds t) override {
    return inner.acquire_lock_fenced(k, t);
  }
  bool renew_lock(std::string_view k, std::string_view tok,
                  std::chrono::milliseconds t) override {
    return inner.renew_lock(k, tok, t);
  }
  bool release_lock(std::string_view k, std::string_view tok) override {
    return inner.release_lock(k, tok);
  }
};

} // namespace

TEST_CASE("a wait's checkpoint write that fails keeps the last checkpoint "
          "that landed: the next message resumes the conversation") {
  auto store = std::make_shared<counting_store>();
  store->fail_wait_at = "cantidad";
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p, .store = store}};
  errors.attach(b);
  b.add_flow(order_flow());
  b.on_message([](botmesh::context& c) { c.reply("nuevo: " + c.text()); });
  b.start();
  p->inject("ana", "pedido");
  REQUIRE(p->wait_for_sent(1, 5s));
  p->inject("ana", "café");
  REQUIRE(test::eventually(
    [&] { return errors.count(botmesh::errc::store_error) == 1; }));
  CHECK(store->failed_writes.load() == 1);
  REQUIRE(test::eventually([&] { return b.stats().conversations == 0; }));
  // The conversation is still in the store, where it last landed.
  auto cp = store->get_checkpoint("test:ana");
  REQUIRE(cp);
  CHECK(cp->flow == "pedido");
  // Waiting for the product, or (the write before the failed one) at the
  // quantity with the product kept.
  CHECK((cp->step == "producto" || cp->step == "cantidad"));
  auto before = p->sent().size();
  p->inject("ana", "3");
  REQUIRE(p->wait_for_sent(before + 1, 5s));
  // Resumed, not routed as new: the saved "café" answered the product
  // and "3" the quantity, or "3" answered the product.
  auto last = p->sent().back().text;
  CAPTURE(last);
  CHECK((last == "¿Confirmas 3 x café? (sí/no)" || last == "¿Cuántas unidades?"));
}

TEST_CASE("checkpoints are read once per chat activation, not per message") {
  auto store = std::make_shared<counting_store>();
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .store = store}};
  b.add_flow(order_flow());
  b.on_message([](botmesh::context& c) { c.reply(c.text()); });
  b.start();
  for (int i = 0; i < 20; ++i)
    p->inject("ana", "hola " + std::to_string(i));
  REQUIRE(p->wait_for_sent(20, 5s));
  // One lookup when the chat's actor started; none for the other 19.
  CHECK(store->checkpoint_reads.load() == 1);
}

TEST_CASE("a waiting flow survives its chat's passivation when the first "
          "message after it never reaches the flows") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .passivate_after = "30ms"}};
  flow f{"pedido"};
  f.hears({"pedido"}).ask("producto", "¿Qué producto quieres?",
                          [](flow_context& c, const answer& a) {
                            c.send("Anotado: " + a.text());
                          });
  b.add_flow(f); // not persistent: it lives in memory only
  // A sticker is swallowed before the flows see it.
  b.use([](botmesh::context& c, const std::function<void()>& next) {
    if (c.text() != "sticker")
      next();
  });
  b.on_message([](botmesh::context& c) { c.reply("handler: " + c.text()); });
  b.start();
  p->inject("ana", "pedido");
  REQUIRE(p->wait_for_sent(1, 5s));
  REQUIRE(test::eventually([&] { return b.stats().passivations >= 1; }));
  p->inject("ana", "sticker");
  REQUIRE(test::eventually([&] { return b.stats().handled == 2; }));
  p->inject("ana", "manzana");
  REQUIRE(p->wait_for_sent(2, 5s));
  CHECK(texts(*p, "ana")
        == std::vector<std::string>{"¿Qué producto quieres?",
                                    "Anotado: manzana"});
}
