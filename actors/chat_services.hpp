#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_addr.hpp>
#include <caf/intrusive_ptr.hpp>
#include <caf/make_counted.hpp>
#include <caf/ref_counted.hpp>

#include <botmesh/actors/turn_token.hpp>
#include <botmesh/providers/provider.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/message.hpp>

namespace botmesh {

/// A provider's turn-end notice (see `delivery_callbacks::turn_ended`),
/// given at most once. Move-only: a copy would give it twice. One that is
/// let go before it was given (a chat actor killed with events in its
/// mailbox as the bot stops, an event sent to an actor that already exited)
/// gives `refused`, so a transport waiting for it (a webhook holding the
/// platform's request) is answered instead of waiting out its own timeout.
class end_notice {
 public:
  end_notice() = default;
  /// From the callback (a std::function, a lambda).
  template <class F,
            class = std::enable_if_t<
              !std::is_same_v<std::decay_t<F>, end_notice>
              && std::is_constructible_v<std::function<void(turn_outcome)>,
                                         F>>>
  end_notice(F&& fn) : fn_(std::forward<F>(fn)) {
    // nop
  }
  end_notice(end_notice&& other) noexcept
    : fn_(std::exchange(other.fn_, nullptr)) {
    // nop
  }
  end_notice& operator=(end_notice&& other) noexcept {
    if (this != &other) {
      let_go();
      fn_ = std::exchange(other.fn_, nullptr);
    }
    return *this;
  }
  ~end_notice() {
    let_go();
  }

  explicit operator bool() const noexcept {
    return static_cast<bool>(fn_);
  }

  /// Gives the notice, once (later calls do nothing). Never throws.
  void operator()(turn_outcome outcome) noexcept {
    if (fn_)
      give(std::exchange(fn_, nullptr), outcome);
  }

 private:
  void let_go() noexcept {
    (*this)(turn_outcome::refused);
  }

  // A notice must not throw (see delivery_callbacks). One that does is
  // logged as an error: it must not end the router or the chat actor that
  // gave it (an actor ended by an exception loses its mailbox), nor take
  // the process down from a destructor.
  static void give(std::function<void(turn_outcome)> fn,
                   turn_outcome outcome) noexcept;

  std::function<void(turn_outcome)> fn_;
};

/// One unit of a chat's order: an inbound message, or a timer the runtime
/// armed for this chat (flow wait timeouts, idle watchers). Timers travel
/// through the router and the chat's queue so they act in the chat's order.
/// Move-only (its notice is).
struct chat_event {
  inbound_message message{};
  /// Non-zero for a timer: the id the runtime gave it when arming it.
  std::uint64_t timer = 0;
  /// The provider's turn-end notice, if any. It travels with the event so
  /// whoever ends it (the turn, a refusal, a turn that never came) tells
  /// the provider, once; an event dropped unended tells it `refused`.
  end_notice on_end{};
  /// With durability: the id of the message's inbound journal record,
  /// which the end of its turn confirms or releases; empty otherwise.
  std::string journal{};
  /// With durability: how many holders took the record so far (1 for a
  /// message that just arrived, more when it is handled again). For a
  /// timer: how many times it got no turn before (its retries back off).
  std::uint32_t attempt = 0;
  /// With durability, on a first attempt: the intake's heartbeat gap count
  /// when the record was written (see durable_intake::hb_gaps_).
  std::uint64_t heartbeat_epoch = 0;
  /// With durability: the intake's holder generation that holds the record.
  std::uint32_t journal_gen = 0;
  /// When the runtime queued the message for its turn (unset for timers
  /// and events that did not come through the bot's intake): the turn-wait
  /// metric and the queue-depth gauge count from it.
  std::chrono::steady_clock::time_point queued_at{};

  bool is_timer() const noexcept {
    return timer != 0;
  }

  /// Reports how the event ended, once (later calls do nothing).
  void end(turn_outcome outcome) {
    on_end(outcome);
  }
};

namespace internal {

/// The link of a chat's lock-free run queue (see event_box).
struct run_link {
  std::atomic<run_link*> next{nullptr};
};

} // namespace internal

/// A chat event in one heap block, as it travels from the bot's intake
/// through the router and the chat actor to the thread that runs its turn.
/// Each hop moves a pointer instead of the ~600-byte event, and the block is
/// freed once, where the event ends: a block freed on another thread than
/// the one that allocated it takes the allocator's arena lock, so once per
/// event, not once per hop.
///
/// Ownership: one owner at a time in practice (the protocol moves it); the
/// reference count only makes it a CAF message type. Nobody reads an event
/// while another thread runs its turn.
struct event_box final : caf::ref_counted, internal::run_link {
  event_box(std::string k, chat_event e)
    : key(std::move(k)), ev(std::move(e)) {
    // nop
  }

  /// A message that just arrived (moved in once, not through a chat_event).
  event_box(std::string k, inbound_message&& m) : key(std::move(k)) {
    ev.message = std::move(m);
  }

  /// The event's chat key (computed once, at intake).
  std::string key;
  chat_event ev;

  /// Internal to the chat actor: whether the event starts the chat
  /// actor's activation (its run queue links through `run_link`).
  bool first = false;

