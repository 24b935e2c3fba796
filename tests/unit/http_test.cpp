// The Beast HTTP server and the pooled HTTP client, on loopback.

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <botmesh/providers/http/http_client.hpp>
#include <botmesh/providers/http/http_server.hpp>
#include <botmesh/runtime/core/error.hpp>

#include "log_capture.hpp"
#include "test_util.hpp"

using namespace std::chrono_literals;
namespace http = botmesh::http;

namespace {

/// A listening socket on a free loopback port (set in `port`).
int listen_on_loopback(std::uint16_t& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(fd, 8) == 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port = ntohs(addr.sin_port);
  return fd;
}

/// A raw loopback socket, for what a well-behaved client would not do.
class raw_socket {
 public:
  explicit raw_socket(std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  }

  ~raw_socket() {
    ::close(fd_);
  }

  /// Shuts the sending side: the request is complete, the answer awaited.
  void half_close() {
    ::shutdown(fd_, SHUT_WR);
  }

  void send(std::string_view s) {
    REQUIRE(::send(fd_, s.data(), s.size(), MSG_NOSIGNAL)
            == static_cast<ssize_t>(s.size()));
  }

  /// Everything until the peer closes (or 10 s pass).
  std::string read_all() {
    std::string out;
    char buf[4096];
    for (;;) {
      auto n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0)
        break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }

 private:
  int fd_ = -1;
};

/// POST `path` on `s` never answers by itself: its responders are held,
/// and answered 200 when this goes (declare it after the server).
class silent_route {
 public:
  silent_route(http::server& s, std::string path)
    : srv_(s), path_(std::move(path)) {
    srv_.route("POST", path_, [this](http::request&, http::responder r) {
      std::lock_guard guard{mtx_};
      held_.push_back(r);
    });
  }

  ~silent_route() {
    srv_.remove_route("POST", path_);
    std::lock_guard guard{mtx_};
    for (auto& r : held_)
      r.respond(200);
  }

 private:
  http::server& srv_;
  std::string path_;
  std::mutex mtx_;
  std::vector<http::responder> held_;
};

http::client_request get(const http::server& s, std::string path) {
  return {.method = "GET", .url = s.url() + path};
}

/// "answered", or the code of the error `c.request(req)` threw.
std::string outcome(http::client& c, const http::client_request& req) {
  try {
    c.request(req);
    return "answered";
  } catch (const botmesh::error& e) {
    return std::string{botmesh::to_string(e.code())};
  }
}

} // namespace

TEST_CASE("the HTTP server routes by method and exact path and answers "
          "404 and 405 otherwise") {
  http::server s;
  s.route("POST", "/hook", [](http::request& req, http::responder r) {
    r.respond({.status = 200, .body = "got " + req.body});
  });
  s.route("GET", "/q", [](http::request& req, http::responder r) {
    r.respond({.body = req.query_param("hub.challenge").value_or("none") + "|"
                       + req.query_param("missing").value_or("none")});
  });
  s.start();
  http::client c;
  auto ok = c.request({.url = s.url() + "/hook", .body = "hola"});
  CHECK(ok.status == 200);
  CHECK(ok.body == "got hola");
  CHECK(c.request(get(s, "/hook")).status == 405);
  CHECK(c.request(get(s, "/nowhere")).status == 404);
  auto q = c.request(get(s, "/q?hub.mode=subscribe&hub.challenge=12%2034+5"));
  CHECK(q.body == "12 34 5|none");
  CHECK(s.stats().not_found == 2);
}

TEST_CASE("the HTTP client reuses one keep-alive connection for sequential "
          "requests to a host") {
  http::server s;
  s.route("POST", "/m", [](http::request&, http::responder r) { r.respond(200); });
  s.start();
  http::client c;
  for (int i = 0; i < 20; ++i)
    REQUIRE(c.request({.url = s.url() + "/m", .body = "{}"}).status == 200);
  CHECK(c.stats().connections_opened == 1);
  CHECK(c.stats().reused == 19);
  CHECK(s.stats().connections == 1);
}

TEST_CASE("a request body over the cap is answered 413 and never reaches "
          "the handler") {
  test::log_capture logs;
  http::server s{{.max_body_bytes = 100}};
  std::atomic<int> calls{0};
  s.route("POST", "/hook", [&](http::request&, http::responder r) {
    ++calls;
    r.respond(200);
  });
  s.start();
  http::client c;
  auto r = c.request({.url = s.url() + "/hook", .body = std::string(101, 'x')});
  CHECK(r.status == 413);
  CHECK(calls.load() == 0);
  CHECK(s.stats().too_large == 1);
  // The operator learns the cap is too small for what a platform sends.
  CHECK(logs.count("http", "a request body over max_body_bytes (100) was "
                           "answered 413 (1 so far)")
        == 1);
  CHECK(c.request({.url = s.url() + "/hook", .body = std::string(100, 'x')}).status
        == 200);
  // A body far over the cap, still being written when the 413 goes out:
  // the server reads the rest instead of resetting the connection, so the
  // client gets its answer.
  auto big = c.request({.url = s.url() + "/hook", .body = std::string(32 << 20, 'x')});
  CHECK(big.status == 413);
  CHECK(calls.load() == 1);
}

TEST_CASE("a client that never finishes its request header is disconnected "
          "after the header timeout") {
  http::server s{{.header_timeout = "200ms"}};
  s.route("POST", "/hook", [](http::request&, http::responder r) { r.respond(200); });
  s.start();
  raw_socket sock{s.port()};
  sock.send("POST /hook HTTP/1.1\r\nHost: x\r\n");
  CHECK(sock.read_all().empty()); // closed without an answer
  CHECK(test::eventually([&] { return s.stats().timeouts == 1; }));
}

