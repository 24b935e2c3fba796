// The chaos test: three replica processes (chaos_replica.cpp) of one bot on
// a Redis server of the test's own (append-only file, so a restart keeps the
// data), lease 2 s, 200 chats. A driver spreads each chat's numbered
// messages over the replicas while it SIGKILLs and restarts replicas,
// freezes them (SIGSTOP) past their lease and restarts Redis. Then the
// faults stop, everything settles, one last message per chat must be
// answered, and every reply the replicas logged is checked (see check()).
//
// What a message is, from the driver's side: "m <chat> <seq> <sleep-ms>"
// written to one replica's stdin. Each chat's messages go in bursts of 1-3
// to random replicas; the next burst waits until every message of the
// previous one ended (the replica reported its outcome, its process died,
// or 8 s passed), then a random pause.
//
// BOTMESH_CHAOS_SEED=<n> replays the same choices (not the same timing).

#include <doctest/doctest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <csignal>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "redis_server.hpp"

namespace {

namespace fs = std::filesystem;

// -- parameters ---------------------------------------------------------------

constexpr int n_replicas = 3;
constexpr int n_chats = 200;
constexpr std::int64_t lease_ms = 2000;
constexpr std::int64_t ms = 1'000'000; // ns
// BOTMESH_CHAOS_SECONDS: how long faults are injected (default 60).
const std::int64_t fault_phase = [] {
  auto s = std::getenv("BOTMESH_CHAOS_SECONDS");
  return (s ? std::atoll(s) : 60) * 1000 * ms;
}();
constexpr std::int64_t give_up = 8'000 * ms;      // a message's outcome
constexpr std::int64_t settle_max = 20'000 * ms;  // after the faults
constexpr std::int64_t final_bound = 15'000 * ms; // the last round's replies
constexpr std::int64_t exit_bound = 30'000 * ms;  // replicas' clean exit

std::int64_t now_ns(clockid_t id) {
  timespec ts{};
  ::clock_gettime(id, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::int64_t mono() {
  return now_ns(CLOCK_MONOTONIC);
}

std::int64_t real() {
  return now_ns(CLOCK_REALTIME);
}

// -- processes ----------------------------------------------------------------

// A window in which a replica process did not run: SIGSTOP seen in effect
// on every thread (a) until just before SIGCONT (b).
struct freeze {
  std::int64_t a_mono, a_real, b_mono, b_real;
};

struct proc {
  std::string slot; // replica id: "a", "b", "c"
  int gen = 0;      // restarts of the slot
  pid_t pid = -1;
  int in = -1, out = -1;
  std::string log, err;
  std::string pending_in, partial_out;
  bool ready = false;
  bool eof = false;    // its stdout ended
  bool exited = false; // reaped
  int status = 0;
  bool killed = false; // by the test (SIGKILL)
  std::int64_t killed_at = 0;
  bool shutting_down = false; // stdin closed by the test
  std::int64_t eof_at = 0;
  std::vector<freeze> freezes;
  std::FILE* out_copy = nullptr; // what it wrote, with the driver's instants
};

void set_nonblocking(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

void spawn(proc& p, const std::string& url, const std::string& prefix,
           const fs::path& dir) {
  auto name = p.slot + "." + std::to_string(p.gen);
  p.log = (dir / (name + ".log")).string();
  p.err = (dir / (name + ".err")).string();
  int in[2], out[2];
  // Close-on-exec: no replica inherits another's pipes (it would keep its
  // stdin open after the test closed it).
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0)
    throw std::runtime_error("pipe failed");
  auto lease = std::to_string(lease_ms);
  p.pid = ::fork();
  if (p.pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    int err = ::open(p.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0)
      ::dup2(err, 2);
    ::execl(BOTMESH_CHAOS_REPLICA, BOTMESH_CHAOS_REPLICA, url.c_str(),
            prefix.c_str(), p.slot.c_str(), lease.c_str(), p.log.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  p.in = in[1];
  p.out = out[0];
  set_nonblocking(p.in);
  set_nonblocking(p.out);
}

// True once every thread of `pid` is stopped.
bool all_threads_stopped(pid_t pid) {
  auto dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(dir.c_str());
  if (!d)
    return false;
  bool all = true;
  while (auto* e = ::readdir(d)) {
    if (e->d_name[0] == '.')
      continue;
    std::ifstream f{dir + "/" + e->d_name + "/stat"};
    std::string s{std::istreambuf_iterator<char>{f}, {}};
    auto rp = s.rfind(')');
    if (rp == std::string::npos || rp + 2 >= s.size())
      continue; // the thread is gone
    char state = s[rp + 2];
    if (state != 'T' && state != 't')
      all = false;
  }
  ::closedir(d);
  return all;
}

// -- messages -------------------------------------------------------------------

struct msg {
  int chat = 0;
  int seq = 0;
  int proc = -1; // index in the driver's processes
  bool final_round = false;
  std::int64_t sent = 0; // written to the replica's stdin (mono)
  std::optional<std::int64_t> start_seen, reply_seen, done_seen;
  std::string outcome; // turn_outcome, empty when none came
  std::vector<std::string> errors;
};

struct chat_state {
  std::vector<msg> msgs; // msgs[seq - 1]
  std::vector<int> burst;
  std::int64_t next_burst = 0;
};

struct outage {
  std::int64_t from, to; // mono
};

// Asks Redis for a PING every 20 ms on its own thread and records every
// span of more than half a lease without an answer (a stall) as an
// outage. Redis can stall with no fault injected (a busy disk, a starved
// machine): a lease lost then has a cause, and is not counted as a
// spurious loss. The outages the test injects are recorded too; they are
// counted apart.
class redis_prober {
 public:
  static constexpr std::int64_t stall = lease_ms / 2 * ms;

  explicit redis_prober(int port) : port_(port) {
    thread_ = std::thread{[this] { loop(); }};
  }
  ~redis_prober() {
    stop();
  }
  redis_prober(const redis_prober&) = delete;
  redis_prober& operator=(const redis_prober&) = delete;

  std::vector<outage> stop() {
    if (thread_.joinable()) {
      stop_ = true;
      thread_.join();
    }
    std::lock_guard guard{mtx_};
    return stalls_;
  }

 private:
  // One PING on `fd` (connected on demand): true on +PONG within 100 ms
  // polls while not stopped.
  bool ping(int& fd) {
    if (fd < 0) {
      fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<std::uint16_t>(port_));
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
        return false;
    }
    if (::write(fd, "PING\r\n", 6) != 6)
      return false;
    std::string got;
    while (!stop_ && got.find("\r\n") == std::string::npos) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0)
        continue;
      char buf[64];
      auto n = ::read(fd, buf, sizeof buf);
      if (n <= 0)
        return false;
      got.append(buf, static_cast<std::size_t>(n));
    }
    return got.rfind("+PONG\r\n", 0) == 0;
  }

  void loop() {
    int fd = -1;
    auto last_ok = mono();
    while (!stop_) {
      bool ok = ping(fd);
      auto t = mono();
      if (ok) {
        if (t - last_ok > stall) {
          std::lock_guard guard{mtx_};
          stalls_.push_back({last_ok, t});
        }
        last_ok = t;
      } else if (fd >= 0) {
        ::close(fd); // a reply out of step, or the server went away
        fd = -1;
      }
      ::usleep(20'000);
    }
    if (fd >= 0)
      ::close(fd);
  }

  int port_;
  std::atomic<bool> stop_{false};
  std::mutex mtx_;
  std::vector<outage> stalls_;
  std::thread thread_;
};

// -- a reply as logged --------------------------------------------------------

struct reply {
  int proc = -1;
  int chat = -1;
  int seq = 0;
  std::uint64_t fence = 0;
  std::int64_t pre_mono = 0, pre_real = 0, send_mono = 0, send_real = 0;
};

struct driver {
  std::mt19937_64 rng;
  fs::path dir;
  test::redis_process redis;
  std::string prefix = test::unique_prefix("bmchaos");
  std::vector<proc> procs;
  std::vector<int> current; // per slot: its live process
  std::vector<chat_state> chats{n_chats};
  std::vector<outage> redis_outages;
  std::vector<outage> redis_stalls; // Redis not answering (redis_prober)
  int n_freezes = 0, n_kills = 0, n_redis_restarts = 0;
  int lost_events = 0;
  std::vector<std::string> runtime_errors; // error events about no message
  std::map<std::string, int> error_codes;   // every error event, by code

  driver(std::uint64_t seed, fs::path d)
    : rng(seed), dir(std::move(d)),
      redis(test::redis_process::persistent((dir / "redis").string())) {
    // nop
  }

  // Nothing outlives the test, also when it ends with an exception.
  ~driver() {
    for (auto& p : procs) {
      if (!p.exited && p.pid > 0) {
        ::kill(p.pid, SIGCONT);
        ::kill(p.pid, SIGKILL);
        ::waitpid(p.pid, nullptr, 0);
      }
      for (auto fd : {p.in, p.out})
        if (fd >= 0)
          ::close(fd);
      if (p.out_copy)
        std::fclose(p.out_copy);
    }
    if (timeline)
      std::fclose(timeline);
  }

  driver(const driver&) = delete;
  driver& operator=(const driver&) = delete;

  // The fault timeline, in faults.log (driver's monotonic ms).
  std::FILE* timeline = std::fopen((dir / "faults.log").c_str(), "w");

  void note(const std::string& what) {
    if (timeline) {
      std::fprintf(timeline, "%lld %s\n", static_cast<long long>(mono() / ms),
                   what.c_str());
      std::fflush(timeline);
    }
  }

  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>{lo, hi}(rng);
  }

  std::string chat_name(int c) const {
    return "c" + std::to_string(c);
  }

  int start_proc(int slot, int gen) {
    proc p;
    p.slot = std::string(1, static_cast<char>('a' + slot));
    p.gen = gen;
    spawn(p, redis.url(), prefix, dir);
    p.out_copy = std::fopen((dir / (p.slot + "." + std::to_string(gen) + ".out"))
                              .c_str(),
                            "w");
    note("start " + p.slot + "." + std::to_string(gen) + " pid "
         + std::to_string(p.pid));
    procs.push_back(std::move(p));
    return static_cast<int>(procs.size()) - 1;
  }

  bool usable(int i) const {
    auto& p = procs[i];
    return p.ready && !p.killed && !p.eof && !p.shutting_down;
  }

  // -- I/O --------------------------------------------------------------------

  void write_line(int i, const std::string& line) {
    procs[i].pending_in += line;
    flush(i);
  }

  void flush(int i) {
    auto& p = procs[i];
    while (!p.pending_in.empty() && p.in >= 0) {
      auto n = ::write(p.in, p.pending_in.data(), p.pending_in.size());
      if (n > 0) {
        p.pending_in.erase(0, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EAGAIN)
        return;
      p.pending_in.clear(); // EPIPE: the process is gone
    }
  }

  msg* find(const std::string& chat, const std::string& seq) {
    if (chat.size() < 2 || chat[0] != 'c')
      return nullptr;
    auto c = std::atoi(chat.c_str() + 1);
    auto s = std::atoi(seq.c_str());
    if (c < 0 || c >= n_chats || s < 1
        || s > static_cast<int>(chats[c].msgs.size()))
      return nullptr;
    return &chats[c].msgs[s - 1];
  }

  void on_line(int i, const std::string& line) {
    auto t = mono();
    if (procs[i].out_copy)
      std::fprintf(procs[i].out_copy, "%lld %s\n",
                   static_cast<long long>(t / ms), line.c_str());
    std::istringstream in{line};
    std::string kind, a, b, c;
    in >> kind;
    if (kind == "ready") {
      procs[i].ready = true;
    } else if (kind == "start" || kind == "sent" || kind == "done") {
      in >> a >> b >> c;
      auto m = find(a, b);
      if (!m)
        return;
      if (kind == "start" && !m->start_seen)
        m->start_seen = t;
      else if (kind == "sent" && !m->reply_seen)
        m->reply_seen = t;
      else if (kind == "done" && !m->done_seen) {
        m->done_seen = t;
        m->outcome = c;
      }
    } else if (kind == "error") {
      in >> a >> b >> c;
      ++error_codes[a];
      if (auto m = find(b, c))
        m->errors.push_back(a);
      else if (runtime_errors.size() < 1000)
        runtime_errors.push_back(procs[i].slot + "." + std::to_string(procs[i].gen)
                                 + ": " + line);
    } else if (kind == "lost") {
      ++lost_events;
    }
  }

  void read_out(int i) {
    auto& p = procs[i];
    char buf[65536];
    for (;;) {
      auto n = ::read(p.out, buf, sizeof buf);
      if (n > 0) {
        p.partial_out.append(buf, static_cast<std::size_t>(n));
        std::size_t pos;
        while ((pos = p.partial_out.find('\n')) != std::string::npos) {
          on_line(i, p.partial_out.substr(0, pos));
          p.partial_out.erase(0, pos + 1);
        }
        continue;
      }
      if (n < 0 && errno == EAGAIN)
        return;
      p.eof = true;
      p.eof_at = mono();
      ::close(p.out);
      p.out = -1;
      if (p.in >= 0) {
        ::close(p.in);
        p.in = -1;
      }
      return;
    }
  }

  void reap() {
    for (auto& p : procs) {
      if (p.exited || p.pid <= 0)
        continue;
      int st = 0;
      if (::waitpid(p.pid, &st, WNOHANG) == p.pid) {
        p.exited = true;
        p.status = st;
      }
    }
  }

  // One round of I/O: waits up to `timeout_ms` for output.
  void pump(int timeout_ms) {
    std::vector<pollfd> fds;
    std::vector<int> who;
    for (int i = 0; i < static_cast<int>(procs.size()); ++i) {
      auto& p = procs[i];
      if (p.out >= 0) {
        fds.push_back({p.out, POLLIN, 0});
        who.push_back(i);
      }
      if (p.in >= 0 && !p.pending_in.empty()) {
        fds.push_back({p.in, POLLOUT, 0});
        who.push_back(i);
      }
    }
    ::poll(fds.data(), fds.size(), timeout_ms);
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0)
        continue;
      if (fds[k].events == POLLIN)
        read_out(who[k]);
      else
        flush(who[k]);
    }
    reap();
  }

  // -- the load -----------------------------------------------------------------

  int pick_replica() {
    std::vector<int> ok;
    for (auto i : current)
      if (usable(i))
        ok.push_back(i);
    if (ok.empty())
      return -1;
    return ok[static_cast<std::size_t>(uniform(0, static_cast<std::int64_t>(ok.size()) - 1))];
  }

  int send_msg(int c, int target, bool final_round) {
    // Most steps are quick; a few hold their turn long enough for a freeze
    // or a renewal to fall inside them.
    static const int sleeps[] = {0, 0, 0, 0, 1, 2, 5, 10, 20, 50, 200};
    auto& ch = chats[c];
    msg m;
    m.chat = c;
    m.seq = static_cast<int>(ch.msgs.size()) + 1;
    m.proc = target;
    m.final_round = final_round;
    m.sent = mono();
    auto sleep = sleeps[uniform(0, std::size(sleeps) - 1)];
    ch.msgs.push_back(m);
    write_line(target, "m " + chat_name(c) + " " + std::to_string(m.seq) + " "
                         + std::to_string(sleep) + "\n");
    return m.seq;
  }

  bool resolved(const msg& m, std::int64_t t) const {
    auto& p = procs[m.proc];
    return m.done_seen || p.killed || p.eof || t - m.sent > give_up;
  }

  bool burst_over(chat_state& ch, std::int64_t t) {
    for (auto s : ch.burst)
      if (!resolved(ch.msgs[s - 1], t))
        return false;
    return true;
  }

  void load(std::int64_t t) {
    for (int c = 0; c < n_chats; ++c) {
      auto& ch = chats[c];
      if (!ch.burst.empty()) {
        if (!burst_over(ch, t))
          continue;
        ch.burst.clear();
        ch.next_burst = t + uniform(300, 1000) * ms;
      }
      if (t < ch.next_burst)
        continue;
      auto n = uniform(1, 3);
      for (int k = 0; k < n; ++k) {
        auto target = pick_replica();
        if (target < 0)
          break;
        ch.burst.push_back(send_msg(c, target, false));
      }
      if (ch.burst.empty())
        ch.next_burst = t + 100 * ms;
    }
  }

  bool all_bursts_over(std::int64_t t) {
    for (auto& ch : chats)
      if (!burst_over(ch, t))
        return false;
    return true;
  }

  // -- faults ---------------------------------------------------------------------

  enum class fault { freeze, kill, redis };

  struct active_fault {
    fault kind;
    int slot = -1;
    int proc = -1;
    std::int64_t until = 0; // when to end it (resume, restart)
    freeze fr{};
    bool loading = false; // Redis started again, not answering PING yet
  };

  std::vector<fault> plan; // upcoming kinds, refilled in shuffled triples
  std::optional<active_fault> active;
  std::int64_t next_fault = 0;

  fault next_kind() {
    if (plan.empty()) {
      plan = {fault::freeze, fault::kill, fault::redis};
      std::shuffle(plan.begin(), plan.end(), rng);
    }
    auto k = plan.back();
    plan.pop_back();
    return k;
  }

  int pick_slot() {
    std::vector<int> ok;
    for (int s = 0; s < n_replicas; ++s)
      if (usable(current[s]))
        ok.push_back(s);
    if (ok.empty())
      return -1;
    return ok[static_cast<std::size_t>(uniform(0, static_cast<std::int64_t>(ok.size()) - 1))];
  }

  void begin_fault(std::int64_t t) {
    auto kind = next_kind();
    active_fault f{kind};
    switch (kind) {
      case fault::freeze: {
        f.slot = pick_slot();
        if (f.slot < 0)
          return;
        f.proc = current[f.slot];
        auto& p = procs[f.proc];
        ::kill(p.pid, SIGSTOP);
        auto deadline = mono() + 1000 * ms;
        while (!all_threads_stopped(p.pid) && mono() < deadline)
          ::usleep(200);
        f.fr.a_mono = mono();
        f.fr.a_real = real();
        f.until = f.fr.a_mono + uniform(3000, 4000) * ms;
        ++n_freezes;
        note("SIGSTOP " + p.slot + "." + std::to_string(p.gen));
        break;
      }
      case fault::kill: {
        f.slot = pick_slot();
        if (f.slot < 0)
          return;
        f.proc = current[f.slot];
        auto& p = procs[f.proc];
        p.killed = true;
        p.killed_at = mono();
        ::kill(p.pid, SIGKILL);
        f.until = t + uniform(200, 800) * ms;
        ++n_kills;
        note("SIGKILL " + p.slot + "." + std::to_string(p.gen));
        break;
      }
      case fault::redis:
        redis.kill();
        redis_outages.push_back({mono(), 0});
        f.until = t + uniform(100, 1000) * ms;
        ++n_redis_restarts;
        note("redis killed");
        break;
    }
    active = f;
  }

  void end_fault() {
    auto& f = *active;
    switch (f.kind) {
      case fault::freeze: {
        auto& p = procs[f.proc];
        f.fr.b_mono = mono();
        f.fr.b_real = real();
        p.freezes.push_back(f.fr);
        ::kill(p.pid, SIGCONT);
        note("SIGCONT " + p.slot + "." + std::to_string(p.gen));
        break;
      }
      case fault::kill:
        current[f.slot] = start_proc(f.slot, procs[f.proc].gen + 1);
        break;
      case fault::redis:
        // Down until it answers (it may stay LOADING a while): the outage
        // ends in faults().
        redis.start();
        f.loading = true;
        note("redis started");
        return;
    }
    active.reset();
  }

  void faults(std::int64_t t, bool stopping) {
    if (active && active->loading) {
      if (redis.ping()) {
        redis_outages.back().to = mono();
        note("redis answers");
        active.reset();
        next_fault = t + uniform(1500, 2500) * ms;
      } else if (t - active->until > 30'000 * ms) {
        throw std::runtime_error("redis-server did not come back");
      }
      return;
    }
    if (active) {
      if (t >= active->until)
        end_fault();
      if (!active)
        next_fault = t + uniform(1500, 2500) * ms;
      return;
    }
    if (!stopping && t >= next_fault)
      begin_fault(t);
  }

  // -- the run ----------------------------------------------------------------

  bool all_ready() {
    for (auto i : current)
      if (!procs[i].ready)
        return false;
    return true;
  }

  std::int64_t final_sent = 0;
  std::int64_t final_latest = 0; // slowest final reply (ns after sending)
  std::string final_slowest;
  int final_unanswered = 0;
  bool exit_timeout = false;

  void run() {
    redis_prober prober{redis.port()};
    for (int s = 0; s < n_replicas; ++s)
      current.push_back(start_proc(s, 0));
    auto t0 = mono();
    while (!all_ready()) {
      if (mono() - t0 > 30'000 * ms)
        throw std::runtime_error("replicas did not start");
      pump(10);
    }
    // The load with faults.
    auto start = mono();
    next_fault = start + 3000 * ms;
    for (;;) {
      auto t = mono();
      bool stopping = t - start >= fault_phase;
      if (stopping && !active)
        break;
      faults(t, stopping);
      if (!stopping)
        load(t);
      pump(5);
    }
    // Settle: no new bursts; wait for the outstanding ones and the replicas.
    auto settle_from = mono();
    while (mono() - settle_from < settle_max) {
      auto t = mono();
      if (t - settle_from >= 2 * lease_ms * ms && all_bursts_over(t)
          && all_ready())
        break;
      pump(5);
    }
    // The last round: one message per chat, each answered within a bound.
    std::vector<std::pair<int, int>> last;
    final_sent = mono();
    for (int c = 0; c < n_chats; ++c) {
      auto target = pick_replica();
      if (target >= 0)
        last.emplace_back(c, send_msg(c, target, true));
    }
    while (mono() - final_sent < final_bound) {
      bool all = true;
      for (auto [c, s] : last)
        if (!chats[c].msgs[s - 1].reply_seen)
          all = false;
      if (all)
        break;
      pump(5);
    }
    for (auto [c, s] : last) {
      auto& m = chats[c].msgs[s - 1];
      if (!m.reply_seen || *m.reply_seen - final_sent > final_bound) {
        ++final_unanswered;
      } else if (*m.reply_seen - final_sent > final_latest) {
        final_latest = *m.reply_seen - final_sent;
        final_slowest = chat_name(c) + "#" + std::to_string(s) + " on "
                        + procs[m.proc].slot + "."
                        + std::to_string(procs[m.proc].gen);
      }
    }
    final_unanswered += n_chats - static_cast<int>(last.size());
    // A clean stop: stdin closes, each replica drains and exits 0.
    for (auto& p : procs) {
      if (p.in >= 0) {
        p.shutting_down = true;
        ::close(p.in);
        p.in = -1;
      }
    }
    auto stop_from = mono();
    for (;;) {
      bool all = true;
      for (auto& p : procs)
        if (!p.exited)
          all = false;
      if (all)
        break;
      if (mono() - stop_from > exit_bound) {
        exit_timeout = true;
        for (auto& p : procs) {
          if (!p.exited) {
            ::kill(p.pid, SIGCONT);
            ::kill(p.pid, SIGKILL);
            ::waitpid(p.pid, &p.status, 0);
            p.exited = true;
          }
        }
        break;
      }
      pump(10);
    }
    // What they wrote before exiting.
    auto drain_from = mono();
    while (mono() - drain_from < 5'000 * ms
           && std::any_of(procs.begin(), procs.end(),
                          [](const proc& p) { return p.out >= 0; }))
      pump(10);
    redis_stalls = prober.stop();
    redis.kill();
  }
};

// -- the check ------------------------------------------------------------------

struct findings {
  std::map<std::string, std::vector<std::string>> bad; // invariant -> examples
  std::map<std::string, int> count;
  // How much each check saw.
  std::size_t order_pairs = 0;       // (p, m) pairs with p required first
  std::size_t order_cross = 0;       // of them, on different replicas
  std::size_t after_resume = 0;      // replies of a process after a freeze
  std::size_t holder_changes = 0;    // consecutive replies by other replicas

  void add(const std::string& invariant, std::string example) {
    auto& v = bad[invariant];
    if (v.size() < 5)
      v.push_back(std::move(example));
    ++count[invariant];
  }
};

std::vector<reply> read_log(const proc& p, int index, int& torn,
                            findings& f) {
  std::vector<reply> out;
  std::ifstream in{p.log, std::ios::binary};
  std::string all{std::istreambuf_iterator<char>{in}, {}};
  std::size_t at = 0;
  while (at < all.size()) {
    auto nl = all.find('\n', at);
    if (nl == std::string::npos) {
      // A line cut by SIGKILL can only be the last one of a killed process.
      ++torn;
      if (!p.killed)
        f.add("no crash", p.log + ": a torn last line in a process the test "
                                  "did not kill");
      break;
    }
    std::istringstream ls{all.substr(at, nl - at)};
    at = nl + 1;
    reply r;
    std::string replica, chat;
    ls >> r.pre_mono >> r.pre_real >> r.send_mono >> r.send_real >> replica
      >> chat >> r.seq >> r.fence;
    if (!ls || chat.size() < 2) {
      f.add("log format", p.log + ": a malformed line");
      continue;
    }
    r.proc = index;
    r.chat = std::atoi(chat.c_str() + 1);
    out.push_back(r);
  }
  return out;
}

std::string describe(const driver& d, const reply& r) {
  auto& p = d.procs[r.proc];
  return "c" + std::to_string(r.chat) + "#" + std::to_string(r.seq) + " by "
         + p.slot + "." + std::to_string(p.gen) + " fence "
         + std::to_string(r.fence) + " at "
         + std::to_string(r.pre_mono / ms % 1'000'000) + " ms";
}

findings check(driver& d, int& torn, std::size_t& n_replies) {
  findings f;
  std::vector<std::vector<reply>> by_chat(n_chats);
  for (int i = 0; i < static_cast<int>(d.procs.size()); ++i)
    for (auto& r : read_log(d.procs[i], i, torn, f))
      if (r.chat >= 0 && r.chat < n_chats)
        by_chat[r.chat].push_back(r);
      else
        f.add("log format", "a reply for an unknown chat");

  for (int c = 0; c < n_chats; ++c) {
    auto& rs = by_chat[c];
    auto& msgs = d.chats[c].msgs;
    n_replies += rs.size();
    // Each message answered at most once, by the replica it was sent to;
    // each turn (chat, fence) sends at most one reply (one message per turn,
    // one reply per message).
    std::map<int, const reply*> first; // seq -> its reply
    std::map<std::uint64_t, int> per_fence;
    for (auto& r : rs) {
      if (r.seq < 1 || r.seq > static_cast<int>(msgs.size())) {
        f.add("log format", "a reply to an unknown message: " + describe(d, r));
        continue;
      }
      if (first.count(r.seq))
        f.add("no duplicate", describe(d, r) + " answers a message answered "
                                               "already");
      else
        first[r.seq] = &r;
      if (msgs[r.seq - 1].proc != r.proc)
        f.add("no duplicate", describe(d, r) + " was sent to another replica");
      if (++per_fence[r.fence] == 2)
        f.add("never two holders",
              describe(d, r) + ": two replies in one turn");
    }

    // Ticket order. p must precede m when p's ticket was certainly taken
    // before m's: both went to the same replica process in that order (its
    // chat actor takes tickets in arrival order and enters them again in
    // order when one is lost), or the driver had seen p's handler start (its
    // turn granted, so its ticket existed) or its reply before it wrote m.
    // Turns are granted in ticket order and each grant has a larger fence,
    // so when both are answered p's fence is smaller, and p's reply came
    // first (each instant read before the reply's own fence check, so a
    // correct runtime's p reply happened before p's turn ended, which was
    // before m's turn began).
    std::vector<const reply*> answered(msgs.size() + 1, nullptr);
    for (auto& [seq, r] : first)
      answered[seq] = r;
    for (std::size_t mi = 1; mi <= msgs.size(); ++mi) {
      auto* rm = answered[mi];
      if (!rm)
        continue;
      auto& m = msgs[mi - 1];
      for (std::size_t pi = 1; pi < mi; ++pi) {
        auto* rp = answered[pi];
        if (!rp)
          continue;
        auto& p = msgs[pi - 1];
        bool before = p.proc == m.proc || (p.start_seen && *p.start_seen < m.sent)
                      || (p.reply_seen && *p.reply_seen < m.sent);
        if (!before)
          continue;
        ++f.order_pairs;
        if (p.proc != m.proc)
          ++f.order_cross;
        if (rp->fence >= rm->fence || rp->pre_mono >= rm->pre_mono)
          f.add("replies in ticket order",
                describe(d, *rp) + " must precede " + describe(d, *rm));
      }
    }

    // Never two holders. A reply with fence f after one with a higher fence
    // g means f's holder sent while the chat was already granted on (g is
    // granted only once f's turn ended in Redis: released — after f's
    // sends — or expired, past every lease f's holder may assume). Instants
    // are read before the fence check, so a step that checks a valid turn
    // has its instant before that turn ended.
    std::vector<const reply*> by_time;
    for (auto& r : rs)
      by_time.push_back(&r);
    std::sort(by_time.begin(), by_time.end(),
              [](auto* x, auto* y) { return x->pre_mono < y->pre_mono; });
    const reply* highest = nullptr;
    for (std::size_t i = 1; i < by_time.size(); ++i)
      if (d.procs[by_time[i]->proc].slot != d.procs[by_time[i - 1]->proc].slot)
        ++f.holder_changes;
    for (auto* r : by_time) {
      if (highest && r->fence < highest->fence)
        f.add("never two holders", describe(d, *r) + " after "
                                     + describe(d, *highest));
      if (!highest || r->fence > highest->fence)
        highest = r;
    }

    // No send after a lost lease. A fence carries the Redis clock of its
    // grant (fence >= server ms * 1024, the host's real-time clock): the
    // turn was granted no later than fence / 1024 ms. A replica frozen over
    // [a, b], longer than the lease, could not renew in between, so a turn
    // granted before b - lease (before a, or while frozen) lapsed before b
    // whatever it was granted or renewed by: a reply of it sent (instant
    // read in the transport's send, after the fence check) after b is a
    // send after the lease.
    for (auto& r : rs) {
      auto granted_by_ms = static_cast<std::int64_t>(r.fence / 1024) + 1;
      for (auto& fr : d.procs[r.proc].freezes) {
        if (fr.b_mono - fr.a_mono < lease_ms * ms)
          continue;
        if (r.send_real >= fr.b_real && r.send_real < fr.b_real + 2 * lease_ms * ms)
          ++f.after_resume;
        if (r.send_real >= fr.b_real
            && (granted_by_ms + lease_ms) * ms <= fr.b_real)
          f.add("no send after a lost lease",
                describe(d, r) + ": granted by "
                  + std::to_string(granted_by_ms % 1'000'000)
                  + " ms (real), sent "
                  + std::to_string((r.send_real - fr.b_real) / ms)
                  + " ms after the replica resumed from a freeze of "
                  + std::to_string((fr.b_mono - fr.a_mono) / ms) + " ms");
      }
    }
  }
  return f;
}

bool sanitizer_report(const std::string& path, std::string& what) {
  std::ifstream in{path};
  std::string line;
  static const char* marks[] = {"AddressSanitizer", "LeakSanitizer",
                                "ThreadSanitizer", "UndefinedBehaviorSanitizer",
                                "runtime error:", "terminate called",
                                "Segmentation fault", "Aborted"};
  while (std::getline(in, line))
    for (auto* mk : marks)
      if (line.find(mk) != std::string::npos) {
        what = line;
        return true;
      }
  return false;
}

// A Redis outage overlapping the message's life (give or take a lease).
bool redis_down_near(const driver& d, const msg& m) {
  auto from = m.sent;
  auto to = m.done_seen ? *m.done_seen : m.sent + give_up;
  for (auto* os : {&d.redis_outages, &d.redis_stalls})
    for (auto& o : *os)
      if (o.from - lease_ms * ms <= to && from <= o.to + 2 * lease_ms * ms)
        return true;
  return false;
}

// True when a fault around the message may explain a lost lease: its
// replica frozen, or Redis down (renewals fail), within a lease or two of
// its turn.
bool fault_near(const driver& d, const msg& m) {
  auto from = m.sent;
  auto to = m.done_seen ? *m.done_seen : m.sent + give_up;
  for (auto& fr : d.procs[m.proc].freezes)
    if (fr.a_mono - lease_ms * ms <= to && from <= fr.b_mono + lease_ms * ms)
      return true;
  return redis_down_near(d, m);
}

} // namespace

TEST_CASE("chaos: three replicas under SIGKILL, SIGSTOP past the lease and "
          "Redis restarts keep each chat's order, one holder, no late or "
          "duplicate reply, and no chat stuck") {
  ::signal(SIGPIPE, SIG_IGN);
  std::uint64_t seed = std::random_device{}();
  if (auto s = std::getenv("BOTMESH_CHAOS_SEED"))
    seed = std::strtoull(s, nullptr, 10);
  char tmpl[] = "/tmp/botmesh-chaos-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  fs::path dir{tmpl};
  fs::create_directories(dir / "redis");
  std::printf("chaos: seed %llu, files in %s\n",
              static_cast<unsigned long long>(seed), dir.c_str());

  auto t0 = mono();
  driver d{seed, dir};
  d.run();
  auto took = (mono() - t0) / ms;

  int torn = 0;
  std::size_t n_replies = 0;
  auto f = check(d, torn, n_replies);

  // Every message accounted for.
  int sent = 0, answered = 0, lost_dead = 0, failed_lease = 0,
      failed_store = 0;
  for (auto& ch : d.chats) {
    for (auto& m : ch.msgs) {
      ++sent;
      auto& p = d.procs[m.proc];
      if (m.reply_seen) {
        ++answered;
        continue;
      }
      auto name = "c" + std::to_string(m.chat) + "#" + std::to_string(m.seq)
                  + " on " + p.slot + "." + std::to_string(p.gen);
      if (m.outcome == "failed") {
        auto lease_lost = std::find(m.errors.begin(), m.errors.end(),
                                    "lease_lost")
                          != m.errors.end();
        // A message the store could not record while Redis was down is
        // not handled (an error event says so): accounted, not stuck.
        auto unrecorded = !m.errors.empty()
                          && std::all_of(m.errors.begin(), m.errors.end(),
                                         [](const std::string& e) {
                                           return e == "store_error";
                                         });
        if (unrecorded) {
          if (redis_down_near(d, m))
            ++failed_store;
          else
            f.add("no chat stuck",
                  name + " failed: store_error with Redis up");
        } else if (!lease_lost) {
          std::string codes;
          for (auto& e : m.errors)
            codes += " " + e;
          f.add(m.errors.empty() ? "every message accounted for"
                                 : "no chat stuck",
                name + " failed:" + codes);
        } else if (!fault_near(d, m)) {
          f.add("no spurious lease_lost",
                name + " lost its lease with no fault near");
        } else {
          ++failed_lease;
        }
      } else if (m.outcome == "handled") {
        // Its reply was logged before "done"; only a killed process's torn
        // last line may have lost the line (and then "sent" too).
        if (p.killed)
          ++lost_dead;
        else
          f.add("every message accounted for",
                name + " handled but its reply is missing");
      } else if (!m.outcome.empty()) {
        f.add("every message accounted for", name + " " + m.outcome);
      } else if (p.killed) {
        // In flight in a process the test killed: no durability yet
        // (issue 12), so it may be lost.
        ++lost_dead;
      } else {
        f.add("every message accounted for",
              name + ": no reply and no outcome from a live replica");
      }
    }
  }
  // No crash: every process the test did not kill ran to the end and exited
  // 0 when its stdin closed; no sanitizer report in any stderr.
  for (auto& p : d.procs) {
    auto name = p.slot + "." + std::to_string(p.gen);
    if (!p.killed) {
      if (p.eof && !p.shutting_down)
        f.add("no crash", name + " ended before the test closed its stdin");
      if (!WIFEXITED(p.status) || WEXITSTATUS(p.status) != 0)
        f.add("no crash", name + " exit status " + std::to_string(p.status));
    }
    std::string what;
    if (sanitizer_report(p.err, what))
      f.add("no crash", name + ": " + what);
  }
  if (d.exit_timeout)
    f.add("no crash", "a replica did not exit within the bound");
  if (d.final_unanswered > 0)
    f.add("no chat stuck", std::to_string(d.final_unanswered)
                             + " chats did not answer the last round within "
                             + std::to_string(final_bound / ms) + " ms");

  std::int64_t longest_outage = 0;
  for (auto& o : d.redis_outages)
    longest_outage = std::max(longest_outage, o.to - o.from);
  std::printf("chaos: %lld ms; faults: %d SIGSTOP (3-4 s), %d SIGKILL + "
              "restart, %d Redis restarts (down up to %lld ms)\n",
              static_cast<long long>(took), d.n_freezes, d.n_kills,
              d.n_redis_restarts, static_cast<long long>(longest_outage / ms));
  // Stalls with Redis up (not overlapping a restart the test made).
  int stalls = 0;
  std::int64_t longest_stall = 0;
  for (auto& st : d.redis_stalls) {
    bool injected = std::any_of(
      d.redis_outages.begin(), d.redis_outages.end(), [&](const outage& o) {
        return o.from <= st.to && st.from <= (o.to ? o.to : st.to);
      });
    if (!injected) {
      ++stalls;
      longest_stall = std::max(longest_stall, st.to - st.from);
    }
  }
  std::printf("chaos: Redis stalls of over %lld ms with no restart near: %d "
              "(longest %lld ms; lost leases near them count as faulted)\n",
              static_cast<long long>(redis_prober::stall / ms), stalls,
              static_cast<long long>(longest_stall / ms));
  std::printf("chaos: messages sent %d, answered %d (%zu replies logged), "
              "lost with a killed replica %d, fenced (lease_lost near a "
              "fault) %d, not recorded (store_error, Redis down) %d; torn "
              "log lines %d\n",
              sent, answered, n_replies, lost_dead, failed_lease,
              failed_store, torn);
  std::printf("chaos: last round: %d chats, slowest answer %lld ms (%s), "
              "unanswered %d\n",
              n_chats, static_cast<long long>(d.final_latest / ms),
              d.final_slowest.c_str(), d.final_unanswered);
  std::printf("chaos: checked: %zu ordered pairs (%zu across replicas), %zu "
              "changes of replica between consecutive replies, %zu replies "
              "within 2 leases after a freeze\n",
              f.order_pairs, f.order_cross, f.holder_changes, f.after_resume);
  std::printf("chaos: lease_lost events %d; error events:", d.lost_events);
  for (auto& [code, n] : d.error_codes)
    std::printf(" %s %d", code.c_str(), n);
  std::printf("\n");
  for (std::size_t i = 0; i < d.runtime_errors.size() && i < 5; ++i)
    std::printf("chaos:   %s\n", d.runtime_errors[i].c_str());
  static const char* invariants[] = {
    "replies in ticket order", "never two holders",
    "no send after a lost lease", "no duplicate", "no spurious lease_lost",
    "every message accounted for", "no chat stuck", "no crash", "log format"};
  for (auto* inv : invariants) {
    auto n = f.count.count(inv) ? f.count[inv] : 0;
    std::printf("chaos: %-28s %s", inv, n == 0 ? "ok\n" : "FAILED");
    if (n > 0) {
      std::printf(" (%d)\n", n);
      for (auto& ex : f.bad[inv])
        std::printf("chaos:     %s\n", ex.c_str());
    }
  }
  std::fflush(stdout);
  auto clean = f.count.empty();
  for (auto* inv : invariants) {
    INFO(inv);
    CHECK(f.count[inv] == 0);
  }
  CHECK(d.n_freezes >= 3);
  CHECK(d.n_kills >= 3);
  CHECK(d.n_redis_restarts >= 3);
  CHECK(answered > sent / 2);
  if (clean && !std::getenv("BOTMESH_CHAOS_KEEP"))
    fs::remove_all(dir);
}
