#include <botmesh/providers/testing_provider.hpp>

#include <condition_variable>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>

namespace botmesh {

struct testing_provider::impl {
  options opts;
  mutable std::mutex mtx;
  mutable std::condition_variable cv;
  provider_host* host = nullptr;
  provider_state state = provider_state::closed;
  std::optional<errc> fail; // what sends fail with, while set
  std::size_t starts = 0;
  std::vector<outgoing_message> sent;
};

testing_provider::testing_provider() : testing_provider(options{}) {
  // nop
}

testing_provider::testing_provider(options opts)
  : impl_(std::make_unique<impl>()) {
  impl_->opts = std::move(opts);
}

testing_provider::~testing_provider() {
  // nop
}

std::string testing_provider::id() const {
  return impl_->opts.id;
}

std::string testing_provider::connection_id() const {
  return impl_->opts.connection_id;
}

provider_capabilities testing_provider::capabilities() const {
  return impl_->opts.capabilities;
}

provider_state testing_provider::state() const {
  std::lock_guard guard{impl_->mtx};
  return impl_->state;
}

void testing_provider::start(provider_host& host) {
  if (impl_->opts.on_start)
    impl_->opts.on_start();
  {
    std::lock_guard guard{impl_->mtx};
    impl_->host = &host;
    impl_->state = provider_state::open;
    ++impl_->starts;
  }
  host.state_changed(provider_state::open);
}

void testing_provider::stop() {
  if (impl_->opts.on_stop)
    impl_->opts.on_stop();
  provider_host* host;
  {
    std::lock_guard guard{impl_->mtx};
    host = impl_->host;
    impl_->host = nullptr;
    impl_->state = provider_state::closed;
  }
  if (host)
    host->state_changed(provider_state::closed);
}

void testing_provider::send(const outgoing_message& msg) {
  std::lock_guard guard{impl_->mtx};
  if (impl_->state != provider_state::open && !impl_->opts.sends_while_closed)
    throw error(errc::provider_error,
                fmt::format("testing provider {}: transport is {}",
                            impl_->opts.id, to_string(impl_->state)));
  if (impl_->fail)
    throw error(*impl_->fail,
                fmt::format("testing provider {}: send to {} failed (simulated)",
                            impl_->opts.id, msg.chat));
  impl_->sent.push_back(msg);
  impl_->cv.notify_all();
}

void testing_provider::inject(inbound_message msg) {
  delivery_callbacks none;
  hand_over(msg, none);
}

bool testing_provider::ask_to_yield(std::string_view reason) {
  provider_host* host;
  {
    std::lock_guard guard{impl_->mtx};
    host = impl_->host;
  }
  return host && host->yield_leadership(reason);
}

void testing_provider::inject(inbound_message msg, delivery_callbacks cb) {
  hand_over(msg, cb);
}

// By reference down to the host: the message is moved once, into deliver().
void testing_provider::hand_over(inbound_message& msg,
                                 delivery_callbacks& cb) {
  provider_host* host;
  {
    std::lock_guard guard{impl_->mtx};
    host = impl_->host;
  }
  if (!host)
    throw error(errc::provider_error,
                fmt::format("testing provider {}: inject before start",
                            impl_->opts.id));
  if (msg.provider.empty())
    msg.provider = impl_->opts.id;
  if (cb.accepted || cb.turn_ended)
    host->deliver(std::move(msg), std::move(cb));
  else
    host->deliver(std::move(msg));
}

void testing_provider::inject(std::string chat, std::string text) {
  inbound_message msg;
  msg.sender = chat;
  msg.chat = std::move(chat);
  msg.text = std::move(text);
  msg.command = command_in(msg.text);
  delivery_callbacks none;
  hand_over(msg, none);
}

void testing_provider::set_state(provider_state s) {
  provider_host* host;
  {
    std::lock_guard guard{impl_->mtx};
    impl_->state = s;
    host = impl_->host;
  }
  if (host)
    host->state_changed(s);
}

void testing_provider::fail_sends(bool on, errc code) {
  std::lock_guard guard{impl_->mtx};
  impl_->fail = on ? std::optional{code} : std::nullopt;
}

void testing_provider::close_input() {
  provider_host* host;
  {
    std::lock_guard guard{impl_->mtx};
    host = impl_->host;
  }
  if (host)
    host->input_closed();
}

std::vector<outgoing_message> testing_provider::sent() const {
  std::lock_guard guard{impl_->mtx};
  return impl_->sent;
}

std::vector<outgoing_message>
testing_provider::sent_to(const std::string& chat) const {
  std::lock_guard guard{impl_->mtx};
  std::vector<outgoing_message> out;
  for (auto& m : impl_->sent)
    if (m.chat == chat)
      out.push_back(m);
  return out;
}

bool testing_provider::wait_for_sent(std::size_t n,
                                     std::chrono::milliseconds timeout) const {
  std::unique_lock guard{impl_->mtx};
  return impl_->cv.wait_for(guard, timeout,
                            [&] { return impl_->sent.size() >= n; });
}

std::size_t testing_provider::starts() const {
  std::lock_guard guard{impl_->mtx};
  return impl_->starts;
}

} // namespace botmesh