TEST_CASE("a client whose body stops arriving is disconnected after the "
          "read timeout") {
  http::server s{{.read_timeout = "200ms"}};
  std::atomic<int> calls{0};
  s.route("POST", "/hook", [&](http::request&, http::responder r) {
    ++calls;
    r.respond(200);
  });
  s.start();
  raw_socket sock{s.port()};
  sock.send("POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"a\":");
  CHECK(sock.read_all().empty());
  CHECK(calls.load() == 0);
}

TEST_CASE("an unparsable request is answered 400") {
  http::server s;
  s.start();
  raw_socket sock{s.port()};
  sock.send("NOT HTTP AT ALL\r\n\r\n");
  CHECK(sock.read_all().starts_with("HTTP/1.1 400"));
}

TEST_CASE("a Transfer-Encoding other than chunked alone is answered 400 and "
          "its body is not read as another request") {
  http::server s;
  std::atomic<int> calls{0};
  s.route("POST", "/hook", [&](http::request&, http::responder r) {
    ++calls;
    r.respond(200);
  });
  s.route("GET", "/healthz", [&](http::request&, http::responder r) {
    ++calls;
    r.respond(200);
  });
  s.start();
  const char* smuggled = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  for (std::string coding : {"gzip", "chunked, identity", "gzip, chunked",
                             "identity\r\nContent-Length: 37"}) {
    CAPTURE(coding);
    raw_socket sock{s.port()};
    sock.send("POST /hook HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + coding
              + "\r\n\r\n" + smuggled);
    auto answer = sock.read_all();
    CHECK(answer.starts_with("HTTP/1.1 400"));
    CHECK(answer.find("HTTP/1.1", 1) == std::string::npos); // one answer
    CHECK(answer.find("Transfer-Encoding") != std::string::npos);
  }
  // Chunked twice is refused too, and chunked on HTTP/1.0 (which has no
  // Transfer-Encoding).
  for (std::string head :
       {"POST /hook HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        "Transfer-Encoding: chunked\r\n\r\n",
        "POST /hook HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked"
        "\r\n\r\n",
        "POST /hook HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"}) {
    CAPTURE(head);
    raw_socket sock{s.port()};
    sock.send(head + "0\r\n\r\n");
    CHECK(sock.read_all().starts_with("HTTP/1.1 400"));
  }
  CHECK(calls.load() == 0);
  // Chunked alone still reads the body, whatever its case, spaces and
  // empty list elements.
  for (std::string coding : {" Chunked ", "chunked,", ", chunked"}) {
    CAPTURE(coding);
    raw_socket sock{s.port()};
    sock.send("POST /hook HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:" + coding
              + "\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n");
    CHECK(sock.read_all().starts_with("HTTP/1.1 200"));
  }
  CHECK(calls.load() == 3);
}

TEST_CASE("the HTTP client times out on a platform that never answers") {
  http::server s;
  silent_route slow{s, "/slow"};
  s.start();
  http::client c;
  try {
    c.request({.url = s.url() + "/slow", .body = "{}", .timeout = 300ms});
    FAIL("expected a timeout");
  } catch (const botmesh::error& e) {
    CHECK(e.code() == botmesh::errc::timeout);
    CHECK(std::string{e.what()}.find("127.0.0.1") != std::string::npos);
  }
}

TEST_CASE("a stop requested before the answer is read stops the request at "
          "once, on a new connection and on a pooled one") {
  http::server s;
  silent_route slow{s, "/slow"};
  s.route("POST", "/fast", [](http::request&, http::responder r) { r.respond(200); });
  s.start();
  http::client c;
  std::stop_source stopped;
  stopped.request_stop();
  for (int round = 0; round < 2; ++round) {
    try {
      c.request({.url = s.url() + "/slow", .body = "{}", .timeout = 20s,
                 .stop = stopped.get_token()});
      FAIL("expected a stop");
    } catch (const botmesh::error& e) {
      CHECK(e.code() == botmesh::errc::stopped);
    }
    // The next round finds a pooled connection.
    REQUIRE(c.request({.url = s.url() + "/fast"}).status == 200);
  }
}

TEST_CASE("a stop cuts a request that waits for a free connection to its "
          "host") {
  http::server s;
  silent_route slow{s, "/slow"};
  s.start();
  http::client c{{.max_connections_per_host = 1}};
  std::stop_source first_stop;
  auto first = std::async(std::launch::async, [&] {
    // (stopped at the end of the test)
    return outcome(c, {.url = s.url() + "/slow", .body = "{}", .timeout = 20s,
                       .stop = first_stop.get_token()});
  });
  std::this_thread::sleep_for(100ms); // the only connection is in use
  std::stop_source stop;
  auto second = std::async(std::launch::async, [&] {
    return outcome(c, {.url = s.url() + "/slow", .body = "{}", .timeout = 20s,
                       .stop = stop.get_token()});
  });
  std::this_thread::sleep_for(100ms);
  stop.request_stop();
  REQUIRE(second.wait_for(10s) == std::future_status::ready);
  CHECK(second.get() == "stopped");
  first_stop.request_stop();
  first.get();
}

