#include <botmesh/runtime/botmesh.hpp>
int main() {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p}};
  b.on_message([](botmesh::context& c) { c.reply("ok " + c.text()); });
  b.start();
  p->inject("x", "hi");
  return p->wait_for_sent(1, std::chrono::seconds(5)) && p->sent()[0].text == "ok hi" ? 0 : 1;
}
