#pragma once

#include <string_view>

namespace botmesh {

/// A runtime text by key, in `lang` ("es", "en"); English when the language
/// or the key in it is missing, the key itself when unknown. Keys:
///   core.conversation.interrupted  the conversation could not go on
///   core.conversation.timeout      a question waited past its timeout
std::string_view text(std::string_view lang, std::string_view key) noexcept;

} // namespace botmesh
