#include <botmesh/runtime/texts.hpp>

#include <array>

namespace botmesh {

namespace {

struct entry {
  std::string_view lang;
  std::string_view key;
  std::string_view text;
};

constexpr std::array<entry, 4> table{{
  {"es", "core.conversation.interrupted",
   "La conversación se interrumpió. Empecemos de nuevo."},
  {"en", "core.conversation.interrupted",
   "The conversation was interrupted. Let's start again."},
  {"es", "core.conversation.timeout",
   "Se acabó el tiempo para responder."},
  {"en", "core.conversation.timeout", "Time to answer is up."},
}};

} // namespace

std::string_view text(std::string_view lang, std::string_view key) noexcept {
  for (auto& e : table)
    if (e.lang == lang && e.key == key)
      return e.text;
  for (auto& e : table)
    if (e.lang == "en" && e.key == key)
      return e.text;
  return key;
}

} // namespace botmesh
