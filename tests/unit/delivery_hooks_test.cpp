// The provider_host hooks transports build on: acceptance, turn end and
// yielding an exclusive transport's leadership.

#include <doctest/doctest.h>

#include <atomic>
#include <future>
#include <latch>
#include <mutex>
#include <vector>

#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/stores/memory_coordinator.hpp>

#include "test_util.hpp"

using namespace std::chrono_literals;

namespace {

/// Records the notices of one delivery, in the order they came.
struct notices {
  std::mutex mtx;
  std::vector<std::string> seen;

  botmesh::delivery_callbacks callbacks() {
    return {
      [this](botmesh::errc code) {
        std::lock_guard guard{mtx};
        seen.push_back(std::string{"accepted:"} + std::string{to_string(code)});
      },
      [this](botmesh::turn_outcome o) {
        std::lock_guard guard{mtx};
        seen.push_back(std::string{"ended:"} + std::string{to_string(o)});
      },
    };
  }

  std::vector<std::string> get() {
    std::lock_guard guard{mtx};
    return seen;
  }

  // Under the lock: an earlier delivery's notices may still be coming.
  void clear() {
    std::lock_guard guard{mtx};
    seen.clear();
  }
};

botmesh::inbound_message text(std::string chat, std::string id,
                              std::string body) {
  botmesh::inbound_message m;
  m.chat = std::move(chat);
  m.sender = m.chat;
  m.id = std::move(id);
  m.text = std::move(body);
  return m;
}

} // namespace

TEST_CASE("a delivered message is accepted first and its turn end is "
          "noticed after the handler's reply") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot bot{{.provider = p}};
  std::atomic<std::size_t> sent_at_end{0};
  bot.on_message([](botmesh::context& c) { c.reply("eco " + c.text()); });
  bot.start();
  notices n;
  auto cb = n.callbacks();
  auto ended = cb.turn_ended;
  cb.turn_ended = [&, ended](botmesh::turn_outcome o) {
    sent_at_end = p->sent().size();
    ended(o);
  };
  p->inject(text("c1", "m1", "hola"), cb);
  REQUIRE(test::eventually([&] { return n.get().size() == 2; }));
  CHECK(n.get() == std::vector<std::string>{"accepted:none", "ended:handled"});
  CHECK(sent_at_end.load() == 1);
}

TEST_CASE("a message over the limits is refused at acceptance and its turn "
          "end never comes") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot bot{{.provider = p, .limits = {.max_text_bytes = 4}}};
  bot.on_message([](botmesh::context&) {});
  bot.start();
  notices n;
  p->inject(text("c1", "m1", "demasiado largo"), n.callbacks());
  CHECK(n.get() == std::vector<std::string>{"accepted:invalid_argument"});
  CHECK(bot.stats().refused_invalid == 1);
}

TEST_CASE("a throwing handler ends its turn as failed") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot bot{{.provider = p}};
  bot.on_message([](botmesh::context&) -> void { throw std::runtime_error{"x"}; });
  bot.start();
  notices n;
  p->inject(text("c1", "m1", "hola"), n.callbacks());
  REQUIRE(test::eventually([&] { return n.get().size() == 2; }));
  CHECK(n.get()[1] == "ended:failed");
}

TEST_CASE("a message refused by a full chat queue ends its turn as refused, "
          "and one arriving at a stopped bot is refused at acceptance") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot bot{{.provider = p, .max_pending_per_chat = 1}};
  std::latch entered{1};
  std::latch release{1};
  bot.on_message([&](botmesh::context& c) {
    if (c.text() == "block") {
      entered.count_down();
      release.wait();
    }
  });
  bot.start();
  notices first, queued, over;
  p->inject(text("c1", "m1", "block"), first.callbacks());
  entered.wait();
  p->inject(text("c1", "m2", "queued"), queued.callbacks());
  p->inject(text("c1", "m3", "over"), over.callbacks());
  REQUIRE(test::eventually([&] { return over.get().size() == 2; }));
  CHECK(over.get() == std::vector<std::string>{"accepted:none", "ended:refused"});
  release.count_down();
  REQUIRE(test::eventually([&] { return queued.get().size() == 2; }));
  CHECK(queued.get()[1] == "ended:handled");
  bot.stop();
  notices late;
  // After stop the provider is closed; deliver through the host directly.
  CHECK(first.get()[1] == "ended:handled");
  botmesh::provider_host& host = [&]() -> botmesh::provider_host& {
    struct capture final : botmesh::provider_host {
      void deliver(botmesh::inbound_message) override {}
      void state_changed(botmesh::provider_state) override {}
      void input_closed() override {}
    };
    static capture c;
    return c;
  }();
  // The default host reports acceptance and an untracked turn.
  host.deliver(text("c1", "m4", "x"), late.callbacks());
  CHECK(late.get() == std::vector<std::string>{"accepted:none", "ended:untracked"});
  CHECK_FALSE(host.yield_leadership("conflict"));
}

TEST_CASE("a bot that is stopping refuses a delivery at acceptance as stopped") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot bot{{.provider = p, .stop_timeout = "5s"}};
  std::latch entered{1};
  std::latch release{1};
  bot.on_message([&](botmesh::context& c) {
    if (c.text() == "block") {
      entered.count_down();
      release.wait();
    }
  });
  bot.start();
  p->inject(text("c1", "m1", "block"), {});
  entered.wait();
  std::thread stopper{[&] { bot.stop(); }};
  // stop() refuses intake before it waits for the running turn.
  notices n;
  REQUIRE(test::eventually([&] {
    n.clear();
    p->inject(text("c2", "m2", "x"), n.callbacks());
    return !n.get().empty() && n.get()[0] == "accepted:stopped";
  }));
  release.count_down();
  stopper.join();
}

