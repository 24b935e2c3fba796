#include <botmesh/providers/http/http_client.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <fmt/format.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>

#include <botmesh/providers/internal/joined_stop.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/internal/text.hpp>

namespace botmesh::http {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using steady = std::chrono::steady_clock;

tls_verification_error::tls_verification_error(std::string reason,
                                               const std::string& what)
  : error(errc::provider_error, what), reason_(std::move(reason)) {
  // nop
}

const std::string* client_response::header(std::string_view lower_name) const
  noexcept {
  for (auto& [k, v] : headers)
    if (k == lower_name)
      return &v;
  return nullptr;
}

url_parts parse_url(std::string_view url) {
  url_parts p;
  // Written verbatim into the request line: a space, a control character
  // (CR LF above all) or a fragment would make another request, or another
  // header, out of what a caller built from data (a chat id in a path).
  for (unsigned char c : url)
    if (c <= 0x20 || c == 0x7f || c == '#')
      throw invalid_argument_error(
        "url", fmt::format("URL {:?} holds a space, a control character "
                           "or a '#'",
                           url));
  std::string_view rest;
  if (url.starts_with("https://")) {
    p.tls = true;
    p.port = 443;
    rest = url.substr(8);
  } else if (url.starts_with("http://")) {
    p.port = 80;
    rest = url.substr(7);
  } else {
    throw invalid_argument_error(
      "url", fmt::format("URL \"{}\" does not start with http:// or https://",
                         url));
  }
  auto slash = rest.find_first_of("/?");
  auto authority = rest.substr(0, slash);
  p.target = slash == std::string_view::npos ? "/" : std::string{rest.substr(slash)};
  if (p.target.front() == '?')
    p.target.insert(0, "/");
  if (authority.empty() || authority.find('@') != std::string_view::npos)
    throw invalid_argument_error(
      "url", fmt::format("URL \"{}\" has no host (or has credentials)", url));
  std::string_view port_part;
  bool has_port = false;
  if (authority.front() == '[') {
    // An IPv6 literal: "[::1]" or "[::1]:8080"; the host is what the
    // brackets hold.
    auto close = authority.find(']');
    if (close == std::string_view::npos || close == 1
        || (close + 1 < authority.size() && authority[close + 1] != ':'))
      throw invalid_argument_error(
        "url", fmt::format("URL \"{}\" has a bad IPv6 host", url));
    if (close + 1 < authority.size()) {
      has_port = true;
      port_part = authority.substr(close + 2);
    }
    authority = authority.substr(1, close - 1);
  } else if (auto colon = authority.find(':'); colon != std::string_view::npos) {
    if (authority.find(':', colon + 1) != std::string_view::npos)
      throw invalid_argument_error(
        "url", fmt::format("URL \"{}\": an IPv6 host goes in brackets "
                           "(\"http://[::1]:8080/\")",
                           url));
    has_port = true;
    port_part = authority.substr(colon + 1);
    authority = authority.substr(0, colon);
  }
  if (has_port) {
    auto port_text = port_part;
    unsigned long port = 0;
    for (char c : port_text) {
      if (c < '0' || c > '9' || port > 65535)
        throw invalid_argument_error(
          "url", fmt::format("URL \"{}\" has a bad port", url));
      port = port * 10 + static_cast<unsigned long>(c - '0');
    }
    if (port_text.empty() || port == 0 || port > 65535)
      throw invalid_argument_error("url",
                                   fmt::format("URL \"{}\" has a bad port", url));
    p.port = static_cast<std::uint16_t>(port);
  }
  p.host = std::string{authority};
  if (p.host.empty())
    throw invalid_argument_error("url",
                                 fmt::format("URL \"{}\" has no host", url));
  return p;
}

namespace {

// The Host header: an IPv6 host in brackets, and the port unless it is the
// scheme's default (RFC 9110, 7.2).
std::string host_header(const url_parts& u) {
  auto host = u.host.find(':') != std::string::npos ? "[" + u.host + "]" : u.host;
  if (u.port != (u.tls ? 443 : 80))
    host += ":" + std::to_string(u.port);
  return host;
}

// One connection. Its I/O runs on its own io_context, driven by the thread
// that uses it (one at a time: it is out of the pool while in use), so a
// request needs no hand-off to another thread and its timeouts are those of
// beast::tcp_stream. The io_context is declared first: destroyed last.
struct connection {
  net::io_context ioc{1};
  std::optional<beast::tcp_stream> plain;
  std::optional<beast::ssl_stream<beast::tcp_stream>> secure;
  beast::flat_buffer buffer;
  steady::time_point idle_since{};

