#pragma once

// Test helpers for Redis: the URL of the server scripts/test started, and a
// redis-server process of a test's own (to kill and restart it).

#include <chrono>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
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

  ~redis_process() {
    kill();
  }

  void start() {
    pid_ = ::fork();
    if (pid_ == 0) {
      auto port = std::to_string(port_);
      if (password_.empty())
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
  int port_;
  std::string password_;
  pid_t pid_ = -1;
};

} // namespace test
