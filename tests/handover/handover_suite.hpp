#pragma once

// Handover of conversations between replicas (spec: "Relevo de
// conversaciones", "Un paso cortado conserva su respuesta"), written once
// and run on every backend. An Env gives:
//   std::shared_ptr<test::recording_store> store;       // shared by replicas
//   std::shared_ptr<botmesh::coordinator> coordinator(std::string id);
//   void corrupt(const std::string& key);  // the stored checkpoint of key
// Instantiate with BOTMESH_HANDOVER_SUITE(Env).

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <botmesh/runtime/botmesh.hpp>

#include "handover/recording_store.hpp"
#include "unit/test_util.hpp"

namespace test::handover {

using namespace std::chrono_literals;

inline std::vector<std::string> texts(const botmesh::testing_provider& p) {
  std::vector<std::string> out;
  for (auto& m : p.sent())
    out.push_back(m.text);
  return out;
}

using test::eventually;

/// One bot replica of the suite: a testing provider, the Env's coordinator
/// and store, and what its events said.
struct replica {
  std::shared_ptr<botmesh::testing_provider> provider =
    std::make_shared<botmesh::testing_provider>();
  std::unique_ptr<botmesh::bot> bot;
  mutable std::mutex mtx;
  std::vector<botmesh::events::handover> handovers;
  std::vector<botmesh::events::error> errors;

  template <class Env>
  replica(Env& env, std::string id, botmesh::handover_options h = {},
          botmesh::duration settle = "1m") {
    botmesh::coordination_options co;
    co.coordinator = env.coordinator(std::move(id));
    co.settle = settle;
    co.handover = std::move(h);
    bot = std::make_unique<botmesh::bot>(botmesh::bot_options{
      .provider = provider, .store = env.store, .coordination = co});
    bot->on<botmesh::events::handover>(
      [this](const botmesh::events::handover& e) {
        std::lock_guard guard{mtx};
        handovers.push_back(e);
      });
    bot->on<botmesh::events::error>([this](const botmesh::events::error& e) {
      std::lock_guard guard{mtx};
      errors.push_back(e);
    });
    // What no conversation consumed is routed as a new message.
    bot->on_message(
      [](botmesh::context& c) { c.reply("nuevo: " + c.text()); });
  }

  ~replica() {
    bot.reset(); // its threads may still report into the vectors
  }

  /// Injects `text` into chat "x" and waits for the `n`-th send.
  bool say(const std::string& text, std::size_t n) {
    provider->inject("x", text);
    return provider->wait_for_sent(n, 10s);
  }

  std::string last() const {
    auto s = provider->sent();
    return s.empty() ? std::string{} : s.back().text;
  }

  bool saw(const std::string& outcome, const std::string& reason) const {
    std::lock_guard guard{mtx};
    for (auto& e : handovers)
      if (e.outcome == outcome && e.reason == reason && e.key == "test:x")
        return true;
    return false;
  }

  std::size_t errors_with(botmesh::errc code) const {
    std::lock_guard guard{mtx};
    std::size_t n = 0;
    for (auto& e : errors)
      n += e.code == code ? 1 : 0;
    return n;
  }

  std::size_t error_count() const {
    std::lock_guard guard{mtx};
    return errors.size();
  }

  std::string error_text(botmesh::errc code) const {
    std::lock_guard guard{mtx};
    for (auto& e : errors)
      if (e.code == code)
        return e.what;
    return {};
  }
};

/// Three asks; `slow_answer` (cleared on use) makes the next first answer's
/// handler hold the turn until the turn's stop token fires (a step cut by
/// settle).
inline botmesh::flow order_flow(bool persistent = false,
                                std::atomic<bool>* slow_answer = nullptr,
                                std::optional<botmesh::duration> wait2 = {}) {
  botmesh::flow f{"pedido"};
  f.hears({"pedido"})
    .ask("producto", "¿Producto?",
         [slow_answer](botmesh::flow_context& c, const botmesh::answer& a) {
           if (slow_answer && slow_answer->exchange(false))
             while (!c.stop_token().stop_requested())
               std::this_thread::sleep_for(1ms);
           c.state()["producto"] = a.text();
         })
    .ask(
      "cantidad", "¿Cantidad?",
      [](botmesh::flow_context& c, const botmesh::answer& a) {
        c.state()["cantidad"] = a.text();
      },
      botmesh::ask_options{.timeout = wait2})
    .ask("direccion", "¿Dirección?",
         [](botmesh::flow_context& c, const botmesh::answer& a) {
           c.send(c.state()["cantidad"].get<std::string>() + " x "
                  + c.state()["producto"].get<std::string>() + " a "
                  + a.text());
         });
  if (persistent)
    f.persistent();
  return f;
}

/// The same flow after a deploy changed it (a step more: a new fingerprint).
inline botmesh::flow changed_order_flow() {
  botmesh::flow f{"pedido"};
  f.hears({"pedido"})
    .ask("producto", "¿Qué producto?",
         [](botmesh::flow_context& c, const botmesh::answer& a) {
           c.state()["producto"] = a.text();
         })
    .ask("talla", "¿Talla?", [](botmesh::flow_context&, const botmesh::answer&) {})
    .ask("cantidad", "¿Cantidad?",
         [](botmesh::flow_context&, const botmesh::answer&) {})
    .ask("direccion", "¿Dirección?",
         [](botmesh::flow_context&, const botmesh::answer&) {});
  return f;
}

/// A coroutine conversation (never serialized).
inline void add_greeting(botmesh::bot& b) {
  b.conversation("saludo", {"hola"},
                 [](botmesh::flow_context& c) -> botmesh::flow_task {
                   auto a = co_await c.ask("¿Cómo te llamas?");
                   auto d = co_await c.ask("¿De dónde eres?");
                   c.send("Hola, " + a.text() + " de " + d.text());
                 });
}

inline botmesh::handover_options forward(botmesh::handover_options h = {}) {
  h.flows = botmesh::handover_flows::forward;
  return h;
}

inline bool near(botmesh::time_point t, botmesh::time_point want,
                 std::chrono::milliseconds tolerance = 30s) {
  auto d = t > want ? t - want : want - t;
  return d <= tolerance;
}

/// Waits until the stored checkpoint of chat "x" waits at `step` (the
/// question goes out before its checkpoint is written) and returns it.
template <class Env>
std::optional<botmesh::flow_checkpoint> waiting_at(Env& env,
                                                   const std::string& step) {
  std::optional<botmesh::flow_checkpoint> cp;
  eventually([&] {
    cp = env.store->get_checkpoint("test:x");
    return cp && cp->waiting && cp->step == step;
  });
  return cp;
}

/// Waits until chat "x" has no stored checkpoint.
template <class Env>
bool no_checkpoint(Env& env) {
  return eventually([&] { return !env.store->get_checkpoint("test:x"); });
}

/// Forwarded flows without a handover message: a taker reads the store
/// (a message from the previous holder's release would spare it that read).
inline botmesh::handover_options reading_store() {
  auto h = forward();
  h.message = false;
  return h;
}

/// Starts `a` and `b` with order_flow() and orders on `a`; returns the
/// checkpoint that waits for the product.
template <class Env>
std::optional<botmesh::flow_checkpoint> order_started_on_a(Env& env,
                                                           replica& a,
                                                           replica& b) {
  for (auto* r : {&a, &b}) {
    r->bot->add_flow(order_flow());
    r->bot->start();
  }
  REQUIRE(a.say("pedido", 1));
  return waiting_at(env, "producto");
}

/// Starts `a` and `b` with order_flow(); a's order gets "café" (message
/// id "m-cafe"), and its checkpoint, written in that message's turn, waits
/// at the next question. Returns that message.
template <class Env>
botmesh::inbound_message cafe_answered_on_a(Env& env, replica& a, replica& b) {
  a.bot->add_flow(order_flow());
  b.bot->add_flow(order_flow());
  a.bot->start();
  b.bot->start();
  botmesh::inbound_message cafe;
  cafe.id = "m-cafe";
  cafe.text = "café";
  cafe.chat = cafe.sender = "x";
  REQUIRE(a.say("pedido", 1));
  a.provider->inject(cafe);
  REQUIRE(a.provider->wait_for_sent(2, 10s));
  // The checkpoint that waits at the next question: "café" is in it.
  REQUIRE(waiting_at(env, "cantidad"));
  return cafe;
}

inline botmesh::time_point now() {
  return botmesh::clock::system().now();
}

/// Two replicas running `order_flow`; a's first answer handler outlives its
/// settle, so `cut` leaves the step cut (its answer saved when it fits)
/// for b to take.
template <class Env>
struct cut_step {
  Env env;
  std::atomic<bool> slow{true};
  std::atomic<bool> never{false};
  replica a;
  replica b;