  beast::tcp_stream& lowest() {
    return secure ? beast::get_lowest_layer(*secure) : *plain;
  }

  // Idle, nothing may be readable: EOF, a reset or stray bytes mean the
  // server closed it or the stream cannot be trusted.
  bool closed_by_peer() {
    pollfd pfd{lowest().socket().native_handle(), POLLIN | POLLRDHUP, 0};
    return ::poll(&pfd, 1, 0) != 0;
  }
};

// Runs one asynchronous operation to completion on `c`'s io_context.
template <class Start>
beast::error_code run(connection& c, Start&& start) {
  beast::error_code result = net::error::would_block;
  start([&result](beast::error_code ec, auto&&...) { result = ec; });
  c.ioc.restart();
  c.ioc.run();
  return result;
}

// While it lives, a stop cancels `c`'s socket operations on the thread
// running them (posting to its io_context is thread-safe); a stop between
// two operations leaves the cancel queued, and it cuts the next one.
using cancel_on_stop = std::optional<std::stop_callback<std::function<void()>>>;

void arm_cancel(cancel_on_stop& out, connection& c, std::stop_token stop) {
  if (stop.stop_possible())
    out.emplace(stop, std::function<void()>{[conn = &c] {
                  net::post(conn->ioc, [conn] { conn->lowest().cancel(); });
                }});
}

// Name lookups given up and still running, in the whole process (see
// client::impl::look_up).
std::atomic<int> abandoned_lookups{0};

// The addresses getaddrinfo finds for `host`, as text.
std::vector<std::string> system_lookup(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_ADDRCONFIG; // (as Asio's resolver asks)
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0)
    throw std::runtime_error(rc == EAI_SYSTEM ? std::strerror(errno)
                                              : ::gai_strerror(rc));
  std::vector<std::string> out;
  for (auto* p = res; p != nullptr; p = p->ai_next) {
    const void* a = nullptr;
    if (p->ai_family == AF_INET)
      a = &reinterpret_cast<const sockaddr_in*>(p->ai_addr)->sin_addr;
    else if (p->ai_family == AF_INET6)
      a = &reinterpret_cast<const sockaddr_in6*>(p->ai_addr)->sin6_addr;
    char text[INET6_ADDRSTRLEN];
    if (a != nullptr && ::inet_ntop(p->ai_family, a, text, sizeof text))
      out.emplace_back(text);
  }
  ::freeaddrinfo(res);
  return out;
}

struct host_pool {
  std::vector<std::unique_ptr<connection>> idle;
  std::size_t open = 0;
};

} // namespace

struct client::impl {
  client_options opts;
  ssl::context tls{ssl::context::tls_client};
  std::mutex mtx;
  std::condition_variable cv;
  std::unordered_map<std::string, host_pool> pools;
  std::atomic<std::uint64_t> n_stale{0};
  std::atomic<std::uint64_t> n_requests{0}, n_opened{0}, n_reused{0},
    n_retried{0};

  static beast::error_code ssl_error() {
    return {static_cast<int>(::ERR_get_error()), net::error::get_ssl_category()};
  }

  [[noreturn]] void fail(const url_parts& u, std::string_view step,
                         beast::error_code ec) {
    auto what = fmt::format("http {}://{}:{}: {} failed: {}",
                            u.tls ? "https" : "http", u.host, u.port, step,
                            ec.message());
    if (ec == beast::error::timeout)
      throw error(errc::timeout, what);
    if (ec == net::error::operation_aborted)
      throw error(errc::stopped, what);
    throw error(errc::provider_error, what);
  }

  // A lookup that failed (not one cut by a timeout or a stop: see fail()).
  [[noreturn]] static void resolve_failed(const url_parts& u,
                                          std::string_view why) {
    throw error(errc::provider_error,
                fmt::format("http {}://{}:{}: resolve failed: {}",
                            u.tls ? "https" : "http", u.host, u.port, why));
  }