  /// Internal to the router: set while the box travels from the router to
  /// a chat actor, cleared by the chat actor that takes it. A box freed in
  /// between was dropped by CAF (the chat ended by an exception with it in
  /// its mailbox, or it arrived after): its event goes back to the router
  /// (bounced_atom), which gives it to the chat's next actor, instead of
  /// being lost with its journal record held. `bounces` counts the round
  /// trips (bounded by the router as a safety net).
  caf::actor_addr via{};
  std::uint8_t bounces = 0;
  /// Internal to the router: the box's number among what the router sent
  /// the chat's actor (bounced boxes go on in this order).
  std::uint64_t seq = 0;

  event_box(const event_box&) = delete;
  event_box& operator=(const event_box&) = delete;
  ~event_box() override;

  /// Boxes are recycled: a box is usually made on a transport's thread and
  /// freed on a handler thread, and glibc frees a block made on another
  /// thread under that thread's arena lock, which the maker holds for its
  /// own allocations (in a burst that costs a fifth of the throughput).
  /// Freed boxes (up to 1024 of them, about 640 KB) go onto a lock-free
  /// list the next box is taken from; the rest go back to the heap.
  static void* operator new(std::size_t size);
  static void operator delete(void* ptr) noexcept;
};

using event_ptr = caf::intrusive_ptr<event_box>;

/// Boxes `ev` of chat `key` for the router (a timer's event has no message
/// to take the key from).
inline event_ptr make_event(std::string key, chat_event ev) {
  return caf::make_counted<event_box>(std::move(key), std::move(ev));
}

/// Boxes a message's event, keyed by its message's chat key.
inline event_ptr make_event(chat_event ev) {
  auto key = chat_key(ev.message);
  return make_event(std::move(key), std::move(ev));
}

/// Boxes a message that just arrived (moved once, into the box).
inline event_ptr make_event(std::string key, inbound_message&& msg) {
  return caf::make_counted<event_box>(std::move(key), std::move(msg));
}

/// What the router and chat actors need from the runtime above them. The
/// bot implements it; an application embedding the actors may too.
///
/// Every method is called from CAF worker threads and must return quickly
/// without blocking.
class chat_services {
 public:
  virtual ~chat_services();

  /// With coordination: runs the turn of `ev` (chat `key`), which holds
  /// `turn`, off the CAF scheduler and returns at once. `done` must be
  /// called exactly once, from any thread, when the turn has finished; the
  /// chat's next messages wait for it. Every visible effect of its handler
  /// checks `turn` first (see turn_token), and `turn->step_started()` is
  /// called on the thread that runs it when it begins (settle counts from
  /// then). `first_of_activation` is true when the turn starts the chat
  /// actor's (re)spawned life. The chat actor gives `ev` away with the turn.
  virtual void run_turn(const std::string& key, event_ptr ev,
                        bool first_of_activation,
                        std::shared_ptr<turn_token> turn,
                        std::function<void()> done)
    = 0;

  /// Without coordination: runs one event to its end on the calling thread
  /// (a handler thread; it may block), refusing it when the bot stops.
  virtual void run_event(const std::string& key, chat_event& ev,
                         bool first_of_activation)
    = 0;

  /// Runs `job` on a handler thread and returns at once.
  virtual void post(std::function<void()> job) = 0;

  /// An event got no turn (`turn_wait` passed): it is dropped after an
  /// `errc::coordination_unavailable` error event.
  virtual void turn_failed(const std::string& key, chat_event ev,
                           std::string why)
    = 0;

  /// A message was refused without running: `errc::overloaded` (the chat's
  /// pending queue is full), `errc::stopped` (the bot is stopping) or
  /// `errc::handler_failed` (`run_turn` threw on it: its chat actor ends).
  virtual void refused(const std::string& key, chat_event ev, errc code,
                       std::string why) = 0;

  /// A chat actor was spawned / passivated (for statistics).
  virtual void chat_activated(const std::string& key);
  virtual void chat_passivated(const std::string& key);

  /// False when the flow timer `id` can do nothing more (its
  /// wait was answered, its conversation ended): it then takes no turn, so
  /// a stale timer neither costs a coordinated turn nor moves the chat
  /// away from the replica whose conversation lives on. Called on the
  /// router's thread; the default says every timer is live.
  virtual bool timer_live(std::uint64_t id);
};

/// Settings of the router and its chat actors.
struct router_config {
  /// Not owned; must outlive the router.
  chat_services* services = nullptr;
  /// Messages a chat may hold waiting for its turn; more are refused with
  /// `errc::overloaded`.
  std::size_t max_pending_per_chat = 1000;
  /// A chat actor with no message for this long is passivated (its actor
  /// exits; the next message spawns a fresh one).
  std::chrono::milliseconds passivate_after{60'000};
  /// With coordination: this replica's lease actor (see lease_actor.hpp),
  /// from which every event gets its turn; empty without.
  caf::actor lease{};
  /// The longest the head event of a chat waits for its turn.
  std::chrono::milliseconds turn_wait{120'000};
};

} // namespace botmesh
