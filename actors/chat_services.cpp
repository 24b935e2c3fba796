#include <botmesh/actors/chat_services.hpp>

#include <mutex>
#include <new>

#include <caf/actor_cast.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/send.hpp>
#include <fmt/format.h>

#include <botmesh/actors/messages.hpp>
#include <botmesh/runtime/core/log.hpp>

#if defined(__SANITIZE_ADDRESS__)
#  define BOTMESH_ASAN 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define BOTMESH_ASAN 1
#  endif
#endif
#ifdef BOTMESH_ASAN
#  include <sanitizer/asan_interface.h>
#endif

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(botmesh::event_ptr)

namespace botmesh {

namespace {

// Freed event boxes, kept for the next ones. Any thread frees (a lock-free
// push); takers take the whole pushed list at once into their own side, so
// no taker ever compares-and-swaps a node another may have taken and given
// back meanwhile (the ABA problem of a lock-free stack): the mutex orders
// takers only, never a freeing thread.
// Every block is sizeof(event_box): the class is final.
class box_cache {
 public:
  static constexpr std::size_t capacity = 1024;

  void* take() {
    {
      std::lock_guard guard{take_mtx_};
      if (!taken_)
        taken_ = pushed_.exchange(nullptr, std::memory_order_acquire);
      if (auto* n = taken_) {
        taken_ = n->next;
        count_.fetch_sub(1, std::memory_order_relaxed);
        unpoison(n);
        return n;
      }
    }
    return ::operator new(sizeof(event_box));
  }

  void give(void* ptr) noexcept {
    if (count_.fetch_add(1, std::memory_order_relaxed) >= capacity) {
      count_.fetch_sub(1, std::memory_order_relaxed);
      ::operator delete(ptr);
      return;
    }
    auto* n = static_cast<node*>(ptr);
    poison(n);
    n->next = pushed_.load(std::memory_order_relaxed);
    while (!pushed_.compare_exchange_weak(n->next, n,
                                          std::memory_order_release,
                                          std::memory_order_relaxed)) {
      // n->next was reloaded
    }
  }

 private:
  struct node {
    node* next;
  };

  // Under AddressSanitizer a cached box is poisoned (all but its link), so
  // a use after free is still caught until the box is taken again.
  static void poison([[maybe_unused]] node* n) noexcept {
#ifdef BOTMESH_ASAN
    ASAN_POISON_MEMORY_REGION(reinterpret_cast<char*>(n) + sizeof(node),
                              sizeof(event_box) - sizeof(node));
#endif
  }

  static void unpoison([[maybe_unused]] node* n) noexcept {
#ifdef BOTMESH_ASAN
    ASAN_UNPOISON_MEMORY_REGION(n, sizeof(event_box));
#endif
  }

  std::atomic<node*> pushed_{nullptr};
  std::atomic<std::size_t> count_{0}; // cached boxes (both sides), roughly
  std::mutex take_mtx_;
  node* taken_ = nullptr; // under take_mtx_
};

// Never destroyed: boxes may be freed by threads that outlive static
// destruction; what it holds at exit stays reachable through it.
box_cache& boxes() {
  static auto* cache = new box_cache;
  return *cache;
}

} // namespace

void end_notice::give(std::function<void(turn_outcome)> fn,
                      turn_outcome outcome) noexcept {
  try {
    fn(outcome);
  } catch (const std::exception& e) {
    log::error("chat", fmt::format("a provider's turn-end notice threw ({}): "
                                   "{}",
                                   to_string(outcome), e.what()));
  } catch (...) {
    log::error("chat", fmt::format("a provider's turn-end notice threw ({})",
                                   to_string(outcome)));
  }
}

event_box::~event_box() {
  if (!via)
    return;
  auto router = caf::actor_cast<caf::actor>(via);
  if (!router)
    return; // the router ended too: the event ends refused (its notice)
  try {
    auto back = caf::make_counted<event_box>(std::move(key), std::move(ev));
    back->bounces = static_cast<std::uint8_t>(bounces + 1);
    back->seq = seq; // its place among what the router sent the chat
    caf::anon_send(router, bounced_atom::value, std::move(back));
  } catch (...) {
    // nop: out of memory; the event ends refused (its notice)
  }
}

void* event_box::operator new(std::size_t) {
  return boxes().take();
}

void event_box::operator delete(void* ptr) noexcept {
  boxes().give(ptr);
}

chat_services::~chat_services() {
  // nop
}

void chat_services::chat_activated(const std::string&) {
  // nop
}

void chat_services::chat_passivated(const std::string&) {
  // nop
}

bool chat_services::timer_live(std::uint64_t) {
  return true;
}

} // namespace botmesh
