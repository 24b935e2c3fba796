#include <botmesh/providers/http/http_server.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <iterator>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/internal/in_flight.hpp>
#include <botmesh/runtime/core/internal/text.hpp>
#include <botmesh/runtime/core/log.hpp>

namespace botmesh::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using steady = std::chrono::steady_clock;

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

namespace internal {

class session;

using route_table = std::unordered_map<std::string, std::shared_ptr<handler>>;

void route_key(std::string& out, std::string_view method, std::string_view path) {
  out.clear();
  out.reserve(method.size() + path.size() + 1);
  out += method;
  out.push_back(' ');
  out += path;
}

std::string route_key(std::string_view method, std::string_view path) {
  std::string k;
  route_key(k, method, path);
  return k;
}

/// One I/O thread: its own io_context, the connections it owns and its
/// view of the routes. Everything here is touched by that thread only
/// (after `start`, until `stop` has joined it), so a connection needs no
/// strand and no lock.
struct io_thread {
  net::io_context ioc{1};
  std::thread thread;
  /// Wakes every `sweep_period` to close connections past their deadline:
  /// one timer a thread instead of a timer operation per read and write.
  net::steady_timer sweep{ioc};
  session* first = nullptr; ///< the connections of this thread (a list)
  std::uint64_t routes_seen = ~std::uint64_t{0};
  std::shared_ptr<const route_table> routes;
  std::string key; ///< scratch for route lookups
};

struct server_state;

// The server whose I/O thread this is, if any: a stop asked for from one
// of its handlers cannot wait for that handler, nor join its own thread.
static thread_local const server_state* io_server = nullptr;

struct server_state : std::enable_shared_from_this<server_state> {
  server_options opts;
  std::vector<std::unique_ptr<io_thread>> io;
  std::optional<tcp::acceptor> acceptor; // runs on io[0]
  std::optional<net::steady_timer> accept_retry; // io[0] too
  /// `server::after` timers, on io[0] too; stop() cancels them.
  std::unordered_map<std::uint64_t, std::unique_ptr<net::steady_timer>> timers;
  std::uint64_t next_timer = 0;
  std::size_t next_io = 0;               // the acceptor's, round robin
  std::uint16_t bound_port = 0;
  std::chrono::milliseconds sweep_period{250};

  std::mutex routes_mtx;
  std::shared_ptr<const route_table> routes = std::make_shared<route_table>();
  std::atomic<std::uint64_t> routes_version{0};
  std::unordered_set<std::string> routed_paths; // under routes_mtx
  std::shared_ptr<const std::unordered_set<std::string>> paths =
    std::make_shared<std::unordered_set<std::string>>();

  std::mutex sessions_mtx;
  std::condition_variable sessions_cv;
  std::size_t live = 0; // connections accepted and not closed
  bool accept_paused = false; // at max_connections (under sessions_mtx)
  std::atomic<bool> stopping{false};
  /// Set by stop() once the threads are joined; `posting` counts answers
  /// being posted, so stop() knows none lands after its last poll.
  std::atomic<bool> io_finished{false};
  std::atomic<int> posting{0};
  bool started = false;
  bool stopped = false;
  std::mutex lifecycle_mtx;
  /// A stop asked for on one of the I/O threads (see server::stop): begun
  /// once, run by `stopper`. stopper_mtx guards the handle only and is
  /// never held while joining; an I/O thread never waits for
  /// lifecycle_mtx, which a stop holds while it joins the I/O threads.
  std::atomic<bool> stop_begun{false};
  std::mutex stopper_mtx;
  std::thread stopper;

  std::atomic<std::uint64_t> n_connections{0}, n_requests{0}, n_not_found{0},
    n_too_large{0}, n_timeouts{0}, n_bad{0}, n_accept_errors{0},
    n_peers_gone{0}, n_at_capacity{0};

  explicit server_state(server_options o) : opts(std::move(o)) {
    for (std::size_t n = 0; n < opts.io_threads; ++n)
      io.push_back(std::make_unique<io_thread>());
    // Timeouts are kept to within an eighth of the shortest one.
    auto shortest = std::min({opts.header_timeout.ms(), opts.read_timeout.ms(),
                              opts.idle_timeout.ms()});
    sweep_period = std::clamp(shortest / 8, std::chrono::milliseconds{5},
                              std::chrono::milliseconds{250});
  }

