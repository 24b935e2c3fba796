#pragma once

// Internal: the asynchronous face of a schedule store whose client has one
// (Redis). The scheduler's task actors call it instead of sending the
// blocking call to the store-I/O actor, so a round trip holds no thread and
// calls of many tasks share the client's pipelining.

#include <chrono>
#include <exception>
#include <functional>
#include <optional>
#include <string_view>

#include <botmesh/stores/schedule_store.hpp>

namespace botmesh::internal {

class async_schedule_store {
 public:
  /// Gets the result, or the exception the synchronous call would have
  /// thrown (a timeout included: a reply that never comes ends the call
  /// after the client's command timeout). Runs once, on the client's
  /// thread, and must not block.
  template <class T>
  using done = std::function<void(T, std::exception_ptr)>;

  /// A claim; when the slot was not claimable, the record as it stands.
  struct claim_result {
    std::optional<schedule_claim> claim;
    std::optional<schedule_record> current;
  };

  virtual ~async_schedule_store() = default;

  /// schedule_store::claim, then schedule_store::get when it claimed nothing.
  virtual void claim_async(std::string_view id, std::string_view owner,
                           time_point now, std::chrono::milliseconds lease,
                           done<claim_result> fn)
    = 0;

  /// schedule_store::renew.
  virtual void renew_async(std::string_view id, std::string_view owner,
                           std::uint64_t token, time_point now,
                           std::chrono::milliseconds lease, done<bool> fn)
    = 0;

  /// schedule_store::get.
  virtual void get_async(std::string_view id,
                         done<std::optional<schedule_record>> fn)
    = 0;

  /// schedule_store::register_task (a record found missing at a claim is
  /// registered again).
  virtual void register_async(std::string_view id, std::string_view spec,
                              time_point first_run, time_point now,
                              done<schedule_record> fn)
    = 0;

  /// schedule_store::remove.
  virtual void remove_async(std::string_view id, time_point now, done<bool> fn)
    = 0;

  /// schedule_store::commit.
  virtual void commit_async(std::string_view id, std::string_view owner,
                            std::uint64_t token, time_point next_run_at,
                            bool done_flag, time_point now, done<bool> fn)
    = 0;
};

} // namespace botmesh::internal
