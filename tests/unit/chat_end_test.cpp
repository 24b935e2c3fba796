// Chat actors that end by an exception, on real threads: what they held,
// and what was on its way to them, goes to the chat's next actor in the
// chat's order.

#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>

#include <botmesh/actors/lease_actor.hpp>
#include <botmesh/actors/messages.hpp>
#include <botmesh/actors/router.hpp>
#include <botmesh/stores/memory_coordinator.hpp>

#include "test_util.hpp"

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::event_ptr)

using namespace std::chrono_literals;

namespace {

// Runs every turn at once, except that the first run of each message whose
// number is 2 mod 5 throws (a services bug): its chat actor ends.
struct throwing_services final : botmesh::chat_services {
  std::mutex mtx;
  std::map<std::string, std::vector<int>> ran; // per chat, in run order
  std::set<std::string> thrown;                // "key#n"
  std::vector<std::string> refused_or_failed;

  void run_turn(const std::string& key, botmesh::event_ptr ev, bool,
                std::shared_ptr<botmesh::turn_token>,
                std::function<void()> done) override {
    auto n = std::stoi(ev->ev.message.text);
    {
      std::lock_guard guard{mtx};
      if (n % 5 == 2 && thrown.insert(key + "#" + std::to_string(n)).second)
        throw std::runtime_error("run_turn failed");
      ran[key].push_back(n);
    }
    done();
  }

  void run_event(const std::string&, botmesh::chat_event&, bool) override {
    FAIL("coordinated chats only");
  }

  void post(std::function<void()> job) override {
    job();
  }

  void turn_failed(const std::string& key, botmesh::chat_event ev,
                   std::string why) override {
    std::lock_guard guard{mtx};
    refused_or_failed.push_back(key + " " + ev.message.text + ": " + why);
  }

  void refused(const std::string& key, botmesh::chat_event ev, botmesh::errc,
               std::string why) override {
    std::lock_guard guard{mtx};
    refused_or_failed.push_back(key + " " + ev.message.text + ": " + why);
  }

  std::size_t runs() {
    std::lock_guard guard{mtx};
    std::size_t n = 0;
    for (auto& [k, v] : ran)
      n += v.size();
    return n;
  }
};

} // namespace

TEST_CASE("chats whose actors end by exceptions keep every other message, in "
          "each chat's order, on real threads") {
  caf::actor_system_config cfg;
  botmesh::configure_scheduler(cfg);
  caf::actor_system sys{cfg};
  botmesh::memory_coordination_hub hub;
  botmesh::lease_config lc;
  lc.coordinator = std::make_shared<botmesh::memory_coordinator>(
    hub, botmesh::memory_coordinator_options{.replica_id = "a"});
  auto lease = botmesh::spawn_lease_actor(sys, lc);
  throwing_services services;
  auto router = botmesh::spawn_router(
    sys, botmesh::router_config{.services = &services, .lease = lease,
                                .turn_wait = std::chrono::milliseconds{30'000}});
  constexpr int chats = 40;
  constexpr int per_chat = 50;
  // Interleaved over the chats, so messages arrive while actors end.
  for (int n = 0; n < per_chat; ++n)
    for (int c = 0; c < chats; ++c) {
      botmesh::inbound_message m;
      m.provider = "test";
      m.chat = "c" + std::to_string(c);
      m.sender = m.chat;
      m.text = std::to_string(n);
      caf::anon_send(router,
                     botmesh::make_event(botmesh::chat_event{std::move(m), 0, {}}));
    }
  // Every message but the ones that threw (one in five) runs.
  constexpr std::size_t expected = chats * (per_chat - per_chat / 5);
  bool all = test::eventually([&] { return services.runs() >= expected; }, 20s);
  caf::anon_send_exit(router, caf::exit_reason::user_shutdown);
  {
    caf::scoped_actor self{sys};
    self->request(lease, 10s, botmesh::shutdown_atom::value)
      .receive([](bool) {}, [](caf::error&) {});
  }
  CHECK(all);
  std::lock_guard guard{services.mtx};
  // Refused: the messages whose run_turn threw, each once, and nothing
  // else.
  CHECK(services.thrown.size() == chats * (per_chat / 5));
  CHECK(services.refused_or_failed.size() == services.thrown.size());
  for (auto& r : services.refused_or_failed)
    CHECK_MESSAGE(r.find("its turn could not start") != std::string::npos, r);
  for (auto& [key, v] : services.ran) {
    std::vector<int> want;
    for (int n = 0; n < per_chat; ++n)
      if (n % 5 != 2)
        want.push_back(n);
    std::string got;
    for (auto n : v)
      got += std::to_string(n) + " ";
    auto what = key + ": " + got;
    CHECK_MESSAGE(v == want, what);
  }
}
