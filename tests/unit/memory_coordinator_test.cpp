#include <doctest/doctest.h>

#include <conformance/coordinator_conformance.hpp>

#include <botmesh/stores/forwarding_coordinator.hpp>
#include <botmesh/stores/memory_coordinator.hpp>
#include <botmesh/stores/schedule_store.hpp>

#include <stdexcept>
#include <utility>

using namespace std::chrono_literals;

namespace {

struct memory_coordinator_factory {
  static constexpr std::chrono::milliseconds lease{15'000};
  botmesh::manual_clock clock;
  botmesh::memory_coordination_hub hub{{.clock = &clock}};

  std::unique_ptr<botmesh::coordinator> make(std::string replica_id) {
    return std::make_unique<botmesh::memory_coordinator>(
      hub, botmesh::memory_coordinator_options{.replica_id = std::move(replica_id),
                                               .lease = lease});
  }

  void crash(botmesh::coordinator& c) {
    static_cast<botmesh::memory_coordinator&>(c).crash();
  }

  void advance(std::chrono::milliseconds d) {
    clock.advance(d);
  }
};

} // namespace

TYPE_TO_STRING(memory_coordinator_factory);
BOTMESH_COORDINATOR_CONFORMANCE(memory_coordinator_factory);

TEST_CASE("the hub evicts idle chats least recently used first, fences stay "
          "monotonic and a recreated chat has no previous holder") {
  botmesh::manual_clock clock;
  botmesh::memory_coordination_hub hub{{.max_idle_keys = 2, .clock = &clock}};
  botmesh::memory_coordinator a{hub, {.replica_id = "a"}};
  botmesh::blocking_coordinator sync{a};
  std::uint64_t first_fence = 0;
  std::uint64_t req = 0;
  for (auto key : {"c1", "c2", "c3"}) {
    auto held = sync.enter(key, ++req);
    REQUIRE(held.granted());
    if (first_fence == 0)
      first_fence = held.fence;
    REQUIRE(sync.release({key, held.fence}).released);
  }
  CHECK(hub.keys() == 2); // c1 was the least recently used idle chat
  auto again = sync.enter("c1", ++req);
  REQUIRE(again.granted());
  CHECK_FALSE(again.previous_holder.has_value());
  CHECK(again.fence > first_fence);
  // c3, used more recently, kept its history.
  auto c3 = sync.enter("c3", ++req);
  REQUIRE(c3.granted());
  CHECK(c3.previous_holder == "a");
}

TEST_CASE("a crashed coordinator refuses calls and replica ids default to "
          "UUIDs") {
  botmesh::memory_coordination_hub hub;
  botmesh::memory_coordinator a{hub};
  botmesh::memory_coordinator b{hub};
  CHECK(a.replica_id().size() == 36);
  CHECK(a.replica_id() != b.replica_id());
  CHECK(a.lease() == 15s);
  a.crash();
  CHECK_THROWS_AS(botmesh::blocking_coordinator{a}.enter("x", 1),
                  botmesh::coordination_unavailable_error);
  CHECK_THROWS_AS((botmesh::memory_coordinator{hub, {.lease = 0ms}}),
                  botmesh::invalid_argument_error);
}

TEST_CASE("a coordinator lease whose acquire won but lost its reply is still "
          "given back: another replica leads at once") {
  // The first renewal runs, and its answer is lost.
  struct lossy final : botmesh::forwarding_coordinator {
    using forwarding_coordinator::forwarding_coordinator;
    bool lose = true;
    void renew(botmesh::renewal r,
               completion<botmesh::renewal_result> done) override {
      if (!std::exchange(lose, false)) {
        c_->renew(std::move(r), std::move(done));
        return;
      }
      c_->renew(std::move(r), [done](botmesh::renewal_result, std::exception_ptr) {
        done({}, std::make_exception_ptr(std::runtime_error("reply lost")));
      });
    }
  };
  botmesh::manual_clock clock;
  botmesh::memory_coordination_hub hub{{.clock = &clock}};
  auto a = std::make_shared<botmesh::memory_coordinator>(
    hub, botmesh::memory_coordinator_options{.replica_id = "a"});
  botmesh::memory_coordinator b{hub, {.replica_id = "b"}};
  auto lease = botmesh::make_coordinator_lease(std::make_shared<lossy>(a));
  CHECK_THROWS(lease->try_acquire("sched", "a", clock.now(), 15s));
  // It did win: b cannot lead while a holds it.
  CHECK_FALSE(botmesh::blocking_coordinator{b}.lead("sched").has_value());
  lease->release("sched", "a");
  CHECK(botmesh::blocking_coordinator{b}.lead("sched").has_value());
}

TEST_CASE("a coordinator lease given back after a lost reply does not take "
          "a leadership another replica holds") {
  struct lossy final : botmesh::forwarding_coordinator {
    using forwarding_coordinator::forwarding_coordinator;
    bool lose = true;
    void renew(botmesh::renewal r,
               completion<botmesh::renewal_result> done) override {
      if (!lose) {
        c_->renew(std::move(r), std::move(done));
        return;
      }
      done({}, std::make_exception_ptr(std::runtime_error("no answer")));
    }
  };
  botmesh::manual_clock clock;
  botmesh::memory_coordination_hub hub{{.clock = &clock}};
  auto a = std::make_shared<botmesh::memory_coordinator>(
    hub, botmesh::memory_coordinator_options{.replica_id = "a"});
  botmesh::memory_coordinator b{hub, {.replica_id = "b"}};
  auto faulty = std::make_shared<lossy>(a);
  auto lease = botmesh::make_coordinator_lease(faulty);
  CHECK_THROWS(lease->try_acquire("sched", "a", clock.now(), 15s));
  auto held = botmesh::blocking_coordinator{b}.lead("sched");
  REQUIRE(held.has_value()); // the lost call never ran: b leads
  faulty->lose = false;
  lease->release("sched", "a");
  auto still = botmesh::blocking_coordinator{b}.lead("sched");
  REQUIRE(still.has_value());
  CHECK(still->fence == held->fence);
}
