// libFuzzer target: Telegram updates (webhook bodies and getUpdates results).
// Any input must either parse or throw invalid_argument_error; a parsed
// message must pass or fail validation with a named field, never crash.

#include <cstddef>
#include <cstdint>
#include <string>
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
  // The webhook's path: read in place from a body with padded capacity
  // (as the HTTP server leaves it); it must agree with the copying parse.
  std::string padded{in};
  padded.reserve(padded.size() + 64);
  bool copied_ok = false, in_place_ok = false;
  try {
    botmesh::telegram::internal::parse_update(in, "telegram");
    copied_ok = true;
  } catch (const botmesh::invalid_argument_error&) {
    // nop
  }
  try {
    botmesh::telegram::internal::parse_update_in_place(padded, "telegram");
    in_place_ok = true;
  } catch (const botmesh::invalid_argument_error&) {
    // nop
  }
  if (copied_ok != in_place_ok)
    __builtin_trap();
  try {
    botmesh::telegram::internal::parse_updates(in, "telegram");
  } catch (const botmesh::invalid_argument_error&) {
    // nop
  }
  return 0;
}
