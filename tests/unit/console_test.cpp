#include <doctest/doctest.h>

#include <sstream>

#include <unistd.h>

#include <botmesh/runtime/botmesh.hpp>

TEST_CASE("the console bot answers each stdin line and exits 0 when input ends") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  std::ostringstream out;
  auto console = std::make_shared<botmesh::console_provider>(
    botmesh::console_provider::options{.input_fd = fds[0], .out = &out});
  botmesh::bot b{{.provider = console}};
  b.hears("hola", [](botmesh::context& c) { c.reply("¡Hola! ¿Qué deseas?"); });
  b.on_message([](botmesh::context& c) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    c.reply("eco: " + c.text());
  });
  std::string input = "hola\r\n\n  \nqué tal\núltima sin salto";
  REQUIRE(::write(fds[1], input.data(), input.size())
          == static_cast<ssize_t>(input.size()));
  ::close(fds[1]);
  CHECK(b.run() == 0);
  ::close(fds[0]);
  // Everything in flight when stdin closed was answered, in order.
  CHECK(out.str()
        == "¡Hola! ¿Qué deseas?\neco: qué tal\neco: última sin salto\n");
  CHECK(b.stats().handled == 3);
}
