#include <botmesh/providers/provider.hpp>

namespace botmesh {

provider_host::~provider_host() {
  // nop
}

void provider_host::deliver(inbound_message msg, delivery_callbacks cb) {
  deliver(std::move(msg));
  if (cb.accepted)
    cb.accepted(errc::none);
  if (cb.turn_ended)
    cb.turn_ended(turn_outcome::untracked);
}

bool retry_later(errc code) noexcept {
  return code == errc::stopped || code == errc::store_error
         || code == errc::timeout || code == errc::provider_not_leader;
}

bool provider_host::yield_leadership(std::string_view) {
  return false;
}

std::string_view to_string(turn_outcome o) noexcept {
  switch (o) {
    case turn_outcome::handled:
      return "handled";
    case turn_outcome::failed:
      return "failed";
    case turn_outcome::refused:
      return "refused";
    case turn_outcome::untracked:
      return "untracked";
    case turn_outcome::duplicate:
      return "duplicate";
  }
  return "untracked";
}

provider::~provider() {
  // nop
}

std::string_view to_string(provider_state s) noexcept {
  switch (s) {
    case provider_state::connecting:
      return "connecting";
    case provider_state::open:
      return "open";
    case provider_state::closed:
      return "closed";
  }
  return "closed";
}

} // namespace botmesh
