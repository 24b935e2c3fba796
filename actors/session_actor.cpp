#include <botmesh/actors/session_actor.hpp>
#include <botmesh/actors/internal/caf_logger.hpp>

#include <caf/all.hpp>

#include <botmesh/actors/messages.hpp>

namespace botmesh {

session_hooks::~session_hooks() {
  // nop
}

namespace {

using check_atom = caf::atom_constant<caf::atom("bm_scheck")>;
using present_atom = caf::atom_constant<caf::atom("bm_spres")>;
// The transport stopped (or the bound on it passed): the leadership goes.
using stopped_atom = caf::atom_constant<caf::atom("bm_sstop")>;

struct session_state {
  session_config cfg;
  std::optional<std::uint64_t> fence; // leading at
  bool told_standby = false;
  bool resting = false; // yielded; presents itself again later
  bool stopping = false;
  // The step-down whose transport stop is awaited before the leadership
  // goes (0: none); a generation, so the bound's message and the stop's
  // notice act once.
  std::uint64_t unleading = 0;
  std::uint64_t next_gen = 0;
  caf::typed_response_promise<bool> shutdown_rp;
  // When this replica last became leader: provider_down counts from here
  // too, since the transport is started on a handler thread afterwards and
  // its closed-since instant may still be an old one until then.
  caf::actor_clock::time_point leading_since{};

  static inline const char* name = "botmesh.session";
};

using session_actor_t = caf::stateful_actor<session_state>;

// Stops the transport; with `then_unlead`, the leadership is given up
// only once it stopped (or after a lease, should the stop hang): given up
// first, another replica elected at once would run its transport beside
// this one's (two pollers of one bot, which the platform refuses).
void stop_transport(session_actor_t* self, bool then_unlead) {
  auto& st = self->state;
  st.fence.reset();
  st.cfg.leading->store(false);
  std::function<void()> stopped;
  if (then_unlead) {
    auto gen = ++st.next_gen;
    st.unleading = gen;
    stopped = [me = caf::actor_cast<caf::actor>(self), gen] {
      caf::anon_send(me, stopped_atom::value, gen);
    };
    self->delayed_send(self, st.cfg.period * 3, stopped_atom::value, gen);
  }
  st.cfg.hooks->set_transport(false, std::move(stopped));
}

// Steps down and presents itself again after the rest period (counted
// from when the leadership went).
void yield(session_actor_t* self, const std::string& reason) {
  auto& st = self->state;
  stop_transport(self, true);
  st.cfg.hooks->follower(st.cfg.name, reason);
  st.resting = true;
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
      if (st.fence == fence)
        return; // the same leadership (presented again): the transport runs
      if (st.fence) {
        // A new term while this replica believed it led: its leadership
        // lapsed in between, unnoticed, and another replica may have led
        // meanwhile (and handed its own fence to the platform). Lost, said
        // so, then won anew: listeners holding the old fence learn the
        // new one.
        stop_transport(self, false);
        st.cfg.hooks->follower(st.cfg.name, "lost");
      }
      st.fence = fence;
      st.told_standby = false;
      st.leading_since = self->clock().now();
      // Elected first, then started: the transport's "open" notice must
      // find this replica leading, or bot::ready() would miss it.
      st.cfg.leading->store(true);
      st.cfg.hooks->set_transport(true, {});
      st.cfg.hooks->leader(st.cfg.name, fence);
    },
    [=](lead_valid_atom, const std::string&, std::int64_t until) {
      auto& st = self->state;
      if (st.cfg.leading_until)
        st.cfg.leading_until->store(until);
    },
    [=](follower_atom, const std::string&, const std::string& reason) {
      auto& st = self->state;
      if (st.stopping)
        return;
      if (st.fence) {
        // Lost: nothing to give up, the transport stops.
        stop_transport(self, false);
        st.cfg.hooks->follower(st.cfg.name, reason);
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
    [=](stopped_atom, std::uint64_t gen) {
      auto& st = self->state;
      if (gen != st.unleading)
        return; // done already (the stop's notice and its bound both come)
      st.unleading = 0;
      self->send(st.cfg.lease, unlead_atom::value, st.cfg.name);
      if (st.stopping) {
        st.shutdown_rp.deliver(true);
        self->quit();
        return;
      }
      self->delayed_send(self, st.cfg.rest, present_atom::value);
    },
    [=](shutdown_atom) -> caf::result<bool> {
      auto& st = self->state;
      if (st.stopping)
        return true; // (asked twice)
      st.stopping = true;
      st.shutdown_rp = self->make_response_promise<bool>();
      // Also while resting: a yield's stop may still run.
      stop_transport(self, true);
      return st.shutdown_rp;
    },
  };
}

} // namespace

caf::actor spawn_session_actor(caf::actor_system& sys, session_config cfg) {
  auto a = sys.spawn(session_actor, std::move(cfg));
  internal::release_caf_logger();
  return a;
}

} // namespace botmesh