  // The addresses of u.host: an IP literal as it is; a name through
  // opts.lookup (or getaddrinfo) on a thread of its own, given up at `by`
  // or a stop. A resolver that hangs would otherwise hold the request, and
  // a stopping provider's thread, past every bound.
  std::vector<tcp::endpoint> look_up(const url_parts& u, steady::time_point by,
                                     std::stop_token stop) {
    beast::error_code not_ip;
    auto literal = net::ip::make_address(u.host, not_ip);
    if (!not_ip)
      return {tcp::endpoint{literal, u.port}};
    struct state {
      std::mutex mtx;
      std::condition_variable cv;
      bool done = false;
      bool abandoned = false; // given up, counted in abandoned_lookups
      std::vector<std::string> found;
      std::string failure;
    };
    auto st = std::make_shared<state>();
    // Lookups left running once given up are bounded: past this many, the
    // resolver hangs for all of them, and another thread would not help.
    constexpr int max_abandoned = 64;
    if (abandoned_lookups.load() >= max_abandoned)
      resolve_failed(u, fmt::format("{} name lookups given up are still "
                                    "running (the resolver does not answer)",
                                    max_abandoned));
    try {
      std::thread{[st, fn = opts.lookup, host = u.host] {
        std::vector<std::string> found;
        std::string failure;
        try {
          found = fn ? fn(host) : system_lookup(host);
          if (found.empty())
            failure = "no address found";
        } catch (const std::exception& e) {
          failure = e.what();
        } catch (...) {
          failure = "the lookup threw";
        }
        std::lock_guard guard{st->mtx};
        if (st->abandoned)
          --abandoned_lookups;
        st->found = std::move(found);
        st->failure = std::move(failure);
        st->done = true;
        st->cv.notify_all();
      }}.detach();
    } catch (const std::system_error& e) {
      resolve_failed(u, fmt::format("no thread for the lookup: {}", e.what()));
    }
    {
      // (Registered before the lock: a stop already requested runs it
      // here, and it takes the lock.)
      std::stop_callback wake{stop, [st] {
                                std::lock_guard guard{st->mtx};
                                st->cv.notify_all();
                              }};
      std::unique_lock guard{st->mtx};
      st->cv.wait_until(guard, by,
                        [&] { return st->done || stop.stop_requested(); });
      if (!st->done) {
        st->abandoned = true;
        ++abandoned_lookups;
        fail(u, "resolve",
             stop.stop_requested()
               ? beast::error_code{net::error::operation_aborted}
               : beast::error_code{beast::error::timeout});
      }
    }
    if (!st->failure.empty())
      resolve_failed(u, st->failure);
    std::vector<tcp::endpoint> out;
    for (auto& a : st->found) {
      beast::error_code bad;
      auto addr = net::ip::make_address(a, bad);
      if (bad)
        resolve_failed(u, fmt::format("the lookup gave {:?}, which is no IP "
                                      "address",
                                      a));
      out.emplace_back(addr, u.port);
    }
    return out;
  }

