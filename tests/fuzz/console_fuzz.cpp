// Console lines: bytes read by the console provider (as piped into the
// demo), then every message it delivers handled by a running bot with the
// demo's kinds of routes (a pattern route, keywords, a catch-all).
//
// Contract checked: the provider delivers exactly the non-blank lines of
// the input (split at '\n', one trailing '\r' stripped) and then reports
// the end of input; each line that passes validation gets exactly one
// answer from the bot; nothing crashes.
//
// The bot lives across inputs and its threads run until exit, so leak
// checks are off in this target (__asan_default_options below): per input
// they would scan the bot's threads each time, at exit they report the live
// threads' state. Leaks of the bot are checked by scripts/sanitize (asan).
// fuzz-ctest: -runs=1500

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <botmesh/providers/console_provider.hpp>
#include <botmesh/providers/testing_provider.hpp>
#include <botmesh/runtime/botmesh.hpp>

#include "fuzz_check.hpp"

namespace {

using namespace std::chrono_literals;

struct collecting_host : botmesh::provider_host {
  std::mutex mtx;
  std::condition_variable cv;
  std::vector<botmesh::inbound_message> got;
  bool closed = false;

  void deliver(botmesh::inbound_message msg) override {
    std::lock_guard guard{mtx};
    got.push_back(std::move(msg));
  }
  void state_changed(botmesh::provider_state) override {
    // nop
  }
  void input_closed() override {
    std::lock_guard guard{mtx};
    closed = true;
    cv.notify_all();
  }
};

// The lines a reader of `in` must deliver.
std::vector<std::string> expected_lines(std::string_view in) {
  std::vector<std::string> out;
  while (!in.empty()) {
    auto [line, rest] = botmesh::fuzz::next_line(in);
    std::string l{line};
    if (!l.empty() && l.back() == '\r')
      l.pop_back();
    if (l.find_first_not_of(" \t") != std::string::npos)
      out.push_back(std::move(l));
    in = rest;
  }
  return out;
}

// One bot for the whole run: starting an actor system per input would cost
// more than the input.
struct running_bot {
  std::shared_ptr<botmesh::testing_provider> provider =
    std::make_shared<botmesh::testing_provider>();
  std::unique_ptr<botmesh::bot> bot;
  std::size_t expected = 0;

  running_bot() {
    bot = std::make_unique<botmesh::bot>(
      botmesh::bot_options{.provider = provider, .log_messages = false});
    bot->hears({"hola", "ayuda"}, [](botmesh::context& c) { c.reply("hi"); });
    bot->hears(botmesh::pattern{R"(^\s*(-?\d+)\s*\+\s*(-?\d+)\s*$)"},
               [](botmesh::context& c) {
                 c.reply(c.matches()[1] + " + " + c.matches()[2]);
               });
    bot->on_message([](botmesh::context& c) { c.reply("echo: " + c.text()); });
    bot->start();
  }
};

// The testing provider keeps every answer, so the bot is replaced after a
// while. The last one is never destroyed: stopping a bot from an exit
// handler crashes in ~actor_system (the main thread's thread_local state is
// gone by then), so its threads run until the process ends.
running_bot& the_bot() {
  static running_bot* current = nullptr;
  if (current == nullptr || current->expected > 2000) {
    delete current;
    current = new running_bot;
  }
  return *current;
}

} // namespace

extern "C" const char* __asan_default_options() {
  return "detect_leaks=0";
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  std::string_view in{reinterpret_cast<const char*>(data), size};
  int fd = ::memfd_create("console_fuzz", MFD_CLOEXEC);
  FUZZ_CHECK(fd >= 0, "memfd_create");
  FUZZ_CHECK(::write(fd, data, size) == static_cast<ssize_t>(size), "write");
  ::lseek(fd, 0, SEEK_SET);
  collecting_host host;
  std::ostringstream out;
  {
    botmesh::console_provider console{{.input_fd = fd, .out = &out}};
    console.start(host);
    std::unique_lock lock{host.mtx};
    FUZZ_CHECK(host.cv.wait_for(lock, 10s, [&] { return host.closed; }),
               "the provider never reported the end of input");
    lock.unlock();
    console.stop();
  }
  ::close(fd);

  auto want = expected_lines(in);
  FUZZ_CHECK(host.got.size() == want.size(),
             std::to_string(host.got.size()) + " messages for "
               + std::to_string(want.size()) + " lines");
  auto& b = the_bot();
  for (std::size_t i = 0; i < want.size(); ++i) {
    auto& m = host.got[i];
    FUZZ_CHECK(m.text == want[i], "line " + std::to_string(i));
    FUZZ_CHECK(m.provider == "console" && m.chat == "console", m.chat);
    try {
      botmesh::validate(m, botmesh::message_limits{});
    } catch (const botmesh::invalid_argument_error& e) {
      FUZZ_CHECK(e.field() == "text", e.what());
      continue;
    }
    m.provider.clear();
    b.provider->inject(std::move(m));
    ++b.expected;
  }
  FUZZ_CHECK(b.provider->wait_for_sent(b.expected, 10s),
             "a line got no answer: " + std::to_string(b.provider->sent().size())
               + " answers for " + std::to_string(b.expected) + " lines");
  FUZZ_CHECK(b.provider->sent().size() == b.expected,
             "more answers than lines");
  return 0;
}