  /// The route for `method` and `path`, as `t` last saw the table; it
  /// looks again (under the lock) only when the routes changed.
  const handler* find(io_thread& t, std::string_view method, std::string_view path) {
    auto v = routes_version.load(std::memory_order_acquire);
    if (v != t.routes_seen) {
      std::lock_guard guard{routes_mtx};
      t.routes = routes;
      t.routes_seen = routes_version.load(std::memory_order_relaxed);
    }
    route_key(t.key, method, path);
    auto it = t.routes->find(t.key);
    return it == t.routes->end() ? nullptr : it->second.get();
  }

  std::shared_ptr<const std::unordered_set<std::string>> known_paths() {
    std::lock_guard guard{routes_mtx};
    return paths;
  }

  /// Posts `fn` to `ioc` unless stop() has finished the I/O (then drops
  /// it): a handler posted to an io_context nobody runs would keep what it
  /// holds alive. `posting` (seq_cst, paired with shut_down()'s
  /// io_finished) tells stop() a post is under way.
  template <class F>
  void post_unless_finished(net::io_context& ioc, F&& fn) {
    botmesh::internal::in_flight guard{posting};
    if (!io_finished.load())
      net::post(ioc, std::forward<F>(fn));
  }

  void do_accept();
  void arm_sweep(io_thread& t);
  /// stop()'s work, under lifecycle_mtx.
  void shut_down();
  void closed() {
    bool resume = false;
    {
      std::lock_guard guard{sessions_mtx};
      if (--live == 0)
        sessions_cv.notify_all();
      if (accept_paused && live < opts.max_connections) {
        accept_paused = false;
        resume = true;
      }
    }
    // The acceptor belongs to io[0].
    if (resume && !stopping)
      post_unless_finished(io.front()->ioc, [p = shared_from_this()] {
        if (!p->stopping)
          p->do_accept();
      });
  }
};

/// One request waiting for its answer: the link from a `responder` back to
/// its connection.
struct exchange {
  std::shared_ptr<session> conn;
  std::uint64_t served = 0; // which request of the connection
  std::atomic<bool> done{false};
  ~exchange();
};

/// Beast's parser, writing straight into the connection's `request` (whose
/// strings keep their capacity from one request to the next) instead of
/// into a field container allocated per request.
class request_reader final : public bhttp::basic_parser<true> {
 public:
  explicit request_reader(request& r) : r_(r) {
    // nop
  }

 private:
  void on_request_impl(bhttp::verb, beast::string_view method,
                       beast::string_view target, int version,
                       beast::error_code&) override {
    version_ = version;
    r_.method.assign(method.data(), method.size());
    r_.target.assign(target.data(), target.size());
    r_.body.clear();
  }

  void on_response_impl(int, beast::string_view, int, beast::error_code&) override {
    // requests only
  }

  void on_field_impl(bhttp::field f, beast::string_view name,
                     beast::string_view value, beast::error_code&) override {
    // A chunked body's trailer fields come after the header is complete:
    // they are not headers (a check that read the header must not see a
    // field added after the body), so they are dropped.
    if (header_done_)
      return;
    if (f == bhttp::field::transfer_encoding) {
      // Only one coding is understood: chunked, alone (see on_header_impl);
      // empty list elements ("chunked,") do not count (RFC 9110 5.6.1).
      std::size_t codings = 0;
      bool chunked = false;
      std::string_view rest{value.data(), value.size()};
      while (true) {
        auto comma = rest.find(',');
        auto item = botmesh::internal::trim(rest.substr(0, comma));
        if (!item.empty()) {
          ++codings;
          chunked = botmesh::internal::ascii_iequals(item, "chunked");
        }
        if (comma == std::string_view::npos)
          break;
        rest.remove_prefix(comma + 1);
      }
      coding_ok_ = !coded_ && codings == 1 && chunked;
      coded_ = true;
    }
    if (n_ == r_.headers.size())
      r_.headers.emplace_back();
    auto& [k, v] = r_.headers[n_++];
    k.assign(name.data(), name.size());
    botmesh::internal::ascii_lower(k);
    v.assign(value.data(), value.size());
  }

  void on_header_impl(beast::error_code& ec) override {
    header_done_ = true;
    r_.headers.resize(n_);
    // RFC 9112 6.3: a request whose Transfer-Encoding does not end in
    // chunked has no length a server can know. The parser reads it as
    // bodiless (or framed by a Content-Length after it), so the body's
    // bytes would be answered as the next request: a proxy that frames it
    // otherwise and reuses the connection would have a request smuggled
    // past it. Another coding (gzip, chunked) this server does not undo,
    // so its body would reach the handler still coded. Refused either way,
    // and the connection closes.
    // HTTP/1.0 has no Transfer-Encoding: its framing is faulty whatever it
    // says (RFC 9112 6.1), and a 1.0 peer may not mean chunked by it.
    if (coded_ && (!coding_ok_ || version_ < 11))
      ec = bhttp::error::bad_transfer_encoding;
  }

