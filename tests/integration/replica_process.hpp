#pragma once

// Runs botmesh_test_replica as a child process with pipes to its stdin and
// stdout, for multi-process tests (SIGKILL, SIGSTOP).

#include <chrono>
#include <csignal>
#include <string>
#include <vector>

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

namespace test {

class replica_process {
 public:
  /// `mode` is passed as a fifth argument when not empty ("durable").
  replica_process(const std::string& url, const std::string& prefix,
                  const std::string& id, int lease_ms,
                  const std::string& mode = {}) {
    int in[2], out[2];
    if (::pipe(in) != 0 || ::pipe(out) != 0)
      throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::close(in[1]);
      ::close(out[0]);
      auto lease = std::to_string(lease_ms);
      if (mode.empty())
        ::execl(BOTMESH_TEST_REPLICA, BOTMESH_TEST_REPLICA, url.c_str(),
                prefix.c_str(), id.c_str(), lease.c_str(),
                static_cast<char*>(nullptr));
      else
        ::execl(BOTMESH_TEST_REPLICA, BOTMESH_TEST_REPLICA, url.c_str(),
                prefix.c_str(), id.c_str(), lease.c_str(), mode.c_str(),
                static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = out[0];
  }

  ~replica_process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGCONT);
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(to_);
    ::close(from_);
  }

  void send(const std::string& line) {
    auto l = line + "\n";
    if (::write(to_, l.data(), l.size()) != static_cast<ssize_t>(l.size()))
      throw std::runtime_error("write to replica failed");
  }

  /// Reads lines until one starts with `prefix`; returns it, or "" on timeout.
  std::string expect(const std::string& prefix,
                     std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      for (size_t i = 0; i < lines_.size(); ++i) {
        if (lines_[i].rfind(prefix, 0) == 0) {
          auto l = lines_[i];
          lines_.erase(lines_.begin() + static_cast<long>(i));
          return l;
        }
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0)
        return {};
      pollfd pfd{from_, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0)
        continue;
      char buf[4096];
      auto n = ::read(from_, buf, sizeof(buf));
      if (n <= 0)
        return {};
      partial_.append(buf, static_cast<size_t>(n));
      size_t pos;
      while ((pos = partial_.find('\n')) != std::string::npos) {
        lines_.push_back(partial_.substr(0, pos));
        partial_.erase(0, pos + 1);
      }
    }
  }

  /// Every line received so far that starts with `prefix`.
  std::vector<std::string> seen(const std::string& prefix) {
    expect("\x01", std::chrono::milliseconds(50)); // drain what is pending
    std::vector<std::string> out;
    for (auto& l : lines_)
      if (l.rfind(prefix, 0) == 0)
        out.push_back(l);
    return out;
  }

  void signal(int sig) {
    ::kill(pid_, sig);
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  int from_ = -1;
  std::string partial_;
  std::vector<std::string> lines_;
};

} // namespace test
