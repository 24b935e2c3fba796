// bench_flows: turns per second of a three-step persistent flow across 10k
// chats on the memory store, next to plain handler turns of the same chats
// in the same run; and checkpoint encode+decode time for a 1 KiB state next
// to a bare JSON dump+parse of that state.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <botmesh/runtime/botmesh.hpp>

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

void wait_until(const std::function<bool()>& pred) {
  auto deadline = clk::now() + 300s;
  while (!pred()) {
    if (clk::now() > deadline) {
      std::fprintf(stderr, "bench_flows: timed out\n");
      std::exit(1);
    }
    std::this_thread::sleep_for(200us);
  }
}

// Three turns per chat: a trigger and two answers.
double turns_per_second(int chats, bool with_flow) {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .passivate_after = "10m", .log_messages = false}};
  std::atomic<long> done{0};
  if (with_flow) {
    botmesh::flow f{"alta"};
    f.hears({"alta"})
      .ask("nombre", "¿Nombre?",
           [](botmesh::flow_context& c, const botmesh::answer& a) {
             c.state()["nombre"] = a.text();
           })
      .ask("edad", "¿Edad?",
           [](botmesh::flow_context& c, const botmesh::answer& a) {
             c.state()["edad"] = a.text();
           })
      .step("fin", [&done](botmesh::flow_context& c) -> botmesh::flow_task {
        c.send("listo");
        ++done;
        co_return;
      })
      .persistent();
    b.add_flow(f);
  } else {
    b.on_message([&done](botmesh::context& c) {
      c.reply("ok");
      if (c.text() == "31")
        ++done;
    });
  }
  b.start();
  std::vector<std::string> ids;
  for (int c = 0; c < chats; ++c)
    ids.push_back("c" + std::to_string(c));
  auto t0 = clk::now();
  for (auto text : {"alta", "Ana", "31"})
    for (auto& id : ids)
      p->inject(id, text);
  wait_until([&] { return done.load() == chats; });
  double secs = std::chrono::duration<double>(clk::now() - t0).count();
  b.stop();
  return 3.0 * chats / secs;
}

void checkpoint_codec() {
  nlohmann::json state = nlohmann::json::object();
  for (int i = 0; state.dump().size() < 1024; ++i)
    state["campo_" + std::to_string(i)] = "valor con acentos áéí y emoji 🍵 " + std::to_string(i);
  botmesh::flow_checkpoint cp;
  cp.key = "telegram:123456";
  cp.flow = "pedido";
  cp.step = "confirmar";
  cp.waiting = true;
  cp.question = 1;
  cp.state = state.dump();
  cp.revision = 42;
  cp.fingerprint = "0123456789abcdef";
  constexpr int n = 100'000;
  std::size_t sink = 0;
  auto t0 = clk::now();
  for (int i = 0; i < n; ++i) {
    auto s = state.dump();
    sink += nlohmann::json::parse(s).size();
  }
  double base_us = std::chrono::duration<double, std::micro>(clk::now() - t0).count() / n;
  t0 = clk::now();
  for (int i = 0; i < n; ++i) {
    auto s = botmesh::to_json(cp);
    sink += botmesh::checkpoint_from_json(s).state.size();
  }
  double us = std::chrono::duration<double, std::micro>(clk::now() - t0).count() / n;
  std::printf("checkpoint encode+decode, %zu-byte state:   %7.2f us\n",
              cp.state.size(), us);
  std::printf("baseline nlohmann dump+parse of the state:   %7.2f us   ratio "
              "%.2f  (checksum %zu)\n",
              base_us, us / base_us, sink % 10);
}

} // namespace

int main(int argc, char** argv) {
  int chats = argc > 1 ? std::atoi(argv[1]) : 10'000;
  std::printf("bench_flows: %d chats, 3 turns each\n", chats);
  double plain = 0, flows = 0;
  for (int round = 0; round < 2; ++round) {
    plain = std::max(plain, turns_per_second(chats, false));
    flows = std::max(flows, turns_per_second(chats, true));
  }
  std::printf("plain handler turns (baseline):              %9.0f turns/s\n",
              plain);
  std::printf("three-step persistent flow, memory store:    %9.0f turns/s\n",
              flows);
  std::printf("ratio flow / plain:                          %9.3f\n",
              flows / plain);
  checkpoint_codec();
  return 0;
}
