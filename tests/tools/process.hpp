#pragma once

// Runs a built executable as a child process for tests of the tool and the
// examples: arguments, environment changes, stdout and stderr captured by a
// reader thread, signals, and the exit status.

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace test {

class process {
 public:
  /// Environment changes: a value sets the variable, nullopt removes it.
  using env_changes = std::map<std::string, std::optional<std::string>>;

  process(std::string path, std::vector<std::string> args,
          const env_changes& env = {}) {
    std::vector<std::string> vars;
    for (char** e = environ; *e; ++e) {
      std::string v{*e};
      if (!env.contains(v.substr(0, v.find('='))))
        vars.push_back(std::move(v));
    }
    for (auto& [k, v] : env)
      if (v)
        vars.push_back(k + "=" + *v);
    args.insert(args.begin(), path);
    std::vector<char*> argv, envp;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& v : vars)
      envp.push_back(v.data());
    envp.push_back(nullptr);
    int out[2], err[2];
    // Close-on-exec: other children never inherit them (dup2 clears it on
    // the child's 1 and 2).
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
      throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ < 0)
      throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execve(path.c_str(), argv.data(), envp.data());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    reader_ = std::thread{[this, o = out[0], e = err[0]] { read_all(o, e); }};
  }

  ~process() {
    if (!status_) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }

  process(const process&) = delete;
  process& operator=(const process&) = delete;

  void signal(int sig) {
    ::kill(pid_, sig);
  }

  /// Waits for the exit; returns the exit code, or 128 + the signal that
  /// ended it.
  int wait() {
    if (!status_) {
      int st = 0;
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
        // retry
      }
      reader_.join();
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    return *status_;
  }

  /// Waits until stderr contains `text` (false if the process closed its
  /// output first, or after `timeout`).
  bool wait_for_stderr(const std::string& text,
                       std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    std::unique_lock guard{mtx_};
    return cv_.wait_for(guard, timeout, [&] {
      return err_.find(text) != std::string::npos || done_;
    }) && err_.find(text) != std::string::npos;
  }

  std::string out() {
    std::lock_guard guard{mtx_};
    return out_;
  }

  std::string err() {
    std::lock_guard guard{mtx_};
    return err_;
  }

 private:
  void read_all(int out_fd, int err_fd) {
    pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
    int open = 2;
    char buf[4096];
    while (open > 0) {
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR)
          continue;
        break;
      }
      for (int k = 0; k < 2; ++k) {
        if (fds[k].fd < 0 || fds[k].revents == 0)
          continue;
        auto n = ::read(fds[k].fd, buf, sizeof(buf));
        if (n <= 0) {
          ::close(fds[k].fd);
          fds[k].fd = -1;
          --open;
          continue;
        }
        std::lock_guard guard{mtx_};
        (k == 0 ? out_ : err_).append(buf, static_cast<size_t>(n));
        cv_.notify_all();
      }
    }
    std::lock_guard guard{mtx_};
    done_ = true;
    cv_.notify_all();
  }

  pid_t pid_ = -1;
  std::thread reader_;
  std::mutex mtx_;
  std::condition_variable cv_;
  std::string out_, err_;
  bool done_ = false;
  std::optional<int> status_;
};

/// Runs to completion: exit code, stdout, stderr.
struct run_result {
  int rc;
  std::string out;
  std::string err;
};

inline run_result run(const std::string& path, std::vector<std::string> args,
                      const process::env_changes& env = {}) {
  process p{path, std::move(args), env};
  int rc = p.wait();
  return {rc, p.out(), p.err()};
}

/// The digits right after `marker` in `text` (a port in a "ready" line);
/// empty when the marker is missing.
inline std::string number_after(const std::string& text,
                                const std::string& marker) {
  auto at = text.find(marker);
  if (at == std::string::npos)
    return {};
  at += marker.size();
  auto end = text.find_first_not_of("0123456789", at);
  return text.substr(at, end == std::string::npos ? end : end - at);
}

} // namespace test