TEST_CASE("cancel_before_write gives up a request that waits for a free "
          "connection, and not one already written") {
  http::server s;
  std::atomic<int> arrived{0};
  std::mutex mtx;
  std::vector<http::responder> held;
  s.route("POST", "/held", [&](http::request&, http::responder r) {
    std::lock_guard guard{mtx};
    held.push_back(r);
    ++arrived;
  });
  s.start();
  // Answered before the test ends, also after a failed REQUIRE.
  std::shared_ptr<void> answer_all{nullptr, [&](void*) {
                                     std::lock_guard guard{mtx};
                                     for (auto& r : held)
                                       r.respond(200);
                                     held.clear();
                                   }};
  http::client c{{.max_connections_per_host = 1}};
  std::stop_source first_cancel;
  auto first = std::async(std::launch::async, [&] {
    return outcome(c, {.url = s.url() + "/held", .body = "{}", .timeout = 20s,
                       .cancel_before_write = first_cancel.get_token()});
  });
  REQUIRE(test::eventually([&] { return arrived.load() == 1; }));
  first_cancel.request_stop(); // written already: it goes on
  std::stop_source cancel;
  auto second = std::async(std::launch::async, [&] {
    return outcome(c, {.url = s.url() + "/held", .body = "{}", .timeout = 20s,
                       .cancel_before_write = cancel.get_token()});
  });
  std::this_thread::sleep_for(100ms); // waits for the only connection
  cancel.request_stop();
  REQUIRE(second.wait_for(10s) == std::future_status::ready);
  CHECK(second.get() == "stopped");
  {
    std::lock_guard guard{mtx};
    for (auto& r : held)
      r.respond(200);
    held.clear();
  }
  CHECK(first.get() == "answered");
  // The given-up one never reached the server, not even once the
  // connection came free.
  std::this_thread::sleep_for(100ms);
  CHECK(arrived.load() == 1);
}

TEST_CASE("a stop cuts a TLS handshake the server never answers") {
  // A listener that never accepts: the kernel completes the TCP handshake,
  // nobody speaks TLS.
  std::uint16_t port = 0;
  int fd = listen_on_loopback(port);
  auto url = "https://127.0.0.1:" + std::to_string(port) + "/x";
  http::client c{{.connect_timeout = "20s"}};
  std::stop_source stop;
  auto call = std::async(std::launch::async, [&] {
    return outcome(c, {.url = url, .body = "{}", .timeout = 20s,
                       .stop = stop.get_token()});
  });
  std::this_thread::sleep_for(200ms);
  stop.request_stop();
  REQUIRE(call.wait_for(10s) == std::future_status::ready);
  CHECK(call.get() == "stopped");
  ::close(fd);
}

namespace {

// A name lookup that waits until the test lets it go.
struct held_lookup {
  std::mutex mtx;
  std::condition_variable cv;
  bool go = false;
  std::atomic<int> asked{0};

  std::vector<std::string> operator()(const std::string&) {
    ++asked;
    std::unique_lock guard{mtx};
    cv.wait(guard, [&] { return go; });
    return {"127.0.0.1"};
  }
  void release() {
    std::lock_guard guard{mtx};
    go = true;
    cv.notify_all();
  }
};

} // namespace

TEST_CASE("a name lookup that hangs is given up at the connect timeout, or "
          "at a stop, naming the lookup") {
  http::server s;
  s.route("GET", "/x", [](http::request&, http::responder r) { r.respond(200); });
  s.start();
  auto held = std::make_shared<held_lookup>();
  http::client c{{.connect_timeout = "300ms",
                  .lookup = [held](const std::string& h) { return (*held)(h); }}};
  auto url = "http://bot.example:" + std::to_string(s.port()) + "/x";
  try {
    c.request({.method = "GET", .url = url, .timeout = 20s});
    FAIL("a hung lookup held the request");
  } catch (const botmesh::error& e) {
    CHECK(e.code() == botmesh::errc::timeout);
    CHECK(std::string{e.what()}.find("bot.example") != std::string::npos);
    CHECK(std::string{e.what()}.find("resolve failed") != std::string::npos);
  }
  std::stop_source stop;
  auto call = std::async(std::launch::async, [&] {
    return outcome(c, {.method = "GET", .url = url, .timeout = 20s,
                       .stop = stop.get_token()});
  });
  REQUIRE(test::eventually([&] { return held->asked.load() == 2; }));
  stop.request_stop();
  REQUIRE(call.wait_for(10s) == std::future_status::ready);
  CHECK(call.get() == "stopped");
  held->release(); // the lookups' threads end
  // A lookup that answers: the request goes to the address it gave.
  auto asked_for = std::make_shared<std::string>();
  http::client named{{.lookup = [asked_for](const std::string& h) {
    *asked_for = h; // (read once the request returned)
    return std::vector<std::string>{"127.0.0.1"};
  }}};
  CHECK(named.request({.method = "GET", .url = url}).status == 200);
  CHECK(*asked_for == "bot.example");
}

TEST_CASE("a name lookup that fails, or gives no IP address, fails the "
          "request naming why") {
  auto fails_with = [](http::client_options o) {
    http::client c{std::move(o)};
    try {
      c.request({.method = "GET", .url = "http://bot.example:1/x"});
    } catch (const botmesh::error& e) {
      CHECK(e.code() == botmesh::errc::provider_error);
      return std::string{e.what()};
    }
    return std::string{"answered"};
  };
  CHECK(fails_with({.lookup = [](const std::string&) -> std::vector<std::string> {
          throw std::runtime_error("no such host here");
        }}).find("resolve failed: no such host here")
        != std::string::npos);
  CHECK(fails_with({.lookup = [](const std::string&) {
          return std::vector<std::string>{};
        }}).find("no address found")
        != std::string::npos);
  CHECK(fails_with({.lookup = [](const std::string&) {
          return std::vector<std::string>{"bot.example"};
        }}).find("which is no IP address")
        != std::string::npos);
}

