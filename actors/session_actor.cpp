#include <botmesh/actors/session_actor.hpp>

#include <caf/all.hpp>

#include <botmesh/actors/messages.hpp>

namespace botmesh {

session_hooks::~session_hooks() {
  // nop
}

namespace {

using check_atom = caf::atom_constant<caf::atom("bm_scheck")>;
using present_atom = caf::atom_constant<caf::atom("bm_spres")>;

struct session_state {
  session_config cfg;
  std::optional<std::uint64_t> fence; // leading at
  bool told_standby = false;
  bool resting = false; // yielded; presents itself again later
  bool stopping = false;
  // When this replica last became leader: provider_down counts from here
  // too, since the transport is started on a handler thread afterwards and
  // its closed-since instant may still be an old one until then.
  caf::actor_clock::time_point leading_since{};

  static inline const char* name = "botmesh.session";
};

using session_actor_t = caf::stateful_actor<session_state>;

void step_down(session_actor_t* self, const std::string& reason) {
  auto& st = self->state;
  st.fence.reset();
  st.cfg.leading->store(false);
  auto* hooks = st.cfg.hooks;
  hooks->run_blocking([hooks] { hooks->stop_transport(); });
  hooks->follower(st.cfg.name, reason);
}

// Steps down and presents itself again after the rest period.
void yield(session_actor_t* self, const std::string& reason) {
  auto& st = self->state;
  self->send(st.cfg.lease, unlead_atom::value, st.cfg.name);
  step_down(self, reason);
  st.resting = true;
  self->delayed_send(self, st.cfg.rest, present_atom::value);
}

caf::behavior session_actor(session_actor_t* self, session_config cfg) {
  self->state.cfg = std::move(cfg);
  return {
    [=](start_atom) {
      auto& st = self->state;
      self->send(st.cfg.lease, lead_atom::value, st.cfg.name);
      self->delayed_send(self, st.cfg.period, check_atom::value);
    },
    [=](yield_atom, const std::string& reason) {
      auto& st = self->state;
      if (st.stopping || !st.fence)
        return;
      yield(self, reason);
    },
    [=](leader_atom, const std::string&, std::uint64_t fence) {
      auto& st = self->state;
      if (st.stopping || st.resting)
        return;
      bool was = st.fence.has_value();
      st.fence = fence;
      if (was)
        return; // re-elected across a brief loss: the transport runs
      st.told_standby = false;
      st.leading_since = self->clock().now();
      // Elected first, then started: the transport's "open" notice must
      // find this replica leading, or bot::ready() would miss it.
      st.cfg.leading->store(true);
      auto* hooks = st.cfg.hooks;
      hooks->run_blocking([hooks] { hooks->start_transport(); });
      hooks->leader(st.cfg.name, fence);
    },
    [=](follower_atom, const std::string&, const std::string& reason) {
      auto& st = self->state;
      if (st.stopping)
        return;
      if (st.fence) {
        step_down(self, reason);
      } else if (!st.told_standby) {
        st.told_standby = true;
        st.cfg.hooks->follower(st.cfg.name, "standby");
      }
    },
    [=](check_atom) {
      auto& st = self->state;
      if (st.stopping)
        return;
      self->delayed_send(self, st.cfg.period, check_atom::value);
      if (!st.fence)
        return;
      auto closed = st.cfg.hooks->closed_for();
      if (closed && *closed >= st.cfg.provider_down
          && self->clock().now() - st.leading_since >= st.cfg.provider_down)
        yield(self, "provider_down"); // so a standby can connect
    },
    [=](present_atom) {
      auto& st = self->state;
      if (st.stopping)
        return;
      st.resting = false;
      self->send(st.cfg.lease, lead_atom::value, st.cfg.name);
    },
    [=](shutdown_atom) {
      auto& st = self->state;
      st.stopping = true;
      self->send(st.cfg.lease, unlead_atom::value, st.cfg.name);
      st.fence.reset();
      st.cfg.leading->store(false);
      self->quit();
      return true;
    },
  };
}

} // namespace

caf::actor spawn_session_actor(caf::actor_system& sys, session_config cfg) {
  return sys.spawn(session_actor, std::move(cfg));
}

} // namespace botmesh
