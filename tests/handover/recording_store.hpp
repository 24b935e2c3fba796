#pragma once

// A store that forwards to another one, counts checkpoint writes and can be
// told to fail them or to report a stored checkpoint as corrupted: the
// handover suite runs over it on every backend.

#include <atomic>
#include <functional>
#include <chrono>
#include <memory>
#include <thread>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/store.hpp>

namespace test {

class recording_store final : public botmesh::store {
 public:
  explicit recording_store(std::shared_ptr<botmesh::store> inner)
    : inner_(std::move(inner)) {
    // nop
  }

  std::atomic<int> checkpoint_writes{0}; ///< sets and clears, landed
  std::atomic<int> checkpoint_clears{0}; ///< clears among them
  std::atomic<int> checkpoint_reads{0};
  std::atomic<bool> fail_writes{false};
  /// Message-log appends fail while set (this many more times: < 0 forever).
  std::atomic<int> fail_log{0};
  /// Those failures throw an int, not a std::exception (a custom store may).
  std::atomic<bool> fail_log_oddly{false};
  std::atomic<bool> corrupt_reads{false};
  /// Runs once a corrupted read was decided, before it throws: what another
  /// replica does while the reader stalls.
  std::function<void()> after_corrupt_read;
  /// The next this many conditional checkpoint writes (set_checkpoint_if,
  /// clear_checkpoint_if) land but report a timeout, as when the reply is
  /// lost. Decided when a write starts: one already on its way when a test
  /// sets this (seen landed, not yet returned) keeps its reply.
  std::atomic<int> lose_write_replies{0};
  /// While set, set_checkpoint_if waits before it reaches the inner store
  /// (a replica frozen in the middle of the write); `write_held` says one
  /// waits. Cleared, the held write lands.
  std::atomic<bool> hold_writes{false};
  std::atomic<bool> write_held{false};
  /// The next set_checkpoint_if reports a timeout at once but is still on
  /// its way: it lands (on a thread of its own) once `hold_writes` is
  /// cleared, as a command whose reply timed out that the server runs late.
  std::atomic<bool> defer_next_write{false};
  /// The next set_checkpoint_if finds the stored checkpoint rewritten just
  /// before it (its revision moved on, as by another holder's write).
  std::atomic<bool> bump_next_write{false};

  ~recording_store() override {
    hold_writes = false;
    if (deferred_.joinable())
      deferred_.join();
  }

  botmesh::store& inner() noexcept {
    return *inner_;
  }

