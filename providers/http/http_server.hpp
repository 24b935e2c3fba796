#pragma once

// An HTTP/1.1 server for webhooks and operational endpoints, on Boost.Beast
// (which stays inside http_server.cpp). Several providers may share one.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <botmesh/runtime/core/duration.hpp>

namespace botmesh::http {

/// One request as a handler sees it. Header names are lower case. The
/// server reuses it for the connection's next request: a handler copies or
/// moves out what it keeps past its call.
struct request {
  /// `body` is followed by at least this many zero bytes of its capacity,
  /// so a parser that reads past the end (simdjson) can read it in place.
  static constexpr std::size_t body_padding = 64;

  std::string method{}; ///< "GET", "POST"...
  std::string target{}; ///< path and query, as sent: "/whatsapp?hub.mode=x"
  std::vector<std::pair<std::string, std::string>> headers{};
  std::string body{};

  /// `target` before any '?'.
  std::string_view path() const noexcept;
  /// `target` after the first '?', or empty.
  std::string_view query() const noexcept;
  /// The first header named `lower_name`, or nothing.
  const std::string* header(std::string_view lower_name) const noexcept;
  /// The query parameter `name`, percent- and '+'-decoded; nothing when absent.
  std::optional<std::string> query_param(std::string_view name) const;
};

/// An answer. `Content-Length` and `Connection` are set by the server.
struct response {
  int status = 200;
  std::string body{};
  std::string content_type = "text/plain; charset=utf-8";
  std::vector<std::pair<std::string, std::string>> headers{};
};

namespace internal {
struct exchange;
struct server_state;
} // namespace internal

/// The way to answer one request: exactly once, from any thread, now or
/// later (a webhook may hold its answer until the bot's turn ends). Copies
/// share the request; the first `respond` wins, later ones are ignored.
/// When the last copy goes away unanswered, the server answers 500.
class responder {
 public:
  explicit responder(std::shared_ptr<internal::exchange> x) noexcept
    : x_(std::move(x)) {
    // nop
  }

  /// Sends `r`; returns false when the request was already answered, or
  /// the server closed its connection (a timeout, a stop past its bound,
  /// the client gone while watched, see `watch_peer`). A client that went
  /// away unnoticed is found only by the write, after this returned true.
  /// Never blocks: the write runs on I/O threads.
  bool respond(response r) const;

  /// Shorthand for an empty-bodied answer with `status`.
  bool respond(int status) const;

  bool answered() const noexcept;

  /// For an answer held a while (a reply carried in a webhook response):
  /// while the request waits for it, a client that closes or resets the
  /// connection is noticed, the connection is closed (counted in
  /// `server_stats::peers_gone`) and `respond` returns false, so the
  /// caller can deliver another way. Not the default: a client that
  /// half-closes after sending its request (shutdown for writing) would be
  /// taken as gone. Any thread; costs one readiness wait on the socket.
  void watch_peer() const;

