// A bot on the terminal: each line you type is a message, each answer a line.
// Runs on embedded defaults (console provider, memory store); no server.
//
//   scripts/demo                      # interactive
//   printf 'hola\n2 + 3\n' | scripts/demo

#include <iostream>
#include <regex>

#include <botmesh/runtime/botmesh.hpp>

int main() {
  botmesh::bot bot{{.provider = std::make_shared<botmesh::console_provider>()}};

  bot.hears({"hola", "buenas", "hi"}, [](botmesh::context& c) {
    c.reply("¡Hola! Soy un bot de botmesh. Escribe 'ayuda' para ver qué sé hacer.");
  });
  bot.hears("ayuda", [](botmesh::context& c) {
    c.reply("Sé saludar, sumar ('2 + 3') y repetir lo que dices.");
  });
  bot.hears(std::regex{R"(^\s*(-?\d+)\s*\+\s*(-?\d+)\s*$)"},
            [](botmesh::context& c) {
              auto a = std::stoll(c.matches()[1]);
              auto b = std::stoll(c.matches()[2]);
              c.reply(c.matches()[1] + " + " + c.matches()[2] + " = "
                      + std::to_string(a + b));
            });
  bot.on_message([](botmesh::context& c) { c.reply("Dijiste: " + c.text()); });

  bot.on<botmesh::events::error>([](const botmesh::events::error& e) {
    std::cerr << "error: " << e.what << '\n';
  });
  return bot.run();
}