  void on_body_init_impl(const boost::optional<std::uint64_t>& length,
                         beast::error_code&) override {
    if (length) // at most the body limit: the parser checked it
      r_.body.reserve(static_cast<std::size_t>(*length) + request::body_padding);
  }

  std::size_t on_body_impl(beast::string_view s, beast::error_code&) override {
    r_.body.append(s.data(), s.size());
    return s.size();
  }

  void on_chunk_header_impl(std::uint64_t, beast::string_view,
                            beast::error_code&) override {
    // nop
  }

  std::size_t on_chunk_body_impl(std::uint64_t, beast::string_view s,
                                 beast::error_code&) override {
    r_.body.append(s.data(), s.size());
    return s.size();
  }

  void on_finish_impl(beast::error_code&) override {
    // Zeroed spare capacity after the body, so a JSON parser that reads
    // past the end (simdjson) needs no padded copy.
    auto n = r_.body.size();
    r_.body.append(request::body_padding, '\0');
    r_.body.resize(n);
  }

  request& r_;
  std::size_t n_ = 0;
  bool header_done_ = false;
  int version_ = 11;
  bool coded_ = false;     // a Transfer-Encoding field came
  bool coding_ok_ = false; // and it was one, saying chunked alone
};

bool clean_header_text(std::string_view s) {
  return s.find_first_of("\r\n") == std::string_view::npos;
}

using botmesh::internal::ascii_iequals;

/// The bytes of `r` (HTTP/1.1), into `out`.
// `head`: the answer to a HEAD request, served by the path's GET route: the
// GET answer's header (its Content-Length too), no body (RFC 9110 9.3.2).
void serialize(const response& r, bool keep_alive, std::string& out,
               bool head = false) {
  out.clear();
  auto reason = bhttp::obsolete_reason(static_cast<bhttp::status>(r.status));
  fmt::format_to(std::back_inserter(out), "HTTP/1.1 {} {}\r\n", r.status,
                 std::string_view{reason.data(), reason.size()});
  // 1xx, 204 and 304 carry no body (RFC 9110 6.4.1).
  bool bodyless = r.status < 200 || r.status == 204 || r.status == 304;
  bool own_type = false;
  for (auto& [k, v] : r.headers) {
    if (ascii_iequals(k, "content-length") || ascii_iequals(k, "connection")
        || ascii_iequals(k, "transfer-encoding"))
      continue; // the server's to set
    if (!clean_header_text(k) || !clean_header_text(v) || k.empty()) {
      log::error("http", fmt::format("response header {:?} dropped: a name or "
                                     "value with CR or LF",
                                     k));
      continue;
    }
    own_type = own_type || ascii_iequals(k, "content-type");
    out += k;
    out += ": ";
    out += v;
    out += "\r\n";
  }
  if (!bodyless) {
    if (!own_type) {
      out += "Content-Type: ";
      out += r.content_type;
      out += "\r\n";
    }
    fmt::format_to(std::back_inserter(out), "Content-Length: {}\r\n",
                   r.body.size());
  }
  if (!keep_alive)
    out += "Connection: close\r\n";
  out += "\r\n";
  if (!bodyless && !head)
    out += r.body;
}

/// A connection. It lives on one I/O thread; `answer` is the only member
/// called from elsewhere, and it posts. Its deadline is a field the
/// thread's sweep reads.
class session : public std::enable_shared_from_this<session> {
 public:
  session(tcp::socket&& socket, std::shared_ptr<server_state> srv, io_thread& t)
    : srv_(std::move(srv)), socket_(std::move(socket)), t_(t) {
    // nop
  }

  /// On the connection's thread.
  void start() {
    next_ = t_.first;
    if (next_)
      next_->prev_ = this;
    t_.first = this;
    linked_ = true;
    beast::error_code ec;
    socket_.non_blocking(true, ec);
    if (ec)
      return close();
    read_request();
  }

  /// On stop (on the connection's thread): close an idle connection, let
  /// the one answering finish with `Connection: close`.
  void shutdown() {
    closing_ = true;
    if (!handling_)
      close();
  }

  /// The answer to the current request (from any thread). Dropped once
  /// the server's I/O has finished: a handler posted to an io_context that
  /// nobody runs would keep the session and the server's state alive.
  void answer(response r) {
    srv_->post_unless_finished(t_.ioc,
                               [self = shared_from_this(), r = std::move(r)]() mutable {
                                 self->write(std::move(r));
                               });
  }

  /// Closed (from any thread; a hint: it may close right after).
  bool gone() const noexcept {
    return gone_.load(std::memory_order_relaxed);
  }