 private:
  std::shared_ptr<internal::exchange> x_;
};

/// Handles one request. Runs on an I/O thread: it must not block; answer
/// through `r` now or later. An exception it throws answers 500.
using handler = std::function<void(request& req, responder r)>;

struct server_options {
  /// Where to listen. Tests use loopback only.
  std::string address = "127.0.0.1";
  /// 0: any free port (read it with `server::port()` after `start`).
  std::uint16_t port = 0;
  /// Threads running the server's I/O and its handlers. A handler that
  /// blocks holds up every connection of its thread.
  std::size_t io_threads = 1;
  /// Largest accepted request body; a larger one is answered 413 and the
  /// connection closed.
  std::size_t max_body_bytes = 1024 * 1024;
  /// From accepting a connection until its first request header is
  /// complete; past it the connection is closed (slow or silent clients).
  duration header_timeout = "10s";
  /// From the end of a header until the end of its body.
  duration read_timeout = "30s";
  /// A keep-alive connection waiting for its next request header.
  duration idle_timeout = "60s";
  /// `stop()` waits this long for requests in flight to be answered.
  duration shutdown_timeout = "10s";
  /// Most connections open at once. At the cap the server stops accepting
  /// (new connections wait in the listen backlog) until one closes, so
  /// slow or idle clients cannot take every descriptor of the process,
  /// whose own Redis and platform connections need some.
  std::size_t max_connections = 512;
};

/// Counters since construction.
struct server_stats {
  std::uint64_t connections = 0; ///< accepted
  std::uint64_t requests = 0;    ///< complete requests handed to a route
  std::uint64_t not_found = 0;   ///< 404 and 405 answers
  std::uint64_t too_large = 0;   ///< 413 answers
  std::uint64_t timeouts = 0;    ///< connections closed by a timeout
  std::uint64_t bad_requests = 0; ///< unparsable requests (400, 431)
  /// Requests whose client closed the connection (or reset it) before
  /// they were answered: their responders refuse the answer.
  std::uint64_t peers_gone = 0;
  /// Times the server stopped accepting at `max_connections`.
  std::uint64_t at_capacity = 0;
};

/// An HTTP/1.1 server with keep-alive, routes by method and exact path,
/// a body cap, timeouts and a graceful stop.
///
/// Cost: each I/O thread runs its own event loop and owns the connections
/// the acceptor gives it (round robin), so a connection needs no lock or
/// strand. A request's headers and body are copied once into a `request`
/// the connection reuses (no allocation once its strings are large enough);
/// an answer is written at once when the socket takes it. Timeouts cost no
/// timer operation per read or write: each thread checks its connections'
/// deadlines every eighth of the shortest timeout (between 5 and 250 ms),
/// which is also how late a timeout may fire. Routes may change at any time
/// (each thread re-reads the table when a version counter moved).
class server {
 public:
  /// Throws `invalid_argument_error` for `io_threads` 0 ("io_threads"),
  /// `max_body_bytes` 0 ("max_body_bytes"), `max_connections` 0
  /// ("max_connections") or a non-positive timeout
  /// (named after the field).
  explicit server(server_options opts = {});

  /// Stops (see `stop`).
  ~server();

  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// Sends requests for `method` and exactly `path` to `h` (replacing an
  /// earlier route). A HEAD on a path with a GET route and no HEAD route
  /// runs the GET handler and is answered without the body. Another method
  /// on a routed path gets 405 with an `Allow` header naming the path's
  /// methods; an unknown path 404. A request the parser refuses gets 400
  /// saying what was wrong ("bad request: bad field"), 413 or 431.
  void route(std::string method, std::string path, handler h);

  /// Removes a route; its requests then get 404.
  void remove_route(const std::string& method, const std::string& path);

  /// Binds, listens and starts the I/O threads. Idempotent while started;
  /// after `stop()` it starts the server again (routes kept; a server that
  /// chose a free port binds the same one again). Throws `botmesh::error`
  /// (`errc::provider_error`) when the address cannot be bound, naming it.
  void start();

  /// Graceful stop: stops accepting, closes idle connections, lets the
  /// requests in flight be answered (with `Connection: close`) for up to
  /// `shutdown_timeout`, then closes everything and joins the threads.
  /// Idempotent; `start()` starts it again. Called from one of
  /// the server's own handlers (on an I/O thread), it only begins the stop
  /// and returns: a thread of its own finishes it once that handler
  /// returned (the handler may still answer its request). A later call
  /// from another thread, or the destructor, waits for that stop.
  void stop();

  /// Runs `fn` on an I/O thread after `delay` (for bounded waits of held
  /// answers). Dropped when the server stops first. After `start` only.
  void after(std::chrono::milliseconds delay, std::function<void()> fn);

  /// The bound port (after `start`).
  std::uint16_t port() const noexcept;

  /// "http://127.0.0.1:<port>" (after `start`).
  std::string url() const;

  server_stats stats() const;

 private:
  std::shared_ptr<internal::server_state> impl_;
};

/// Decodes %XX escapes and '+' (as in a query string). Invalid escapes are
/// kept as they are.
std::string percent_decode(std::string_view s);

} // namespace botmesh::http
