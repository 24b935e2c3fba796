#pragma once

// Internal: where a webhook provider keeps its host (the bot) while it runs.

#include <condition_variable>
#include <cstddef>
#include <mutex>

#include <botmesh/providers/provider.hpp>

namespace botmesh::internal {

/// The host of a provider between `start` and `stop`, used by request
/// threads that may outlive it: on a server shared with other routes, a
/// request being handled when `stop()` runs would otherwise deliver to a
/// bot that may be gone once `stop()` returned. Each use is counted;
/// `clear` waits until none is left. Thread-safe.
class host_slot {
 public:
  /// A use of the host (or of nothing, after `clear`): it stays valid, and
  /// `clear` waits, until this goes.
  class use {
   public:
    explicit use(host_slot& s) : s_(&s) {
      std::lock_guard guard{s.mtx_};
      h_ = s.host_;
      if (h_) {
        ++s.users_;
        ++held_here();
      }
    }
    ~use() {
      if (!h_)
        return;
      --held_here();
      std::lock_guard guard{s_->mtx_};
      if (--s_->users_ == 0)
        s_->idle_.notify_all();
    }
    use(const use&) = delete;
    use& operator=(const use&) = delete;

    provider_host* get() const noexcept {
      return h_;
    }
    explicit operator bool() const noexcept {
      return h_ != nullptr;
    }
    provider_host* operator->() const noexcept {
      return h_;
    }

   private:
    host_slot* s_;
    provider_host* h_ = nullptr;
  };

  void set(provider_host& h) {
    std::lock_guard guard{mtx_};
    host_ = &h;
  }

  /// Takes the host away and waits until no use of it is left but the
  /// calling thread's own (a listener that stops the bot from a request
  /// thread must not wait for itself). Returns the host it held.
  provider_host* clear() {
    std::unique_lock guard{mtx_};
    auto* h = host_;
    host_ = nullptr;
    auto mine = held_here();
    idle_.wait(guard, [this, mine] { return users_ <= mine; });
    return h;
  }

 private:
  // Uses held by the calling thread (of any slot: a thread handles one
  // request at a time, so it holds at most the one of its provider).
  static std::size_t& held_here() {
    thread_local std::size_t n = 0;
    return n;
  }

  std::mutex mtx_;
  std::condition_variable idle_;
  provider_host* host_ = nullptr;
  std::size_t users_ = 0;
};

} // namespace botmesh::internal