  explicit cut_step(bool persistent = false,
                    botmesh::handover_options h = forward())
    : a{env, "a", h, "300ms"}, b{env, "b", h} {
    a.bot->add_flow(order_flow(persistent, &slow));
    b.bot->add_flow(order_flow(persistent, &never));
  }

  /// Starts both (middleware goes before), starts the order on a and
  /// answers its first question with `answer`; returns the checkpoint the
  /// cut left.
  std::optional<botmesh::flow_checkpoint> cut(botmesh::inbound_message answer) {
    a.bot->start();
    b.bot->start();
    if (!a.say("pedido", 1))
      return std::nullopt;
    answer.chat = answer.sender = "x";
    a.provider->inject(std::move(answer));
    if (!eventually([&] { return a.errors_with(botmesh::errc::lease_lost) >= 1; }))
      return std::nullopt;
    return env.store->get_checkpoint("test:x");
  }

  std::optional<botmesh::flow_checkpoint> cut(std::string text) {
    botmesh::inbound_message m;
    m.text = std::move(text);
    return cut(std::move(m));
  }

  /// cut() with "café" (platform id "m-cafe"), which the checkpoint saves;
  /// returns that message as chat "x" sent it.
  botmesh::inbound_message cut_cafe() {
    botmesh::inbound_message cafe;
    cafe.id = "m-cafe";
    cafe.text = "café";
    auto cp = cut(cafe);
    REQUIRE(cp);
    REQUIRE(cp->saved_answer);
    REQUIRE(cp->saved_answer->id == "m-cafe");
    cafe.chat = cafe.sender = "x";
    return cafe;
  }
};

/// Holds a replica's turn for one message text on chat "x", after its
/// handlers ran, until `open`: a message for another replica waits for
/// that turn meanwhile.
struct turn_gate {
  std::mutex mtx;
  std::string text; // the message whose turn holds; empty: none
  std::atomic<bool> open{false};

  void arm(const std::string& t) {
    std::lock_guard guard{mtx};
    text = t;
    open = false;
  }

  botmesh::middleware hold() {
    return [this](botmesh::context& c, const std::function<void()>& next) {
      next();
      {
        std::lock_guard guard{mtx};
        if (text.empty() || c.text() != text)
          return;
        text.clear();
      }
      auto until = std::chrono::steady_clock::now() + 10s;
      while (!open.load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(1ms);
    };
  }
};

/// Runs `text` on `holder` under `gate` and injects `next` into `taker`
/// while that turn holds, so the taker's turn is granted by the holder's
/// release; returns once the taker sent its `n`-th message.
inline bool relay(replica& holder, turn_gate& gate, const std::string& text,
                  std::size_t holder_sends, replica& taker,
                  const std::string& next, std::size_t n) {
  gate.arm(text);
  if (!holder.say(text, holder_sends))
    return false;
  taker.provider->inject("x", next);
  // The taker's ticket reaches the backend in about a millisecond; this
  // leaves it far more.
  std::this_thread::sleep_for(300ms);
  gate.open = true;
  return taker.provider->wait_for_sent(n, 10s);
}

/// Runs the calling test with handover messages on (the default) and off
/// (every change of replica reads the store); `nested` runs inside each,
/// so its own subcases cross with these. Returns which one runs now.
inline bool messages_on_and_off(const std::function<void()>& nested = {}) {
  bool on = true;
  SUBCASE("handover messages on (the default)") {
    on = true;
    if (nested)
      nested();
  }
  SUBCASE("handover messages off: the store is read") {
    on = false;
    if (nested)
      nested();
  }
  return on;
}

/// Two replicas running `order_flow()`, each able to hold one turn under
/// its own gate (see `relay`).
struct gated_pair {
  turn_gate gate_a, gate_b; // before the replicas: their middleware uses them
  replica a;
  replica b;

  template <class Env>
  gated_pair(Env& env, const botmesh::handover_options& h)
    : gated_pair(env, h, h) {
    // nop
  }