  /// responder::watch_peer (from any thread).
  void watch(std::uint64_t served) {
    srv_->post_unless_finished(t_.ioc, [self = shared_from_this(), served] {
      self->watch_peer(served);
    });
  }

  /// Called by the sweep: closes the connection when its deadline passed.
  void check(steady::time_point now) {
    if (now >= deadline_) {
      close();
      // Counted once closed: who reads the count may rely on the close
      // (a client that sees it then finds its pooled connection shut).
      ++srv_->n_timeouts;
    }
  }

  /// Closes at once, whatever it was doing (on the connection's thread, or
  /// after the threads were joined).
  void close() {
    if (closed_)
      return;
    closed_ = true;
    gone_.store(true, std::memory_order_relaxed);
    deadline_ = steady::time_point::max();
    if (linked_) {
      (prev_ ? prev_->next_ : t_.first) = next_;
      if (next_)
        next_->prev_ = prev_;
      linked_ = false;
    }
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    srv_->closed();
  }

  session* next_ = nullptr;

 private:
  void read_request() {
    if (closing_ || srv_->stopping) {
      close();
      return;
    }
    head_ = false;
    parser_.emplace(req_);
    parser_->eager(true);
    parser_->body_limit(srv_->opts.max_body_bytes);
    parser_->header_limit(header_limit);
    header_done_ = false;
    started_ = false;
    auto& o = srv_->opts;
    deadline_ = steady::now()
                + (served_ == 0 ? o.header_timeout.ms() : o.idle_timeout.ms());
    parse();
  }

  /// Feeds what is buffered to the parser; reads more when it needs more.
  void parse() {
    if (!started_ && served_ > 0 && buffer_.size() > 0) {
      // The next request on a kept-alive connection has begun: its header
      // gets header_timeout from here, as a new connection's does, not
      // what is left of the idle wait (a client that dribbles a header
      // would hold the connection's slot for idle_timeout).
      started_ = true;
      deadline_ = steady::now() + srv_->opts.header_timeout.ms();
    }
    while (buffer_.size() > 0) {
      beast::error_code ec;
      auto used = parser_->put(buffer_.data(), ec);
      buffer_.consume(used);
      bool more = ec == bhttp::error::need_more;
      if (ec && !more)
        return fail(ec);
      // Checked before `more`: a header can end in a read that stops
      // inside the first chunk-size line.
      if (!header_done_ && parser_->is_header_done()) {
        header_done_ = true;
        deadline_ = steady::now() + srv_->opts.read_timeout.ms();
      }
      if (more || used == 0) {
        // Nothing taken from a full buffer: a chunk-size line or trailer
        // that never ends would grow it until the read timeout.
        if (buffer_.size() >= max_pending)
          return fail(bhttp::error::bad_chunk);
        break;
      }
      if (parser_->is_done())
        return dispatch();
    }
    // Asio tries the read at once and waits on the reactor only when
    // nothing is there yet.
    socket_.async_read_some(buffer_.prepare(read_chunk),
                            [self = shared_from_this()](beast::error_code ec,
                                                        std::size_t n) {
                              self->on_read(ec, n);
                            });
  }

  void on_read(beast::error_code ec, std::size_t n) {
    if (closed_)
      return;
    if (ec)
      return fail(ec);
    buffer_.commit(n);
    parse();
  }

  void dispatch() {
    keep_alive_ = parser_->keep_alive();
    parser_.reset();
    handling_ = true;
    deadline_ = steady::time_point::max(); // the bot's turn is not timed here
    ++served_;
    auto* h = srv_->find(t_, req_.method, req_.path());
    // A HEAD is answered wherever a GET is (RFC 9110 9.1): an uptime check
    // by HEAD on /healthz must not read as a failing probe. No answer to a
    // HEAD has a body, whichever route gave it (a client reads none).
    if (!h && req_.method == "HEAD")
      h = srv_->find(t_, "GET", req_.path());
    head_ = h && req_.method == "HEAD";
    if (!h) {
      ++srv_->n_not_found;
      auto known = srv_->known_paths();
      response r{404, {}, "text/plain; charset=utf-8", {}};
      if (known->count(std::string{req_.path()})) {
        // A 405 says which methods the path has (RFC 9110 15.5.6).
        r.status = 405;
        std::string allow;
        bool get = srv_->find(t_, "GET", req_.path()) != nullptr;
        for (std::string_view m : {"GET", "HEAD", "POST", "PUT", "PATCH",
                                   "DELETE", "OPTIONS"})
          if ((m == "HEAD" && get) || srv_->find(t_, m, req_.path()))
            allow += (allow.empty() ? "" : ", ") + std::string{m};
        r.headers.emplace_back("Allow", std::move(allow));
      }
      // Posted, not written here: pipelined unrouted requests would
      // otherwise recurse (dispatch, write, read, dispatch...).
      answer(std::move(r));
      return;
    }
    ++srv_->n_requests;
    auto x = std::make_shared<exchange>();
    x->conn = shared_from_this();
    x->served = served_;
    responder r{std::move(x)};
    try {
      (*h)(req_, r);
    } catch (const std::exception& e) {
      r.respond(response{500, "internal error", "text/plain; charset=utf-8", {}});
      log::error("http", fmt::format("handler for {} {} threw: {}", req_.method,
                                     req_.path(), e.what()));
    } catch (...) {
      r.respond(500);
    }
  }

