#include <botmesh/runtime/core/error.hpp>

#include <fmt/format.h>

namespace botmesh {

std::string_view to_string(errc code) noexcept {
  switch (code) {
    case errc::none:
      return "none";
    case errc::invalid_argument:
      return "invalid_argument";
    case errc::lease_lost:
      return "lease_lost";
    case errc::coordination_unavailable:
      return "coordination_unavailable";
    case errc::provider_not_leader:
      return "provider_not_leader";
    case errc::overloaded:
      return "overloaded";
    case errc::stopped:
      return "stopped";
    case errc::handler_failed:
      return "handler_failed";
    case errc::provider_error:
      return "provider_error";
    case errc::corrupted_record:
      return "corrupted_record";
    case errc::store_error:
      return "store_error";
    case errc::timeout:
      return "timeout";
    case errc::retry_after:
      return "retry_after";
    case errc::forbidden:
      return "forbidden";
    case errc::bad_request:
      return "bad_request";
  }
  return "unknown";
}

error::error(errc code, const std::string& what)
  : std::runtime_error(what), code_(code) {
  // nop
}

invalid_argument_error::invalid_argument_error(std::string field,
                                               const std::string& what)
  : error(errc::invalid_argument, what), field_(std::move(field)) {
  // nop
}

lease_lost_error::lease_lost_error(std::string key, std::string reason)
  : error(errc::lease_lost,
          fmt::format("lease lost for {}: {}", key, reason)),
    key_(std::move(key)),
    reason_(std::move(reason)) {
  // nop
}

corrupted_checkpoint_error::corrupted_checkpoint_error(
  const std::string& what, std::optional<std::uint64_t> revision)
  : error(errc::corrupted_record, what), revision_(revision) {
  // nop
}

coordination_unavailable_error::coordination_unavailable_error(
  const std::string& what)
  : error(errc::coordination_unavailable, what) {
  // nop
}

platform_error::platform_error(errc code, int http_status,
                               std::string description,
                               std::chrono::milliseconds retry_after,
                               const std::string& what, scope wait_scope)
  : error(code, what),
    http_status_(http_status),
    description_(std::move(description)),
    retry_after_(retry_after),
    scope_(wait_scope) {
  // nop
}

provider_not_leader_error::provider_not_leader_error(std::string provider_id)
  : error(errc::provider_not_leader,
          fmt::format("provider {} is not the leader on this replica: send() "
                      "is only possible on the replica elected for provider:{}",
                      provider_id, provider_id)) {
  // nop
}

} // namespace botmesh
