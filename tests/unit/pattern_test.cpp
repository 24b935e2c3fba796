#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <botmesh/runtime/botmesh.hpp>

#include "test_util.hpp"

using namespace std::chrono_literals;
using botmesh::pattern;

namespace {

std::string field_of(const char* expr) {
  try {
    pattern p{expr};
  } catch (const botmesh::invalid_argument_error& e) {
    return e.field();
  }
  return "ok";
}

constexpr std::size_t max_text = 64 * 1024;

} // namespace

TEST_CASE("a pattern finds a match anywhere and returns its groups") {
  pattern p{R"(pedido (\d+)( urgente)?)"};
  std::vector<std::string> g;
  REQUIRE(p.search("mi pedido 42 por favor", &g));
  CHECK(g == std::vector<std::string>{"pedido 42", "42", ""});
  REQUIRE(p.search("pedido 7 urgente", &g));
  CHECK(g == std::vector<std::string>{"pedido 7 urgente", "7", " urgente"});
  CHECK_FALSE(p.search("pedido x"));
  CHECK(pattern{"^hola$", {.case_insensitive = true}}.search("HoLa"));
  CHECK_FALSE(pattern{"^hola$"}.search("HoLa"));
  CHECK(pattern{"(?i)ñandú"}.search("un ÑANDÚ"));
  CHECK(p.str() == R"(pedido (\d+)( urgente)?)");
}

TEST_CASE("an invalid pattern is rejected naming the field and the problem") {
  CHECK(field_of("(unclosed") == "pattern");
  CHECK(field_of("a{2,1}") == "pattern");
  CHECK(field_of(R"((a)\1)") == "pattern"); // backreferences: not linear
  CHECK(field_of("(?=look)ahead") == "pattern");
  CHECK(field_of(R"(\d+)") == "ok");
  try {
    pattern p{"(unclosed"};
    FAIL("accepted");
  } catch (const botmesh::invalid_argument_error& e) {
    CHECK(std::string{e.what()}.find("\"(unclosed\"") != std::string::npos);
    CHECK(std::string{e.what()}.find("missing )") != std::string::npos);
  }
}

TEST_CASE("64 KiB adversarial texts are matched without exhausting the stack") {
  // Each of these crashed or stalled a backtracking, recursive engine.
  struct adversarial {
    const char* expr;
    std::string text;
    bool matches;
  };
  std::vector<adversarial> cases{
    {R"(\d+)", std::string(max_text, '7'), true},
    {R"(^\s*(-?\d+)\s*\+\s*(-?\d+)\s*$)",
     std::string(max_text - 4, '9') + " + 1", true},
    {R"(\s*x)", std::string(max_text, ' '), false},
    {"(a+)+$", std::string(max_text - 1, 'a') + "b", false},
    {"(x+x+)+y", std::string(max_text, 'x'), false},
    {"(a|aa)*c", std::string(max_text, 'a'), false},
    {"(.*)*z", std::string(max_text, 'q'), false},
  };
  for (auto& c : cases) {
    CAPTURE(c.expr);
    pattern p{c.expr};
    std::vector<std::string> g;
    CHECK(p.search(c.text, &g) == c.matches);
    CHECK(p.search(c.text) == c.matches);
    if (c.matches)
      CHECK_FALSE(g.empty());
  }
}

TEST_CASE("a bot and a flow route 64 KiB messages through their patterns") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::flow f{"big"};
  f.hears(pattern{"^(a+)+$"})
    .step("only", [](botmesh::flow_context& c) -> botmesh::flow_task {
      c.send("flow");
      co_return;
    });
  botmesh::bot b{{.provider = p}};
  b.add_flow(std::move(f));
  b.hears(pattern{R"(^(\d+)$)"}, [](botmesh::context& c) {
    c.reply("digits " + std::to_string(c.matches().at(1).size()));
  });
  b.on_message([](botmesh::context& c) { c.reply("other"); });
  b.start();
  p->inject("ana", std::string(max_text, '5'));
  p->inject("ana", std::string(max_text, 'a'));
  p->inject("ana", std::string(max_text - 1, 'a') + "b");
  REQUIRE(p->wait_for_sent(3, 10s));
  std::vector<std::string> got;
  for (auto& m : p->sent_to("ana"))
    got.push_back(m.text);
  CHECK(got == std::vector<std::string>{"digits 65536", "flow", "other"});
}
