#include <botmesh/providers/console_provider.hpp>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <iostream>
#include <mutex>
#include <string_view>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>

namespace botmesh {

namespace {

// The lines in flight of one start()..stop() run. Shared with the delivery
// callbacks, which the bot may call after the provider stopped (a turn that
// ends late) or never (a bot destroyed with messages queued).
struct flight {
  std::mutex mtx;
  std::condition_variable cv;
  std::size_t in_flight = 0;
  bool stopping = false;     // stop() was called
  bool host_stopped = false; // the bot refused a line with errc::stopped

  // One line finished: refused at acceptance, or its turn ended.
  void finished() {
    std::lock_guard guard{mtx};
    --in_flight;
    cv.notify_one();
  }
};

} // namespace

struct console_provider::impl {
  options opts;
  std::atomic<provider_state> state{provider_state::closed};
  std::thread reader;
  std::shared_ptr<flight> current;
  int wake[2] = {-1, -1}; // stop() writes to wake[1] to end the reader's poll
  std::mutex out_mtx;

  std::ostream& out() {
    return opts.out ? *opts.out : std::cout;
  }

  // Delivers one line once fewer than max_in_flight are in flight. Returns
  // false when the reader must end: stop() was called or the bot is stopping.
  bool deliver_line(provider_host& host, const std::shared_ptr<flight>& f,
                    std::string_view raw) {
    if (!raw.empty() && raw.back() == '\r')
      raw.remove_suffix(1);
    if (raw.find_first_not_of(" \t") == std::string_view::npos)
      return true;
    {
      std::unique_lock guard{f->mtx};
      f->cv.wait(guard, [&] {
        return f->in_flight < opts.max_in_flight || f->stopping
               || f->host_stopped;
      });
      if (f->stopping || f->host_stopped)
        return false;
      ++f->in_flight;
    }
    inbound_message msg;
    // No id: the bot stamps one unique across processes and restarts.
    msg.provider = "console";
    msg.chat = opts.chat;
    msg.sender = opts.sender;
    msg.text = std::string{raw};
    msg.command = command_in(msg.text);
    delivery_callbacks cb;
    cb.accepted = [f](errc code) {
      if (code == errc::none)
        return;
      std::lock_guard guard{f->mtx};
      --f->in_flight;
      f->host_stopped |= code == errc::stopped;
      f->cv.notify_one();
    };
    cb.turn_ended = [f](turn_outcome) { f->finished(); };
    host.deliver(std::move(msg), std::move(cb));
    return true;
  }

  // Waits with poll() on the input and on the wake pipe, so stop() ends the
  // reader at once even when no input arrives (a blocking read on stdin
  // could not be interrupted).
  void run(provider_host& host, std::shared_ptr<flight> f, int wake_fd) {
    std::string pending;
    char buf[4096];
    for (;;) {
      pollfd pfds[2] = {{opts.input_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
      int rc = ::poll(pfds, 2, -1);
      if (rc < 0 && errno == EINTR)
        continue;
      if (rc > 0 && pfds[1].revents != 0)
        return; // stop()
      ssize_t n = rc < 0 ? -1 : ::read(opts.input_fd, buf, sizeof(buf));
      if (n < 0 && (errno == EINTR || errno == EAGAIN))
        continue;
      if (n <= 0)
        break; // EOF or a read error: the input is over either way
      pending.append(buf, static_cast<size_t>(n));
      std::size_t start = 0;
      for (auto pos = pending.find('\n'); pos != std::string::npos;
           pos = pending.find('\n', start)) {
        auto line = std::string_view{pending}.substr(start, pos - start);
        start = pos + 1;
        if (!deliver_line(host, f, line))
          return;
      }
      pending.erase(0, start);
    }
    if (!pending.empty() && !deliver_line(host, f, pending))
      return;
    {
      std::lock_guard guard{f->mtx};
      if (f->stopping)
        return;
    }
    host.input_closed();
  }
};

console_provider::console_provider() : console_provider(options{}) {
  // nop
}

console_provider::console_provider(options opts)
  : impl_(std::make_unique<impl>()) {
  if (opts.max_in_flight == 0)
    throw invalid_argument_error(
      "max_in_flight", "console_provider: max_in_flight must be at least 1");
  if (opts.input_fd < 0)
    throw invalid_argument_error(
      "input_fd", fmt::format("console_provider: input_fd {} is not a file "
                              "descriptor",
                              opts.input_fd));
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
  auto& i = *impl_;
  if (i.reader.joinable())
    return;
  if (::pipe2(i.wake, O_CLOEXEC) != 0)
    throw error(errc::provider_error,
                fmt::format("console provider: pipe failed: {}",
                            std::strerror(errno)));
  i.current = std::make_shared<flight>();
  i.state = provider_state::open;
  host.state_changed(provider_state::open);
  i.reader = std::thread{
    [this, &host, f = i.current, fd = i.wake[0]] { impl_->run(host, f, fd); }};
}

void console_provider::stop() {
  auto& i = *impl_;
  if (i.reader.joinable()) {
    {
      std::lock_guard guard{i.current->mtx};
      i.current->stopping = true;
      i.current->cv.notify_all();
    }
    char byte = 1;
    while (::write(i.wake[1], &byte, 1) < 0 && errno == EINTR) {
      // retry
    }
    i.reader.join();
    ::close(i.wake[0]);
    ::close(i.wake[1]);
    i.wake[0] = i.wake[1] = -1;
    i.current.reset();
  }
  i.state = provider_state::closed;
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
