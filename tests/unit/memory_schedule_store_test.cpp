#include <doctest/doctest.h>

#include <conformance/schedule_store_conformance.hpp>

#include <botmesh/stores/memory_schedule_store.hpp>

namespace {

struct memory_schedule_store_factory {
  std::shared_ptr<botmesh::schedule_store> make() {
    auto s = std::make_shared<botmesh::memory_schedule_store>();
    s->start();
    return s;
  }
};

} // namespace

TYPE_TO_STRING(memory_schedule_store_factory);
BOTMESH_SCHEDULE_STORE_CONFORMANCE(memory_schedule_store_factory);

TEST_CASE("the memory leader lease excludes other owners until it expires") {
  using namespace std::chrono_literals;
  botmesh::memory_lease_provider l;
  auto t = botmesh::from_unix_ms(1'000'000);
  auto a = l.try_acquire("leader", "a", t, 10s);
  REQUIRE(a);
  CHECK_FALSE(l.try_acquire("leader", "b", t + 5s, 10s).has_value());
  CHECK(l.try_acquire("leader", "a", t + 5s, 10s) == a); // renewal
  auto b = l.try_acquire("leader", "b", t + 16s, 10s);
  REQUIRE(b);
  CHECK(*b > *a);
  l.release("leader", "b");
  CHECK(l.try_acquire("leader", "a", t + 17s, 10s).has_value());
}
