#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include <botmesh/runtime/botmesh.hpp>

#include "temp_file.hpp"

using namespace std::chrono_literals;

namespace {

botmesh::flow name_flow() {
  botmesh::flow f{"registro"};
  f.hears({"registro"})
    .ask("nombre", "¿Nombre?",
         [](botmesh::flow_context& c, const botmesh::answer& a) {
           c.state()["nombre"] = a.text();
           c.state()["meta"] = {{"emoji", "🦤"}, {"lista", {1, 2.5, nullptr}}};
         })
    .step("ciudad", [](botmesh::flow_context& c) -> botmesh::flow_task {
      auto a = co_await c.ask("¿Ciudad?");
      c.send(c.state()["nombre"].get<std::string>() + " de " + a.text() + " "
             + c.state()["meta"]["emoji"].get<std::string>());
    })
    .persistent();
  return f;
}

bool wait_for(const std::function<bool()>& pred) {
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline)
      return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

} // namespace

TEST_CASE("a persistent flow resumes from a SQLite file after a restart, "
          "unicode state intact") {
  test::temp_file file;
  {
    auto db = std::make_shared<botmesh::sqlite_store>(
      botmesh::sqlite_store_options{.path = file.path()});
    auto p = std::make_shared<botmesh::testing_provider>();
    botmesh::bot a{{.provider = p, .store = db}};
    a.add_flow(name_flow());
    a.start();
    p->inject("ana", "registro");
    p->inject("ana", "Zoë Ñúñez");
    REQUIRE(p->wait_for_sent(2, 5s));
    REQUIRE(wait_for([&] {
      auto cp = db->get_checkpoint("test:ana");
      return cp && cp->step == "ciudad" && cp->waiting;
    }));
  }
  auto db = std::make_shared<botmesh::sqlite_store>(
    botmesh::sqlite_store_options{.path = file.path()});
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .store = db}};
  b.add_flow(name_flow());
  b.start();
  auto state = nlohmann::json::parse(db->get_checkpoint("test:ana")->state);
  CHECK(state["nombre"] == "Zoë Ñúñez");
  CHECK(state["meta"]["lista"][1] == 2.5);
  p->inject("ana", "Málaga");
  REQUIRE(p->wait_for_sent(1, 5s));
  CHECK(p->sent()[0].text == "Zoë Ñúñez de Málaga 🦤");
  REQUIRE(wait_for([&] { return !db->get_checkpoint("test:ana"); }));
}

TEST_CASE("a garbage checkpoint gives a clear error and the chat keeps "
          "working") {
  test::temp_file file;
  auto db = std::make_shared<botmesh::sqlite_store>(
    botmesh::sqlite_store_options{.path = file.path()});
  db->start();
  botmesh::flow_checkpoint cp;
  cp.key = "test:ana";
  cp.flow = "registro";
  REQUIRE(db->set_checkpoint_if(cp, 0));
  {
    sqlite3* raw = nullptr;
    REQUIRE(sqlite3_open(file.path().c_str(), &raw) == SQLITE_OK);
    REQUIRE(sqlite3_exec(raw, "UPDATE checkpoints SET body='%%garbage'", nullptr,
                         nullptr, nullptr)
            == SQLITE_OK);
    sqlite3_close(raw);
  }
  auto p = std::make_shared<botmesh::testing_provider>();
  std::mutex mtx;
  std::vector<botmesh::events::error> errors;
  botmesh::bot b{{.provider = p, .store = db}};
  b.on<botmesh::events::error>([&](const botmesh::events::error& e) {
    std::lock_guard guard{mtx};
    errors.push_back(e);
  });
  b.add_flow(name_flow());
  b.on_message([](botmesh::context& c) { c.reply("handler: " + c.text()); });
  b.start();
  p->inject("ana", "hola");
  REQUIRE(p->wait_for_sent(1, 5s));
  CHECK(p->sent()[0].text == "handler: hola");
  {
    std::lock_guard guard{mtx};
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].code == botmesh::errc::corrupted_record);
    CHECK(errors[0].what.find("test:ana") != std::string::npos);
  }
  // The chat goes on: a flow can start again in it.
  p->inject("ana", "registro");
  p->inject("ana", "Ana");
  p->inject("ana", "Vigo");
  REQUIRE(p->wait_for_sent(4, 5s));
  CHECK(p->sent()[3].text == "Ana de Vigo 🦤");
}
