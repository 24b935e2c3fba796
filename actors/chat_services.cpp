#include <botmesh/actors/chat_services.hpp>

namespace botmesh {

chat_services::~chat_services() {
  // nop
}

void chat_services::chat_activated(const std::string&) {
  // nop
}

void chat_services::chat_passivated(const std::string&) {
  // nop
}

} // namespace botmesh