  /// a and b with handover options of their own (a rolling deploy).
  template <class Env>
  gated_pair(Env& env, const botmesh::handover_options& ha,
             const botmesh::handover_options& hb)
    : a{env, "a", ha}, b{env, "b", hb} {
    a.bot->use(gate_a.hold());
    b.bot->use(gate_b.hold());
    for (auto* r : {&a, &b}) {
      r->bot->add_flow(order_flow());
      r->bot->start();
    }
  }
};

} // namespace test::handover

TEST_CASE_TEMPLATE_DEFINE("handover: forward carries a non-persistent flow "
                          "across three replicas through ephemeral "
                          "checkpoints",
                          Env, handover_1) {
  using namespace test::handover;
  Env env;
  replica a{env, "a", forward()};
  replica b{env, "b", forward()};
  replica c{env, "c", forward()};
  for (auto* r : {&a, &b, &c}) {
    r->bot->add_flow(order_flow());
    r->bot->start();
  }
  REQUIRE(a.say("pedido", 1));
  CHECK(a.last() == "¿Producto?");
  auto cp = waiting_at(env, "producto");
  REQUIRE(cp);
  CHECK(cp->ephemeral);
  CHECK_FALSE(cp->marker);
  CHECK(cp->waiting);
  CHECK(cp->step == "producto");
  // Without a ttl nor a wait timeout: 5 minutes after the write.
  CHECK(near(cp->expires_at, now() + 5min));
  REQUIRE(b.say("café", 1));
  CHECK(b.last() == "¿Cantidad?");
  REQUIRE(c.say("3", 1));
  CHECK(c.last() == "¿Dirección?");
  // Back on a: its copy in memory is stale; the checkpoint wins.
  REQUIRE(a.say("Calle 1", 2));
  CHECK(a.last() == "3 x café a Calle 1");
  CHECK(no_checkpoint(env));
  CHECK(eventually([&] { return b.saw("resumed", "") && c.saw("resumed", ""); }));
  for (auto* r : {&a, &b, &c})
    CHECK(r->error_count() == 0);
}

TEST_CASE_TEMPLATE_DEFINE("handover: with flows keep (the default) a "
                          "non-persistent flow is lost on a change of replica "
                          "and its message routed as new",
                          Env, handover_2) {
  using namespace test::handover;
  Env env;
  replica a{env, "a"};
  replica b{env, "b"};
  for (auto* r : {&a, &b}) {
    r->bot->add_flow(order_flow());
    r->bot->start();
  }
  REQUIRE(a.say("pedido", 1));
  CHECK_FALSE(env.store->get_checkpoint("test:x"));
  CHECK(env.store->checkpoint_writes.load() == 0);
  REQUIRE(b.say("café", 1));
  CHECK(b.last() == "nuevo: café");
}

TEST_CASE_TEMPLATE_DEFINE("handover: an ephemeral checkpoint lives ttl after "
                          "its last write and never less than its wait's "
                          "timeout, each wait renews it",
                          Env, handover_3) {
  using namespace test::handover;
  Env env;
  botmesh::handover_options h = forward();
  h.ttl = "10m";
  replica a{env, "a", h};
  a.bot->add_flow(order_flow(false, nullptr, botmesh::duration{"30m"}));
  a.bot->start();
  REQUIRE(a.say("pedido", 1));
  auto first = waiting_at(env, "producto");
  REQUIRE(first);
  CHECK(near(first->expires_at, now() + 10min));
  REQUIRE(a.say("café", 2)); // waits at "cantidad", whose timeout is 30m
  auto second = waiting_at(env, "cantidad");
  REQUIRE(second);
  CHECK(second->revision > first->revision);
  CHECK(near(second->expires_at, now() + 30min));
  REQUIRE(a.say("2", 3)); // back to the ttl
  auto third = waiting_at(env, "direccion");
  REQUIRE(third);
  CHECK(near(third->expires_at, now() + 10min));
}

TEST_CASE_TEMPLATE_DEFINE("handover: an expired ephemeral checkpoint is not "
                          "resumed",
                          Env, handover_4) {
  using namespace test::handover;
  Env env;
  botmesh::handover_options h = forward();
  h.ttl = "300ms";
  replica a{env, "a", h};
  replica b{env, "b", h};
  for (auto* r : {&a, &b}) {
    r->bot->add_flow(order_flow());
    r->bot->start();
  }
  REQUIRE(a.say("pedido", 1));
  REQUIRE(eventually([&] { return !env.store->get_checkpoint("test:x"); }));
  REQUIRE(b.say("café", 1));
  CHECK(b.last() == "nuevo: café");
}

TEST_CASE_TEMPLATE_DEFINE("handover: a conversation whose own ephemeral "
                          "checkpoint expired goes on where it waits, and "
                          "writes its checkpoint anew",
                          Env, handover_25) {
  using namespace test::handover;
  Env env;
  botmesh::handover_options h = forward();
  h.ttl = "300ms";
  replica a{env, "a", h};
  a.bot->add_flow(order_flow());
  a.bot->start();
  REQUIRE(a.say("pedido", 1));
  REQUIRE(eventually([&] { return !env.store->get_checkpoint("test:x"); }));
  // The same replica still has the conversation, and nobody took the chat.
  REQUIRE(a.say("café", 2));
  CHECK(a.last() == "¿Cantidad?");
  auto cp = waiting_at(env, "cantidad");
  REQUIRE(cp);
  CHECK(cp->ephemeral);
  CHECK(a.error_count() == 0);
}

TEST_CASE_TEMPLATE_DEFINE("handover: a replica that does not forward resumes "
                          "an ephemeral checkpoint and removes it",
                          Env, handover_5) {
  using namespace test::handover;
  Env env;
  replica a{env, "a", forward()};
  replica b{env, "b"}; // flows: keep
  for (auto* r : {&a, &b}) {
    r->bot->add_flow(order_flow());
    r->bot->start();
  }
  REQUIRE(a.say("pedido", 1));
  REQUIRE(b.say("café", 1));
  CHECK(b.last() == "¿Cantidad?");
  CHECK(no_checkpoint(env));
  REQUIRE(b.say("2", 2));
  CHECK(b.last() == "¿Dirección?");
}

TEST_CASE_TEMPLATE_DEFINE("handover: the ephemeral checkpoint is kept after an "
                          "orderly stop and the next replica resumes it",
                          Env, handover_6) {
  using namespace test::handover;
  Env env;
  replica a{env, "a", forward()};
  replica b{env, "b", forward()};
  for (auto* r : {&a, &b}) {
    r->bot->add_flow(order_flow());
    r->bot->start();
  }
  REQUIRE(a.say("pedido", 1));
  a.bot->stop();
  REQUIRE(env.store->get_checkpoint("test:x"));
  REQUIRE(b.say("café", 1));
  CHECK(b.last() == "¿Cantidad?");
}

TEST_CASE_TEMPLATE_DEFINE("handover: a forwarded state that is not plain JSON "
                          "leaves a marker and goes to fallback with reason "
                          "state",
                          Env, handover_7) {
  using namespace test::handover;
  Env env;
  botmesh::handover_options h = forward();
  h.fallback = botmesh::handover_fallback::notify;
  auto make = [] {
    botmesh::flow f{"pedido"};
    f.hears({"pedido"})
      .ask("producto", "¿Producto?",
           [](botmesh::flow_context& c, const botmesh::answer&) {
             c.state()["foto"] = nlohmann::json::binary({1, 2, 3});
           })
      .ask("cantidad", "¿Cantidad?",
           [](botmesh::flow_context&, const botmesh::answer&) {});
    return f;
  };
  replica a{env, "a", h};
  replica b{env, "b", h};
  for (auto* r : {&a, &b}) {
    r->bot->add_flow(make());
    r->bot->start();
  }
  REQUIRE(a.say("pedido", 1));
  REQUIRE(a.say("café", 2));
  CHECK(a.last() == "¿Cantidad?");
  std::optional<botmesh::flow_checkpoint> cp;
  REQUIRE(eventually([&] {
    cp = env.store->get_checkpoint("test:x");
    return cp && cp->marker;
  }));
  CHECK(cp->ephemeral);
  REQUIRE(b.say("3", 1));
  CHECK(b.last() == botmesh::text("en", "core.conversation.interrupted"));
  CHECK(eventually([&] { return b.saw("notified", "state"); }));
  CHECK(no_checkpoint(env));
}

TEST_CASE_TEMPLATE_DEFINE("handover: a flow changed between replicas goes to "
                          "fallback with reason changed",
                          Env, handover_8) {
  using namespace test::handover;
  botmesh::handover_options h = forward();
  std::string want_last;
  std::string want_outcome;
  std::mutex seen_mtx;
  botmesh::handover_info seen;
  SUBCASE("drop") {
    want_last = "nuevo: café";
    want_outcome = "dropped";
  }
  SUBCASE("notify") {
    h.fallback = botmesh::handover_fallback::notify;
    h.notify_message = "Se cortó: empecemos de nuevo";
    want_last = "Se cortó: empecemos de nuevo";
    want_outcome = "notified";
  }
  SUBCASE("restart") {
    h.fallback = botmesh::handover_fallback::restart;
    want_last = "¿Qué producto?"; // the new flow, from its beginning
    want_outcome = "restarted";
  }
  SUBCASE("function") {
    h.fallback = [&](const botmesh::handover_info& info, botmesh::context& c) {
      {
        std::lock_guard guard{seen_mtx};
        seen = info;
      }
      c.reply("migrado " + info.name + " en " + info.step);
      return true;
    };
    want_last = "migrado pedido en producto";
    want_outcome = "handled";
  }
  Env env;
  replica a{env, "a", h};
  replica b{env, "b", h};
  a.bot->add_flow(order_flow());
  b.bot->add_flow(changed_order_flow());
  a.bot->start();
  b.bot->start();
  REQUIRE(a.say("pedido", 1));
  REQUIRE(waiting_at(env, "producto"));
  REQUIRE(b.say("café", 1));
  CHECK(b.last() == want_last);
  CHECK(eventually([&] { return b.saw(want_outcome, "changed"); }));
  if (want_outcome == "handled") {
    std::lock_guard guard{seen_mtx};
    CHECK(seen.key == "test:x");
    CHECK(seen.reason == "changed");
    CHECK(seen.state == "{}");
  }
  if (want_outcome == "restarted")
    CHECK(waiting_at(env, "producto"));
  else
    CHECK(no_checkpoint(env));
}

TEST_CASE_TEMPLATE_DEFINE("handover: a coroutine conversation taken by "
                          "another replica gets each fallback",
                          Env, handover_9) {
  using namespace test::handover;
  botmesh::handover_options h;
  std::vector<std::string> want_b;
  std::string want_outcome;
  bool marker = true;
  SUBCASE("drop writes no marker and routes the message") {
    want_b = {"nuevo: Ana"};
    want_outcome = "";
    marker = false;
  }
  SUBCASE("notify answers the default notice and consumes the message") {
    h.fallback = botmesh::handover_fallback::notify;
    want_b = {std::string{botmesh::text("en", "core.conversation.interrupted")}};
    want_outcome = "notified";
  }
  SUBCASE("restart enters the conversation again from its beginning") {
    h.fallback = botmesh::handover_fallback::restart;
    want_b = {"¿Cómo te llamas?"};
    want_outcome = "restarted";
  }
  SUBCASE("a function that consumes the message") {
    h.fallback = [](const botmesh::handover_info& info, botmesh::context& c) {
      c.reply("migrado " + info.name + " (" + info.reason + ")");
      return true;
    };
    want_b = {"migrado saludo (conversation)"};
    want_outcome = "handled";
  }
  SUBCASE("a function that declines routes the message") {
    h.fallback = [](const botmesh::handover_info&, botmesh::context&) {
      return false;
    };
    want_b = {"nuevo: Ana"};
    want_outcome = "dropped";
  }
  Env env;
  replica a{env, "a", h};
  replica b{env, "b", h};
  replica c{env, "c", h};
  for (auto* r : {&a, &b, &c}) {
    add_greeting(*r->bot);
    r->bot->start();
  }
  REQUIRE(a.say("hola", 1));
  CHECK(a.last() == "¿Cómo te llamas?");
  if (marker) {
    auto cp = waiting_at(env, "conversation");
    REQUIRE(cp);
    CHECK(cp->marker);
    CHECK(cp->flow == "saludo");
  }
  REQUIRE(b.say("Ana", 1));
  CHECK(texts(*b.provider) == want_b);
  if (!want_outcome.empty())
    CHECK(eventually([&] { return b.saw(want_outcome, "conversation"); }));
  if (want_outcome == "restarted") {
    // The restarted conversation lives on b (with its own marker), and a
    // third replica applies the fallback again.
    REQUIRE(waiting_at(env, "conversation"));
    REQUIRE(c.say("Ana", 1));
    CHECK(c.last() == "¿Cómo te llamas?");
  } else {
    CHECK(no_checkpoint(env));
  }
  if (!marker)
    CHECK(env.store->checkpoint_writes.load() == 0);
}

TEST_CASE_TEMPLATE_DEFINE("handover: a coroutine conversation's marker costs "
                          "two writes: at its first wait and at its end",
                          Env, handover_10) {
  using namespace test::handover;
  Env env;
  botmesh::handover_options h;
  h.fallback = botmesh::handover_fallback::notify;
  replica a{env, "a", h};
  add_greeting(*a.bot);
  a.bot->start();
  REQUIRE(a.say("hola", 1));
  REQUIRE(eventually([&] { return env.store->checkpoint_writes.load() == 1; }));
  REQUIRE(a.say("Ana", 2));
  CHECK(a.last() == "¿De dónde eres?");
  REQUIRE(a.say("Lima", 3));
  CHECK(a.last() == "Hola, Ana de Lima");
  // The removal is the last write of the conversation: once it is counted
  // every earlier one is, and the second wait wrote nothing.
  REQUIRE(eventually([&] { return env.store->checkpoint_clears.load() == 1; }));
  CHECK(env.store->checkpoint_writes.load() == 2);
  CHECK_FALSE(env.store->get_checkpoint("test:x"));
}

TEST_CASE_TEMPLATE_DEFINE("handover: a coroutine conversation that waits "
                          "past its marker's ttl keeps its marker",
                          Env, handover_27) {
  using namespace test::handover;
  Env env;
  botmesh::handover_options h;
  h.fallback = botmesh::handover_fallback::notify;
  h.ttl = botmesh::duration{3s};
  replica a{env, "a", h};
  replica b{env, "b", h};
  add_greeting(*a.bot);
  add_greeting(*b.bot);
  a.bot->start();
  b.bot->start();
  REQUIRE(a.say("hola", 1));
  REQUIRE(eventually([&] { return env.store->checkpoint_writes.load() == 1; }));
  // The second wait comes when less than half of the marker's life is
  // left: written again.
  std::this_thread::sleep_for(2s);
  REQUIRE(a.say("Ana", 2));
  CHECK(a.last() == "¿De dónde eres?");
  REQUIRE(eventually([&] { return env.store->checkpoint_writes.load() == 2; }));
  // Past the first write's ttl: the marker is still there for a taker.
  std::this_thread::sleep_for(1600ms);
  auto cp = env.store->get_checkpoint("test:x");
  REQUIRE(cp);
  CHECK(cp->marker);
  REQUIRE(b.say("Lima", 1));
  CHECK(b.last() == botmesh::text("en", "core.conversation.interrupted"));
}

TEST_CASE_TEMPLATE_DEFINE("handover: a step cut by settle keeps its answer, "
                          "the taker does not ask again and keeps the waking "
                          "message for the next question",
                          Env, handover_11) {
  using namespace test::handover;
  bool persistent = false;
  SUBCASE("forwarded flow") {
    persistent = false;
  }
  SUBCASE("persistent flow") {
    persistent = true;
  }
  cut_step<Env> t{persistent};
  replica& a = t.a;
  replica& b = t.b;
  auto cp = t.cut("café");
  REQUIRE(cp);
  REQUIRE(cp->saved_answer);
  CHECK(cp->saved_answer->text == "café");
  CHECK(cp->step == "producto");
  REQUIRE(b.say("3", 1));
  // "café" answered the cut step, "3" the next question: nothing is asked.
  CHECK(b.last() == "¿Dirección?");
  REQUIRE(b.say("Calle 1", 2));
  CHECK(b.last() == "3 x café a Calle 1");
  CHECK(a.provider->sent().size() == 1); // a's late steps never answered
}

TEST_CASE_TEMPLATE_DEFINE("handover: what middleware did to a saved answer "
                          "travels with it, and the taker does not run "
                          "middleware on it again",
                          Env, handover_16) {
  using namespace test::handover;
  cut_step<Env> t;
  replica& a = t.a;
  replica& b = t.b;
  // A voice note becomes its transcript, with the detected language.
  std::atomic<int> a_runs{0}, b_runs{0};
  auto transcribe = [](std::atomic<int>& runs) {
    return [&runs](botmesh::context& c, const std::function<void()>& next) {
      ++runs;
      if (c.message().type == botmesh::message_type::audio) {
        auto& m = c.edit_message();
        m.text = "café (" + m.media_id + ")";
        m.language = "es";
      }
      next();
    };
  };
  a.bot->use(transcribe(a_runs));
  b.bot->use(transcribe(b_runs));
  botmesh::inbound_message voice;
  voice.type = botmesh::message_type::audio;
  voice.media_id = "nota-1";
  auto cp = t.cut(voice);
  CHECK(a_runs.load() == 2);
  REQUIRE(cp);
  REQUIRE(cp->saved_answer);
  CHECK(cp->saved_answer->text == "café (nota-1)");
  CHECK(cp->saved_answer->language == "es");
  CHECK(cp->saved_answer->type == botmesh::message_type::audio);
  REQUIRE(b.say("3", 1));
  CHECK(b.last() == "¿Dirección?");
  REQUIRE(b.say("Calle 1", 2));
  CHECK(b.last() == "3 x café (nota-1) a Calle 1");
  CHECK(b_runs.load() == 2); // "3" and "Calle 1": not the saved answer
}

TEST_CASE_TEMPLATE_DEFINE("handover: the saved answer handled again (its "
                          "message replayed) answers once, not also the next "
                          "question",
                          Env, handover_17) {
  using namespace test::handover;
  cut_step<Env> t;
  replica& b = t.b;
  auto cafe = t.cut_cafe();
  // The same message reaches b (as a journal record is handled again).
  b.provider->inject(cafe);
  REQUIRE(b.provider->wait_for_sent(1, 10s));
  CHECK(b.last() == "¿Cantidad?"); // not taken as the quantity
  REQUIRE(b.say("3", 2));
  CHECK(b.last() == "¿Dirección?");
  REQUIRE(b.say("Calle 1", 3));
  CHECK(b.last() == "3 x café a Calle 1");
}

TEST_CASE_TEMPLATE_DEFINE("handover: an edit of the saved answer is a "
                          "message of its own: it answers the next question",
                          Env, handover_32) {
  using namespace test::handover;
  cut_step<Env> t;
  replica& b = t.b;
  // The user edits "café" into "3" (same message id, an edit id of its
  // own) and the edit reaches b: before, it passed for the saved answer
  // handled again and was swallowed.
  auto edit = t.cut_cafe();
  edit.text = "3";
  edit.edited = true;
  edit.edit_id = "e-1";
  b.provider->inject(edit);
  REQUIRE(b.provider->wait_for_sent(1, 10s));
  CHECK(b.last() == "¿Dirección?");
  REQUIRE(b.say("Calle 1", 2));
  CHECK(b.last() == "3 x café a Calle 1");
}

TEST_CASE_TEMPLATE_DEFINE("handover: an answer handled again after its "
                          "turn moved the conversation on (its message "
                          "replayed) does not also answer the next question",
                          Env, handover_26) {
  using namespace test::handover;
  Env env;
  replica a{env, "a", forward()};
  replica b{env, "b", forward()};
  auto cafe = cafe_answered_on_a(env, a, b);
  CHECK(a.last() == "¿Cantidad?");
  // The same message reaches b (as a journal record whose confirm was
  // lost is handled again): the step asks again, it is no quantity.
  b.provider->inject(cafe);
  REQUIRE(b.provider->wait_for_sent(1, 10s));
  CHECK(b.last() == "¿Cantidad?");
  REQUIRE(b.say("3", 2));
  CHECK(b.last() == "¿Dirección?");
  REQUIRE(b.say("Calle 1", 3));
  CHECK(b.last() == "3 x café a Calle 1");
}

TEST_CASE_TEMPLATE_DEFINE("handover: an edit of the message whose turn wrote "
                          "the checkpoint is a message of its own: it answers "
                          "the question the checkpoint waits at",
                          Env, handover_30) {
  using namespace test::handover;
  Env env;
  replica a{env, "a", forward()};
  replica b{env, "b", forward()};
  auto cafe = cafe_answered_on_a(env, a, b);
  // The user edits "café" into "3" (same message id, an edit id of its
  // own): on b it answers the quantity.
  auto edit = cafe;
  edit.text = "3";
  edit.edited = true;
  edit.edit_id = "e-1";
  b.provider->inject(edit);
  REQUIRE(b.provider->wait_for_sent(1, 10s));
  CHECK(b.last() == "¿Dirección?");
}

TEST_CASE_TEMPLATE_DEFINE("handover: an answer over max_answer_bytes is not "
                          "embedded, and without durability the cut step "
                          "asks again",
                          Env, handover_12) {
  using namespace test::handover;
  botmesh::handover_options h = forward();
  h.max_answer_bytes = 256;
  cut_step<Env> t{false, h};
  replica& b = t.b;
  auto cp = t.cut(std::string(400, 'c'));
  REQUIRE(cp);
  CHECK_FALSE(cp->saved_answer);
  CHECK(cp->step == "producto");
  // Nothing brings the answer back: before, "té" was taken for the
  // product, an answer to a question the user never saw again.
  REQUIRE(b.say("té", 1));
  CHECK(b.last() == "¿Producto?");
  REQUIRE(b.say("café", 2));
  CHECK(b.last() == "¿Cantidad?");
}

TEST_CASE_TEMPLATE_DEFINE("handover: a resume refused by the store (it "
                          "moved on) sends nothing: the waking message is not "
                          "routed as a new one either",
                          Env, handover_29) {
  using namespace test::handover;
  cut_step<Env> t;
  replica& b = t.b;
  auto cp = t.cut("café");
  REQUIRE(cp);
  REQUIRE(cp->saved_answer);
  // b resumes the cut step with "café" and keeps "3" for the next
  // question; its first write finds the store moved on.
  t.env.store->bump_next_write = true;
  b.provider->inject("x", "3");
  REQUIRE(eventually([&] { return b.errors_with(botmesh::errc::lease_lost) >= 1; }));
  std::this_thread::sleep_for(200ms);
  CHECK(b.provider->sent().empty());
}

TEST_CASE_TEMPLATE_DEFINE("handover: a checkpoint write that fails is an "
                          "error event naming it, the chat goes on",
                          Env, handover_13) {
  using namespace test::handover;
  Env env;
  replica a{env, "a", forward()};
  a.bot->add_flow(order_flow());
  a.bot->start();
  env.store->fail_writes = true;
  REQUIRE(a.say("hola", 1)); // not a flow: no write, answered
  a.provider->inject("x", "pedido");
  REQUIRE(eventually([&] { return a.errors_with(botmesh::errc::store_error) == 1; }));
  CHECK(a.error_text(botmesh::errc::store_error).find("checkpoint write failed")
        != std::string::npos);
  CHECK(eventually([&] { return a.bot->stats().conversations == 0; }));
  env.store->fail_writes = false;
  REQUIRE(a.say("pedido", 2));
  CHECK(a.last() == "¿Producto?");
}

TEST_CASE_TEMPLATE_DEFINE("handover: a corrupted checkpoint is an error event "
                          "naming what was wrong, the message is routed as "
                          "new",
                          Env, handover_14) {
  using namespace test::handover;
  Env env;
  // b reads the store (b's message may still find a's turn held).
  replica a{env, "a", reading_store()};
  replica b{env, "b", reading_store()};
  REQUIRE(order_started_on_a(env, a, b));
  env.corrupt("test:x");
  REQUIRE(b.say("café", 1));
  CHECK(b.last() == "nuevo: café");
  auto what = b.error_text(botmesh::errc::corrupted_record);
  CHECK(what.find("test:x") != std::string::npos);
  CHECK(what.find("checkpoint") != std::string::npos);
  REQUIRE(b.say("pedido", 2));
  CHECK(b.last() == "¿Producto?");
}

TEST_CASE_TEMPLATE_DEFINE("handover: a first answer its validator refused is "
                          "not handed to the taker",
                          Env, handover_15) {
  using namespace test::handover;
  Env env;
  auto make = [] {
    botmesh::flow f{"pedido"};
    f.hears({"pedido"})
      .ask(
        "producto", "¿Producto?",
        [](botmesh::flow_context& c, const botmesh::answer& a) {
          c.state()["producto"] = a.text();
        },
        botmesh::ask_options{
          .validate = [](const botmesh::answer& a) -> std::optional<std::string> {
            if (a.text() == "nada")
              return "Elige un producto";
            return std::nullopt;
          }})
      .ask("cantidad", "¿Cantidad?",
           [](botmesh::flow_context&, const botmesh::answer&) {});
    return f;
  };
  replica a{env, "a", forward()};
  replica b{env, "b", forward()};
  for (auto* r : {&a, &b}) {
    r->bot->add_flow(make());
    r->bot->start();
  }
  REQUIRE(a.say("pedido", 1));
  REQUIRE(waiting_at(env, "producto"));
  REQUIRE(a.say("nada", 3));
  CHECK(texts(*a.provider)
        == std::vector<std::string>{"¿Producto?", "Elige un producto",
                                    "¿Producto?"});
  REQUIRE(eventually([&] {
    auto cp = env.store->get_checkpoint("test:x");
    return cp && cp->waiting && cp->step == "producto" && !cp->saved_answer;
  }));
  REQUIRE(b.say("café", 1));
  CHECK(b.last() == "¿Cantidad?");
}

TEST_CASE_TEMPLATE_DEFINE("handover: a release hands the chat's checkpoint "
                          "to the replica its grant goes to, which resumes "
                          "without reading the store",
                          Env, handover_18) {
  using namespace test::handover;
  bool message = messages_on_and_off();
  Env env;
  auto h = forward();
  h.message = message;
  gated_pair p{env, h};
  auto &a = p.a, &b = p.b;
  auto &gate_a = p.gate_a, &gate_b = p.gate_b;
  REQUIRE(a.say("pedido", 1));
  // a answers the product and holds its turn; b's message waits for it.
  auto reads = env.store->checkpoint_reads.load();
  REQUIRE(relay(a, gate_a, "café", 2, b, "3", 1));
  CHECK(b.last() == "¿Dirección?");
  if (message)
    CHECK(env.store->checkpoint_reads.load() == reads);
  else
    CHECK(env.store->checkpoint_reads.load() > reads);
  // b finishes the order (clearing its checkpoint): "no checkpoint" is
  // never handed (nothing could check it against a write still on its
  // way), so a, whose copy in memory is stale, reads the store.
  reads = env.store->checkpoint_reads.load();
  REQUIRE(relay(b, gate_b, "Calle 1", 2, a, "hola", 3));
  CHECK(texts(*b.provider).back() == "3 x café a Calle 1");
  CHECK(a.last() == "nuevo: hola");
  CHECK(env.store->checkpoint_reads.load() > reads);
  CHECK(no_checkpoint(env));
  // A new order on a, answered on b: handed again.
  REQUIRE(a.say("pedido", 4));
  reads = env.store->checkpoint_reads.load();
  REQUIRE(relay(a, gate_a, "té", 5, b, "2", 3));
  CHECK(b.last() == "¿Dirección?");
  if (message)
    CHECK(env.store->checkpoint_reads.load() == reads);
  else
    CHECK(env.store->checkpoint_reads.load() > reads);
  for (auto* r : {&a, &b})
    CHECK(r->error_count() == 0);
}

/// A middleware that answers `text` itself ("ok") without calling next():
/// the turn of that message never reaches the flow engine.
inline botmesh::middleware answers_itself(std::string text) {
  return [text](botmesh::context& c, const std::function<void()>& next) {
    if (c.text() == text) {
      c.reply("ok");
      return;
    }
    next();
  };
}

TEST_CASE_TEMPLATE_DEFINE("handover: a handed checkpoint that its turn did not "
                          "use is not used by a later turn of the same "
                          "replica once the store's copy expired",
                          Env, handover_19) {
  using namespace test::handover;
  bool message = messages_on_and_off();
  bool marker = false;
  SUBCASE("an ephemeral checkpoint (forward)") {
    marker = false;
  }
  SUBCASE("a waiting marker (fallback notify)") {
    marker = true;
  }
  CAPTURE(message);
  CAPTURE(marker);
  Env env;
  auto h = marker ? botmesh::handover_options{} : forward();
  if (marker)
    h.fallback = botmesh::handover_fallback::notify;
  h.message = message;
  h.ttl = botmesh::duration{2s};
  // Before the replicas: their handlers use it until they are gone.
  turn_gate gate;
  replica a{env, "a", h};
  replica b{env, "b", h};
  a.bot->use(gate.hold());
  // b's middleware answers "saltar" itself (an admin command, a filter).
  b.bot->use(answers_itself("saltar"));
  for (auto* r : {&a, &b}) {
    if (marker)
      add_greeting(*r->bot);
    else
      r->bot->add_flow(order_flow());
    r->bot->start();
  }
  // a's turn writes the checkpoint (expiring 2 s later) and holds while
  // b's "saltar" waits: a's release hands it to b, whose turn does not
  // reach the flow engine.
  if (marker) {
    REQUIRE(relay(a, gate, "hola", 1, b, "saltar", 1));
  } else {
    REQUIRE(a.say("pedido", 1));
    REQUIRE(relay(a, gate, "café", 2, b, "saltar", 1));
  }
  CHECK(b.last() == "ok");
  // The store's copy expires: the chat has no conversation any more.
  REQUIRE(eventually([&] { return !env.store->get_checkpoint("test:x"); }));
  // b's next turn (b held the chat last) must see what the store holds:
  // nothing, so the message is routed as a new one.
  b.provider->inject("x", "Ana");
  CHECK(b.provider->wait_for_sent(2, 5s));
  CHECK(texts(*b.provider).size() == 2);
  CHECK(b.last() == "nuevo: Ana");
  CHECK(b.error_text(botmesh::errc::lease_lost) == "");
}

TEST_CASE_TEMPLATE_DEFINE("handover: a replica restarted with the same id "
                          "whose first turn did not reach the flow engine "
                          "never hands \"no checkpoint\" while the store "
                          "holds one",
                          Env, handover_20) {
  using namespace test::handover;
  bool message = messages_on_and_off();
  Env env;
  botmesh::handover_options h;
  h.message = message;
  // Before the replicas: their handlers use it until they are gone.
  turn_gate gate;
  auto a = std::make_unique<replica>(env, "a", h);
  replica b{env, "b", h};
  a->bot->add_flow(order_flow(true));
  b.bot->add_flow(order_flow(true));
  a->bot->start();
  b.bot->start();
  REQUIRE(a->say("pedido", 1));
  REQUIRE(waiting_at(env, "producto"));
  // a restarts with the same replica id: the chat's last holder is "a".
  a.reset();
  replica a2{env, "a", h};
  a2.bot->use(answers_itself("saltar"));
  a2.bot->use(gate.hold());
  a2.bot->add_flow(order_flow(true));
  a2.bot->start();
  // The first turn of the chat on a2 is answered by a middleware.
  REQUIRE(a2.say("saltar", 1));
  REQUIRE(waiting_at(env, "producto"));
  // a2's next turn holds while b's message waits; its release grants b.
  REQUIRE(relay(a2, gate, "hola", 2, b, "café", 1));
  // a2's next message still looked at the store (the first turn's look was
  // not lost to the middleware): "hola" answered the product.
  CHECK(a2.last() == "¿Cantidad?");
  // And b went on from where a2 left the order: "café" is the quantity.
  CHECK(b.last() == "¿Dirección?");
}

TEST_CASE_TEMPLATE_DEFINE("handover: a handed ephemeral checkpoint that "
                          "expires while its turn's middleware runs is not "
                          "resumed",
                          Env, handover_21) {
  using namespace test::handover;
  bool message = messages_on_and_off();
  CAPTURE(message);
  Env env;
  auto h = forward();
  h.message = message;
  h.ttl = botmesh::duration{2s};
  // Before the replicas: their handlers use it until they are gone.
  turn_gate gate;
  replica a{env, "a", h};
  replica b{env, "b", h};
  a.bot->use(gate.hold());
  // b's middleware takes its time (an external lookup) before next().
  b.bot->use([&env](botmesh::context&, const std::function<void()>& next) {
    eventually([&] { return !env.store->get_checkpoint("test:x"); }, 5s);
    next();
  });
  for (auto* r : {&a, &b}) {
    r->bot->add_flow(order_flow());
    r->bot->start();
  }
  REQUIRE(a.say("pedido", 1));
  // a writes the checkpoint at the quantity (expiring 2 s later) and its
  // release grants b's "3", handing it over with 1.7 s to live.
  CHECK(relay(a, gate, "café", 2, b, "3", 1));
  // By the time "3" reaches the flows the store holds nothing: it is a new
  // message.
  CHECK(b.last() == "nuevo: 3");
  CHECK(b.error_text(botmesh::errc::lease_lost) == "");
}

TEST_CASE_TEMPLATE_DEFINE("handover: a conversation whose timer turn failed "
                          "after its clear landed is not handed over",
                          Env, handover_22) {
  using namespace test::handover;
  bool message = messages_on_and_off();
  CAPTURE(message);
  Env env;
  botmesh::handover_options h;
  h.message = message;
  // Before the replicas: their handlers use it until they are gone.
  turn_gate gate;
  replica a{env, "a", h};
  replica b{env, "b", h};
  a.bot->use(gate.hold());
  for (auto* r : {&a, &b}) {
    r->bot->add_flow(order_flow(true, nullptr, botmesh::duration{1s}));
    r->bot->start();
  }
  REQUIRE(a.say("pedido", 1));
  REQUIRE(a.say("café", 2));
  REQUIRE(waiting_at(env, "cantidad"));
  // The quantity times out on a: its timer turn says so and ends the
  // conversation; the clear lands, its reply is lost.
  env.store->lose_write_replies = 1;
  REQUIRE(a.provider->wait_for_sent(3, 10s));
  REQUIRE(no_checkpoint(env));
  REQUIRE(eventually([&] { return a.error_count() >= 1; }));
  // a's next turn holds while b's message waits; its release grants b.
  CHECK(relay(a, gate, "hola", 4, b, "Ana", 1));
  CHECK(a.last() == "nuevo: hola");
  // The store holds nothing: "Ana" is a new message on b.
  CHECK(b.last() == "nuevo: Ana");
  CHECK(b.error_text(botmesh::errc::lease_lost) == "");
}

namespace test::handover {

/// Subcases of handover_23/24: the late write is a coroutine conversation's
/// marker (fallback notify) or a persistent flow's first checkpoint.
/// Returns true for the marker.
inline bool marker_or_first_checkpoint() {
  bool marker = true;
  SUBCASE("a coroutine conversation's marker (fallback notify)") {
    marker = true;
  }
  SUBCASE("a persistent flow's first checkpoint") {
    marker = false;
  }
  return marker;
}

/// handover_23/24: a's first checkpoint write is held before it reaches
/// the store while b takes the chat; then it lands, and a's next message
/// must see it.
struct late_write {
  bool marker;
  turn_gate gate; // before the replicas: their middleware uses it
  replica a;
  replica b;

