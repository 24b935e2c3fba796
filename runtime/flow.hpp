#pragma once

#include <chrono>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <botmesh/runtime/core/duration.hpp>
#include <botmesh/runtime/core/message.hpp>
#include <botmesh/runtime/core/pattern.hpp>

namespace botmesh {

class flow_context;

namespace internal {
struct conversation;
class flow_engine;
} // namespace internal

/// The coroutine type of `do` steps and conversations. It starts at once
/// and runs until it awaits an answer (`co_await c.ask(...)`) or returns;
/// the chat's next message resumes it.
class flow_task {
 public:
  struct promise_type {
    std::exception_ptr error;

    flow_task get_return_object() {
      return flow_task{std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_never initial_suspend() noexcept {
      return {};
    }
    std::suspend_always final_suspend() noexcept {
      return {};
    }
    void return_void() noexcept {
      // nop
    }
    void unhandled_exception() noexcept {
      error = std::current_exception();
    }
  };

  flow_task() = default;
  flow_task(flow_task&& other) noexcept : h_(std::exchange(other.h_, {})) {
    // nop
  }
  flow_task& operator=(flow_task&& other) noexcept {
    if (this != &other) {
      reset();
      h_ = std::exchange(other.h_, {});
    }
    return *this;
  }
  ~flow_task() {
    reset();
  }

  bool done() const noexcept {
    return !h_ || h_.done();
  }

  /// Rethrows what the coroutine threw, if it finished with an exception.
  void rethrow() const {
    if (h_ && h_.done() && h_.promise().error)
      std::rethrow_exception(h_.promise().error);
  }

 private:
  explicit flow_task(std::coroutine_handle<promise_type> h) : h_(h) {
    // nop
  }

  void reset() noexcept {
    if (h_)
      h_.destroy();
    h_ = {};
  }

  std::coroutine_handle<promise_type> h_;
};

/// What a handover fallback function gets about the conversation that
/// cannot be resumed (see `handover_options` in bot.hpp).
struct handover_info {
  /// The chat key.
  std::string key;
  /// The flow or conversation name.
  std::string name;
  /// The step it waited in.
  std::string step;
  /// "conversation", "state" or "changed" (see `events::handover`).
  std::string reason;
  /// The saved state (JSON) when the checkpoint had one ("changed"),
  /// else "{}".
  std::string state = "{}";
};

/// An answer to a question.
struct answer {
  inbound_message message{};
  /// True when the wait timeout passed before an answer came.
  bool timed_out = false;

  const std::string& text() const noexcept {
    return message.text;
  }
};

struct ask_options {
  /// Longest wait for the answer; then the ask resumes with `timed_out`.
  std::optional<duration> timeout{};
  /// Checks an answer: returns nothing to accept it, or a text to send
  /// before the question is asked again.
  std::function<std::optional<std::string>(const answer&)> validate{};
};

/// The result of an action that completes at once (`send`, `sleep`): it can
/// be awaited (`co_await c.send("hola");`) or ignored (`c.send("hola");`).
struct done_awaiter {
  bool await_ready() const noexcept {
    return true;
  }
  void await_suspend(std::coroutine_handle<>) const noexcept {
    // nop: never suspends
  }
  void await_resume() const noexcept {
    // nop
  }
};

/// Awaiting a question's answer (see `flow_context::ask`).
class ask_awaiter {
 public:
  bool await_ready();
  void await_suspend(std::coroutine_handle<> h);
  answer await_resume();

 private:
  friend class flow_context;
  ask_awaiter(flow_context& c, std::string question, ask_options opts)
    : c_(c), question_(std::move(question)), opts_(std::move(opts)) {
    // nop
  }

  flow_context& c_;
  std::string question_;
  ask_options opts_;
  answer result_;
};

/// What a flow step sees ("c" in the spec). Valid while its conversation
/// runs; every call happens in the chat's turn.
class flow_context {
 public:
  /// The conversation state: a JSON document (an object at first). Only
  /// JSON can enter it, so a pointer or a function is a compile error.
  nlohmann::json& state();

