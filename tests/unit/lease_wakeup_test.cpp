#include <doctest/doctest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <botmesh/actors/lease_actor.hpp>
#include <botmesh/actors/messages.hpp>
#include <botmesh/stores/memory_coordinator.hpp>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::turn_token>)

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
