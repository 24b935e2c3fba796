#include <botmesh/providers/console_provider.hpp>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <mutex>
#include <thread>

#include <poll.h>
#include <unistd.h>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>

namespace botmesh {

struct console_provider::impl {
  options opts;
  std::atomic<provider_state> state{provider_state::closed};
  std::atomic<bool> stopping{false};
  std::thread reader;
  std::mutex out_mtx;
  std::uint64_t next_id = 1;

  std::ostream& out() {
    return opts.out ? *opts.out : std::cout;
  }

  void deliver_line(provider_host& host, std::string line) {
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos)
      return;
    inbound_message msg;
    msg.id = fmt::format("console-{}", next_id++);
    msg.provider = "console";
    msg.chat = opts.chat;
    msg.sender = opts.sender;
    msg.text = std::move(line);
    host.deliver(std::move(msg));
  }

  // Reads with poll() so stop() is noticed within 100 ms even when no input
  // arrives (a blocking read on stdin could not be interrupted).
  void run(provider_host& host) {
    std::string pending;
    char buf[4096];
    while (!stopping.load()) {
      pollfd pfd{opts.input_fd, POLLIN, 0};
      int rc = ::poll(&pfd, 1, 100);
      if (rc < 0 && errno == EINTR)
        continue;
      if (rc == 0)
        continue;
      ssize_t n = rc < 0 ? -1 : ::read(opts.input_fd, buf, sizeof(buf));
      if (n < 0 && (errno == EINTR || errno == EAGAIN))
        continue;
      if (n <= 0)
        break; // EOF or a read error: the input is over either way
      pending.append(buf, static_cast<size_t>(n));
      size_t pos;
      while ((pos = pending.find('\n')) != std::string::npos) {
        deliver_line(host, pending.substr(0, pos));
        pending.erase(0, pos + 1);
      }
    }
    if (stopping.load())
      return;
    if (!pending.empty())
      deliver_line(host, std::move(pending));
    host.input_closed();
  }
};

console_provider::console_provider() : console_provider(options{}) {
  // nop
}

console_provider::console_provider(options opts)
  : impl_(std::make_unique<impl>()) {
  impl_->opts = std::move(opts);
}

console_provider::~console_provider() {
  stop();
}

std::string console_provider::id() const {
  return "console";
}

provider_state console_provider::state() const {
  return impl_->state.load();
}

void console_provider::start(provider_host& host) {
  if (impl_->reader.joinable())
    return;
  impl_->stopping = false;
  impl_->state = provider_state::open;
  host.state_changed(provider_state::open);
  impl_->reader = std::thread{[this, &host] { impl_->run(host); }};
}

void console_provider::stop() {
  impl_->stopping = true;
  if (impl_->reader.joinable())
    impl_->reader.join();
  impl_->state = provider_state::closed;
}

void console_provider::send(const outgoing_message& msg) {
  std::lock_guard guard{impl_->out_mtx};
  auto& out = impl_->out();
  out << msg.text << '\n';
  out.flush();
  if (!out)
    throw error(errc::provider_error, "console provider: writing output failed");
}

} // namespace botmesh
