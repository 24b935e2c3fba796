#include <botmesh/providers/http/http_server.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/log.hpp>

namespace botmesh::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;

// -- request ------------------------------------------------------------------

std::string_view request::path() const noexcept {
  std::string_view t{target};
  return t.substr(0, t.find('?'));
}

std::string_view request::query() const noexcept {
  std::string_view t{target};
  auto q = t.find('?');
  return q == std::string_view::npos ? std::string_view{} : t.substr(q + 1);
}

const std::string* request::header(std::string_view lower_name) const noexcept {
  for (auto& [k, v] : headers)
    if (k == lower_name)
      return &v;
  return nullptr;
}

std::optional<std::string> request::query_param(std::string_view name) const {
  auto q = query();
  while (!q.empty()) {
    auto amp = q.find('&');
    auto pair = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view{} : q.substr(amp + 1);
    auto eq = pair.find('=');
    auto key = percent_decode(pair.substr(0, eq));
    if (key == name)
      return eq == std::string_view::npos
               ? std::string{}
               : percent_decode(pair.substr(eq + 1));
  }
  return std::nullopt;
}

std::string percent_decode(std::string_view s) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9')
      return c - '0';
    if (c >= 'a' && c <= 'f')
      return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
      return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out.push_back(' ');
    } else if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// -- sessions -----------------------------------------------------------------

namespace {

class session;

using route_table = std::unordered_map<std::string, std::shared_ptr<handler>>;

std::string route_key(std::string_view method, std::string_view path) {
  std::string k;
  k.reserve(method.size() + path.size() + 1);
  k += method;
  k.push_back(' ');
  k += path;
  return k;
}

} // namespace

namespace internal {

struct server_state : std::enable_shared_from_this<server_state> {
  server_options opts;
  net::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  std::uint16_t bound_port = 0;

  std::mutex routes_mtx;
  std::shared_ptr<const route_table> routes = std::make_shared<route_table>();
  std::unordered_set<std::string> routed_paths; // under routes_mtx
  std::shared_ptr<const std::unordered_set<std::string>> paths =
    std::make_shared<std::unordered_set<std::string>>();

  std::mutex sessions_mtx;
  std::condition_variable sessions_cv;
  std::unordered_map<session*, std::weak_ptr<session>> sessions;
  std::atomic<bool> stopping{false};
  bool started = false;
  bool stopped = false;
  std::mutex lifecycle_mtx;

  std::atomic<std::uint64_t> n_connections{0}, n_requests{0}, n_not_found{0},
    n_too_large{0}, n_timeouts{0}, n_bad{0};

  explicit server_state(server_options o) : opts(std::move(o)) {
    // nop
  }

  std::shared_ptr<const route_table> table() {
    std::lock_guard guard{routes_mtx};
    return routes;
  }

  std::shared_ptr<const std::unordered_set<std::string>> known_paths() {
    std::lock_guard guard{routes_mtx};
    return paths;
  }

  void do_accept();
  void add(const std::shared_ptr<session>& s);
  void remove(session* s);
};

/// One request waiting for its answer: the link from a `responder` back to
/// its connection.
struct exchange {
  std::shared_ptr<session> conn;
  std::atomic<bool> done{false};
  ~exchange();
};

} // namespace internal

namespace {

class session : public std::enable_shared_from_this<session> {
 public:
  session(tcp::socket&& socket, std::shared_ptr<internal::server_state> srv)
    : stream_(std::move(socket)), srv_(std::move(srv)) {
    // nop
  }

  void start() {
    net::dispatch(stream_.get_executor(),
                  beast::bind_front_handler(&session::read_header,
                                            shared_from_this()));
  }

