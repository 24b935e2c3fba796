#pragma once

// Internal: pressed buttons whose callback query is not answered yet.

#include <exception>
#include <mutex>
#include <string>
#include <unordered_set>

#include <botmesh/providers/provider.hpp>
#include <botmesh/providers/telegram/bot_api.hpp>

namespace botmesh::telegram::internal {

/// Callback queries waiting for their answerCallbackQuery (until it comes,
/// the button shows a spinner). Each is answered once: by the first reply
/// to it, or else when its turn ran. So the set holds only the presses
/// whose turns are under way. Thread-safe.
class callback_answers {
 public:
  void open(const std::string& id) {
    std::lock_guard guard{mtx_};
    ids_.insert(id);
  }

  /// A reply to `id` went out: answers it if it is still waiting.
  void replied(bot_api& api, const std::string& id) {
    if (close(id))
      answer(api, id);
  }

  /// The turn of `id` ended: a turn that ran answers it if nothing did.
  /// Other ends only stop waiting: they may come from a thread that must
  /// not wait for the Bot API (those presses stop on the client's timeout).
  void ended(bot_api& api, const std::string& id, turn_outcome outcome) {
    if (close(id) && outcome == turn_outcome::handled)
      answer(api, id);
  }

  /// The bot refused the press (`accepted` with an error): no turn will
  /// end it, so it waits no longer (a redelivery opens it again).
  void refused(const std::string& id) {
    close(id);
  }

  /// Answers `id` now. A failure is ignored: the spinner stops by itself.
  static void answer(bot_api& api, const std::string& id) {
    try {
      api.answer_callback_query(id);
    } catch (const std::exception&) {
      // nop
    }
  }

 private:
  bool close(const std::string& id) {
    std::lock_guard guard{mtx_};
    return ids_.erase(id) != 0;
  }

  std::mutex mtx_;
  std::unordered_set<std::string> ids_;
};

} // namespace botmesh::telegram::internal