  // While request `served` is handled nothing is read (the next request
  // waits in the socket), so a client that went away would go unnoticed
  // until the answer is written into the void, and the answer counted as
  // delivered (a Telegram reply in the webhook response, say). Readiness
  // is watched instead: an end of stream or a reset closes the connection,
  // and the request's responder then refuses its answer, so the caller can
  // deliver it another way. Data (a pipelined request) is left unread, and
  // the watch ends there.
  void watch_peer(std::uint64_t served) {
    if (closed_ || !handling_ || served_ != served)
      return;
    socket_.async_wait(
      tcp::socket::wait_read,
      [self = shared_from_this(), served](beast::error_code ec) {
        if (ec || self->closed_ || !self->handling_ || self->served_ != served)
          return;
        char c;
        auto n = ::recv(self->socket_.native_handle(), &c, 1,
                        MSG_PEEK | MSG_DONTWAIT);
        if (n > 0)
          return;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
          return self->watch_peer(served); // woken for nothing
        ++self->srv_->n_peers_gone;
        self->close();
      });
  }

  void write(response r) {
    if (closed_ || !handling_ || writing_)
      return; // a stale answer
    writing_ = true;
    bool keep = keep_alive_ && !closing_ && !srv_->stopping && r.status != 413
                && r.status != 400 && r.status != 431;
    serialize(r, keep, out_, head_);
    // Most answers fit the socket's buffer: written here, with no
    // asynchronous operation and no completion to run.
    std::size_t sent = 0;
    while (sent < out_.size()) {
      beast::error_code ec;
      auto n = socket_.write_some(net::buffer(out_.data() + sent, out_.size() - sent), ec);
      if (ec == net::error::would_block || ec == net::error::try_again)
        break;
      if (ec)
        return close();
      sent += n;
    }
    if (sent == out_.size())
      return written(keep);
    deadline_ = steady::now() + srv_->opts.read_timeout.ms();
    net::async_write(socket_, net::buffer(out_.data() + sent, out_.size() - sent),
                     [self = shared_from_this(), keep](beast::error_code ec,
                                                       std::size_t) {
                       if (self->closed_)
                         return;
                       if (ec)
                         return self->close();
                       self->written(keep);
                     });
  }

  void written(bool keep) {
    writing_ = false;
    handling_ = false;
    if (out_.capacity() > keep_capacity)
      std::string{}.swap(out_);
    if (req_.body.capacity() > keep_capacity)
      std::string{}.swap(req_.body);
    if (!keep)
      return linger_ ? linger() : close();
    read_request();
  }

  // After refusing a request whose rest is still arriving (a body over the
  // cap): closing at once with unread bytes makes the kernel answer with a
  // reset, and a client still writing its body never reads the answer. The
  // sending side is shut, and what comes is read and dropped until the
  // client closes or the read timeout passes (the sweep closes it then).
  void linger() {
    if (closing_ || srv_->stopping)
      return close(); // a stopping server waits for nobody's drain
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec)
      return close();
    deadline_ = steady::now() + srv_->opts.read_timeout.ms();
    out_.resize(read_chunk);
    drain();
  }

  void drain() {
    socket_.async_read_some(net::buffer(out_.data(), out_.size()),
                            [self = shared_from_this()](beast::error_code ec,
                                                        std::size_t) {
                              if (self->closed_)
                                return;
                              if (ec)
                                return self->close();
                              self->drain();
                            });
  }