  /// Called on stop (from any thread): close idle connections, let the
  /// one answering finish with `Connection: close`.
  void shutdown() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      self->closing_ = true;
      if (!self->handling_)
        self->close();
    });
  }

  /// Closes at once (from any thread), whatever it was doing.
  void abort() {
    net::post(stream_.get_executor(),
              [self = shared_from_this()] { self->close(); });
  }

  /// The answer to the current request (from any thread).
  void answer(response r) {
    net::post(stream_.get_executor(),
              [self = shared_from_this(), r = std::move(r)]() mutable {
                self->write(std::move(r));
              });
  }

 private:
  void read_header() {
    if (closing_ || srv_->stopping) {
      close();
      return;
    }
    parser_.emplace();
    parser_->body_limit(srv_->opts.max_body_bytes);
    parser_->header_limit(16 * 1024);
    auto& o = srv_->opts;
    stream_.expires_after(served_ == 0 ? o.header_timeout.ms()
                                       : o.idle_timeout.ms());
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             beast::bind_front_handler(&session::on_header,
                                                       shared_from_this()));
  }

  void on_header(beast::error_code ec, std::size_t) {
    if (ec)
      return fail(ec);
    if (parser_->is_done())
      return on_body({}, 0);
    stream_.expires_after(srv_->opts.read_timeout.ms());
    bhttp::async_read(stream_, buffer_, *parser_,
                      beast::bind_front_handler(&session::on_body,
                                                shared_from_this()));
  }

  void on_body(beast::error_code ec, std::size_t) {
    if (ec)
      return fail(ec);
    stream_.expires_never();
    auto msg = parser_->release();
    keep_alive_ = msg.keep_alive();
    request req;
    req.method = std::string{msg.method_string()};
    req.target = std::string{msg.target()};
    req.headers.reserve(8);
    for (auto& f : msg) {
      std::string name{f.name_string()};
      for (auto& c : name)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      req.headers.emplace_back(std::move(name), std::string{f.value()});
    }
    req.body = std::move(msg.body());
    handling_ = true;
    ++served_;
    auto table = srv_->table();
    auto it = table->find(route_key(req.method, req.path()));
    if (it == table->end()) {
      ++srv_->n_not_found;
      auto known = srv_->known_paths();
      write(response{known->count(std::string{req.path()}) ? 405 : 404,
                     {}, "text/plain; charset=utf-8", {}});
      return;
    }
    ++srv_->n_requests;
    auto x = std::make_shared<internal::exchange>();
    x->conn = shared_from_this();
    responder r{x};
    try {
      (*it->second)(req, r);
    } catch (const std::exception& e) {
      r.respond(response{500, "internal error", "text/plain; charset=utf-8", {}});
      log::error("http", fmt::format("handler for {} {} threw: {}", req.method,
                                     req.path(), e.what()));
    } catch (...) {
      r.respond(500);
    }
  }

  void write(response r) {
    if (!handling_ || writing_)
      return; // a stale answer
    writing_ = true;
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>();
    res->result(static_cast<unsigned>(r.status));
    res->version(11);
    if (!r.body.empty() || r.status >= 200)
      res->set(bhttp::field::content_type, r.content_type);
    for (auto& [k, v] : r.headers)
      res->set(k, v);
    res->body() = std::move(r.body);
    bool keep = keep_alive_ && !closing_ && !srv_->stopping && r.status != 413
                && r.status != 400 && r.status != 431;
    res->keep_alive(keep);
    res->prepare_payload();
    stream_.expires_after(srv_->opts.read_timeout.ms());
    bhttp::async_write(stream_, *res,
                       [self = shared_from_this(), res, keep](
                         beast::error_code ec, std::size_t) {
                         self->writing_ = false;
                         self->handling_ = false;
                         if (ec || !keep)
                           return self->close();
                         self->read_header();
                       });
  }

  void fail(beast::error_code ec) {
    if (ec == beast::error::timeout) {
      ++srv_->n_timeouts;
      return close();
    }
    if (ec == bhttp::error::body_limit) {
      ++srv_->n_too_large;
      handling_ = true;
      keep_alive_ = false;
      return write(response{413, "request body too large",
                            "text/plain; charset=utf-8", {}});
    }
    if (ec == bhttp::error::header_limit) {
      ++srv_->n_bad;
      handling_ = true;
      keep_alive_ = false;
      return write(response{431, {}, "text/plain; charset=utf-8", {}});
    }
    if (ec == bhttp::error::end_of_stream || ec == net::error::eof
        || ec == net::error::operation_aborted
        || ec == net::error::connection_reset
        || ec == bhttp::error::partial_message)
      return close();
    if (&ec.category()
        == &bhttp::make_error_code(bhttp::error::bad_target).category()) {
      ++srv_->n_bad;
      handling_ = true;
      keep_alive_ = false;
      return write(response{400, "bad request", "text/plain; charset=utf-8", {}});
    }
    close();
  }

  void close() {
    if (closed_)
      return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
    srv_->remove(this);
  }

  beast::tcp_stream stream_;
  std::shared_ptr<internal::server_state> srv_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::uint64_t served_ = 0;
  bool keep_alive_ = true;
  bool handling_ = false;
  bool writing_ = false;
  bool closing_ = false;
  bool closed_ = false;
};

} // namespace

