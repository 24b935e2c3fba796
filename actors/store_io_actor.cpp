// The store-I/O actor: blocking store calls (SQLite, the synchronous Redis
// schedule store) run on its own thread, never on a CAF worker; each reply
// is a message to the actor that asked (CAF's curl_fuse pattern).

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <botmesh/actors/internal/scheduler_engine.hpp>
#include <botmesh/actors/internal/caf_logger.hpp>
#include <botmesh/actors/messages.hpp>
#include <botmesh/runtime/core/internal/text.hpp>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::internal::store_call>)

namespace botmesh::internal {

namespace {

// A class rather than a function: CAF 0.17 spawns a function-based actor
// without arguments by dereferencing a null pointer to its (empty)
// argument tuple, which UBSan reports.
class store_io : public caf::event_based_actor {
 public:
  using caf::event_based_actor::event_based_actor;

  caf::behavior make_behavior() override {
    return {
      [](io_atom, std::shared_ptr<store_call>& call) {
        try {
          call->fn();
        } catch (...) {
          call->failure = what_of(std::current_exception());
        }
        return caf::make_message(io_atom::value, std::move(call));
      },
    };
  }
};

} // namespace

caf::actor spawn_store_io(caf::actor_system& sys) {
  // On CAF's test coordinator (virtual-time tests) every actor runs on the
  // test's thread, this one too; a thread of its own would race with it.
  if (dynamic_cast<caf::scheduler::test_coordinator*>(&sys.scheduler()))
    return sys.spawn<store_io>();
  auto a = sys.spawn<store_io, caf::detached>();
  release_caf_logger();
  return a;
}

} // namespace botmesh::internal
