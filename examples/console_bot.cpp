// A bot on the terminal: each line you type is a message, each answer a line.
// Runs on embedded defaults (console provider, memory store); no server.
//
//   scripts/demo                        # interactive, memory store
//   printf 'hola\n2 + 3\n' | scripts/demo
//   scripts/demo --db pedidos.db        # SQLite: an order survives restarts
//
// Type "pedido" to place an order (product, quantity, confirmation).

#include <charconv>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iostream>

#include <nlohmann/json.hpp>

#include <botmesh/runtime/botmesh.hpp>

namespace {

// The order-taking flow: persistent, so with --db an unfinished order goes
// on where it stopped when the demo is started again.
botmesh::flow order_flow() {
  using botmesh::answer;
  using botmesh::flow_context;
  botmesh::flow f{"pedido"};
  f.hears({"pedido", "comprar"})
    .ask("producto", "¿Qué producto quieres? (café, té, chocolate)",
         [](flow_context& c, const answer& a) {
           c.state()["producto"] = a.text();
         },
         {.validate = [](const answer& a) -> std::optional<std::string> {
           for (auto p : {"café", "té", "chocolate"})
             if (a.text() == p)
               return std::nullopt;
           return "Solo tenemos café, té o chocolate.";
         }})
    .ask("cantidad", "¿Cuántas unidades? (1-20)",
         [](flow_context& c, const answer& a) {
           c.state()["cantidad"] = std::stoi(a.text());
         },
         {.validate = [](const answer& a) -> std::optional<std::string> {
           auto& t = a.text();
           if (t.empty() || t.size() > 2
               || t.find_first_not_of("0123456789") != std::string::npos
               || std::stoi(t) < 1 || std::stoi(t) > 20)
             return "Escribe un número del 1 al 20.";
           return std::nullopt;
         }})
    .step("confirmar", [](flow_context& c) -> botmesh::flow_task {
      auto& s = c.state();
      auto summary = std::to_string(s["cantidad"].get<int>()) + " x "
                     + s["producto"].get<std::string>();
      auto ok = co_await c.ask("¿Confirmas " + summary + "? (sí/no)");
      if (ok.text() == "sí" || ok.text() == "si")
        c.send("✅ Pedido confirmado: " + summary + ". ¡Gracias!");
      else
        c.send("Pedido cancelado.");
    })
    .persistent();
  return f;
}

// "a + b" for 64-bit integers; a number or a sum that does not fit gets a
// sentence instead of a wrong result.
std::string sum(const std::string& a_text, const std::string& b_text) {
  auto parse = [](const std::string& t, std::int64_t& v) {
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    return ec == std::errc{} && p == t.data() + t.size();
  };
  std::int64_t a = 0;
  std::int64_t b = 0;
  if (!parse(a_text, a) || !parse(b_text, b))
    return "Ese número es demasiado grande: sé sumar enteros de hasta 19 "
           "cifras.";
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r))
    return "La suma no cabe en un entero de 64 bits.";
  return a_text + " + " + b_text + " = " + std::to_string(r);
}

int run(int argc, char** argv) {
  std::shared_ptr<botmesh::store> store = std::make_shared<botmesh::memory_store>();
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--db") == 0 && i + 1 < argc) {
      store = std::make_shared<botmesh::sqlite_store>(
        botmesh::sqlite_store_options{.path = argv[++i]});
    } else {
      std::cerr << "usage: console_bot [--db FILE]\n";
      return 2;
    }
  }
  botmesh::bot bot{{.provider = std::make_shared<botmesh::console_provider>(),
                    .store = store,
                    .lang = "es"}};

  bot.add_flow(order_flow());
  bot.hears({"hola", "buenas", "hi"}, [](botmesh::context& c) {
    c.reply("¡Hola! Soy un bot de botmesh. Escribe 'pedido' para pedir o "
            "'ayuda' para ver qué más sé hacer.");
  });
  bot.hears("ayuda", [](botmesh::context& c) {
    c.reply("Sé tomar pedidos ('pedido'), sumar ('2 + 3') y repetir lo que "
            "dices.");
  });
  bot.hears(botmesh::pattern{R"(^\s*(-?\d+)\s*\+\s*(-?\d+)\s*$)"},
            [](botmesh::context& c) {
              c.reply(sum(c.matches()[1], c.matches()[2]));
            });
  bot.on_message([](botmesh::context& c) { c.reply("Dijiste: " + c.text()); });

  bot.on<botmesh::events::error>([](const botmesh::events::error& e) {
    std::cerr << "error: " << e.what << '\n';
  });
  return bot.run();
}

} // namespace

int main(int argc, char** argv) {
  // A bad --db (a missing directory, a directory, a damaged file) is a
  // message and an exit code, not an abort.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "console_bot: " << e.what() << '\n';
    return 1;
  }
}