namespace internal {

exchange::~exchange() {
  if (!done.exchange(true) && conn)
    conn->answer(response{500, "no answer", "text/plain; charset=utf-8", {}});
}

} // namespace internal

bool responder::respond(response r) const {
  if (!x_ || x_->done.exchange(true))
    return false;
  x_->conn->answer(std::move(r));
  return true;
}

bool responder::respond(int status) const {
  return respond(response{status, {}, "text/plain; charset=utf-8", {}});
}

bool responder::answered() const noexcept {
  return !x_ || x_->done.load();
}

// -- server_state -------------------------------------------------------------

namespace internal {

void server_state::do_accept() {
  acceptor->async_accept(
    net::make_strand(ioc),
    [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
      if (ec) {
        if (ec == net::error::operation_aborted || self->stopping)
          return;
      } else if (!self->stopping) {
        beast::error_code ignored;
        socket.set_option(tcp::no_delay{true}, ignored);
        ++self->n_connections;
        auto s = std::make_shared<session>(std::move(socket), self);
        self->add(s);
        s->start();
      }
      if (!self->stopping)
        self->do_accept();
    });
}

void server_state::add(const std::shared_ptr<session>& s) {
  std::lock_guard guard{sessions_mtx};
  sessions.emplace(s.get(), s);
}

void server_state::remove(session* s) {
  std::lock_guard guard{sessions_mtx};
  sessions.erase(s);
  if (sessions.empty())
    sessions_cv.notify_all();
}

} // namespace internal

// -- server -------------------------------------------------------------------

server::server(server_options opts) {
  if (opts.io_threads == 0)
    throw invalid_argument_error("io_threads",
                                 "http server_options.io_threads must be > 0");
  if (opts.max_body_bytes == 0)
    throw invalid_argument_error(
      "max_body_bytes", "http server_options.max_body_bytes must be > 0");
  auto positive = [](const duration& d, const char* name) {
    if (d.count() <= 0)
      throw invalid_argument_error(
        name, fmt::format("http server_options.{} must be > 0", name));
  };
  positive(opts.header_timeout, "header_timeout");
  positive(opts.read_timeout, "read_timeout");
  positive(opts.idle_timeout, "idle_timeout");
  positive(opts.shutdown_timeout, "shutdown_timeout");
  impl_ = std::make_shared<internal::server_state>(std::move(opts));
}

server::~server() {
  stop();
}

void server::route(std::string method, std::string path, handler h) {
  auto& i = *impl_;
  std::lock_guard guard{i.routes_mtx};
  auto next = std::make_shared<route_table>(*i.routes);
  i.routed_paths.insert(path);
  (*next)[route_key(method, path)] = std::make_shared<handler>(std::move(h));
  i.routes = std::move(next);
  i.paths = std::make_shared<std::unordered_set<std::string>>(i.routed_paths);
}

