#pragma once

// Internal: pressed buttons whose callback query is not answered yet.

#include <mutex>
#include <string>
#include <unordered_set>

namespace botmesh::telegram::internal {

/// Callback queries waiting for their answerCallbackQuery (until it comes,
/// the button shows a spinner). Each is answered once: by the first reply
/// to it, or at the end of its turn when the handler sent none (also a
/// refused or duplicate delivery). So the set holds only the presses whose
/// turns are under way. Thread-safe.
class callback_answers {
 public:
  void open(const std::string& id) {
    std::lock_guard guard{mtx_};
    ids_.insert(id);
  }

  /// True when `id` was waiting (the caller answers it now).
  bool close(const std::string& id) {
    std::lock_guard guard{mtx_};
    return ids_.erase(id) != 0;
  }

 private:
  std::mutex mtx_;
  std::unordered_set<std::string> ids_;
};

} // namespace botmesh::telegram::internal
