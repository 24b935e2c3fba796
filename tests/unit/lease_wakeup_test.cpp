#include <doctest/doctest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <botmesh/actors/chat_services.hpp>
#include <botmesh/actors/lease_actor.hpp>
#include <botmesh/actors/messages.hpp>
#include <botmesh/actors/router.hpp>
#include <botmesh/stores/memory_coordinator.hpp>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::turn_token>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::event_ptr)

using namespace std::chrono_literals;

namespace {

// An actor system on CAF's deterministic scheduler and clock.
struct deterministic {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;

  deterministic() {
    cfg.set("scheduler.policy", caf::atom("testing"));
    cfg.set("logger.file-verbosity", caf::atom("quiet"));
    sys = std::make_unique<caf::actor_system>(cfg);
    sched = &dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
    sched->clock().current_time += std::chrono::hours(1);
  }

  ~deterministic() {
    sched->run();
  }

  // Lets `d` pass in steps, running everything due after each.
  void pass(caf::timespan d, caf::timespan step = 100ms) {
    for (caf::timespan t{0}; t < d; t += step) {
      sched->clock().advance_time(step);
      sched->run();
    }
  }
};

} // namespace

TEST_CASE("the lease actor keeps one wake-up pending however often it is "
          "re-armed for an earlier instant") {
  deterministic d;
  botmesh::memory_coordination_hub hub;
  auto coord = std::make_shared<botmesh::memory_coordinator>(
    hub, botmesh::memory_coordinator_options{.replica_id = "a"});
  auto lease = botmesh::spawn_lease_actor(
    *d.sys, botmesh::lease_config{.coordinator = coord, .settle = 1s});
  // A chat actor of its own: chat "x" holds one long turn; every step a new
  // chat takes a turn, starts it (its settle bound arms a wake-up sooner
  // than x's lease) and releases it.
  auto chats = d.sys->spawn([lease](caf::event_based_actor* self) {
    return caf::behavior{
      [=](int n) {
        self->send(lease, botmesh::acquire_atom::value,
                   n == 0 ? std::string{"x"} : "y" + std::to_string(n),
                   static_cast<std::uint64_t>(n + 1));
      },
      [=](botmesh::granted_atom, std::uint64_t,
          std::shared_ptr<botmesh::turn_token>& t) {
        if (t->key() == "x")
          return;
        self->send(lease, botmesh::start_atom::value, t->key(), t->fence());
        self->send(lease, botmesh::release_atom::value, t->key(), t->fence());
      },
      [](botmesh::lost_atom, std::uint64_t, std::uint64_t,
         const std::string&) {
        // nop
      },
    };
  });
  d.sched->run();
  caf::anon_send(chats, 0);
  d.sched->run();
  for (int n = 1; n <= 300; ++n) {
    caf::anon_send(chats, n);
    d.pass(100ms);
  }
  // Wake-ups superseded by an earlier one are still pending until their
  // instant (then ignored); past the lease every one of them came. Left:
  // the renewal tick and the wake-up for x's lease.
  d.pass(20s);
  CHECK(d.sched->clock().schedule().size() <= 2);
  caf::anon_send_exit(chats, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(lease, caf::exit_reason::user_shutdown);
}

namespace {

// Runs every turn at once (done on the spot) and counts what failed.
struct instant_services final : botmesh::chat_services {
  int ran = 0;
  std::vector<std::string> failed;
  std::vector<std::string> texts; // of the turns run, in order
  int throw_next = 0;             // this many run_turn calls throw

  void run_turn(const std::string&, botmesh::event_ptr ev, bool,
                std::shared_ptr<botmesh::turn_token>,
                std::function<void()> done) override {
    if (throw_next > 0) {
      --throw_next;
      throw std::runtime_error("no handler thread");
    }
    ++ran;
    texts.push_back(ev->ev.message.text);
    ev->ev.end(botmesh::turn_outcome::handled);
    done();
  }
  void run_event(const std::string&, botmesh::chat_event&, bool) override {
    // nop: coordinated only
  }
  void post(std::function<void()> job) override {
    job();
  }
  void turn_failed(const std::string&, botmesh::chat_event ev,
                   std::string) override {
    failed.push_back(ev.message.text);
  }
  void refused(const std::string&, botmesh::chat_event ev, botmesh::errc,
               std::string) override {
    failed.push_back("refused " + ev.message.text);
  }
};

// A lease actor that grants only when told: it keeps who asked.
struct asks {
  std::vector<std::pair<caf::actor, std::uint64_t>> pending;
};

caf::behavior manual_lease(caf::event_based_actor* self,
                           std::shared_ptr<asks> a) {
  return {
    [=](botmesh::acquire_atom, const std::string&, std::uint64_t req) {
      a->pending.emplace_back(
        caf::actor_cast<caf::actor>(self->current_sender()), req);
    },
    [](botmesh::release_atom, const std::string&, std::uint64_t) {},
    [](botmesh::release_atom, const std::string&, std::uint64_t,
       const std::string&) {},
    [](botmesh::leave_atom, const std::string&, std::uint64_t) {},
  };
}

botmesh::event_ptr event(std::string text) {
  botmesh::inbound_message m;
  m.provider = "test";
  m.chat = "c";
  m.text = std::move(text);
  return botmesh::make_event("test:c", std::move(m));
}

} // namespace

// A router with `instant_services` and a `manual_lease`, on the
// deterministic scheduler; ended with the fixture.
struct manual_chats {
  deterministic d;
  instant_services svc;
  std::shared_ptr<asks> a = std::make_shared<asks>();
  caf::actor lease;
  caf::actor router;

  explicit manual_chats(std::chrono::milliseconds turn_wait = std::chrono::minutes{2}) {
    lease = d.sys->spawn(manual_lease, a);
    router = botmesh::spawn_router(
      *d.sys, botmesh::router_config{.services = &svc, .lease = lease,
                                     .turn_wait = turn_wait});
    d.sched->run();
  }

  ~manual_chats() {
    caf::anon_send_exit(router, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(lease, caf::exit_reason::user_shutdown);
    d.sched->run(); // while svc lives: the exits may still call it
  }

  void send(std::string text) {
    caf::anon_send(router, event(std::move(text)));
    d.sched->run();
  }

  // Grants every pending request (fence = request id), and those they
  // lead to, a few rounds deep.
  void grant_all() {
    for (int round = 0; round < 10 && !a->pending.empty(); ++round) {
      auto asked = std::move(a->pending);
      a->pending.clear();
      for (auto& [chat, req] : asked)
        caf::anon_send(chat, botmesh::granted_atom::value, req,
                       std::make_shared<botmesh::turn_token>(
                         "test:c", req, req, std::nullopt,
                         std::chrono::steady_clock::now() + std::chrono::hours(1)));
      d.sched->run();
    }
  }
};

TEST_CASE("a chat actor keeps one turn_wait tick pending however many "
          "messages wait for their turns, and each still gets its full "
          "bound") {
  manual_chats f{std::chrono::seconds{10}};
  // 300 messages, one after the other, each waiting for its grant.
  for (int n = 1; n <= 300; ++n) {
    f.send("m" + std::to_string(n));
    REQUIRE(f.a->pending.size() == 1);
    f.grant_all();
  }
  CHECK(f.svc.ran == 300);
  // The router's idle sweep and the chat's one tick.
  CHECK(f.d.sched->clock().schedule().size() <= 2);
  // A message whose wait begins after the tick was armed is not cut short:
  // it waits its whole turn_wait.
  f.d.pass(6s);
  f.send("tarde");
  f.d.pass(6s); // the tick (armed 12 s ago) came; "tarde" waited 6 s
  CHECK(f.svc.failed.empty());
  f.d.pass(5s);
  CHECK(f.svc.failed == std::vector<std::string>{"tarde"});
}

TEST_CASE("a run_turn that throws ends the chat actor and refuses the message "
          "it was given, once, and the ones after it run on the chat's next actor") {
  manual_chats f;
  f.svc.throw_next = 1;
  caf::anon_send(f.router, event("uno"));
  f.send("dos");
  f.grant_all();
  CHECK(f.svc.texts == std::vector<std::string>{"dos"});
  CHECK(f.svc.failed == std::vector<std::string>{"refused uno"});
}
