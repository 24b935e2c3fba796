#include <botmesh/stores/coordinator.hpp>

#include <future>
#include <mutex>
#include <unordered_map>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/schedule_store.hpp>

namespace botmesh {

coordinator::~coordinator() {
  // nop
}

void coordinator::submit(std::vector<turn_op> ops) {
  for (auto& op : ops) {
    if (auto* e = std::get_if<enter_op>(&op))
      enter(e->key, e->req, e->retry, std::move(e->done));
    else {
      auto& r = std::get<release_op>(op);
      release(std::move(r.turn), r.handoff, std::move(r.done));
    }
  }
}

namespace {

// Runs one asynchronous operation and waits for its completion.
template <class T, class F>
T wait_for(F&& start) {
  auto p = std::make_shared<std::promise<T>>();
  auto f = p->get_future();
  start([p](T value, std::exception_ptr e) {
    if (e)
      p->set_exception(e);
    else
      p->set_value(std::move(value));
  });
  return f.get();
}

} // namespace

turn_state blocking_coordinator::enter(std::string_view key, std::uint64_t req,
                                       bool retry) {
  return wait_for<turn_state>(
    [&](auto done) { c_.enter(key, req, retry, std::move(done)); });
}

turn_state blocking_coordinator::poll(std::string_view key, std::uint64_t req) {
  return wait_for<turn_state>(
    [&](auto done) { c_.poll(key, req, std::move(done)); });
}

release_result blocking_coordinator::release(turn_ref t,
                                             std::string_view handoff) {
  return wait_for<release_result>(
    [&](auto done) { c_.release(std::move(t), handoff, std::move(done)); });
}

bool blocking_coordinator::leave(std::string_view key, std::uint64_t req) {
  return wait_for<bool>([&](auto done) { c_.leave(key, req, std::move(done)); });
}

bool blocking_coordinator::skip_if_dead(std::string_view key,
                                        std::string_view incarnation) {
  return wait_for<bool>(
    [&](auto done) { c_.skip_if_dead(key, incarnation, std::move(done)); });
}

renewal_result blocking_coordinator::renew(renewal r) {
  return wait_for<renewal_result>(
    [&](auto done) { c_.renew(std::move(r), std::move(done)); });
}

std::optional<leadership> blocking_coordinator::lead(std::string_view name,
                                                     std::uint64_t known_term) {
  renewal r;
  r.leads.emplace_back(name);
  r.known_terms.push_back(known_term);
  auto res = renew(std::move(r));
  if (res.lead_failed(0))
    throw coordination_unavailable_error(
      res.errors.empty() ? std::string{"leading failed"} : res.errors.front());
  return res.leads.empty() ? std::nullopt : res.leads.front();
}

bool blocking_coordinator::unlead(std::string_view name, std::uint64_t fence) {
  return wait_for<bool>(
    [&](auto done) { c_.unlead(name, fence, std::move(done)); });
}

namespace {

// The scheduler's leader lease on the coordinator's leaderships. Its calls
// come from the scheduler's own thread, which may block.
class coordinator_lease final : public lease_provider {
 public:
  explicit coordinator_lease(std::shared_ptr<coordinator> c)
    : c_(std::move(c)) {
    // nop
  }

  std::optional<std::uint64_t> try_acquire(std::string_view name,
                                           std::string_view, time_point,
                                           std::chrono::milliseconds) override {
    std::optional<leadership> l;
    std::uint64_t known = 0;
    {
      std::lock_guard guard{mtx_};
      if (auto i = fences_.find(std::string{name}); i != fences_.end())
        known = i->second.value_or(0);
    }
    try {
      l = blocking_coordinator{*c_}.lead(name, known);
    } catch (...) {
      // Its reply lost, the call may have won: release() must still be
      // able to give it back.
      std::lock_guard guard{mtx_};
      fences_[std::string{name}] = std::nullopt;
      throw;
    }
    std::lock_guard guard{mtx_};
    if (!l) {
      fences_.erase(std::string{name});
      return std::nullopt;
    }
    fences_[std::string{name}] = l->fence;
    return l->fence;
  }

  void release(std::string_view name, std::string_view) override {
    std::optional<std::uint64_t> fence;
    {
      std::lock_guard guard{mtx_};
      auto i = fences_.find(std::string{name});
      if (i == fences_.end())
        return;
      fence = i->second;
      fences_.erase(i);
    }
    blocking_coordinator b{*c_};
    if (!fence) {
      // Unknown since a lost reply: a lead call says it. It keeps this
      // replica's leadership (and its fence) or takes a free one, both
      // given up below; it takes nothing another replica leads.
      auto l = b.lead(name);
      if (!l)
        return;
      fence = l->fence;
    }
    b.unlead(name, *fence);
  }

 private:
  std::shared_ptr<coordinator> c_;
  std::mutex mtx_;
  // Per name this replica may lead: its fence, or nothing when the reply
  // that would say it was lost.
  std::unordered_map<std::string, std::optional<std::uint64_t>> fences_;
};

} // namespace

std::shared_ptr<lease_provider>
make_coordinator_lease(std::shared_ptr<coordinator> c) {
  return std::make_shared<coordinator_lease>(std::move(c));
}

} // namespace botmesh
