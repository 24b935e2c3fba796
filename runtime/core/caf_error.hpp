#pragma once

#include <string>

#include <caf/atom.hpp>
#include <caf/error.hpp>

#include <botmesh/runtime/core/error.hpp>

namespace botmesh {

/// The CAF error category of botmesh errors.
using error_category = caf::atom_constant<caf::atom("botmesh")>;

/// Converts a code into a `caf::error` (category `botmesh`), so it can be
/// the result of a request between actors.
caf::error make_error(errc code);

/// Same, with a human-readable context string.
caf::error make_error(errc code, std::string what);

/// Returns the code of a `caf::error` of category `botmesh`, or `errc::none`.
errc code_of(const caf::error& err) noexcept;

/// Returns the context text of a botmesh `caf::error` (empty when none).
std::string what_of(const caf::error& err);


} // namespace botmesh
