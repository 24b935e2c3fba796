#include <doctest/doctest.h>

#include <conformance/store_conformance.hpp>

#include <botmesh/stores/memory_store.hpp>

namespace {

struct memory_store_factory {
  botmesh::manual_clock clock{
    std::chrono::time_point_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now())};

  std::shared_ptr<botmesh::store> make() {
    auto s = std::make_shared<botmesh::memory_store>(
      botmesh::memory_store_options{.clock = &clock});
    s->start();
    return s;
  }

  void advance(std::chrono::milliseconds d) {
    clock.advance(d);
  }
};

} // namespace

TYPE_TO_STRING(memory_store_factory);
BOTMESH_STORE_CONFORMANCE(memory_store_factory);

TEST_CASE("the memory store caps a chat's log at max_log_per_chat") {
  botmesh::memory_store s{{.max_log_per_chat = 3}};
  for (int i = 1; i <= 5; ++i)
    s.append_message("k", botmesh::logged_message{0, botmesh::direction::in, "",
                                                  "", std::to_string(i)});
  auto all = s.messages("k", 10);
  REQUIRE(all.size() == 3);
  CHECK(all.front().text == "3");
  CHECK(all.front().seq == 3);
  CHECK(all.back().seq == 5);
}

TEST_CASE("a log cap of 0 is refused, naming the option") {
  std::string field;
  try {
    botmesh::memory_store s{{.max_log_per_chat = 0}};
  } catch (const botmesh::invalid_argument_error& e) {
    field = e.field();
  }
  CHECK(field == "max_log_per_chat");
}