TEST_CASE("a delivery whose acceptance report outlasts the bot's chats is "
          "refused as stopped, not lost at the ended router") {
  std::latch in_report{1};
  std::latch go_on{1};
  std::future<void> injector;
  botmesh::testing_provider::options po;
  // The transport stops after the router ended: the report still running
  // goes on then, and the stop waits for its delivery to be done.
  po.on_stop = [&] {
    go_on.count_down();
    injector.wait();
  };
  auto p = std::make_shared<botmesh::testing_provider>(po);
  test::error_log errors;
  botmesh::bot bot{{.provider = p}};
  errors.attach(bot);
  std::atomic<int> handled{0};
  bot.on_message([&](botmesh::context&) { ++handled; });
  bot.start();
  std::mutex mtx;
  std::vector<std::string> seen;
  botmesh::delivery_callbacks cb{
    [&](botmesh::errc e) {
      {
        std::lock_guard guard{mtx};
        seen.push_back(std::string{"accepted:"} + std::string{to_string(e)});
      }
      in_report.count_down();
      go_on.wait(); // accepted before the stop, reported on during it
    },
    [&](botmesh::turn_outcome o) {
      std::lock_guard guard{mtx};
      seen.push_back(std::string{"ended:"} + std::string{to_string(o)});
    },
  };
  injector = std::async(std::launch::async, [&] {
    p->inject(text("c1", "m1", "late"), std::move(cb));
  });
  in_report.wait();
  bot.stop();
  CHECK(handled == 0);
  {
    std::lock_guard guard{mtx};
    CHECK(seen == std::vector<std::string>{"accepted:none", "ended:refused"});
  }
  CHECK(errors.count(botmesh::errc::stopped) == 1);
  CHECK(bot.stats().refused_stopped == 1);
  CHECK(bot.stats().received == 1);
}

TEST_CASE("an exclusive transport that sees another live connection yields "
          "its leadership and presents itself again later") {
  botmesh::memory_coordination_hub hub;
  auto coord = std::make_shared<botmesh::memory_coordinator>(
    hub, botmesh::memory_coordinator_options{.replica_id = "a", .lease = "1s"});
  auto p = std::make_shared<botmesh::testing_provider>(
    botmesh::testing_provider::options{.id = "tg",
                                       .capabilities = {.exclusive_session = true}});
  botmesh::coordination_options co;
  co.coordinator = coord;
  botmesh::bot bot{{.provider = p, .coordination = co}};
  std::mutex mtx;
  std::vector<std::string> followers;
  bot.on<botmesh::events::follower>([&](const botmesh::events::follower& f) {
    std::lock_guard guard{mtx};
    followers.push_back(f.reason);
  });
  bot.start();
  REQUIRE(bot.ready(10s));
  CHECK(p->starts() == 1);
  CHECK(p->ask_to_yield("conflict"));
  REQUIRE(test::eventually([&] {
    std::lock_guard guard{mtx};
    return !followers.empty() && followers.back() == "conflict";
  }));
  CHECK(p->state() == botmesh::provider_state::closed);
  CHECK_THROWS_AS(bot.send("c", "x"), botmesh::provider_not_leader_error);
  // After standing down for a while it is elected again.
  REQUIRE(test::eventually([&] { return p->starts() == 2; }, 15s));
  CHECK(bot.ready(10s));
}

TEST_CASE("a turn running when its replica yields an exclusive transport "
          "still sends its reply") {
  botmesh::memory_coordination_hub hub;
  auto coord = std::make_shared<botmesh::memory_coordinator>(
    hub, botmesh::memory_coordinator_options{.replica_id = "a", .lease = "1s"});
  // Telegram's Bot API takes a send while getUpdates is stopped.
  auto p = std::make_shared<botmesh::testing_provider>(
    botmesh::testing_provider::options{
      .id = "tg",
      .capabilities = {.exclusive_session = true},
      .sends_while_closed = true});
  botmesh::coordination_options co;
  co.coordinator = coord;
  botmesh::bot bot{{.provider = p, .coordination = co}};
  std::latch entered{1};
  std::atomic<bool> go{false};
  bot.on_message([&](botmesh::context& c) {
    entered.count_down();
    test::eventually([&] { return go.load(); }, 30s);
    c.reply("answer");
  });
  // The handler goes on before the bot stops, also after a failed REQUIRE.
  std::shared_ptr<void> thaw{nullptr, [&](void*) { go = true; }};
  std::atomic<bool> follower{false};
  bot.on<botmesh::events::follower>(
    [&](const botmesh::events::follower&) { follower = true; });
  bot.start();
  REQUIRE(bot.ready(10s));
  notices n;
  p->inject(text("c1", "m1", "question"), n.callbacks());
  entered.wait();
  REQUIRE(p->ask_to_yield("conflict"));
  REQUIRE(test::eventually([&] { return follower.load(); }));
  REQUIRE(p->state() == botmesh::provider_state::closed);
  go = true;
  // The turn still holds its chat: its reply goes out, and it is handled.
  REQUIRE(test::eventually([&] { return n.get().size() == 2; }));
  CHECK(n.get()[1] == "ended:handled");
  auto sent = p->sent_to("c1");
  REQUIRE(sent.size() == 1);
  CHECK(sent[0].text == "answer");
  // Outside a turn the standby still refuses.
  CHECK_THROWS_AS(bot.send("c1", "x"), botmesh::provider_not_leader_error);
}

TEST_CASE("without coordination a transport's request to yield is declined") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot bot{{.provider = p}};
  bot.start();
  CHECK_FALSE(p->ask_to_yield("conflict"));
  CHECK(p->state() == botmesh::provider_state::open);
}
