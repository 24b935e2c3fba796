#include <botmesh/providers/provider.hpp>

namespace botmesh {

provider_host::~provider_host() {
  // nop
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