  void fail(beast::error_code ec) {
    if (ec == bhttp::error::body_limit) {
      // Logged: a platform retries a refused delivery with the same body,
      // so the operator must learn that the cap is below what it sends.
      // Before any authentication, so the 1st, 2nd, 4th, 8th... only, and
      // without the target (a secret may be in its path).
      auto n = srv_->n_too_large.load() + 1;
      if ((n & (n - 1)) == 0)
        log::warn("http", fmt::format("a request body over max_body_bytes "
                                      "({}) was answered 413 ({} so far)",
                                      srv_->opts.max_body_bytes, n));
      return refuse(srv_->n_too_large, 413, "request body too large");
    }
    if (ec == bhttp::error::header_limit)
      return refuse(srv_->n_bad, 431,
                    "request header fields too large (over 16 KiB)");
    // What the parser found wrong goes in the answer ("bad field", "bad
    // version"...): the sender of a malformed request can see what to fix.
    if (&ec.category()
        == &bhttp::make_error_code(bhttp::error::bad_target).category())
      return refuse(srv_->n_bad, 400, "bad request: " + ec.message());
    close(); // end of stream, reset, aborted: nothing to answer
  }

  /// Answers a request the parser refused, then closes (write() does not
  /// keep a connection alive after 400, 413 or 431).
  void refuse(std::atomic<std::uint64_t>& counter, int status, std::string body) {
    ++counter;
    handling_ = true;
    head_ = false; // the refusal's text is the point
    keep_alive_ = false;
    linger_ = true;
    write(response{status, std::move(body), "text/plain; charset=utf-8", {}});
  }

  static constexpr std::size_t read_chunk = 16 * 1024;
  static constexpr std::size_t header_limit = 16 * 1024;
  /// Bytes the parser may leave unconsumed (a header in progress is
  /// bounded by `header_limit` already).
  static constexpr std::size_t max_pending = header_limit + read_chunk;
  /// Past a request or an answer this large, the connection gives the
  /// memory back instead of keeping it for the next one.
  static constexpr std::size_t keep_capacity = 64 * 1024;

  // srv_ first: it is destroyed last, after the socket, whose destructor
  // still uses the io_context's services the state owns.
  std::shared_ptr<server_state> srv_;
  tcp::socket socket_;
  io_thread& t_;
  session* prev_ = nullptr;
  bool linked_ = false;
  beast::flat_buffer buffer_;
  std::optional<request_reader> parser_;
  request req_;     // reused: its strings keep their capacity
  std::string out_; // reused: the answer's bytes
  steady::time_point deadline_ = steady::time_point::max();
  bool started_ = false; // bytes of the request being read have come
  std::uint64_t served_ = 0;
  bool header_done_ = false;
  bool keep_alive_ = true;
  bool head_ = false; // a HEAD served by a GET route: no body written
  bool handling_ = false;
  bool writing_ = false;
  bool closing_ = false;
  bool closed_ = false;
  bool linger_ = false; // refused mid-request: drain before closing
  std::atomic<bool> gone_{false};
};

exchange::~exchange() {
  if (!done.exchange(true) && conn)
    conn->answer(response{500, "no answer", "text/plain; charset=utf-8", {}});
}

} // namespace internal

bool responder::respond(response r) const {
  if (!x_ || x_->conn->gone() || x_->done.exchange(true))
    return false;
  x_->conn->answer(std::move(r));
  return true;
}

bool responder::respond(int status) const {
  return respond(response{status, {}, "text/plain; charset=utf-8", {}});
}

void responder::watch_peer() const {
  if (x_ && !x_->done.load())
    x_->conn->watch(x_->served);
}

bool responder::answered() const noexcept {
  return !x_ || x_->done.load();
}

// -- server_state -------------------------------------------------------------

