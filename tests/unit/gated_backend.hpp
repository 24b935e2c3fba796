#pragma once

// A durable backend for tests whose journal writes can be held, failed, or
// made to lose their reply; everything else goes to a memory backend.

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <botmesh/runtime/bot.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/memory_durable_backend.hpp>

namespace test {

// A backend whose journal writes wait until the test opens the gate, or
// fail; everything else goes to a memory backend.
class gated_backend final : public botmesh::durable_backend {
 public:
  botmesh::memory_durable_backend inner;
  std::mutex mtx;
  std::vector<std::function<void()>> held;
  bool gate_open = false;
  std::atomic<bool> fail_records{false};
  std::atomic<int> fail_next_records{0}; // this many journal writes fail
  std::atomic<bool> lose_record_replies{false}; // the write lands, its reply is lost
  std::atomic<bool> fail_beats{false}; // the heartbeat is not renewed
  std::atomic<int> fail_settles{0}; // this many confirms/releases fail, unrun
  std::atomic<int> fail_outbox{0};  // this many outbox entry writes fail, unrun
  std::atomic<bool> fail_start{false}; // start() throws (a file it cannot open)
  // This many confirms/releases fail late, unrun: answered 500 ms later
  // on a thread of their own, whose ids `late_threads` keeps.
  std::atomic<int> late_settles{0};
  std::vector<std::thread::id> late_threads; // guarded by mtx
  std::vector<std::string> beats; // each beat's holder, guarded by mtx

  std::vector<std::string> answered; // beats answered, guarded by mtx
  std::vector<std::string> calls; // releases and retires, guarded by mtx

  void note(std::string call) {
    std::lock_guard guard{mtx};
    calls.push_back(std::move(call));
  }

  // How many beats the holders of generation `gen` made ("<holder>~<gen>"),
  // or had answered.
  std::size_t beats_of_generation(int gen, bool were_answered = false) {
    auto tail = "~" + std::to_string(gen);
    std::lock_guard guard{mtx};
    auto& v = were_answered ? answered : beats;
    return static_cast<std::size_t>(
      std::count_if(v.begin(), v.end(),
                    [&](const std::string& h) { return h.ends_with(tail); }));
  }

  // Beats wait (no heartbeat, no claim) while it lives: declared after
  // the bot, it resumes them before the bot stops (a stop waits for its
  // last beat), also when a REQUIRE fails.
  class beats_pause {
   public:
    explicit beats_pause(gated_backend& b) : b_(b) {
      b_.pause_beats();
    }
    ~beats_pause() {
      b_.resume_beats();
    }
    beats_pause(const beats_pause&) = delete;
    beats_pause& operator=(const beats_pause&) = delete;

   private:
    gated_backend& b_;
  };

  // Beats wait (no heartbeat, no claim) until resume_beats().
  void pause_beats() {
    std::lock_guard guard{mtx};
    beats_paused = true;
  }
  void resume_beats() {
    std::vector<std::function<void()>> run;
    {
      std::lock_guard guard{mtx};
      beats_paused = false;
      run.swap(paused);
    }
    for (auto& f : run)
      f();
  }

  ~gated_backend() override {
    for (auto& t : late)
      t.join();
  }

  void start() override {
    if (fail_start)
      throw botmesh::error(botmesh::errc::store_error,
                           "durable backend: cannot open its file");
    inner.start();
  }
  std::atomic<bool> lose_claim_replies{false}; // a claim runs, its reply is lost
  std::atomic<int> lose_outbox_replies{0}; // this many outbox claims run,
                                           // their replies lost
  std::atomic<bool> fail_held{false}; // held writes fail when the gate opens
  // What a held write that fails throws (a store error unless told).
  std::atomic<botmesh::errc> fail_held_code{botmesh::errc::store_error};

  void close() { // later writes wait again
    std::lock_guard guard{mtx};
    gate_open = false;
  }

  void open() {
    std::vector<std::function<void()>> run;
    {
      std::lock_guard guard{mtx};
      gate_open = true;
      run.swap(held);
    }
    for (auto& f : run)
      f();
  }

