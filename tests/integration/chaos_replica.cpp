// A bot replica for the chaos test (chaos_test.cpp): a bot on a Redis store
// with its Redis coordinator, fed from stdin, every reply recorded in a log
// file of its own.
//
//   botmesh_chaos_replica <redis-url> <prefix> <replica-id> <lease-ms> <log>
//
// stdin, one line per message:  "m <chat> <seq> <sleep-ms>"
//   the handler sleeps that long holding the turn, then replies once.
//
// <log>, one line per reply, written by the transport's send with a single
// write(2) (so a SIGKILL loses at most the line being written, and a torn
// line can only be the last one of a killed process):
//   "<pre-mono-ns> <pre-real-ns> <send-mono-ns> <send-real-ns> <replica>
//    <chat> <seq> <fence>"
// `pre` is read by the handler just before `context::reply` (before the
// turn's fence check), `send` in the transport's send (after it).
//
// stdout, for the driver (written after the log line of the same reply):
//   "ready"                         the bot started
//   "start <chat> <seq> <fence>"    the handler began (its turn is granted)
//   "sent <chat> <seq> <fence>"     the reply was sent
//   "done <chat> <seq> <outcome>"   the message's turn ended (turn_outcome)
//   "error <code> <chat> <seq> <what>"   an error event about a message
//   "error <code> - - <what>"       one about no message
//   "lost <key> <reason>"           events::lease_lost
// Ends cleanly (exit 0) when stdin closes.

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/stores/forwarding_coordinator.hpp>
#include <botmesh/stores/redis/redis_store.hpp>

