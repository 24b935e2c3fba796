// libFuzzer target: Telegram updates (webhook bodies and getUpdates results).
// Any input must either parse or throw invalid_argument_error; a parsed
// message must pass or fail validation with a named field, never crash.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <botmesh/providers/telegram/internal/update_parser.hpp>
#include <botmesh/runtime/core/error.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view in{reinterpret_cast<const char*>(data), size};
  try {
    auto u = botmesh::telegram::internal::parse_update(in, "telegram");
    try {
      botmesh::validate(u.message, botmesh::message_limits{});
    } catch (const botmesh::invalid_argument_error&) {
      // nop: named refusal
    }
  } catch (const botmesh::invalid_argument_error&) {
    // nop
  }
  try {
    botmesh::telegram::internal::parse_updates(in, "telegram");
  } catch (const botmesh::invalid_argument_error&) {
    // nop
  }
  return 0;
}
