// Inbound messages: as decoded from the message log / a saved answer (JSON),
// and as a provider builds them from raw platform fields.
//
// Input: first byte 'J' -> the rest is JSON for inbound_message_from_json;
// anything else -> the bytes split at '\0' into id, provider, chat,
// participant, sender, text.
//
// Contract checked: the decoder throws only corrupted_record; validate()
// throws only invalid_argument_error naming a field it documents; a message
// validate() accepts round-trips through to_json exactly; chat keys are
// injective: the key splits at ':' back into percent-encoded segments that
// decode to provider, chat and participant.

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/json.hpp>
#include <botmesh/runtime/core/message.hpp>

#include "fuzz_check.hpp"

namespace {

const std::set<std::string> fields{"chat",   "provider", "text",
                                   "participant", "sender", "id"};

std::string percent_decode(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      FUZZ_CHECK(i + 2 < s.size(), std::string{s});
      auto hex = s.substr(i + 1, 2);
      FUZZ_CHECK(std::isxdigit(static_cast<unsigned char>(hex[0]))
                   && std::isxdigit(static_cast<unsigned char>(hex[1])),
                 std::string{s});
      out.push_back(static_cast<char>(std::stoi(std::string{hex}, nullptr, 16)));
      i += 2;
    } else {
      FUZZ_CHECK(s[i] != ':', std::string{s});
      out.push_back(s[i]);
    }
  }
  return out;
}

void check_key(const botmesh::inbound_message& m) {
  auto key = botmesh::chat_key(m);
  std::vector<std::string_view> parts;
  std::string_view rest = key;
  for (auto colon = rest.find(':'); colon != std::string_view::npos;
       colon = rest.find(':')) {
    parts.push_back(rest.substr(0, colon));
    rest = rest.substr(colon + 1);
  }
  parts.push_back(rest);
  FUZZ_CHECK(parts.size() == (m.participant.empty() ? 2u : 3u), key);
  FUZZ_CHECK(percent_decode(parts[0]) == m.provider, key);
  FUZZ_CHECK(percent_decode(parts[1]) == m.chat, key);
  if (!m.participant.empty())
    FUZZ_CHECK(percent_decode(parts[2]) == m.participant, key);
}

void check(const botmesh::inbound_message& m) {
  try {
    botmesh::validate(m, botmesh::message_limits{});
  } catch (const botmesh::invalid_argument_error& e) {
    FUZZ_CHECK(fields.count(e.field()) == 1, e.field());
    return;
  }
  check_key(m);
  auto json = botmesh::to_json(m);
  FUZZ_CHECK(botmesh::is_valid_json(json), json);
  botmesh::inbound_message back;
  try {
    back = botmesh::inbound_message_from_json(json);
  } catch (const botmesh::error& e) {
    FUZZ_CHECK(false, json + ": " + e.what());
  }
  FUZZ_CHECK(back == m, "round trip changed the message: " + json);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  std::string_view in{reinterpret_cast<const char*>(data), size};
  if (!in.empty() && in[0] == 'J') {
    botmesh::inbound_message m;
    try {
      m = botmesh::inbound_message_from_json(in.substr(1));
    } catch (const botmesh::error& e) {
      FUZZ_CHECK(e.code() == botmesh::errc::corrupted_record, e.what());
      return 0;
    }
    check(m);
    return 0;
  }
  std::vector<std::string> f;
  std::string_view rest = in;
  while (f.size() < 5) {
    auto nul = rest.find('\0');
    f.emplace_back(rest.substr(0, nul));
    rest = nul == std::string_view::npos ? std::string_view{}
                                         : rest.substr(nul + 1);
  }
  botmesh::inbound_message m;
  m.id = f[0];
  m.provider = f[1];
  m.chat = f[2];
  m.participant = f[3];
  m.sender = f[4];
  m.text = std::string{rest};
  check(m);
  return 0;
}
