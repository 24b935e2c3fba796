#include <botmesh/actors/internal/caf_logger.hpp>

#include <caf/logger.hpp>

namespace botmesh::internal {

void release_caf_logger() noexcept {
  caf::logger::set_current_actor_system(nullptr);
}

} // namespace botmesh::internal