  void start() override {
    inner_->start();
  }
  void stop() override {
    inner_->stop();
  }
  void save_chat(const botmesh::chat_record& r) override {
    inner_->save_chat(r);
  }
  std::optional<botmesh::chat_record> get_chat(std::string_view k) override {
    return inner_->get_chat(k);
  }
  bool delete_chat(std::string_view k) override {
    return inner_->delete_chat(k);
  }
  std::vector<botmesh::chat_record> list_chats() override {
    return inner_->list_chats();
  }
  void save_contact(const botmesh::contact_record& r) override {
    inner_->save_contact(r);
  }
  std::optional<botmesh::contact_record>
  get_contact(std::string_view i) override {
    return inner_->get_contact(i);
  }
  bool delete_contact(std::string_view i) override {
    return inner_->delete_contact(i);
  }
  std::vector<botmesh::contact_record> list_contacts() override {
    return inner_->list_contacts();
  }
  std::uint64_t append_message(std::string_view k,
                               const botmesh::logged_message& m) override {
    if (fail_log.load() != 0) {
      if (fail_log.load() > 0)
        --fail_log;
      if (fail_log_oddly)
        throw 42;
      throw botmesh::error(botmesh::errc::store_error,
                           "message log append failed: the test store is down");
    }
    return inner_->append_message(k, m);
  }
  std::vector<botmesh::logged_message> messages(std::string_view k,
                                                std::size_t n) override {
    return inner_->messages(k, n);
  }
  std::optional<botmesh::flow_checkpoint>
  get_checkpoint(std::string_view k) override {
    ++checkpoint_reads;
    if (corrupt_reads.exchange(false))
      if (auto cp = inner_->get_checkpoint(k)) {
        // As a store that could read the damaged record's revision.
        if (after_corrupt_read)
          after_corrupt_read();
        throw botmesh::corrupted_checkpoint_error(
          "checkpoint " + std::string{k} + ": field \"state\" is not JSON",
          cp->revision);
      }
    try {
      return inner_->get_checkpoint(k);
    } catch (const botmesh::error& e) {
      // Damaged in the inner store itself (a test wrote garbage there).
      if (e.code() == botmesh::errc::corrupted_record && after_corrupt_read)
        after_corrupt_read();
      throw;
    }
  }
  std::uint64_t set_checkpoint(const botmesh::flow_checkpoint& c) override {
    check_write();
    auto r = inner_->set_checkpoint(c);
    ++checkpoint_writes;
    return r;
  }
  std::optional<std::uint64_t>
  set_checkpoint_if(const botmesh::flow_checkpoint& c,
                    std::uint64_t r) override {
    check_write();
    if (defer_next_write.exchange(false)) {
      write_held = true;
      deferred_ = std::thread([this, c, r] {
        while (hold_writes.load())
          std::this_thread::sleep_for(std::chrono::milliseconds{1});
        if (inner_->set_checkpoint_if(c, r))
          ++checkpoint_writes;
        write_held = false;
      });
      throw botmesh::error(botmesh::errc::timeout,
                           "checkpoint write: no reply yet (it lands later)");
    }
    if (bump_next_write.exchange(false))
      if (auto cur = inner_->get_checkpoint(c.key))
        inner_->set_checkpoint(*cur);
    auto lose = take_lost_reply();
    if (hold_writes.load()) {
      write_held = true;
      while (hold_writes.load())
        std::this_thread::sleep_for(std::chrono::milliseconds{1});
      write_held = false;
    }
    auto out = inner_->set_checkpoint_if(c, r);
    if (out)
      ++checkpoint_writes;
    if (lose)
      throw_lost_reply();
    return out;
  }
  bool clear_checkpoint_if(std::string_view k, std::uint64_t r) override {
    check_write();
    auto lose = take_lost_reply();
    auto out = inner_->clear_checkpoint_if(k, r);
    if (out) {
      ++checkpoint_writes;
      ++checkpoint_clears;
    }
    if (lose)
      throw_lost_reply();
    return out;
  }
  void clear_checkpoint(std::string_view k) override {
    check_write();
    inner_->clear_checkpoint(k);
    ++checkpoint_writes;
    ++checkpoint_clears;
  }
  bool clear_damaged_checkpoint(std::string_view k) override {
    check_write();
    auto out = inner_->clear_damaged_checkpoint(k);
    if (out) {
      ++checkpoint_writes;
      ++checkpoint_clears;
    }
    return out;
  }
  std::optional<std::string> get_user_data(std::string_view u,
                                           std::string_view n,
                                           std::string_view k) override {
    return inner_->get_user_data(u, n, k);
  }
  void set_user_data(std::string_view u, std::string_view n,
                     std::string_view k, std::string_view v,
                     std::optional<std::chrono::milliseconds> t) override {
    inner_->set_user_data(u, n, k, v, t);
  }
  bool delete_user_data(std::string_view u, std::string_view n,
                        std::string_view k) override {
    return inner_->delete_user_data(u, n, k);
  }
  std::vector<std::pair<std::string, std::string>>
  list_user_data(std::string_view u, std::string_view n) override {
    return inner_->list_user_data(u, n);
  }
  std::optional<botmesh::fenced_lock>
  acquire_lock_fenced(std::string_view k,
                      std::chrono::milliseconds t) override {
    return inner_->acquire_lock_fenced(k, t);
  }
  bool renew_lock(std::string_view k, std::string_view tok,
                  std::chrono::milliseconds t) override {
    return inner_->renew_lock(k, tok, t);
  }
  bool release_lock(std::string_view k, std::string_view tok) override {
    return inner_->release_lock(k, tok);
  }

 private:
  void check_write() {
    if (fail_writes)
      throw botmesh::error(botmesh::errc::store_error,
                           "checkpoint write failed: the test store is down");
  }

  bool take_lost_reply() {
    for (auto n = lose_write_replies.load(); n > 0;)
      if (lose_write_replies.compare_exchange_weak(n, n - 1))
        return true;
    return false;
  }

  [[noreturn]] static void throw_lost_reply() {
    throw botmesh::error(botmesh::errc::timeout,
                         "checkpoint write: no reply (it landed)");
  }

  std::shared_ptr<botmesh::store> inner_;
  std::thread deferred_;
};

} // namespace test
