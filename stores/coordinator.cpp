#include <botmesh/stores/coordinator.hpp>

#include <botmesh/stores/schedule_store.hpp>

namespace botmesh {

coordinator::~coordinator() {
  // nop
}

namespace {

class coordinator_lease final : public lease_provider {
 public:
  explicit coordinator_lease(std::shared_ptr<coordinator> c)
    : c_(std::move(c)) {
    // nop
  }

  std::optional<std::uint64_t> try_acquire(std::string_view name,
                                           std::string_view, time_point,
                                           std::chrono::milliseconds) override {
    if (auto l = c_->try_lead(name))
      return l->fence;
    return std::nullopt;
  }

  void release(std::string_view name, std::string_view) override {
    if (auto l = c_->try_lead(name))
      c_->release_lead(*l);
  }

 private:
  std::shared_ptr<coordinator> c_;
};

} // namespace

std::shared_ptr<lease_provider>
make_coordinator_lease(std::shared_ptr<coordinator> c) {
  return std::make_shared<coordinator_lease>(std::move(c));
}

} // namespace botmesh