  template <class Env>
  late_write(Env& env, bool marker_kind, bool message,
             botmesh::duration a_settle)
    : marker(marker_kind),
      a{env, "a", options(message), a_settle},
      b{env, "b", options(message)} {
    b.bot->use(gate.hold());
    for (auto* r : {&a, &b}) {
      if (marker)
        add_greeting(*r->bot);
      else
        r->bot->add_flow(order_flow(true));
      r->bot->start();
    }
  }

  static botmesh::handover_options options(bool message) {
    botmesh::handover_options h;
    h.message = message;
    h.fallback = botmesh::handover_fallback::notify;
    return h;
  }

  /// a starts the conversation.
  void start() {
    a.provider->inject("x", marker ? "hola" : "pedido");
  }

  /// b's message is granted, reads the store (nothing yet) and is new; b
  /// holds its turn. Then a's write lands: the store holds a checkpoint of
  /// the chat that b never saw.
  template <class Env>
  void b_takes_then_write_lands(Env& env) {
    gate.arm("b1");
    REQUIRE(b.say("b1", 1));
    CHECK(b.last() == "nuevo: b1");
    env.store->hold_writes = false;
    REQUIRE(eventually([&] {
      return static_cast<bool>(env.store->get_checkpoint("test:x"));
    }));
  }

