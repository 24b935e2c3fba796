#include <doctest/doctest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <botmesh/runtime/botmesh.hpp>

#include "test_util.hpp"

TEST_CASE("the console bot answers each stdin line and exits 0 when input ends") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  std::ostringstream out;
  auto console = std::make_shared<botmesh::console_provider>(
    botmesh::console_provider::options{.input_fd = fds[0], .out = &out});
  botmesh::bot b{{.provider = console}};
  b.hears("hola", [](botmesh::context& c) { c.reply("¡Hola! ¿Qué deseas?"); });
  b.on_message([](botmesh::context& c) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    c.reply("eco: " + c.text());
  });
  std::string input = "hola\r\n\n  \nqué tal\núltima sin salto";
  REQUIRE(::write(fds[1], input.data(), input.size())
          == static_cast<ssize_t>(input.size()));
  ::close(fds[1]);
  CHECK(b.run() == 0);
  ::close(fds[0]);
  // Everything in flight when stdin closed was answered, in order.
  CHECK(out.str()
        == "¡Hola! ¿Qué deseas?\neco: qué tal\neco: última sin salto\n");
  CHECK(b.stats().handled == 3);
}

namespace {

/// Writes `text` into a pipe's write end from its own thread (a pipe holds
/// only 64 KiB) and closes it when done.
class pipe_writer {
 public:
  explicit pipe_writer(std::string text) : text_(std::move(text)) {
    REQUIRE(::pipe(fds_) == 0);
    thread_ = std::thread{[this] {
      std::size_t done = 0;
      while (done < text_.size()) {
        auto n = ::write(fds_[1], text_.data() + done, text_.size() - done);
        if (n <= 0)
          break;
        done += static_cast<std::size_t>(n);
      }
      ::close(fds_[1]);
    }};
  }

  ~pipe_writer() {
    ::close(fds_[0]); // a writer still blocked gets EPIPE and ends
    thread_.join();
  }

  int read_end() const {
    return fds_[0];
  }

 private:
  std::string text_;
  int fds_[2] = {-1, -1};
  std::thread thread_;
};

/// A provider_host that keeps every delivery's callbacks, so the test
/// decides when each turn ends.
struct holding_host : botmesh::provider_host {
  std::mutex mtx;
  std::condition_variable cv;
  std::vector<std::string> texts;
  std::vector<botmesh::delivery_callbacks> held;
  std::size_t ended = 0;
  std::size_t most_outstanding = 0;
  bool closed = false;

  void deliver(botmesh::inbound_message msg) override {
    deliver(std::move(msg), {});
  }

  void deliver(botmesh::inbound_message msg,
               botmesh::delivery_callbacks cb) override {
    cb.accepted(botmesh::errc::none);
    std::lock_guard guard{mtx};
    texts.push_back(msg.text);
    held.push_back(std::move(cb));
    most_outstanding = std::max(most_outstanding, texts.size() - ended);
    cv.notify_all();
  }

  void state_changed(botmesh::provider_state) override {
    // nop
  }

  void input_closed() override {
    std::lock_guard guard{mtx};
    closed = true;
    cv.notify_all();
  }

  /// Waits until `n` lines were delivered (false after 30 s).
  bool wait_delivered(std::size_t n) {
    std::unique_lock guard{mtx};
    return cv.wait_for(guard, std::chrono::seconds(30),
                       [&] { return texts.size() >= n; });
  }

