#include <botmesh/actors/journal_actor.hpp>
#include <botmesh/actors/internal/caf_logger.hpp>

#include <caf/all.hpp>

#include <botmesh/actors/messages.hpp>

namespace botmesh {

namespace {

using tick_atom = caf::atom_constant<caf::atom("bm_jtick")>;
using beat_done_atom = caf::atom_constant<caf::atom("bm_jdone")>;
using retired_atom = caf::atom_constant<caf::atom("bm_jret")>;

struct journal_state {
  journal_config cfg;
  bool beating = false;
  bool stopping = false;
  std::vector<caf::typed_response_promise<bool>> waiters;

  static inline const char* name = "botmesh.journal";
};

using journal_actor_t = caf::stateful_actor<journal_state>;

void retire(journal_actor_t* self) {
  auto h = caf::actor_cast<caf::actor>(self);
  self->state.cfg.retire([h] { caf::anon_send(h, retired_atom::value); });
}

// One beat, unless one is running (never two at once).
void beat(journal_actor_t* self) {
  auto& st = self->state;
  if (st.beating)
    return;
  st.beating = true;
  auto h = caf::actor_cast<caf::actor>(self);
  st.cfg.beat([h] { caf::anon_send(h, beat_done_atom::value); });
}

caf::behavior journal_actor(journal_actor_t* self, journal_config cfg) {
  self->state.cfg = std::move(cfg);
  self->delayed_send(self, self->state.cfg.period, tick_atom::value);
  return {
    [=](tick_atom) {
      auto& st = self->state;
      if (st.stopping)
        return;
      self->delayed_send(self, st.cfg.period, tick_atom::value);
      beat(self);
    },
    [=](beat_now_atom) {
      if (!self->state.stopping)
        beat(self);
    },
    [=](beat_done_atom) {
      auto& st = self->state;
      st.beating = false;
      if (st.stopping)
        retire(self);
    },
    [=](shutdown_atom) -> caf::result<bool> {
      auto& st = self->state;
      auto rp = self->make_response_promise<bool>();
      st.waiters.push_back(rp);
      if (!st.stopping) {
        st.stopping = true;
        if (!st.beating)
          retire(self);
      }
      return rp;
    },
    [=](retired_atom) {
      for (auto& rp : self->state.waiters)
        rp.deliver(true);
      self->state.waiters.clear();
      self->quit();
    },
  };
}

} // namespace

caf::actor spawn_journal_actor(caf::actor_system& sys, journal_config cfg) {
  auto a = sys.spawn(journal_actor, std::move(cfg));
  internal::release_caf_logger();
  return a;
}

} // namespace botmesh