  /// a's next message waits for b's turn; b's release grants it. The store
  /// holds a's checkpoint: "Ana" must not be routed as a new message (as it
  /// is when b hands over "no checkpoint").
  void a_sees_its_checkpoint() {
    a.provider->inject("x", "Ana");
    std::this_thread::sleep_for(300ms);
    gate.open = true;
    REQUIRE(a.provider->wait_for_sent(marker ? 2 : 1, 10s));
    CHECK(a.last() != "nuevo: Ana");
    if (marker)
      CHECK(eventually([&] { return a.saw("notified", "conversation"); }));
    else
      CHECK(a.last() == "¿Producto?");
  }
};

} // namespace test::handover

TEST_CASE_TEMPLATE_DEFINE("handover: a checkpoint write that lands after "
                          "settle cut its turn is not hidden from the next "
                          "holder by a handed \"no checkpoint\"",
                          Env, handover_23) {
  using namespace test::handover;
  bool marker = true;
  bool message = messages_on_and_off(
    [&marker] { marker = marker_or_first_checkpoint(); });
  CAPTURE(message);
  CAPTURE(marker);
  Env env;
  late_write t{env, marker, message, "300ms"};
  // a's first checkpoint write (the marker at the first wait, the
  // persistent flow's first step) passed its turn check and freezes before
  // it reaches the store; settle cuts a's turn (released without a
  // handover message).
  env.store->hold_writes = true;
  t.start();
  REQUIRE(eventually([&] { return env.store->write_held.load(); }));
  t.b_takes_then_write_lands(env);
  t.a_sees_its_checkpoint();
}

TEST_CASE_TEMPLATE_DEFINE("handover: a checkpoint write whose reply timed "
                          "out and that lands later is not hidden from the "
                          "next holder by a handed \"no checkpoint\"",
                          Env, handover_24) {
  using namespace test::handover;
  bool marker = true;
  bool message = messages_on_and_off(
    [&marker] { marker = marker_or_first_checkpoint(); });
  CAPTURE(message);
  CAPTURE(marker);
  Env env;
  late_write t{env, marker, message, "1m"};
  // a's first checkpoint write gets no reply in time (an error event, the
  // conversation goes) but is still on its way; a's release hands nothing
  // over (its write is uncertain).
  env.store->hold_writes = true;
  env.store->defer_next_write = true;
  t.start();
  REQUIRE(eventually([&] {
    return t.a.errors_with(botmesh::errc::timeout) >= 1;
  }));
  t.b_takes_then_write_lands(env);
  t.a_sees_its_checkpoint();
}

TEST_CASE_TEMPLATE_DEFINE("handover: a conversation whose ephemeral "
                          "checkpoint lapsed does not write it anew once its "
                          "turn ended during the refused write",
                          Env, handover_31) {
  using namespace test::handover;
  Env env;
  botmesh::handover_options h = forward();
  h.ttl = "300ms";
  replica a{env, "a", h, "300ms"};
  replica b{env, "b", h};
  for (auto* r : {&a, &b}) {
    r->bot->add_flow(order_flow());
    r->bot->start();
  }
  REQUIRE(a.say("pedido", 1));
  REQUIRE(waiting_at(env, "producto"));
  REQUIRE(no_checkpoint(env)); // lapsed; a still waits in memory
  // a's answer: its write passed the turn check and freezes before the
  // store while settle (300 ms) cuts the turn.
  env.store->hold_writes = true;
  a.provider->inject("x", "café");
  REQUIRE(eventually([&] { return env.store->write_held.load(); }));
  REQUIRE(b.say("b1", 1)); // b held the chat: a's turn is over
  CHECK(b.last() == "nuevo: b1");
  auto writes = env.store->checkpoint_writes.load();
  // It lands and is refused (its checkpoint lapsed). Written as new, it
  // would revive a conversation whose turn ended: the turn is checked
  // first, and it is not written.
  env.store->hold_writes = false;
  REQUIRE(eventually([&] { return !env.store->write_held.load(); }));
  REQUIRE(eventually([&] { return a.errors_with(botmesh::errc::lease_lost) >= 1; }));
  // What a's step does next, if anything, comes within a moment.
  std::this_thread::sleep_for(100ms);
  CHECK(env.store->checkpoint_writes.load() == writes);
  CHECK(!env.store->get_checkpoint("test:x"));
  CHECK(a.provider->sent().size() == 1); // "¿Producto?" only
}

/// Runs every case of the suite on `Env`.
TEST_CASE_TEMPLATE_DEFINE("handover: a notice that could not be sent "
                          "leaves the coroutine conversation's marker, and "
                          "the next message is answered with the notice",
                          Env, handover_33) {
  using namespace test::handover;
  botmesh::handover_options h;
  h.fallback = botmesh::handover_fallback::notify;
  Env env;
  replica a{env, "a", h};
  replica b{env, "b", h};
  for (auto* r : {&a, &b}) {
    add_greeting(*r->bot);
    r->bot->start();
  }
  REQUIRE(a.say("hola", 1));
  REQUIRE(waiting_at(env, "conversation"));
  b.provider->fail_sends(true);
  b.provider->inject("x", "Ana");
  REQUIRE(eventually([&] { return b.bot->stats().send_errors >= 1; }));
  REQUIRE(eventually([&] { return b.bot->stats().handled >= 1; }));
  // The marker is still there: the conversation is not dropped unsaid.
  auto cp = env.store->get_checkpoint("test:x");
  REQUIRE(cp);
  CHECK(cp->marker);
  b.provider->fail_sends(false);
  REQUIRE(b.say("Ana", 1));
  CHECK(b.last() == botmesh::text("en", "core.conversation.interrupted"));
  CHECK(no_checkpoint(env));
}

TEST_CASE_TEMPLATE_DEFINE("handover: a stale flow timer's turn on the "
                          "replica a conversation left keeps alive the "
                          "conversation the new holder has only in memory",
                          Env, handover_34) {
  using namespace test::handover;
  Env env;
  replica a{env, "a"};
  replica b{env, "b"};
  for (auto* r : {&a, &b}) {
    // The order, checkpointed, with a wait on a's side that outlives the
    // steps below; and a flow that leaves no checkpoint (in memory only).
    r->bot->add_flow(order_flow(true, nullptr, botmesh::duration{"2s"}));
    botmesh::flow name{"nombre"};
    name.hears({"nombre"}).ask(
      "nombre", "¿Nombre?",
      [](botmesh::flow_context& c, const botmesh::answer& ans) {
        c.send("Hola " + ans.text());
      });
    r->bot->add_flow(std::move(name));
    r->bot->start();
  }
  REQUIRE(a.say("pedido", 1));
  REQUIRE(a.say("café", 2)); // a waits for the quantity, its timer armed
  REQUIRE(waiting_at(env, "cantidad"));
  REQUIRE(b.say("3", 1)); // the order moves on on b, and ends there
  REQUIRE(b.say("Calle 1", 2));
  CHECK(b.last() == "3 x café a Calle 1");
  REQUIRE(b.say("nombre", 3));
  CHECK(b.last() == "¿Nombre?");
  // a's copy is still waiting; its timer's turn finds it stale, drops it
  // and runs nothing.
  REQUIRE(a.bot->stats().conversations == 1);
  REQUIRE(eventually([&] { return a.bot->stats().conversations == 0; }));
  // b, granted next, still holds its conversation: the answer lands in it.
  REQUIRE(b.say("Ana", 4));
  CHECK(b.last() == "Hola Ana");
  CHECK(a.provider->sent().size() == 2);
  CHECK(a.error_count() == 0);
  CHECK(b.error_count() == 0);
}

#define BOTMESH_HANDOVER_SUITE(Env) \
  TEST_CASE_TEMPLATE_INVOKE(handover_1, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_2, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_3, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_4, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_5, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_6, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_7, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_8, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_9, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_10, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_11, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_12, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_13, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_14, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_15, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_16, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_17, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_18, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_19, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_20, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_21, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_22, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_23, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_24, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_25, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_26, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_27, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_29, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_30, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_31, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_32, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_33, Env); \
  TEST_CASE_TEMPLATE_INVOKE(handover_34, Env);
