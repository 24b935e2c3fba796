#include <doctest/doctest.h>

#include <conformance/durable_conformance.hpp>

#include <botmesh/stores/memory_durable_backend.hpp>

namespace {

struct memory_durable_factory {
  static constexpr std::chrono::milliseconds lease{1000};
  botmesh::manual_clock clock;
  std::shared_ptr<botmesh::memory_durable_backend> shared;

  std::shared_ptr<botmesh::durable_backend> make() {
    if (!shared)
      shared = std::make_shared<botmesh::memory_durable_backend>(&clock);
    return shared;
  }

  void advance(std::chrono::milliseconds d) {
    clock.advance(d);
  }
};

} // namespace

TYPE_TO_STRING(memory_durable_factory);
BOTMESH_DURABLE_CONFORMANCE(memory_durable_factory);