  /// The message that started or last resumed this step.
  const inbound_message& message() const;

  const std::string& key() const;

  /// Sends a text to the chat. Throws `botmesh::error` when the provider
  /// fails, or `lease_lost_error` when the conversation lost its turn.
  done_awaiter send(std::string_view text);

  /// Sends `question` and waits for the chat's next message:
  /// `auto a = co_await c.ask("¿Cómo te llamas?");`. With `validate`, an
  /// invalid answer gets the validator's text and the question again.
  ask_awaiter ask(std::string question, ask_options opts = {});

  /// Pauses the step, keeping the chat's turn (its messages wait), on the
  /// handler thread that runs it. Returns early when the bot stops.
  /// `co_await c.sleep("2s");`
  done_awaiter sleep(duration d);

  /// After the current step: continue in `flow` (at `step`, or its first).
  void go_to(std::string flow, std::string step = {});

  /// After the current step: continue at `step` of this flow.
  void go_to_step(std::string step);

  /// After the current step: end the conversation.
  void end();

  /// Calls `fn` when the chat stays silent for `after` while this
  /// conversation lasts (re-armed by every message of the chat). A second
  /// call with the same `after` replaces the first (a step that loops
  /// registers one watcher, not one per pass). A `go_to` or `end` the
  /// waiting step set before its ask holds unless `fn` sets its own.
  void idle(duration after, std::function<void(flow_context&)> fn);

  /// Fires when the bot stops.
  std::stop_token stop_token() const;

 private:
  friend class ask_awaiter;
  friend class internal::flow_engine;
  friend struct internal::conversation;

  explicit flow_context(internal::conversation& conv) : conv_(conv) {
    // nop
  }

  internal::conversation& conv_;
};

/// A conversation flow: a name, triggers and ordered steps.
///
///   botmesh::flow pedido{"pedido"};
///   pedido.hears({"pedido", "comprar"})
///     .ask("producto", "¿Qué producto quieres?",
///          [](flow_context& c, const answer& a) { c.state()["producto"] = a.text(); })
///     .step("confirmar", [](flow_context& c) -> flow_task {
///        auto a = co_await c.ask("¿Confirmas? (sí/no)");
///        ...
///      })
///     .persistent();
class flow {
 public:
  using answer_handler = std::function<void(flow_context&, const answer&)>;
  using step_fn = std::function<flow_task(flow_context&)>;

  /// Throws `invalid_argument_error` (field "name") for an empty name.
  explicit flow(std::string name);

  /// Starts the flow when a message's trimmed text equals a keyword
  /// (ASCII case-insensitive) and no conversation is active in the chat.
  flow& hears(std::vector<std::string> keywords);
  flow& hears(std::initializer_list<const char*> keywords);
  /// Starts the flow when the text contains a match of `p` (linear time:
  /// see `botmesh::pattern`).
  flow& hears(botmesh::pattern p);

  /// An ask step: sends `question`, waits for the answer, validates it
  /// (re-asking), then calls `on_answer`. On a timeout the conversation ends.
  flow& ask(std::string step, std::string question, answer_handler on_answer,
            ask_options opts = {});

  /// A `do` step: a coroutine that may send, sleep and ask several times.
  flow& step(std::string step, step_fn fn);

  /// Saves a checkpoint at entry, at every wait and after every step, so the
  /// conversation survives restarts and moves between processes sharing the
  /// store.
  flow& persistent(bool on = true);

  const std::string& name() const noexcept;

  /// A hash of the flow's structure (names and kinds of steps).
  std::string fingerprint() const;

  struct definition;

  const definition& def() const noexcept {
    return *def_;
  }

 private:
  std::shared_ptr<definition> def_;
};

} // namespace botmesh
