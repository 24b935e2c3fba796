#include <doctest/doctest.h>

#include <string>

#include <botmesh/providers/http/http_client.hpp>
#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/runtime/core/metrics.hpp>
#include <botmesh/runtime/observability.hpp>
#include <botmesh/stores/memory_coordinator.hpp>

#include "test_util.hpp"

using namespace std::chrono_literals;
namespace metrics = botmesh::metrics;

namespace {

// The value of the sample whose line starts with `series` followed by a
// space, or -1 when there is none.
double sample(const std::string& text, const std::string& series) {
  auto pos = text.find("\n" + series + " ");
  if (pos == std::string::npos)
    return -1;
  auto start = pos + series.size() + 2;
  auto end = text.find('\n', start);
  return std::stod(text.substr(start, end - start));
}

botmesh::http::client_response get(botmesh::http::client& c,
                                   const std::string& url) {
  botmesh::http::client_request req;
  req.method = "GET";
  req.url = url;
  req.body.clear();
  return c.request(req);
}

} // namespace

TEST_CASE("the text format groups a family under one HELP and TYPE and "
          "escapes label values") {
  metrics::exposition e;
  e.counter("botmesh_x_total", "Xs.", {{"bot", "a"}}, 1);
  e.gauge("botmesh_y", "Ys.", {}, 2.5);
  e.counter("botmesh_x_total", "Xs.", {{"bot", "b\"\\\n"}, {"replica", ""}}, 3);
  auto text = e.str();
  CHECK(text
        == "# HELP botmesh_x_total Xs.\n# TYPE botmesh_x_total counter\n"
           "botmesh_x_total{bot=\"a\"} 1\n"
           "botmesh_x_total{bot=\"b\\\"\\\\\\n\"} 3\n"
           "# HELP botmesh_y Ys.\n# TYPE botmesh_y gauge\nbotmesh_y 2.5\n");
}

TEST_CASE("a histogram renders cumulative buckets, sum and count") {
  metrics::histogram h;
  h.observe(200us);  // <= 0.0005
  h.observe(3ms);    // <= 0.005
  h.observe(2min);   // +Inf
  h.observe(-1ms);   // counted as 0
  metrics::exposition e;
  e.histogram("botmesh_t_seconds", "T.", {{"bot", "a"}}, h.read());
  auto text = "\n" + e.str();
  CHECK(sample(text, "botmesh_t_seconds_bucket{bot=\"a\",le=\"0.0005\"}") == 2);
  CHECK(sample(text, "botmesh_t_seconds_bucket{bot=\"a\",le=\"0.001\"}") == 2);
  CHECK(sample(text, "botmesh_t_seconds_bucket{bot=\"a\",le=\"0.005\"}") == 3);
  CHECK(sample(text, "botmesh_t_seconds_bucket{bot=\"a\",le=\"60\"}") == 3);
  CHECK(sample(text, "botmesh_t_seconds_bucket{bot=\"a\",le=\"+Inf\"}") == 4);
  CHECK(sample(text, "botmesh_t_seconds_count{bot=\"a\"}") == 4);
  CHECK(sample(text, "botmesh_t_seconds_sum{bot=\"a\"}")
        == doctest::Approx(120.0032));
}

TEST_CASE("a collector leaves the registry with its registration") {
  metrics::registry r;
  {
    auto reg = r.add([](metrics::exposition& e) {
      e.gauge("botmesh_z", "Z.", {}, 1);
    });
    CHECK(r.scrape().find("botmesh_z 1") != std::string::npos);
    auto moved = std::move(reg);
    CHECK(r.scrape().find("botmesh_z 1") != std::string::npos);
  }
  CHECK(r.scrape().empty());
}

