// libFuzzer target: WhatsApp Cloud / Messenger / Instagram webhook payloads
// and Graph API error answers.

#include <cstddef>
#include <cstdint>
#include <string>
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
    // The webhook's path, in place from padded capacity: it must agree.
    std::string padded{in};
    padded.reserve(padded.size() + 64);
    std::size_t copied = 0, in_place = 0;
    bool copied_ok = false, in_place_ok = false;
    try {
      copied = botmesh::meta::internal::parse_payload(in, kind, "meta").messages.size();
      copied_ok = true;
    } catch (const botmesh::invalid_argument_error&) {
      // nop
    }
    try {
      in_place = botmesh::meta::internal::parse_payload_in_place(padded, kind, "meta")
                   .messages.size();
      in_place_ok = true;
    } catch (const botmesh::invalid_argument_error&) {
      // nop
    }
    if (copied_ok != in_place_ok || copied != in_place)
      __builtin_trap();
  }
  try {
    botmesh::meta::internal::check_graph_answer(400, in);
  } catch (const botmesh::platform_error&) {
    // nop: always thrown for a 400
  }
  return 0;
}
