#pragma once

#include <memory>
#include <string>

#include <botmesh/stores/coordinator.hpp>

namespace botmesh {

/// A coordinator that hands every call to another one: derive from it and
/// override the calls to watch, count or fault (diagnostics, tests). Costs
/// one virtual call per call.
class forwarding_coordinator : public coordinator {
 public:
  explicit forwarding_coordinator(std::shared_ptr<coordinator> c)
    : c_(std::move(c)) {
    // nop
  }

  const std::string& replica_id() const noexcept override {
    return c_->replica_id();
  }
  const std::string& incarnation() const noexcept override {
    return c_->incarnation();
  }
  std::chrono::milliseconds lease() const noexcept override {
    return c_->lease();
  }
  void enter(std::string_view key, std::uint64_t req, bool retry,
             completion<turn_state> done) override {
    c_->enter(key, req, retry, std::move(done));
  }
  void poll(std::string_view key, std::uint64_t req,
            completion<turn_state> done) override {
    c_->poll(key, req, std::move(done));
  }
  void release(turn_ref t, std::string_view handoff,
               completion<release_result> done) override {
    c_->release(std::move(t), handoff, std::move(done));
  }
  void leave(std::string_view key, std::uint64_t req,
             completion<bool> done) override {
    c_->leave(key, req, std::move(done));
  }
  void skip_if_dead(std::string_view key, std::string_view inc,
                    completion<bool> done) override {
    c_->skip_if_dead(key, inc, std::move(done));
  }
  void renew(renewal r,
             completion<renewal_result> done) override {
    c_->renew(std::move(r), std::move(done));
  }
  void unlead(std::string_view name, std::uint64_t fence,
              completion<bool> done) override {
    c_->unlead(name, fence, std::move(done));
  }
  void on_grant(grant_listener fn) override {
    c_->on_grant(std::move(fn));
  }
  std::uint64_t push_epoch() const noexcept override {
    return c_->push_epoch();
  }

 protected:
  std::shared_ptr<coordinator> c_;
};

} // namespace botmesh