TEST_CASE("the HTTP client reports a refused connection as a provider error "
          "and a bad URL as an invalid argument") {
  std::uint16_t port;
  {
    http::server s;
    s.start();
    port = s.port();
  }
  http::client c{{.connect_timeout = "2s"}};
  try {
    c.request({.url = "http://127.0.0.1:" + std::to_string(port) + "/x"});
    FAIL("expected a provider error");
  } catch (const botmesh::error& e) {
    CHECK(e.code() == botmesh::errc::provider_error);
  }
  CHECK_THROWS_AS(c.request({.url = "ftp://127.0.0.1/x"}),
                  botmesh::invalid_argument_error);
  CHECK_THROWS_AS(http::parse_url("http://127.0.0.1:99999/"),
                  botmesh::invalid_argument_error);
  // What would end the request line early, or add a header to it.
  for (auto bad : {"http://h/a b", "http://h/a\r\nX: y", "http://h/a#frag",
                   "http://h/a\x7f"})
    CHECK_THROWS_AS(http::parse_url(bad), botmesh::invalid_argument_error);
  auto u = http::parse_url("https://api.telegram.org/bot1:a/getMe?x=1");
  CHECK(u.tls);
  CHECK(u.port == 443);
  CHECK(u.host == "api.telegram.org");
  CHECK(u.target == "/bot1:a/getMe?x=1");
  auto v6 = http::parse_url("http://[::1]:8080/x");
  CHECK(v6.host == "::1");
  CHECK(v6.port == 8080);
  CHECK(v6.target == "/x");
  auto v6_default = http::parse_url("https://[2001:db8::1]");
  CHECK(v6_default.host == "2001:db8::1");
  CHECK(v6_default.port == 443);
  for (const char* bad : {"http://::1:8080/", "http://[::1/", "http://[]/",
                          "http://[::1]x/", "http://[::1]:/", "http://h:0/"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(http::parse_url(bad), botmesh::invalid_argument_error);
  }
}

TEST_CASE("the HTTP client reaches an IPv6 loopback server, and its Host "
          "header names the port") {
  http::server s{{.address = "::1"}};
  std::string host;
  s.route("GET", "/h", [&](http::request& req, http::responder r) {
    auto* h = req.header("host");
    host = h ? *h : std::string{};
    r.respond(200);
  });
  s.start();
  http::client c;
  auto res = c.request({.method = "GET",
                        .url = "http://[::1]:" + std::to_string(s.port()) + "/h"});
  CHECK(res.status == 200);
  CHECK(host == "[::1]:" + std::to_string(s.port()));
  CHECK(s.url() == "http://[::1]:" + std::to_string(s.port()));
}

TEST_CASE("the HTTP client resends once on a new connection when the server "
          "closed the pooled one while it was idle") {
  http::server s{{.idle_timeout = "100ms"}};
  std::atomic<int> calls{0};
  s.route("POST", "/m", [&](http::request&, http::responder r) {
    ++calls;
    r.respond(200);
  });
  s.start();
  http::client c;
  REQUIRE(c.request({.url = s.url() + "/m"}).status == 200);
  REQUIRE(test::eventually([&] { return s.stats().timeouts == 1; }));
  CHECK(c.request({.url = s.url() + "/m"}).status == 200);
  CHECK(calls.load() == 2);
  CHECK(c.stats().connections_opened == 2);
  // Seen closed before it was used: nothing was sent on it.
  CHECK(c.stats().stale == 1);
  CHECK(c.stats().retried == 0);
}

namespace {

/// A loopback server that answers the first request of its first
/// connection, then reads a second request on it and closes without an
/// answer (a crash after it ran the request); later connections are
/// answered. Counts the requests it read.
class closing_server {
 public:
  closing_server() {
    fd_ = listen_on_loopback(port_);
    thread_ = std::thread{[this] { serve(); }};
  }

  ~closing_server() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }

  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/m";
  }

  std::atomic<int> requests{0};

 private:
  // One request (header and Content-Length body); false on EOF.
  bool read_request(int fd) {
    std::string in;
    char buf[4096];
    for (;;) {
      auto end = in.find("\r\n\r\n");
      if (end != std::string::npos) {
        std::size_t length = 0;
        if (auto at = in.find("Content-Length: "); at != std::string::npos)
          length = std::stoul(in.substr(at + 16));
        if (in.size() >= end + 4 + length)
          break;
      }
      auto n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0)
        return false;
      in.append(buf, static_cast<std::size_t>(n));
    }
    ++requests;
    return true;
  }

  void answer(int fd) {
    std::string_view ok = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
    (void) !::send(fd, ok.data(), ok.size(), MSG_NOSIGNAL);
  }

  void serve() {
    for (int n = 0;; ++n) {
      int fd = ::accept(fd_, nullptr, nullptr);
      if (fd < 0)
        return;
      if (read_request(fd)) {
        answer(fd);
        if (n > 0)
          while (read_request(fd))
            answer(fd);
        else
          read_request(fd); // ran, never answered
      }
      ::close(fd);
    }
  }

  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

} // namespace

namespace {

/// A loopback server that answers every request (a header, no body) of
/// every connection with `reply`, as it is. Counts the connections.
class scripted_server {
 public:
  explicit scripted_server(std::string reply) : reply_(std::move(reply)) {
    fd_ = listen_on_loopback(port_);
    thread_ = std::thread{[this] { serve(); }};
  }

  ~scripted_server() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }

  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/m";
  }

  std::atomic<int> connections{0};

 private:
  void serve() {
    for (;;) {
      int fd = ::accept(fd_, nullptr, nullptr);
      if (fd < 0)
        return;
      ++connections;
      std::string in;
      char buf[4096];
      for (;;) {
        auto end = in.find("\r\n\r\n");
        if (end != std::string::npos) {
          in.erase(0, end + 4);
          (void) !::send(fd, reply_.data(), reply_.size(), MSG_NOSIGNAL);
          continue;
        }
        auto n = ::recv(fd, buf, sizeof(buf), 0);
        if (n <= 0)
          break;
        in.append(buf, static_cast<std::size_t>(n));
      }
      ::close(fd);
    }
  }

  std::string reply_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

} // namespace