namespace internal {

void server_state::do_accept() {
  auto& t = *io[next_io];
  next_io = (next_io + 1) % io.size();
  acceptor->async_accept(
    t.ioc, [self = shared_from_this(), &t](beast::error_code ec, tcp::socket socket) {
      if (ec) {
        if (ec == net::error::operation_aborted || self->stopping)
          return;
        // Out of descriptors or memory: accepting again at once would
        // spin; the pending connections wait in the backlog meanwhile.
        ++self->n_accept_errors;
        if (self->n_accept_errors.load() % 1000 == 1)
          log::error("http", fmt::format("accept failed: {}; retrying in 100 ms",
                                         ec.message()));
        self->accept_retry->expires_after(std::chrono::milliseconds{100});
        self->accept_retry->async_wait([self](beast::error_code e) {
          if (!e && !self->stopping)
            self->do_accept();
        });
        return;
      }
      bool full = false;
      if (!self->stopping) {
        beast::error_code ignored;
        socket.set_option(tcp::no_delay{true}, ignored);
        ++self->n_connections;
        {
          std::lock_guard guard{self->sessions_mtx};
          ++self->live;
          // At the cap: the next accept waits for a connection to close
          // (see closed()).
          full = self->accept_paused = self->live >= self->opts.max_connections;
        }
        if (full)
          ++self->n_at_capacity;
        auto s = std::make_shared<session>(std::move(socket), self, t);
        net::post(t.ioc, [s] { s->start(); });
      }
      if (!self->stopping && !full)
        self->do_accept();
    });
}

void server_state::arm_sweep(io_thread& t) {
  t.sweep.expires_after(sweep_period);
  t.sweep.async_wait([this, &t](beast::error_code ec) {
    if (ec)
      return;
    auto now = steady::now();
    for (auto* s = t.first; s;) {
      auto* next = s->next_; // check() may unlink s
      s->check(now);
      s = next;
    }
    arm_sweep(t);
  });
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
  if (opts.max_connections == 0)
    throw invalid_argument_error(
      "max_connections", "http server_options.max_connections must be > 0");
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
  // Destroyed on one of its own I/O threads: the stop's thread holds the
  // state and ends by itself.
  std::lock_guard guard{impl_->stopper_mtx};
  if (impl_->stopper.joinable())
    impl_->stopper.detach();
}

void server::route(std::string method, std::string path, handler h) {
  auto& i = *impl_;
  std::lock_guard guard{i.routes_mtx};
  auto next = std::make_shared<internal::route_table>(*i.routes);
  i.routed_paths.insert(path);
  (*next)[internal::route_key(method, path)] = std::make_shared<handler>(std::move(h));
  i.routes = std::move(next);
  i.paths = std::make_shared<std::unordered_set<std::string>>(i.routed_paths);
  i.routes_version.fetch_add(1, std::memory_order_release);
}

void server::remove_route(const std::string& method, const std::string& path) {
  auto& i = *impl_;
  std::lock_guard guard{i.routes_mtx};
  auto next = std::make_shared<internal::route_table>(*i.routes);
  next->erase(internal::route_key(method, path));
  bool still = false;
  for (auto& [k, v] : *next)
    if (std::string_view{k}.substr(k.find(' ') + 1) == path)
      still = true;
  if (!still)
    i.routed_paths.erase(path);
  i.routes = std::move(next);
  i.paths = std::make_shared<std::unordered_set<std::string>>(i.routed_paths);
  i.routes_version.fetch_add(1, std::memory_order_release);
}

void server::start() {
  auto& i = *impl_;
  // A stop begun on an I/O thread (a handler that stops the bot) ends
  // first: started now, the server would be shut down under the caller by
  // that stop's thread. Its thread takes lifecycle_mtx for the shutdown, so
  // it is joined (or, joined by a stop() meanwhile, waited for) without
  // holding that lock.
  std::unique_lock guard{i.lifecycle_mtx, std::defer_lock};
  for (;;) {
    std::thread pending;
    {
      std::lock_guard g{i.stopper_mtx};
      pending = std::move(i.stopper);
    }
    if (pending.joinable()) {
      pending.join();
      continue;
    }
    guard.lock();
    if (!i.stop_begun.load() || i.stopped || !i.started)
      break;
    guard.unlock();
    std::this_thread::yield();
  }
  if (i.started && !i.stopped)
    return;
  if (i.stopped) {
    // Started again after a stop (a transport closed and opened again: a
    // replica that lost a leadership and won it back).
    {
      std::lock_guard g{i.sessions_mtx};
      i.accept_paused = false;
    }
    for (auto& t : i.io)
      t->ioc.restart();
    i.io_finished = false;
    i.stop_begun = false;
    i.stopping = false;
    i.stopped = false;
    i.started = false;
  }
  try {
    auto addr = net::ip::make_address(i.opts.address);
    // The port it had, when it chose one: a webhook registered with the
    // platform names it.
    tcp::endpoint ep{addr, i.opts.port != 0 ? i.opts.port : i.bound_port};
    i.acceptor.emplace(i.io.front()->ioc);
    i.acceptor->open(ep.protocol());
    i.acceptor->set_option(net::socket_base::reuse_address(true));
    i.acceptor->bind(ep);
    i.acceptor->listen(net::socket_base::max_listen_connections);
    i.bound_port = i.acceptor->local_endpoint().port();
    i.accept_retry.emplace(i.io.front()->ioc);
  } catch (const std::exception& e) {
    i.acceptor.reset();
    throw error(errc::provider_error,
                fmt::format("http server: cannot listen on {}:{}: {}",
                            i.opts.address,
                            i.opts.port != 0 ? i.opts.port : i.bound_port,
                            e.what()));
  }
  i.started = true;
  try {
    for (auto& t : i.io) {
      i.arm_sweep(*t); // keeps run() from returning while idle
      t->thread = std::thread{[p = impl_, t = t.get()] {
        internal::io_server = p.get();
        t->ioc.run();
      }};
    }
    // Accepting only once every thread runs: a connection dealt to a
    // thread that failed to start would hold stop() for its whole bound.
    net::post(i.io.front()->ioc, [p = impl_] { p->do_accept(); });
  } catch (const std::exception& e) {
    i.shut_down(); // joins the threads that did start
    throw error(errc::provider_error,
                fmt::format("http server: cannot start its I/O threads: {}",
                            e.what()));
  }
}

namespace internal {

void server_state::shut_down() {
  auto& i = *this;
  i.stopped = true;
  i.stopping = true;
  net::post(i.io.front()->ioc, [p = shared_from_this()] {
    beast::error_code ec;
    p->acceptor->close(ec);
  });
  for (auto& t : i.io)
    net::post(t->ioc, [t = t.get()] {
      for (auto* s = t->first; s;) {
        auto* next = s->next_; // shutdown() may unlink s
        s->shutdown();
        s = next;
      }
    });
  {
    std::unique_lock g{i.sessions_mtx};
    i.sessions_cv.wait_for(g, i.opts.shutdown_timeout.ms(),
                           [&] { return i.live == 0; });
  }
  for (auto& t : i.io)
    t->ioc.stop();
  for (auto& t : i.io)
    if (t->thread.joinable())
      t->thread.join();
  // The threads are gone: close what is left (past the bound) from here,
  // then run what cancellation completes, so nothing keeps the server's
  // state alive.
  for (auto& t : i.io) {
    while (t->first)
      t->first->close();
    t->sweep.cancel();
  }
  i.accept_retry->cancel();
  for (auto& [id, timer] : i.timers)
    timer->cancel();
  i.io_finished = true;
  while (i.posting.load() != 0)
    std::this_thread::yield();
  for (auto& t : i.io) {
    t->ioc.restart();
    t->ioc.poll();
  }
}

} // namespace internal

void server::stop() {
  auto& i = *impl_;
  if (internal::io_server == &i) {
    // From a handler of this server (an error listener that stops the
    // bot, say): this thread can neither wait for its own request nor
    // join itself. A thread of its own stops the server once the handler
    // returned; the handler's request is answered like any in flight.
    if (i.stop_begun.exchange(true))
      return;
    i.stopping = true;
    std::lock_guard guard{i.stopper_mtx};
    try {
      i.stopper = std::thread{[p = impl_] {
        std::lock_guard g{p->lifecycle_mtx};
        if (p->started && !p->stopped)
          p->shut_down();
      }};
    } catch (...) {
      i.stop_begun = false;
      throw;
    }
    return;
  }
  {
    std::lock_guard guard{i.lifecycle_mtx};
    if (i.started && !i.stopped)
      i.shut_down();
  }
  // A stop begun on an I/O thread ends (the shutdown ran, here or there)
  // before this returns: its thread takes lifecycle_mtx for the whole
  // shutdown.
  std::thread running;
  {
    std::lock_guard guard{i.stopper_mtx};
    running = std::move(i.stopper);
  }
  if (running.joinable())
    running.join();
}

void server::after(std::chrono::milliseconds delay, std::function<void()> fn) {
  auto& i = *impl_;
  if (i.stopping)
    return;
  // Armed on io[0], which owns its timers, so stop() can cancel them: a
  // pending `fn` (often holding a responder) would otherwise keep the
  // server's state alive.
  auto* st = impl_.get(); // outlives its io_contexts' handlers
  auto& ioc = i.io.front()->ioc;
  i.post_unless_finished(ioc, [st, &ioc, delay, fn = std::move(fn)]() mutable {
    auto id = st->next_timer++;
    auto& timer = st->timers[id];
    timer = std::make_unique<net::steady_timer>(ioc, delay);
    timer->async_wait([st, id, fn = std::move(fn)](beast::error_code ec) {
      auto node = st->timers.extract(id); // the timer dies with this handler
      if (!ec)
        fn();
    });
  });
}

std::uint16_t server::port() const noexcept {
  return impl_->bound_port;
}

std::string server::url() const {
  auto& a = impl_->opts.address;
  if (a.find(':') != std::string::npos) // IPv6: in brackets
    return fmt::format("http://[{}]:{}", a, impl_->bound_port);
  return fmt::format("http://{}:{}", a, impl_->bound_port);
}

server_stats server::stats() const {
  auto& i = *impl_;
  return server_stats{i.n_connections, i.n_requests, i.n_not_found,
                      i.n_too_large,   i.n_timeouts, i.n_bad,
                      i.n_peers_gone,  i.n_at_capacity};
}

} // namespace botmesh::http
