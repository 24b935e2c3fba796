// The store-I/O actor: blocking store calls (SQLite, the synchronous Redis
// schedule store) run on its own thread, never on a CAF worker; each reply
// is a message to the actor that asked (CAF's curl_fuse pattern).

#include <caf/all.hpp>

#include <botmesh/actors/internal/scheduler_engine.hpp>
#include <botmesh/actors/messages.hpp>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::internal::store_call>)

namespace botmesh::internal {

caf::actor spawn_store_io(caf::actor_system& sys) {
  return sys.spawn<caf::detached>([](caf::event_based_actor*) {
    return caf::behavior{
      [](io_atom, std::shared_ptr<store_call>& call) {
        try {
          call->fn();
        } catch (const std::exception& e) {
          call->failure = e.what();
          if (call->failure.empty())
            call->failure = "unknown error";
        } catch (...) {
          call->failure = "unknown error";
        }
        return caf::make_message(io_atom::value, std::move(call));
      },
    };
  });
}

} // namespace botmesh::internal
