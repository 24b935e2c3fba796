#include <botmesh/actors/internal/end_actors.hpp>

#include <chrono>

#include <caf/all.hpp>

namespace botmesh::internal {

void end_and_wait(caf::actor_system& sys, const std::vector<caf::actor>& actors,
                  const std::function<void(std::size_t left, int seconds)>&
                    still_waiting) {
  caf::scoped_actor self{sys};
  for (auto& a : actors) {
    self->monitor(a);
    self->send_exit(a, caf::exit_reason::user_shutdown);
  }
  for (std::size_t left = actors.size(), rounds = 1; left > 0;) {
    self->receive([&](caf::down_msg&) { --left; },
                  caf::after(std::chrono::seconds(10)) >> [&] {
                    still_waiting(left, 10 * static_cast<int>(rounds++));
                  });
  }
}

} // namespace botmesh::internal
