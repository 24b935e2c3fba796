// libFuzzer target: WhatsApp Cloud / Messenger / Instagram webhook payloads
// and Graph API error answers.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <botmesh/providers/meta/internal/payload.hpp>
#include <botmesh/runtime/core/error.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view in{reinterpret_cast<const char*>(data), size};
  for (auto kind : {botmesh::meta::platform::whatsapp,
                    botmesh::meta::platform::messenger}) {
    try {
      auto p = botmesh::meta::internal::parse_payload(in, kind, "meta");
      for (auto& m : p.messages) {
        try {
          botmesh::validate(m, botmesh::message_limits{});
        } catch (const botmesh::invalid_argument_error&) {
          // nop
        }
      }
    } catch (const botmesh::invalid_argument_error&) {
      // nop
    }
  }
  try {
    botmesh::meta::internal::check_graph_answer(400, in);
  } catch (const botmesh::platform_error&) {
    // nop: always thrown for a 400
  }
  return 0;
}