  /// Ends the turns of every delivered line not ended yet.
  void end_turns() {
    std::vector<botmesh::delivery_callbacks> now;
    {
      std::lock_guard guard{mtx};
      for (auto k = ended; k < held.size(); ++k)
        now.push_back(std::move(held[k]));
      ended = held.size();
    }
    for (auto& cb : now)
      cb.turn_ended(botmesh::turn_outcome::handled);
  }
};

std::string numbered_lines(std::size_t n) {
  std::string text;
  for (std::size_t k = 0; k < n; ++k)
    text += "line " + std::to_string(k) + "\n";
  return text;
}

/// "" when equal, else the first differing line of each (no megabytes of
/// output on a failure).
std::string first_difference(const std::string& got, const std::string& want) {
  std::istringstream g{got}, w{want};
  std::string a, b;
  for (std::size_t line = 1;; ++line) {
    bool more_g = static_cast<bool>(std::getline(g, a));
    bool more_w = static_cast<bool>(std::getline(w, b));
    if (!more_g && !more_w)
      return {};
    if (more_g != more_w || a != b)
      return "line " + std::to_string(line) + ": got \"" + (more_g ? a : "<end>")
             + "\", want \"" + (more_w ? b : "<end>") + "\"";
  }
}

} // namespace

TEST_CASE("a console bot fed 200,000 piped lines answers every one in order "
          "without overloading its chat") {
  constexpr std::size_t lines = 200'000;
  pipe_writer input{numbered_lines(lines)};
  std::ostringstream out;
  auto console = std::make_shared<botmesh::console_provider>(
    botmesh::console_provider::options{.input_fd = input.read_end(), .out = &out});
  botmesh::bot b{{.provider = console}};
  test::error_log errors;
  errors.attach(b);
  b.on_message([](botmesh::context& c) { c.reply(c.text()); });
  CHECK(b.run() == 0);
  CHECK(errors.count(botmesh::errc::overloaded) == 0);
  CHECK(b.stats().refused_overload == 0);
  CHECK(b.stats().handled == lines);
  // Every line answered, in the order it was read.
  CHECK(first_difference(out.str(), numbered_lines(lines)) == "");
}

TEST_CASE("the console provider keeps at most max_in_flight lines whose "
          "turns have not ended") {
  constexpr std::size_t lines = 1000;
  pipe_writer input{numbered_lines(lines)};
  holding_host host;
  botmesh::console_provider console{
    {.input_fd = input.read_end(), .max_in_flight = 16}};
  console.start(host);
  // Each time the reader has filled its window, end those turns: the next
  // window comes, and no more.
  for (std::size_t n = 16; n <= lines; n += 16) {
    REQUIRE(host.wait_delivered(n));
    host.end_turns();
  }
  {
    std::unique_lock guard{host.mtx};
    REQUIRE(host.cv.wait_for(guard, std::chrono::seconds(30), [&] {
      return host.closed && host.texts.size() == lines;
    }));
    CHECK(host.most_outstanding == 16);
    for (std::size_t k = 0; k < lines; ++k)
      REQUIRE(host.texts[k] == "line " + std::to_string(k));
  }
  console.stop();
  host.end_turns();
}

TEST_CASE("the console provider's stop() returns while its reader waits for "
          "turns to end or for input") {
  holding_host host;
  SUBCASE("a full backlog") {
    pipe_writer input{numbered_lines(5000)};
    {
      botmesh::console_provider console{{.input_fd = input.read_end()}};
      console.start(host);
      REQUIRE(host.wait_delivered(256));
      console.stop(); // the reader waits for a turn to end: interrupted
      std::lock_guard guard{host.mtx};
      CHECK(host.texts.size() == 256);
      CHECK_FALSE(host.closed);
    }
    // Turns that end after the provider is gone are harmless.
    host.end_turns();
  }
  SUBCASE("no input at all") {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    botmesh::console_provider console{{.input_fd = fds[0]}};
    console.start(host);
    console.stop(); // the reader waits in poll(): woken at once
    CHECK(console.state() == botmesh::provider_state::closed);
    ::close(fds[0]);
    ::close(fds[1]);
  }
}

TEST_CASE("the console provider rejects a zero max_in_flight and a negative "
          "input_fd, naming the field") {
  auto field_of = [](botmesh::console_provider::options o) {
    try {
      botmesh::console_provider p{std::move(o)};
    } catch (const botmesh::invalid_argument_error& e) {
      return std::string{e.field()};
    }
    return std::string{};
  };
  CHECK(field_of({.max_in_flight = 0}) == "max_in_flight");
  CHECK(field_of({.input_fd = -1}) == "input_fd");
}
