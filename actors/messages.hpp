#pragma once

// Atoms of the router / chat actor protocol. Include only in .cpp files that
// talk to these actors (pulls in caf/atom.hpp).

#include <caf/atom.hpp>

namespace botmesh {

/// router -> chat, bot -> router: finish what is queued, then reply.
/// To the router it carries the bound (std::chrono::milliseconds) and the
/// reply is `true` when every chat drained in time.
using drain_atom = caf::atom_constant<caf::atom("bm_drain")>;

/// router -> chat: refuse everything still queued with `errc::stopped`.
using abandon_atom = caf::atom_constant<caf::atom("bm_abandn")>;

/// handler thread -> chat: the running turn finished.
using turn_done_atom = caf::atom_constant<caf::atom("bm_done")>;

/// chat -> router: (key, messages received); the reply `true` lets the chat
/// exit because the router forwarded nothing more.
using idle_atom = caf::atom_constant<caf::atom("bm_idle")>;

/// chat -> router: (key, step running, run queue): the chat is ending by
/// an exception; the router holds what it sent back (bounced_atom) and what
/// comes for the chat until the actor is down and, if a step of the chat
/// was running, until that step returned (step_done_atom); then it gives
/// all of it, in order, to a new chat actor, with the ended one's run queue
/// (without coordination; may be null) to go on with.
using chat_gone_atom = caf::atom_constant<caf::atom("bm_cgone")>;

/// step's end -> router: (chat actor address): a step returned after its
/// chat actor ended (see chat_gone_atom).
using step_done_atom = caf::atom_constant<caf::atom("bm_stdone")>;

/// event box / chat -> router: (event): a chat event the router sent on to
/// a chat actor that ended by an exception before running it (left in its
/// queue, or freed by CAF from its mailbox); the router sends it on again,
/// to the chat's next actor.
using bounced_atom = caf::atom_constant<caf::atom("bm_bounce")>;

/// runtime -> router: (key, timer id): a timer armed for a chat fired; the
/// router sends it on to the chat actor as a timer event (an event box, so
/// it comes back if that actor ends before taking it), spawning it if needed.
using timer_atom = caf::atom_constant<caf::atom("bm_timer")>;

// -- chat <-> lease actor (see lease_actor.hpp) ------------------------------
//
//   chat                         lease actor                    coordinator
//    | (acquire, key, req) ------->| enter(key, req) ----------------->|
//    |                             |<------------- granted | waiting --|
//    |<-- (granted, req, token) ---|  (waiting: pushed grant, or poll) |
//    | (start, key, fence) ------->|  settle bound starts              |
//    |   ... the step runs on the handler pool, checking the token ... |
//    | (release, key, fence) ----->| release(key, fence) ------------->|
//    |                             |   grants the next ticket itself   |
//    |<-- (lost, req, fence, why) -|  a turn or a ticket was lost      |
//    | (leave, key, req) --------->| leave(key, req) --------------->|
//
// Every lease/3 the lease actor renews its heartbeat, every held turn and
// every leadership in one batch.

/// chat -> lease: (key, req): take a ticket for request `req` (one per
/// message or timer, unique in the process).
using acquire_atom = caf::atom_constant<caf::atom("bm_acq")>;

/// lease -> chat: (req, shared_ptr<turn_token>): the turn is the request's.
using granted_atom = caf::atom_constant<caf::atom("bm_grant")>;

/// chat -> lease: (key, fence): the step of this turn starts now (its
/// settle bound starts counting).
using start_atom = caf::atom_constant<caf::atom("bm_start")>;

/// chat -> lease: (key, fence[, handoff]): the turn is over; `handoff`
/// (a string, may be empty) goes to the next holder with the grant this
/// release makes (see coordinator::release).
using release_atom = caf::atom_constant<caf::atom("bm_rel")>;

/// chat -> lease: (key, fence): the turn is over and changed nothing
/// (turn_token::changed_nothing): given up as a grant that never ran, the
/// chat's last holder staying the one before it (see coordinator::leave).
using pass_atom = caf::atom_constant<caf::atom("bm_pass")>;

/// chat -> lease: (key, req): the request is given up (turn_wait passed,
/// the bot stops, or it is entered again to keep the chat's order).
using leave_atom = caf::atom_constant<caf::atom("bm_leave")>;

/// lease -> chat: (req, fence, reason): the request's turn (fence != 0) or
/// its ticket (fence == 0: "gone") was lost.
using lost_atom = caf::atom_constant<caf::atom("bm_lost")>;

/// chat -> itself: (req): the turn_wait bound of the head request passed.
using turn_wait_atom = caf::atom_constant<caf::atom("bm_twait")>;

// -- session <-> lease actor ------------------------------------------------

/// session -> lease: (name): present this replica for leading `name`.
using lead_atom = caf::atom_constant<caf::atom("bm_lead")>;

/// session -> lease: (name): stop presenting; give the leadership up.
using unlead_atom = caf::atom_constant<caf::atom("bm_unlead")>;

/// lease -> session: (name, fence): elected.
using leader_atom = caf::atom_constant<caf::atom("bm_leader")>;

/// lease -> session: (name, until): the leadership is valid until `until`
/// (steady_clock ticks: from when its renewal left, minus the margin). Sent
/// before `leader_atom` and whenever a renewal extends it.
using lead_valid_atom = caf::atom_constant<caf::atom("bm_lvalid")>;

/// lease -> session: (name, reason): not (or no longer) leading.
using follower_atom = caf::atom_constant<caf::atom("bm_follow")>;

/// transport -> session: (reason): another connection is live (Telegram's
/// 409): step down as on provider_down, present again later.
using yield_atom = caf::atom_constant<caf::atom("bm_yield")>;

/// bot -> lease, bot -> session: shut down cleanly, then reply.
using shutdown_atom = caf::atom_constant<caf::atom("bm_shut")>;

/// bot -> journal actor: (): beat now (the transport just opened: records
/// of dead replicas need not wait for the next period).
using beat_now_atom = caf::atom_constant<caf::atom("bm_jnow")>;


// -- scheduler actors (see internal/scheduler_engine.hpp) -------------------
//
//   facade / timer           task actor                   store I/O (detached)
//    | (resume) | tick ------->| due? (claim) ------------->| claim / get
//    |                         |<---------------- (io reply) |
//    |                         | run plan on the executor    |
//    |   handler thread ------>| (task_done, token, ran)     |
//    |   every lease/3 ------->| (renew) ------------------>| renew
//    |                         | (commit) ------------------>| commit
//    | (poll) ---------------->| replies once idle           |
//    | (pause) --------------->| stop token of the run fires |

/// facade -> task / timer actor: evaluate what is due now; the reply (same
/// atom) comes once nothing is claimed, running or committing.
using task_poll_atom = caf::atom_constant<caf::atom("bm_tpoll")>;

/// self -> task / timer actor: (generation) a wake-up armed earlier.
using task_tick_atom = caf::atom_constant<caf::atom("bm_ttick")>;

/// handler thread -> task actor: (token, slots run) the claimed run ended;
/// -> timer actor: in-memory runs ended (the engine's timer inbox holds
/// them; the first of a batch sends this).
using task_done_atom = caf::atom_constant<caf::atom("bm_tdone")>;

/// self -> task actor: (token) renew the claim's lease (every lease/3).
using task_renew_atom = caf::atom_constant<caf::atom("bm_trenew")>;

/// self -> task actor: (token, attempt) try a failed commit again.
using task_commit_atom = caf::atom_constant<caf::atom("bm_tcommit")>;

/// facade -> actors: stop() (the running handler's stop token fires).
using task_pause_atom = caf::atom_constant<caf::atom("bm_tpause")>;

/// facade -> task actor: (ticket) stop(), once nothing runs: a claim whose
/// reply was lost and that was not taken up again is found in the store
/// and its lease cut; the ticket is let go once done.
using task_give_back_atom = caf::atom_constant<caf::atom("bm_tgive")>;

/// facade -> actors: start() (arm wake-ups); to the timer actor with the
/// stored ids of the registered durable tasks (the orphan check).
using task_resume_atom = caf::atom_constant<caf::atom("bm_tresume")>;

/// facade -> timer actor: in-memory tasks were added or cancelled (the
/// engine's timer inbox holds them; the first of a batch sends this).
using timer_add_atom = caf::atom_constant<caf::atom("bm_tadd")>;

/// facade -> task actor: the task was cancelled: exit once idle.
using task_cancel_atom = caf::atom_constant<caf::atom("bm_tcncl")>;

/// actor -> store I/O: (shared_ptr<store_call>), replied the same way.
using io_atom = caf::atom_constant<caf::atom("bm_io")>;

} // namespace botmesh