  std::unique_ptr<connection> open(const url_parts& u, steady::time_point deadline,
                                   std::stop_token stop) {
    auto c = std::make_unique<connection>();
    beast::error_code ec;
    auto endpoints = look_up(u, std::min(deadline, steady::now()
                                                     + opts.connect_timeout.ms()),
                             stop);
    if (u.tls)
      c->secure.emplace(c->ioc, tls);
    else
      c->plain.emplace(c->ioc);
    // A stop cuts the connect and the TLS handshake as it cuts a request.
    cancel_on_stop on_stop;
    arm_cancel(on_stop, *c, stop);
    if (stop.stop_requested())
      fail(u, "connect", net::error::operation_aborted);
    auto connect_by = std::min(deadline, steady::now() + opts.connect_timeout.ms());
    c->lowest().expires_at(connect_by);
    ec = run(*c, [&](auto h) { c->lowest().async_connect(endpoints, h); });
    if (ec)
      fail(u, "connect", ec);
    beast::error_code ignored;
    c->lowest().socket().set_option(tcp::no_delay{true}, ignored);
    if (u.tls) {
      auto* native = c->secure->native_handle();
      // An IP literal is checked against the certificate's IP addresses and
      // sent without SNI (RFC 6066 allows host names only).
      beast::error_code not_ip;
      net::ip::make_address(u.host, not_ip);
      if (opts.verify_tls) {
        c->secure->set_verify_mode(ssl::verify_peer);
        // OpenSSL's own host check, so a mismatch has its own verify result.
        int set = not_ip ? SSL_set1_host(native, u.host.c_str())
                         : X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(native),
                                                          u.host.c_str());
        if (set != 1)
          fail(u, "TLS host check set-up", ssl_error());
      } else {
        c->secure->set_verify_mode(ssl::verify_none);
      }
      if (not_ip && !SSL_set_tlsext_host_name(native, u.host.c_str()))
        fail(u, "TLS server name", ssl_error());
      c->lowest().expires_at(connect_by);
      ec = run(*c, [&](auto h) {
        c->secure->async_handshake(ssl::stream_base::client, h);
      });
      if (ec) {
        auto verify = SSL_get_verify_result(native);
        if (opts.verify_tls && verify != X509_V_OK) {
          std::string reason = X509_verify_cert_error_string(verify);
          bool issuer = verify == X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT
                        || verify == X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN
                        || verify == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT
                        || verify == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY
                        || verify == X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE;
          throw tls_verification_error(
            reason, fmt::format("http https://{}:{}: the server's certificate "
                                "was refused: {}{}",
                                u.host, u.port, reason,
                                issuer ? " (a private CA is trusted with "
                                         "client_options.ca_file)"
                                       : ""));
        }
        fail(u, "TLS handshake", ec);
      }
    }
    ++n_opened;
    return c;
  }

  // A pooled connection (reused = true) or a new one; waits while the host
  // has max_connections_per_host in use.
  std::unique_ptr<connection> acquire(const std::string& key, const url_parts& u,
                                      steady::time_point deadline,
                                      std::stop_token stop, bool& reused) {
    // A stop wakes a wait for a free connection.
    std::stop_callback wake{stop, [this] {
                              std::lock_guard g{mtx};
                              cv.notify_all();
                            }};
    std::unique_lock guard{mtx};
    auto& pool = pools[key];
    for (;;) {
      if (stop.stop_requested())
        throw error(errc::stopped,
                    fmt::format("http {}:{}: stopped while waiting for a "
                                "connection",
                                u.host, u.port));
      auto now = steady::now();
      while (!pool.idle.empty()) {
        auto c = std::move(pool.idle.back());
        pool.idle.pop_back();
        if (now - c->idle_since < opts.idle_timeout.ms()) {
          if (!c->closed_by_peer()) {
            reused = true;
            return c;
          }
          ++n_stale;
        }
        --pool.open; // too old, or closed: the server has closed it
      }
      if (pool.open < opts.max_connections_per_host) {
        ++pool.open;
        guard.unlock();
        try {
          reused = false;
          return open(u, deadline, stop);
        } catch (...) {
          guard.lock();
          --pool.open;
          cv.notify_all(); // (one variable for every host: see give_back)
          throw;
        }
      }
      if (cv.wait_until(guard, deadline) == std::cv_status::timeout)
        throw error(errc::timeout,
                    fmt::format("http {}:{}: no connection came free before "
                                "the timeout ({} in use)",
                                u.host, u.port, pool.open));
    }
  }

  void give_back(const std::string& key, std::unique_ptr<connection> c,
                 bool keep) {
    std::lock_guard guard{mtx};
    auto& pool = pools[key];
    if (keep) {
      c->idle_since = steady::now();
      pool.idle.push_back(std::move(c));
    } else {
      --pool.open;
    }
    // All: the waiters of every host share this variable, and one woken
    // for another host would sleep again while this host's waits on.
    cv.notify_all();
  }

  template <class Stream>
  client_response exchange(connection& c, Stream& stream, const url_parts& u,
                           const client_request& req, steady::time_point deadline,
                           bool& answer_started, beast::error_code& ec,
                           bool& keep) {
    bhttp::request<bhttp::string_body> out;
    out.method_string(req.method);
    out.target(u.target);
    out.version(11);
    out.set(bhttp::field::host, host_header(u));
    out.set(bhttp::field::user_agent, opts.user_agent);
    if (!req.body.empty() || req.method == "POST")
      out.set(bhttp::field::content_type, req.content_type);
    for (auto& [k, v] : req.headers)
      out.set(k, v);
    out.body() = req.body;
    out.keep_alive(true);
    out.prepare_payload();
    c.lowest().expires_at(deadline);
    if (req.cancel_before_write.stop_requested()) {
      ec = net::error::operation_aborted; // nothing was written
      return {};
    }
    cancel_on_stop on_stop;
    arm_cancel(on_stop, c, req.stop);
    ec = run(c, [&](auto h) { bhttp::async_write(stream, out, h); });
    if (ec)
      return {};
    // A stop that came before the read started spent its cancel on the
    // write (or on nothing): the read would wait for the whole answer.
    if (req.stop.stop_requested()) {
      ec = net::error::operation_aborted;
      return {};
    }
    // Interim answers (100 Continue, 103 Early Hints) come before the
    // final one on the same connection: read past them, a bounded number,
    // or the final answer's bytes would be left for the next request on a
    // pooled connection. A HEAD answer has a Content-Length but no body.
    std::optional<bhttp::response_parser<bhttp::string_body>> parser;
    for (int interim = 0;; ++interim) {
      parser.emplace();
      parser->body_limit(opts.max_response_bytes);
      if (req.method == "HEAD")
        parser->skip(true);
      ec = run(c, [&](auto h) { bhttp::async_read(stream, c.buffer, *parser, h); });
      answer_started = answer_started || parser->got_some();
      if (ec)
        return {};
      auto code = parser->get().result_int();
      if (code >= 200 || code == 101)
        break;
      if (interim == 16) {
        ec = bhttp::error::bad_status;
        return {};
      }
    }
    auto msg = parser->release();
    // 101 switches to a protocol this client does not speak. Bytes read
    // past this answer (a body longer than its Content-Length, a body on
    // an answer that has none) would be taken for the next request's
    // answer on this connection, and every answer after it shifted by one:
    // such a connection is not kept. (With TLS, bytes OpenSSL holds count.)
    bool spare = c.buffer.size() != 0;
    if constexpr (!std::is_same_v<std::decay_t<Stream>, beast::tcp_stream>)
      spare = spare || SSL_pending(stream.native_handle()) > 0;
    keep = msg.keep_alive() && msg.result_int() != 101 && !spare;
    client_response r;
    r.status = static_cast<int>(msg.result_int());
    for (auto& f : msg) {
      std::string name{f.name_string()};
      botmesh::internal::ascii_lower(name);
      r.headers.emplace_back(std::move(name), std::string{f.value()});
    }
    r.body = std::move(msg.body());
    return r;
  }
};