namespace {

std::mutex out_mtx;

void say(const std::string& line) {
  std::lock_guard guard{out_mtx};
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
}

std::int64_t now_ns(clockid_t id) {
  timespec ts{};
  ::clock_gettime(id, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// The reply text is "<pre-mono> <pre-real> <seq> <fence>": the handler's
// instants and its turn travel to the transport in the text itself.
class chaos_provider final : public botmesh::provider {
 public:
  chaos_provider(std::string replica, int log_fd)
    : replica_(std::move(replica)), log_fd_(log_fd) {
    // nop
  }

  std::string id() const override {
    return "chaos";
  }

  botmesh::provider_state state() const override {
    return host_ ? botmesh::provider_state::open
                 : botmesh::provider_state::closed;
  }

  void start(botmesh::provider_host& host) override {
    host_ = &host;
    host.state_changed(botmesh::provider_state::open);
  }

  void stop() override {
    if (host_)
      host_->state_changed(botmesh::provider_state::closed);
    host_ = nullptr;
  }

  void send(const botmesh::outgoing_message& msg) override {
    auto mono = now_ns(CLOCK_MONOTONIC);
    auto real = now_ns(CLOCK_REALTIME);
    auto sp = msg.text.find(' ');
    sp = msg.text.find(' ', sp + 1);
    auto pre = msg.text.substr(0, sp);
    auto rest = msg.text.substr(sp + 1); // "<seq> <fence>"
    auto line = pre + " " + std::to_string(mono) + " " + std::to_string(real)
                + " " + replica_ + " " + msg.chat + " " + rest + "\n";
    if (::write(log_fd_, line.data(), line.size())
        != static_cast<ssize_t>(line.size()))
      throw botmesh::error(botmesh::errc::provider_error,
                           "chaos log write failed");
    say("sent " + msg.chat + " " + rest);
  }

  void inject(std::string chat, std::string seq, std::string text) {
    botmesh::inbound_message m;
    m.chat = chat;
    m.sender = chat;
    m.id = seq;
    m.text = std::move(text);
    host_->deliver(std::move(m),
                   botmesh::delivery_callbacks{
                     {},
                     [chat, seq](botmesh::turn_outcome o) {
                       say("done " + chat + " " + seq + " "
                           + std::string{botmesh::to_string(o)});
                     }});
  }

 private:
  std::string replica_;
  int log_fd_;
  botmesh::provider_host* host_ = nullptr;
};

// The replica's coordinator, watched: a renewal that fails or takes longer
// than a third of the lease is reported as "diag renew <ms> <error>" (the
// runtime retries it silently; the driver keeps the line in <replica>.out).
class watched_coordinator final : public botmesh::forwarding_coordinator {
 public:
  using forwarding_coordinator::forwarding_coordinator;

  // Renewal batches (all the lease actor's: heartbeat, turns and the
  // scheduler's leadership).
  std::atomic<std::uint64_t> started{0}, finished{0};

  // Enters and releases are not watched: they go to Redis batched, as in a
  // bot (the default would split them into single calls).
  void submit(std::vector<turn_op> ops) override {
    c_->submit(std::move(ops));
  }

  void renew(botmesh::renewal r,
             completion<botmesh::renewal_result> done) override {
    auto t0 = std::chrono::steady_clock::now();
    ++started;
    auto slow = lease() / 3;
    auto n = r.turns.size();
    c_->renew(std::move(r), [this, t0, slow, n, done = std::move(done)](
                              botmesh::renewal_result res, std::exception_ptr e) {
      ++finished;
      auto took = std::chrono::steady_clock::now() - t0;
      if (e || took > slow) {
        std::string what = "ok";
        if (e) {
          try {
            std::rethrow_exception(e);
          } catch (const std::exception& x) {
            what = x.what();
          }
        }
        say("diag renew "
            + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                               took)
                               .count())
            + " ms " + std::to_string(n) + " turns: " + what);
      }
      done(std::move(res), e);
    });
  }
};

std::string one_line(std::string s) {
  for (auto& ch : s)
    if (ch == '\n')
      ch = ' ';
  return s;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: botmesh_chaos_replica URL PREFIX ID LEASE_MS "
                         "LOG\n");
    return 2;
  }
  std::string id = argv[3];
  int log_fd = ::open(argv[5], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    std::perror("botmesh_chaos_replica: opening the log");
    return 2;
  }
  auto lease = std::chrono::milliseconds(std::atoi(argv[4]));
  auto provider = std::make_shared<chaos_provider>(id, log_fd);
  // A replica restarted while Redis restarts (refused, or LOADING its
  // append-only file) cannot take its first heartbeat: as a supervisor
  // would, try again for a while.
  std::shared_ptr<botmesh::redis_store> store;
  botmesh::coordination_options co;
  for (int attempt = 0;; ++attempt) {
    try {
      store = std::make_shared<botmesh::redis_store>(
        botmesh::redis_store_options{.url = argv[1], .prefix = argv[2]});
      co.coordinator =
        std::make_shared<watched_coordinator>(store->coordinator(id, lease));
      break;
    } catch (const botmesh::error& e) {
      if (attempt == 300)
        throw;
      std::fprintf(stderr, "botmesh_chaos_replica: starting: %s\n", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  // Far above any fault of the test (a freeze of 4 s, a Redis restart): a
  // message that waits this long for its turn shows a stuck chat.
  co.turn_wait = "30s";
  botmesh::bot bot{{.provider = provider, .store = store, .coordination = co}};
  bot.on_message([&](botmesh::context& c) {
    auto& text = c.text(); // "<seq> <sleep-ms>"
    auto sp = text.find(' ');
    auto seq = text.substr(0, sp);
    int sleep_ms = 0;
    std::from_chars(text.data() + sp + 1, text.data() + text.size(), sleep_ms);
    auto fence = std::to_string(c.fence());
    say("start " + c.message().chat + " " + seq + " " + fence);
    if (sleep_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    auto pre_mono = now_ns(CLOCK_MONOTONIC);
    auto pre_real = now_ns(CLOCK_REALTIME);
    c.reply(std::to_string(pre_mono) + " " + std::to_string(pre_real) + " "
            + seq + " " + fence);
  });
  bot.on<botmesh::events::error>([](const botmesh::events::error& e) {
    auto code = std::string{botmesh::to_string(e.code)};
    if (e.message)
      say("error " + code + " " + e.message->chat + " " + e.message->id + " "
          + one_line(e.what));
    else
      say("error " + code + " - - " + one_line(e.what));
  });
  bot.on<botmesh::events::lease_lost>([](const botmesh::events::lease_lost& e) {
    say("lost " + e.key + " " + e.reason);
  });
  bot.start();
  say("ready");
  std::atomic<bool> done_watching{false};
  std::thread watcher{[&] {
    auto& w = static_cast<watched_coordinator&>(*co.coordinator);
    std::uint64_t last = 0;
    while (!done_watching) {
      std::this_thread::sleep_for(std::chrono::seconds(2));
      auto n = w.started.load();
      say("diag lease-renewals " + std::to_string(n - last) + " in 2 s, "
          + std::to_string(n - w.finished.load()) + " unanswered");
      last = n;
    }
  }};
  std::string line;
  while (std::getline(std::cin, line)) {
    // "m <chat> <seq> <sleep-ms>"
    if (line.rfind("m ", 0) != 0)
      continue;
    auto a = line.find(' ', 2);
    auto b = line.find(' ', a + 1);
    if (a == std::string::npos || b == std::string::npos)
      continue;
    auto chat = line.substr(2, a - 2);
    auto seq = line.substr(a + 1, b - a - 1);
    provider->inject(chat, seq, seq + " " + line.substr(b + 1));
  }
  bot.stop();
  done_watching = true;
  watcher.join();
  ::close(log_fd);
  return 0;
}