TEST_CASE("/metrics, /healthz and /readyz answer a real HTTP client") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .bot_id = "shop"}};
  b.hears("fail", [](botmesh::context&) { throw std::runtime_error("x"); });
  b.on_message([](botmesh::context& c) { c.reply("ok"); });
  b.on<botmesh::events::error>([](const botmesh::events::error&) {});
  botmesh::observability_server obs{b, {}};
  botmesh::http::client client;
  // Before start the transport is closed: alive, not ready.
  CHECK(get(client, obs.url() + "/healthz").status == 200);
  CHECK(get(client, obs.url() + "/readyz").status == 503);
  b.start();
  REQUIRE(test::eventually([&] {
    return get(client, obs.url() + "/readyz").status == 200;
  }));
  p->inject("ana", "hola");
  p->inject("ana", "fail");
  p->inject("", "no chat"); // refused: invalid
  REQUIRE(p->wait_for_sent(1, 10s));
  REQUIRE(test::eventually([&] { return b.stats().handled == 2; }));

  auto res = get(client, obs.url() + "/metrics");
  REQUIRE(res.status == 200);
  auto* type = res.header("content-type");
  REQUIRE(type != nullptr);
  CHECK(type->starts_with("text/plain; version=0.0.4"));
  auto text = "\n" + res.body;
  CHECK(sample(text, "botmesh_messages_received_total{bot=\"shop\"}") == 2);
  CHECK(sample(text, "botmesh_messages_handled_total{bot=\"shop\"}") == 2);
  CHECK(sample(text, "botmesh_messages_sent_total{bot=\"shop\"}") == 1);
  CHECK(sample(text,
               "botmesh_messages_refused_total{bot=\"shop\",reason=\"invalid\"}")
        == 1);
  CHECK(sample(text, "botmesh_handler_errors_total{bot=\"shop\"}") == 1);
  CHECK(sample(text, "botmesh_handler_seconds_count{bot=\"shop\"}") == 2);
  CHECK(sample(text, "botmesh_turn_wait_seconds_count{bot=\"shop\"}") == 2);
  CHECK(sample(text, "botmesh_queue_depth{bot=\"shop\"}") == 0);
  CHECK(sample(text, "botmesh_live_chats{bot=\"shop\"}") == 1);
  CHECK(sample(text, "botmesh_transport_up{bot=\"shop\"}") == 1);
  CHECK(sample(text, "botmesh_lease_losses_total{bot=\"shop\"}") == 0);
  CHECK(sample(text, "botmesh_scheduler_runs_total{bot=\"shop\"}") == 0);
  CHECK(text.find("# TYPE botmesh_turn_wait_seconds histogram")
        != std::string::npos);
  // Every sample line names a botmesh_ metric.
  std::size_t pos = 1;
  while (pos < text.size()) {
    auto end = text.find('\n', pos);
    auto line = text.substr(pos, end - pos);
    if (!line.empty() && line[0] != '#')
      CHECK(line.starts_with("botmesh_"));
    pos = end + 1;
  }

  // The transport goes down: not ready, still alive.
  p->set_state(botmesh::provider_state::closed);
  CHECK(get(client, obs.url() + "/readyz").status == 503);
  CHECK(get(client, obs.url() + "/healthz").status == 200);
  p->set_state(botmesh::provider_state::open);
  CHECK(get(client, obs.url() + "/readyz").status == 200);
  b.stop();
  CHECK(get(client, obs.url() + "/readyz").status == 503);
}

TEST_CASE("the queue depth counts messages waiting for their turn") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .stop_timeout = "1s"}};
  std::atomic<bool> release{false};
  std::atomic<int> entered{0};
  b.on_message([&](botmesh::context& c) {
    ++entered;
    // Held until the test saw the queue (or the bot stops: a failed check
    // must not hang the test).
    while (!release.load() && !c.stop_token().stop_requested())
      std::this_thread::sleep_for(1ms);
  });
  b.start();
  auto depth = [] {
    auto text = "\n" + metrics::global_registry().scrape();
    return sample(text, "botmesh_queue_depth");
  };
  for (int i = 0; i < 4; ++i)
    p->inject("ana", "m");
  // One runs (blocked), three wait behind it in the chat's order.
  REQUIRE(test::eventually([&] { return entered.load() == 1; }));
  REQUIRE(test::eventually([&] { return depth() == 3; }));
  release = true;
  REQUIRE(test::eventually([&] { return b.stats().handled == 4; }));
  CHECK(depth() == 0);
}

TEST_CASE("a turn whose chat last ran on another replica counts as a hand-off "
          "on the replica that gets it") {
  botmesh::memory_coordination_hub hub;
  auto store = std::make_shared<botmesh::memory_store>();
  struct replica {
    std::shared_ptr<botmesh::testing_provider> provider =
      std::make_shared<botmesh::testing_provider>();
    std::unique_ptr<botmesh::bot> bot;
  };
  auto make = [&](const std::string& id) {
    auto r = std::make_unique<replica>();
    botmesh::coordination_options co;
    co.coordinator = std::make_shared<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = id});
    r->bot = std::make_unique<botmesh::bot>(botmesh::bot_options{
      .provider = r->provider, .store = store, .coordination = co});
    r->bot->on_message([](botmesh::context& c) { c.reply("ok"); });
    r->bot->start();
    return r;
  };
  auto a = make("a");
  auto b = make("b");
  auto handoffs = [](const std::string& id) {
    auto text = "\n" + metrics::global_registry().scrape();
    return sample(text, "botmesh_handoffs_total{replica=\"" + id + "\"}");
  };
  a->provider->inject("x", "1");
  REQUIRE(a->provider->wait_for_sent(1, 10s));
  CHECK(handoffs("a") == 0); // the chat's first turn: no previous holder
  b->provider->inject("x", "2");
  REQUIRE(b->provider->wait_for_sent(1, 10s));
  CHECK(handoffs("b") == 1);
  b->provider->inject("x", "3"); // same replica again: no hand-off
  REQUIRE(b->provider->wait_for_sent(2, 10s));
  CHECK(handoffs("b") == 1);
  a->provider->inject("x", "4");
  REQUIRE(a->provider->wait_for_sent(2, 10s));
  CHECK(handoffs("a") == 1);
  b.reset();
  a.reset();
}