namespace {

bool idempotent(const client_request& req) {
  return req.idempotent || req.method == "GET" || req.method == "HEAD"
         || req.method == "OPTIONS" || req.method == "PUT"
         || req.method == "DELETE";
}

} // namespace

client::client(client_options opts) : impl_(std::make_unique<impl>()) {
  if (opts.max_connections_per_host == 0)
    throw invalid_argument_error(
      "max_connections_per_host",
      "http client_options.max_connections_per_host must be > 0");
  auto positive = [](const duration& d, const char* name) {
    if (d.count() <= 0)
      throw invalid_argument_error(
        name, fmt::format("http client_options.{} must be > 0", name));
  };
  positive(opts.connect_timeout, "connect_timeout");
  positive(opts.request_timeout, "request_timeout");
  positive(opts.idle_timeout, "idle_timeout");
  impl_->opts = std::move(opts);
  beast::error_code ec;
  if (impl_->opts.ca_file.empty())
    impl_->tls.set_default_verify_paths(ec);
  else
    impl_->tls.load_verify_file(impl_->opts.ca_file, ec);
  if (ec && !impl_->opts.ca_file.empty())
    throw error(errc::provider_error,
                fmt::format("http client: cannot load CA file {}: {}",
                            impl_->opts.ca_file, ec.message()));
}

client::~client() {
  // nop: pooled connections close with their io_contexts
}

client_response client::request(const client_request& req) {
  auto u = parse_url(req.url);
  auto& i = *impl_;
  ++i.n_requests;
  auto timeout = req.timeout.count() > 0 ? req.timeout : i.opts.request_timeout.ms();
  auto deadline = steady::now() + timeout;
  auto key = fmt::format("{}://{}:{}", u.tls ? "https" : "http", u.host, u.port);
  // Until the request is written, either token cuts its waits.
  botmesh::internal::joined_stop early{req.stop, req.cancel_before_write};
  auto before_write = early.token();
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    auto c = i.acquire(key, u, deadline, before_write, reused);
    if (reused)
      ++i.n_reused;
    bool answer_started = false;
    bool keep = false;
    beast::error_code ec;
    client_response r;
    try {
      if (c->secure)
        r = i.exchange(*c, *c->secure, u, req, deadline, answer_started, ec, keep);
      else
        r = i.exchange(*c, *c->plain, u, req, deadline, answer_started, ec, keep);
    } catch (...) {
      i.give_back(key, std::move(c), false);
      throw;
    }
    if (!ec) {
      // A stop that fired may have left a cancel queued on this connection.
      i.give_back(key, std::move(c), keep && !req.stop.stop_requested());
      return r;
    }
    i.give_back(key, std::move(c), false);
    // A pooled connection the server closed meanwhile: resend once, only
    // what may run twice (the server may have run it before closing).
    if (req.stop.stop_requested())
      ec = net::error::operation_aborted;
    if (reused && attempt == 0 && !answer_started && idempotent(req)
        && ec != beast::error::timeout && ec != net::error::operation_aborted) {
      ++i.n_retried;
      continue;
    }
    i.fail(u, "request", ec);
  }
}

client_stats client::stats() const {
  return client_stats{impl_->n_requests, impl_->n_opened, impl_->n_reused,
                      impl_->n_retried, impl_->n_stale};
}

} // namespace botmesh::http
