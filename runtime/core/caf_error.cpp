#include <botmesh/runtime/core/caf_error.hpp>

#include <caf/message.hpp>
#include <caf/make_message.hpp>

namespace botmesh {

caf::error make_error(errc code) {
  return caf::error{static_cast<uint8_t>(code), error_category::value};
}

caf::error make_error(errc code, std::string what) {
  return caf::error{static_cast<uint8_t>(code), error_category::value,
                    caf::make_message(std::move(what))};
}

errc code_of(const caf::error& err) noexcept {
  if (!err || err.category() != error_category::value)
    return errc::none;
  return static_cast<errc>(err.code());
}

std::string what_of(const caf::error& err) {
  if (!err)
    return {};
  auto& ctx = err.context();
  if (ctx.match_elements<std::string>())
    return ctx.get_as<std::string>(0);
  return {};
}

} // namespace botmesh