void server::remove_route(const std::string& method, const std::string& path) {
  auto& i = *impl_;
  std::lock_guard guard{i.routes_mtx};
  auto next = std::make_shared<route_table>(*i.routes);
  next->erase(route_key(method, path));
  bool still = false;
  for (auto& [k, v] : *next)
    if (std::string_view{k}.substr(k.find(' ') + 1) == path)
      still = true;
  if (!still)
    i.routed_paths.erase(path);
  i.routes = std::move(next);
  i.paths = std::make_shared<std::unordered_set<std::string>>(i.routed_paths);
}

void server::start() {
  auto& i = *impl_;
  std::lock_guard guard{i.lifecycle_mtx};
  if (i.started)
    return;
  try {
    auto addr = net::ip::make_address(i.opts.address);
    tcp::endpoint ep{addr, i.opts.port};
    i.acceptor.emplace(i.ioc);
    i.acceptor->open(ep.protocol());
    i.acceptor->set_option(net::socket_base::reuse_address(true));
    i.acceptor->bind(ep);
    i.acceptor->listen(net::socket_base::max_listen_connections);
    i.bound_port = i.acceptor->local_endpoint().port();
  } catch (const std::exception& e) {
    i.acceptor.reset();
    throw error(errc::provider_error,
                fmt::format("http server: cannot listen on {}:{}: {}",
                            i.opts.address, i.opts.port, e.what()));
  }
  i.started = true;
  i.do_accept();
  for (std::size_t n = 0; n < i.opts.io_threads; ++n)
    i.threads.emplace_back([p = impl_] { p->ioc.run(); });
}

void server::stop() {
  auto& i = *impl_;
  std::lock_guard guard{i.lifecycle_mtx};
  if (!i.started || i.stopped)
    return;
  i.stopped = true;
  i.stopping = true;
  net::post(i.ioc, [p = impl_] {
    beast::error_code ec;
    p->acceptor->close(ec);
  });
  std::vector<std::shared_ptr<session>> live;
  {
    std::lock_guard g{i.sessions_mtx};
    for (auto& [ptr, weak] : i.sessions)
      if (auto s = weak.lock())
        live.push_back(std::move(s));
  }
  for (auto& s : live)
    s->shutdown();
  live.clear();
  {
    std::unique_lock g{i.sessions_mtx};
    i.sessions_cv.wait_for(g, i.opts.shutdown_timeout.ms(),
                           [&] { return i.sessions.empty(); });
  }
  i.ioc.stop();
  for (auto& t : i.threads)
    t.join();
  i.threads.clear();
  // Close what is left (past the bound) and run the handlers that
  // cancellation completes, so nothing keeps the server's state alive.
  {
    std::lock_guard g{i.sessions_mtx};
    for (auto& [ptr, weak] : i.sessions)
      if (auto s = weak.lock())
        live.push_back(std::move(s));
  }
  for (auto& s : live)
    s->abort();
  live.clear();
  i.ioc.restart();
  i.ioc.poll();
}

void server::after(std::chrono::milliseconds delay, std::function<void()> fn) {
  auto& i = *impl_;
  if (i.stopping)
    return;
  auto timer = std::make_shared<net::steady_timer>(i.ioc, delay);
  timer->async_wait([timer, fn = std::move(fn)](beast::error_code ec) {
    if (!ec)
      fn();
  });
}

std::uint16_t server::port() const noexcept {
  return impl_->bound_port;
}

std::string server::url() const {
  return fmt::format("http://{}:{}", impl_->opts.address, impl_->bound_port);
}

server_stats server::stats() const {
  auto& i = *impl_;
  return server_stats{i.n_connections, i.n_requests, i.n_not_found,
                      i.n_too_large,   i.n_timeouts, i.n_bad};
}

} // namespace botmesh::http