TEST_CASE("the HTTP client reads past interim answers to the final one, and "
          "a HEAD answer's length without waiting for a body") {
  {
    scripted_server srv{"HTTP/1.1 100 Continue\r\n\r\n"
                        "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
                        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"};
    http::client c;
    for (int i = 0; i < 2; ++i) {
      auto r = c.request({.method = "GET", .url = srv.url()});
      CHECK(r.status == 200);
      CHECK(r.body == "ok");
    }
    CHECK(srv.connections.load() == 1); // the pooled connection stayed in step
  }
  {
    scripted_server srv{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"};
    http::client c{{.request_timeout = 5s}};
    for (int i = 0; i < 2; ++i) {
      auto r = c.request({.method = "HEAD", .url = srv.url()});
      CHECK(r.status == 200);
      CHECK(r.body.empty());
    }
    CHECK(srv.connections.load() == 1);
  }
  // Interim answers without end: refused, not read forever.
  std::string endless;
  for (int i = 0; i < 40; ++i)
    endless += "HTTP/1.1 100 Continue\r\n\r\n";
  scripted_server srv{endless};
  http::client c;
  CHECK_THROWS_AS(c.request({.method = "GET", .url = srv.url()}), botmesh::error);
}

TEST_CASE("a connection whose answer came with bytes past its end is not "
          "reused: the next request does not read them as its answer") {
  scripted_server srv{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                      "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale"};
  http::client c;
  CHECK(c.request({.method = "GET", .url = srv.url()}).body == "ok");
  CHECK(c.request({.method = "GET", .url = srv.url()}).body == "ok");
  CHECK(srv.connections.load() == 2);
}

TEST_CASE("the HTTP server answers HEAD where a path has GET, names a path's "
          "methods in a 405, and says what made a request malformed") {
  http::server s;
  s.route("GET", "/healthz", [](http::request&, http::responder r) {
    r.respond({.body = "ok\n"});
  });
  s.route("POST", "/hook", [](http::request&, http::responder r) {
    r.respond({.body = "got"});
  });
  s.start();
  {
    raw_socket sock{s.port()};
    sock.send("HEAD /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    auto got = sock.read_all();
    CHECK(got.rfind("HTTP/1.1 200", 0) == 0);
    CHECK(got.find("Content-Length: 3\r\n") != std::string::npos);
    CHECK(got.substr(got.find("\r\n\r\n") + 4).empty()); // no body
  }
  for (auto* method : {"GET", "OPTIONS"}) {
    raw_socket sock{s.port()};
    sock.send(std::string{method}
              + " /hook HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    auto got = sock.read_all();
    CAPTURE(got);
    CHECK(got.rfind("HTTP/1.1 405", 0) == 0);
    CHECK(got.find("Allow: POST\r\n") != std::string::npos);
  }
  {
    raw_socket sock{s.port()};
    sock.send("DELETE /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    CHECK(sock.read_all().find("Allow: GET, HEAD\r\n") != std::string::npos);
  }
  {
    raw_socket sock{s.port()};
    sock.send("GET /healthz HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n");
    auto got = sock.read_all();
    CAPTURE(got);
    CHECK(got.rfind("HTTP/1.1 400", 0) == 0);
    auto body = got.substr(got.find("\r\n\r\n") + 4);
    CHECK(body.rfind("bad request: ", 0) == 0);
    CHECK(body.size() > std::string_view{"bad request: "}.size());
  }
  {
    raw_socket sock{s.port()};
    sock.send("GET /" + std::string(64 * 1024, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n");
    auto got = sock.read_all();
    CHECK(got.rfind("HTTP/1.1 431", 0) == 0);
    CHECK(got.find("request header fields too large") != std::string::npos);
  }
  {
    // A HEAD, then a refused request on the same connection: the refusal
    // keeps its text (the HEAD's "no body" is for the HEAD alone).
    raw_socket sock{s.port()};
    sock.send("HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
              "GET /healthz HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n");
    auto got = sock.read_all();
    CAPTURE(got);
    auto second = got.find("HTTP/1.1 400");
    REQUIRE(second != std::string::npos);
    CHECK(got.find("bad request: ", second) != std::string::npos);
  }
  http::client c;
  auto head = c.request({.method = "HEAD", .url = s.url() + "/healthz"});
  CHECK(head.status == 200);
  CHECK(head.body.empty());
}

TEST_CASE("a POST whose pooled connection closes after it was written is not "
          "sent again, an idempotent request is") {
  {
    closing_server srv;
    http::client c;
    REQUIRE(c.request({.url = srv.url(), .body = "{}"}).status == 200);
    CHECK_THROWS_AS(c.request({.url = srv.url(), .body = "{}"}), botmesh::error);
    CHECK(srv.requests.load() == 2);
    CHECK(c.stats().retried == 0);
  }
  closing_server srv;
  http::client c;
  REQUIRE(c.request({.method = "GET", .url = srv.url()}).status == 200);
  CHECK(c.request({.method = "GET", .url = srv.url()}).status == 200);
  CHECK(srv.requests.load() == 3);
  CHECK(c.stats().retried == 1);
}

TEST_CASE("a request whose handler drops its responder unanswered gets 500") {
  http::server s;
  s.route("POST", "/drop", [](http::request&, http::responder) {});
  s.route("POST", "/throw", [](http::request&, http::responder) -> void {
    throw std::runtime_error{"boom"};
  });
  s.start();
  http::client c;
  CHECK(c.request({.url = s.url() + "/drop"}).status == 500);
  CHECK(c.request({.url = s.url() + "/throw"}).status == 500);
}

TEST_CASE("a stopping HTTP server answers the request in flight, closes idle "
          "connections and accepts no more") {
  http::server s;
  std::promise<http::responder> arrived;
  s.route("POST", "/hold", [&](http::request&, http::responder r) {
    arrived.set_value(r);
  });
  s.route("POST", "/quick", [](http::request&, http::responder r) { r.respond(200); });
  s.start();
  auto url = s.url();
  http::client idle_client;
  REQUIRE(idle_client.request({.url = url + "/quick"}).status == 200);
  http::client c;
  auto in_flight = std::async(std::launch::async, [&] {
    return c.request({.url = url + "/hold", .body = "x"});
  });
  auto r = arrived.get_future().get();
  auto stopping = std::async(std::launch::async, [&] { s.stop(); });
  // stop() waits for the answer in flight.
  CHECK(stopping.wait_for(100ms) == std::future_status::timeout);
  r.respond({.status = 200, .body = "late but answered"});
  auto res = in_flight.get();
  CHECK(res.status == 200);
  CHECK(res.body == "late but answered");
  REQUIRE(res.header("connection"));
  CHECK(*res.header("connection") == "close");
  stopping.get();
  http::client fresh{{.connect_timeout = "1s"}};
  CHECK_THROWS_AS(fresh.request({.url = url + "/quick"}), botmesh::error);
}

TEST_CASE("pipelined requests on one connection are answered in order, and a "
          "reused request holds nothing of the one before") {
  http::server s;
  std::mutex m;
  std::vector<std::string> seen;
  s.route("POST", "/p", [&](http::request& req, http::responder r) {
    auto* a = req.header("x-a");
    std::lock_guard g{m};
    seen.push_back(req.body + "|" + (a ? *a : "-") + "|"
                   + std::to_string(req.headers.size()));
    r.respond({.body = "echo:" + req.body});
  });
  s.start();
  raw_socket sock{s.port()};
  // Three requests in one write; the second has fewer headers and the
  // third a chunked body.
  sock.send("POST /p HTTP/1.1\r\nHost: x\r\nX-A: one\r\nContent-Length: 5\r\n\r\nfirst"
            "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
            "POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            "Connection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  auto all = sock.read_all();
  auto first = all.find("echo:first");
  auto third = all.find("echo:abcde");
  REQUIRE(first != std::string::npos);
  REQUIRE(third != std::string::npos);
  CHECK(first < third);
  // Three status lines: the second answer is there too, in between.
  std::size_t lines = 0;
  for (auto p = all.find("HTTP/1.1 200"); p != std::string::npos;
       p = all.find("HTTP/1.1 200", p + 1))
    ++lines;
  CHECK(lines == 3);
  CHECK(all.ends_with("echo:abcde"));
  std::lock_guard g{m};
  REQUIRE(seen.size() == 3);
  CHECK(seen[0] == "first|one|3");
  CHECK(seen[1] == "|-|2");
  CHECK(seen[2] == "abcde|-|3");
}

TEST_CASE("a chunked body's trailer fields are not taken as headers") {
  http::server s;
  std::mutex m;
  std::vector<std::string> seen;
  s.route("POST", "/t", [&](http::request& req, http::responder r) {
    auto* a = req.header("x-a");
    auto* b = req.header("x-b");
    std::lock_guard g{m};
    seen.push_back(req.body + "|" + (a ? *a : "-") + "|" + (b ? *b : "-")
                   + "|" + std::to_string(req.headers.size()));
    r.respond({.body = "ok"});
  });
  s.start();
  raw_socket sock{s.port()};
  // The second request's trailer names a header the first had and one it
  // did not; neither is the request's.
  sock.send("POST /t HTTP/1.1\r\nHost: x\r\nX-A: one\r\nContent-Length: 2\r\n\r\nhi"
            "POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            "Trailer: X-A, X-B\r\nConnection: close\r\n\r\n"
            "3\r\nabc\r\n0\r\nX-A: trailer\r\nX-B: trailer\r\n\r\n");
  auto all = sock.read_all();
  std::size_t answered = 0;
  for (auto p = all.find("HTTP/1.1 200"); p != std::string::npos;
       p = all.find("HTTP/1.1 200", p + 1))
    ++answered;
  CHECK(answered == 2);
  std::lock_guard g{m};
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == "hi|one|-|3");
  CHECK(seen[1] == "abc|-|-|4");
}

TEST_CASE("the next request's header on a kept-alive connection gets the "
          "header timeout once it has begun, not the idle timeout") {
  http::server s{{.header_timeout = "200ms", .idle_timeout = "30s"}};
  s.route("GET", "/x", [](http::request&, http::responder r) { r.respond(200); });
  s.start();
  raw_socket sock{s.port()};
  sock.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
  sock.send("GET /x HTTP/1.1\r\nHo"); // and no more
  // The first answer, then the close (read_all gives up after 10 s, far
  // short of the idle timeout).
  auto a = sock.read_all();
  CHECK(a.starts_with("HTTP/1.1 200"));
  CHECK(test::eventually([&] { return s.stats().timeouts == 1; }));
}

TEST_CASE("an idle keep-alive connection is closed after the idle timeout, a "
          "busy one is not") {
  http::server s{{.idle_timeout = "1s"}};
  s.route("GET", "/x", [](http::request&, http::responder r) { r.respond(200); });
  s.start();
  raw_socket idle{s.port()};
  idle.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
  raw_socket busy{s.port()};
  // The busy connection sends a request every 100 ms for 1.5 s: each
  // answered request starts a new idle period, ten times shorter than
  // the timeout, so even a loaded machine does not stretch one past it.
  for (int i = 0; i < 15; ++i) {
    busy.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
    std::this_thread::sleep_for(100ms);
  }
  busy.send("GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  auto b = busy.read_all();
  std::size_t answers = 0;
  for (auto p = b.find("HTTP/1.1 200"); p != std::string::npos;
       p = b.find("HTTP/1.1 200", p + 1))
    ++answers;
  CHECK(answers == 16);
  auto a = idle.read_all(); // returns when the server closes it
  CHECK(a.starts_with("HTTP/1.1 200"));
  CHECK(test::eventually([&] { return s.stats().timeouts == 1; }));
}

TEST_CASE("an answer the client does not read is bounded by the read timeout") {
  http::server s{{.read_timeout = "300ms"}};
  s.route("GET", "/big", [](http::request&, http::responder r) {
    r.respond({.body = std::string(64 * 1024 * 1024, 'x')});
  });
  s.start();
  raw_socket sock{s.port()};
  sock.send("GET /big HTTP/1.1\r\nHost: x\r\n\r\n");
  // Never read: the socket buffers fill, the write waits, the deadline
  // closes the connection.
  CHECK(test::eventually([&] { return s.stats().timeouts == 1; }));
}

TEST_CASE("an HTTP/1.0 request without keep-alive is answered and closed, and "
          "a response header with a line break is not sent") {
  http::server s;
  s.route("GET", "/h", [](http::request&, http::responder r) {
    r.respond({.body = "ok",
               .headers = {{"X-Good", "yes"}, {"X-Bad", "a\r\nSet-Cookie: evil=1"}}});
  });
  s.start();
  raw_socket sock{s.port()};
  sock.send("GET /h HTTP/1.0\r\n\r\n");
  auto all = sock.read_all(); // returns because the server closes
  CHECK(all.starts_with("HTTP/1.1 200 OK\r\n"));
  CHECK(all.find("X-Good: yes\r\n") != std::string::npos);
  CHECK(all.find("evil") == std::string::npos);
  CHECK(all.find("Connection: close\r\n") != std::string::npos);
  CHECK(all.ends_with("\r\n\r\nok"));
}

TEST_CASE("a server with several I/O threads answers many connections at once") {
  http::server s{{.io_threads = 3}};
  std::atomic<int> calls{0};
  s.route("POST", "/n", [&](http::request& req, http::responder r) {
    ++calls;
    // Half answered later, from another thread.
    if (req.body.back() % 2 == 0)
      r.respond({.body = req.body});
    else
      std::thread{[r, b = req.body] { r.respond({.body = b}); }}.detach();
  });
  s.start();
  std::vector<std::future<int>> clients;
  for (int c = 0; c < 12; ++c)
    clients.push_back(std::async(std::launch::async, [&, c] {
      http::client cl;
      int ok = 0;
      for (int i = 0; i < 50; ++i) {
        auto body = std::to_string(c * 1000 + i);
        auto res = cl.request({.url = s.url() + "/n", .body = body});
        ok += res.status == 200 && res.body == body;
      }
      return ok;
    }));
  int ok = 0;
  for (auto& f : clients)
    ok += f.get();
  CHECK(ok == 600);
  CHECK(calls.load() == 600);
  CHECK(s.stats().connections == 12);
}

TEST_CASE("a chunked request whose header ends mid chunk-size line is timed by "
          "the read timeout, not the header timeout") {
  http::server s{{.header_timeout = "200ms", .read_timeout = "5s"}};
  s.route("POST", "/c", [](http::request& req, http::responder r) {
    r.respond({.body = "got " + req.body});
  });
  s.start();
  raw_socket sock{s.port()};
  sock.send("POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            "Connection: close\r\n\r\n5");
  std::this_thread::sleep_for(600ms); // three header timeouts
  sock.send("\r\nhello\r\n0\r\n\r\n");
  auto all = sock.read_all();
  CHECK(all.starts_with("HTTP/1.1 200"));
  CHECK(all.ends_with("got hello"));
  CHECK(s.stats().timeouts == 0);
}

TEST_CASE("a chunk-size line that never ends is refused, not buffered until "
          "the read timeout") {
  http::server s{{.read_timeout = "30s"}};
  std::atomic<int> calls{0};
  s.route("POST", "/c", [&](http::request&, http::responder r) {
    ++calls;
    r.respond(200);
  });
  s.start();
  raw_socket sock{s.port()};
  auto began = std::chrono::steady_clock::now();
  sock.send("POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1;"
            + std::string(40 * 1024, 'a'));
  sock.read_all(); // the 400, or a reset: the connection is closed either way
  CHECK(std::chrono::steady_clock::now() - began < 5s);
  CHECK(test::eventually([&] { return s.stats().bad_requests == 1; }));
  CHECK(calls.load() == 0);
}

TEST_CASE("an answer for a connection the stopping server closed is refused") {
  http::server s{{.shutdown_timeout = "100ms"}};
  std::promise<http::responder> arrived;
  s.route("POST", "/hold", [&](http::request&, http::responder r) {
    arrived.set_value(r);
  });
  s.start();
  raw_socket sock{s.port()};
  sock.send("POST /hold HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  auto r = arrived.get_future().get();
  s.stop(); // nobody answers within 100 ms: the connection is closed
  CHECK_FALSE(r.respond(200));
  CHECK(sock.read_all().empty());
}

TEST_CASE("after() runs its callback on time, and one still pending when the "
          "server stops is dropped rather than kept") {
  auto token = std::make_shared<int>(0);
  std::atomic<bool> fired{false}, late{false};
  http::server s;
  s.start();
  s.after(20ms, [&] { fired = true; });
  s.after(10s, [token, &late] { late = true; });
  CHECK(test::eventually([&] { return fired.load(); }));
  s.stop();
  // The pending callback (and what it holds, often a responder) is gone.
  CHECK(token.use_count() == 1);
  CHECK_FALSE(late.load());
}

TEST_CASE("a handler that stops its own server still answers its request, "
          "and the server then stops and accepts no more") {
  http::server s;
  std::atomic<bool> stop_threw{false};
  std::promise<void> stop_returned_p;
  auto stop_returned = stop_returned_p.get_future();
  s.route("POST", "/stop", [&](http::request&, http::responder r) {
    // An error listener that stops the bot does this, on the I/O thread.
    try {
      s.stop();
    } catch (const std::exception&) {
      stop_threw = true;
    }
    stop_returned_p.set_value();
    r.respond({.status = 200, .body = "bye"});
  });
  s.start();
  auto url = s.url();
  http::client c;
  auto res = c.request({.url = url + "/stop", .body = "x"});
  REQUIRE(stop_returned.wait_for(0s) == std::future_status::ready);
  CHECK_FALSE(stop_threw.load());
  CHECK(res.status == 200);
  CHECK(res.body == "bye");
  // The stop goes on without the handler: the port is closed soon after.
  bool refused = false;
  auto until = std::chrono::steady_clock::now() + 10s;
  while (!refused && std::chrono::steady_clock::now() < until) {
    http::client fresh{{.connect_timeout = "1s"}};
    try {
      fresh.request(get(s, "/probe")); // answered 404 while it is up
      std::this_thread::sleep_for(10ms);
    } catch (const botmesh::error&) {
      refused = true;
    }
  }
  CHECK(refused);
  s.stop(); // from outside: waits for the stop begun by the handler
}

TEST_CASE("a start called while a handler's stop of its server is on its way "
          "starts the server after that stop, not under it") {
  http::server s;
  std::promise<void> entered_p;
  auto entered = entered_p.get_future();
  std::promise<void> gate_p;
  auto gate = gate_p.get_future().share();
  s.route("POST", "/stop", [&](http::request&, http::responder r) {
    s.stop(); // begins the stop on this I/O thread
    entered_p.set_value();
    gate.wait();
    r.respond(200);
  });
  s.route("GET", "/up", [](http::request&, http::responder r) { r.respond(200); });
  s.start();
  auto url = s.url();
  auto stopping = std::async(std::launch::async, [&] {
    http::client c;
    return c.request({.url = url + "/stop", .body = "x"}).status;
  });
  entered.wait();
  // The transport opens again (a leadership won back) while that stop runs.
  auto started = std::async(std::launch::async, [&] { s.start(); });
  started.wait_for(200ms); // (returns early only without the wait)
  gate_p.set_value();
  CHECK(stopping.get() == 200);
  started.get();
  CHECK(s.url() == url);
  http::client fresh{{.connect_timeout = "2s"}};
  CHECK(fresh.request(get(s, "/up")).status == 200);
  s.stop();
}

TEST_CASE("a client that half-closes after its request gets the answer held "
          "for it, and a watched request whose client left refuses its "
          "answer") {
  http::server s;
  std::mutex mtx;
  std::vector<http::responder> held;
  s.route("POST", "/hold", [&](http::request&, http::responder r) {
    std::lock_guard guard{mtx};
    held.push_back(r);
  });
  s.route("POST", "/watched", [&](http::request&, http::responder r) {
    r.watch_peer();
    std::lock_guard guard{mtx};
    held.push_back(r);
  });
  s.start();
  auto held_count = [&] {
    std::lock_guard guard{mtx};
    return held.size();
  };
  const std::string req = "POST /hold HTTP/1.1\r\nHost: x\r\n"
                          "Content-Length: 1\r\n\r\nx";
  // Not watched (the default): the half-close is no hang-up.
  raw_socket a{s.port()};
  a.send(req);
  a.half_close();
  REQUIRE(test::eventually([&] { return held_count() == 1; }));
  std::this_thread::sleep_for(50ms); // the end of stream has arrived
  CHECK(held[0].respond({.status = 200, .body = "tarde"}));
  auto answer = a.read_all();
  CHECK(answer.starts_with("HTTP/1.1 200"));
  CHECK(answer.find("tarde") != std::string::npos);
  // Watched: the client closing is noticed, and the answer refused.
  {
    raw_socket b{s.port()};
    b.send("POST /watched HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx");
    REQUIRE(test::eventually([&] { return held_count() == 2; }));
  } // closed
  REQUIRE(test::eventually([&] { return s.stats().peers_gone == 1; }));
  CHECK_FALSE(held[1].respond(200));
}

TEST_CASE("at max_connections the server accepts no more connections until "
          "one closes, and max_connections 0 is refused") {
  CHECK_THROWS_AS(http::server({.max_connections = 0}),
                  botmesh::invalid_argument_error);
  http::server s{{.max_connections = 2}};
  s.route("GET", "/x", [](http::request&, http::responder r) { r.respond(200); });
  s.start();
  auto a = std::make_unique<raw_socket>(s.port());
  raw_socket b{s.port()};
  REQUIRE(test::eventually([&] { return s.stats().at_capacity == 1; }));
  // Connected (the kernel's backlog takes it) but not accepted meanwhile.
  raw_socket c{s.port()};
  c.send("GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  std::this_thread::sleep_for(200ms);
  CHECK(s.stats().connections == 2);
  a.reset(); // one closes: the next is accepted and answered
  auto answer = c.read_all();
  CHECK(answer.starts_with("HTTP/1.1 200"));
  CHECK(s.stats().connections == 3);
}
