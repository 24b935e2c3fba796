#pragma once

// Test helpers for Redis: the URL of the server scripts/test started, and a
// redis-server process of a test's own (to kill and restart it).

#include <chrono>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include <arpa/inet.h>
#include <csignal>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace test {

/// REDIS_URL from the environment. Redis tests must run, never skip: a
/// missing URL is an error telling how to run them.
inline std::string redis_url() {
  auto url = std::getenv("REDIS_URL");
  if (!url || !*url)
    throw std::runtime_error(
      "REDIS_URL is not set: run the tests with scripts/test, which starts "
      "redis-server on loopback and exports it");
  return url;
}

/// A prefix no other test uses, so tests share one server safely.
inline std::string unique_prefix(const std::string& base = "bmtest") {
  static std::mt19937_64 rng{std::random_device{}()};
  return base + "-" + std::to_string(rng());
}

/// A free TCP port on 127.0.0.1 (bound then released).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

/// True when 127.0.0.1:port can be bound now.
inline bool port_free(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

/// A free port for a cluster node: its bus port (+10000) must be free and
/// below 65536 too, so it is picked from 20000-39999 (as scripts/test
/// picks its cluster's).
inline int free_cluster_port() {
  static std::mt19937 rng{std::random_device{}()};
  for (;;) {
    int p = 20000 + static_cast<int>(rng() % 20000);
    if (port_free(p) && port_free(p + 10000))
      return p;
  }
}

/// True when something accepts connections on 127.0.0.1:port.
inline bool port_open(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

/// A redis-server process on a free loopback port, killed on destruction.
class redis_process {
 public:
  explicit redis_process(std::string password = {})
    : port_(free_port()), password_(std::move(password)) {
    start();
  }

  /// A server that keeps its data across `kill()` + `start()`: an
  /// append-only file in `dir`. Redis writes it to the kernel before it
  /// sends the replies of a round, so a SIGKILL and restart loses no
  /// acknowledged write. It is not fsynced (`appendfsync no`): an fsync
  /// guards against a machine crash, which no test makes, and on a busy
  /// disk it held Redis's one thread for seconds (a fault no test meant).
  /// For the same reason the file is never rewritten: the end of a
  /// rewrite fsyncs its manifest on that thread.
  static redis_process persistent(std::string dir) {
    return redis_process{std::move(dir), 0};
  }

  /// A cluster-enabled server that asks for `password`: one node, which
  /// serves no slot until told (CLUSTER ADDSLOTSRANGE). Its node file is
  /// its own (under /tmp), so several can run at once.
  static redis_process cluster_node(std::string password) {
    return redis_process{std::move(password), true};
  }

  ~redis_process() {
    kill();
  }

  void start() {
    auto log = aof_dir_ + "/redis.log";
    pid_ = ::fork();
    if (pid_ == 0) {
      auto port = std::to_string(port_);
      if (!aof_dir_.empty())
        ::execlp("redis-server", "redis-server", "--port", port.c_str(),
                 "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
                 "--appendfsync", "no", "--dir", aof_dir_.c_str(),
                 "--auto-aof-rewrite-percentage", "0",
                 "--logfile", log.c_str(), "--loglevel", "notice",
                 static_cast<char*>(nullptr));
      else if (cluster_) {
        auto conf = "/tmp/botmesh-test-nodes-" + port + ".conf";
        ::unlink(conf.c_str());
        ::execlp("redis-server", "redis-server", "--port", port.c_str(),
                 "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--cluster-enabled", "yes", "--cluster-config-file",
                 conf.c_str(), "--cluster-announce-ip", "127.0.0.1",
                 "--requirepass", password_.c_str(),
                 "--masterauth", password_.c_str(), "--loglevel", "warning",
                 static_cast<char*>(nullptr));
      } else if (password_.empty())
        ::execlp("redis-server", "redis-server", "--port", port.c_str(),
                 "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--enable-debug-command", "yes", "--loglevel", "warning",
                 static_cast<char*>(nullptr));
      else
        ::execlp("redis-server", "redis-server", "--port", port.c_str(),
                 "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--requirepass", password_.c_str(), "--loglevel", "warning",
                 static_cast<char*>(nullptr));
      ::_exit(127);
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!port_open(port_)) {
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("redis-server did not start (is it installed? "
                                 "scripts/setup-deps installs it)");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  /// True when the server answers PING with PONG now (not LOADING while it
  /// reads its append-only file, not refused while it is down).
  bool ping() const {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{0, 200'000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    char buf[64] = {};
    bool pong = false;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0
        && ::write(fd, "PING\r\n", 6) == 6
        && ::read(fd, buf, sizeof buf - 1) > 0)
      pong = std::string_view{buf}.rfind("+PONG", 0) == 0;
    ::close(fd);
    return pong;
  }

  /// SIGKILL, as a crash.
  void kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGCONT);
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  std::string url() const {
    return "redis://127.0.0.1:" + std::to_string(port_);
  }

  void signal(int sig) {
    if (pid_ > 0)
      ::kill(pid_, sig);
  }

  int port() const noexcept {
    return port_;
  }

 private:
  redis_process(std::string aof_dir, int)
    : port_(free_port()), aof_dir_(std::move(aof_dir)) {
    start();
  }

  redis_process(std::string password, bool cluster)
    : port_(cluster ? free_cluster_port() : free_port()),
      password_(std::move(password)),
      cluster_(cluster) {
    start();
  }

  int port_;
  std::string password_;
  bool cluster_ = false;
  std::string aof_dir_;
  pid_t pid_ = -1;
};

} // namespace test