  void record(botmesh::journal_record rec, std::string_view holder,
              std::chrono::milliseconds ttl,
              completion<botmesh::journal_put> done) override {
    if (lose_record_replies) {
      inner.record(std::move(rec), holder, ttl,
                   [](botmesh::journal_put, std::exception_ptr) {});
      return done(botmesh::journal_put::duplicate,
                  std::make_exception_ptr(botmesh::error(
                    botmesh::errc::timeout, "simulated lost reply")));
    }
    if (fail_records || take(fail_next_records))
      return done(botmesh::journal_put::duplicate,
                  std::make_exception_ptr(botmesh::error(
                    botmesh::errc::store_error, "simulated journal failure")));
    auto go = [this, rec = std::move(rec), h = std::string{holder}, ttl,
               done = std::move(done)]() mutable {
      if (fail_held)
        return done(botmesh::journal_put::duplicate,
                    std::make_exception_ptr(botmesh::error(
                      fail_held_code.load(), "simulated journal failure")));
      inner.record(std::move(rec), h, ttl, std::move(done));
    };
    {
      std::lock_guard guard{mtx};
      if (!gate_open) {
        held.push_back(std::move(go));
        return;
      }
    }
    go();
  }
  void confirm(std::string_view id, std::string_view holder,
               completion<bool> done) override {
    if (settle_fails(done))
      return;
    inner.confirm(id, holder, std::move(done));
  }
  void release(std::string_view id, std::string_view holder,
               completion<bool> done) override {
    note("release " + std::string{id} + " " + std::string{holder});
    if (settle_fails(done))
      return;
    inner.release(id, holder, std::move(done));
  }
  // Answers `done` with a failure when one is due (fail_settles at once,
  // late_settles later).
  bool settle_fails(completion<bool>& done) {
    if (take(fail_settles)) {
      done(false, settle_failure());
      return true;
    }
    if (!take(late_settles))
      return false;
    std::lock_guard guard{mtx};
    late.emplace_back([this, done = std::move(done)] {
      {
        std::lock_guard guard{mtx};
        late_threads.push_back(std::this_thread::get_id());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds{500});
      done(false, settle_failure());
    });
    return true;
  }
  void beat_and_claim(std::string_view holder, std::chrono::milliseconds lease,
                      std::size_t limit, std::uint32_t max_attempts,
                      completion<claim_result> done) override {
    {
      std::lock_guard guard{mtx};
      if (beats_paused) {
        paused.push_back([this, h = std::string{holder}, lease, limit,
                          max_attempts, done = std::move(done)]() mutable {
          beat_and_claim(h, lease, limit, max_attempts, std::move(done));
        });
        return;
      }
      beats.emplace_back(holder);
    }
    // Counted as answered once the caller's completion returned.
    done = [this, h = std::string{holder},
            inner_done = std::move(done)](claim_result r,
                                          std::exception_ptr e) {
      inner_done(std::move(r), e);
      std::lock_guard guard{mtx};
      answered.push_back(h);
    };
    if (fail_beats)
      return done({}, std::make_exception_ptr(botmesh::error(
                        botmesh::errc::store_error, "simulated beat failure")));
    if (limit > 0 && lose_claim_replies.exchange(false)) {
      inner.beat_and_claim(holder, lease, limit, max_attempts,
                           [](claim_result, std::exception_ptr) {});
      return done({}, std::make_exception_ptr(botmesh::error(
                        botmesh::errc::timeout, "simulated lost reply")));
    }
    inner.beat_and_claim(holder, lease, limit, max_attempts, std::move(done));
  }
  // Takes one of `count`'s failures, if any is left.
  static bool take(std::atomic<int>& count) {
    int n = count.load();
    while (n > 0 && !count.compare_exchange_weak(n, n - 1)) {
      // nop: n reloaded
    }
    return n > 0;
  }
  static std::exception_ptr settle_failure() {
    return std::make_exception_ptr(
      botmesh::error(botmesh::errc::store_error, "simulated settle failure"));
  }
  void retire(std::string_view holder, completion<bool> done) override {
    note("retire " + std::string{holder});
    inner.retire(holder, std::move(done));
  }
  void outbox_claim(std::string_view send_id, std::string_view key,
                    std::uint64_t fence, std::string_view writer,
                    std::chrono::milliseconds ttl,
                    completion<botmesh::outbox_verdict> done) override {
    if (outbox_fails(done))
      return;
    if (take(lose_outbox_replies)) {
      inner.outbox_claim(send_id, key, fence, writer, ttl,
                         [](botmesh::outbox_verdict, std::exception_ptr) {});
      return done(botmesh::outbox_verdict::send,
                  std::make_exception_ptr(botmesh::error(
                    botmesh::errc::timeout, "simulated lost outbox reply")));
    }
    inner.outbox_claim(send_id, key, fence, writer, ttl, std::move(done));
  }
  void outbox_record(std::string_view send_id, std::string_view key,
                     std::uint64_t fence, std::string_view writer,
                     std::chrono::milliseconds ttl,
                     completion<botmesh::outbox_verdict> done) override {
    if (outbox_fails(done))
      return;
    inner.outbox_record(send_id, key, fence, writer, ttl, std::move(done));
  }
  // Answers `done` with a failure when one is due (fail_outbox).
  bool outbox_fails(completion<botmesh::outbox_verdict>& done) {
    if (!take(fail_outbox))
      return false;
    done(botmesh::outbox_verdict::send,
         std::make_exception_ptr(botmesh::error(botmesh::errc::store_error,
                                                "simulated outbox failure")));
    return true;
  }
  void outbox_forget(std::string_view send_id, std::string_view writer,
                     completion<bool> done) override {
    inner.outbox_forget(send_id, writer, std::move(done));
  }

 private:
  std::vector<std::thread> late; // guarded by mtx
  bool beats_paused = false;     // guarded by mtx
  std::vector<std::function<void()>> paused; // guarded by mtx
};

// An open gated backend whose journal writes fail until the test clears
// `fail_records`.
inline std::shared_ptr<gated_backend> failing_journal() {
  auto b = std::make_shared<gated_backend>();
  b->open();
  b->fail_records = true;
  return b;
}

// Durable processing over `b`, with a short lease.
inline botmesh::durability_options durable_over(std::shared_ptr<gated_backend> b) {
  return botmesh::durability_options{.backend = std::move(b), .lease = "300ms"};
}

} // namespace test
