#pragma once

#include <string>
#include <string_view>

namespace botmesh::internal {

/// SHA-1 of `data` as 40 lower-case hex characters (Redis script ids).
std::string sha1_hex(std::string_view data);

} // namespace botmesh::internal
