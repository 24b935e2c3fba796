#pragma once

// An HTTP/1.1 client for platform APIs: HTTPS (OpenSSL, verified) and plain
// HTTP (tests pointing a provider at a local fake server), with per-host
// keep-alive connection pools. Boost.Beast and OpenSSL stay in the .cpp.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <botmesh/runtime/core/duration.hpp>
#include <botmesh/runtime/core/error.hpp>

namespace botmesh::http {

struct client_request {
  std::string method = "POST";
  /// "https://api.telegram.org/bot.../sendMessage" or "http://127.0.0.1:8080/x".
  std::string url{};
  std::string body{};
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers{};
  /// The whole exchange (connect, TLS, write, read); zero: the client's
  /// `request_timeout`.
  std::chrono::milliseconds timeout{0};
  /// Cancels the request from another thread (a long poll when its
  /// provider stops): it then throws `botmesh::error` with `errc::stopped`.
  /// It cuts the wait for a free connection, the connect, the TLS
  /// handshake, the write and the read; not a name lookup in progress.
  std::stop_token stop{};
  /// Cancels the request only before it is written: the wait for a free
  /// connection, the connect and the TLS handshake (as `stop`), then
  /// nothing. For a send that must not go out once its turn ended, yet
  /// must not be cut while written or answered (it may have been
  /// delivered, and a failure would be reported). `errc::stopped` too.
  std::stop_token cancel_before_write{};
  /// Whether sending it twice does no harm (a long poll, a read). A request
  /// that failed on a pooled connection after it was written is resent
  /// only then; GET, HEAD, OPTIONS, PUT and DELETE always are.
  bool idempotent = false;
};

struct client_response {
  int status = 0;
  std::string body{};
  /// Names lower case.
  std::vector<std::pair<std::string, std::string>> headers{};

  /// The first header named `lower_name`, or nothing.
  const std::string* header(std::string_view lower_name) const noexcept;
};

struct client_options {
  /// Most connections open to one host (scheme, host, port) at once; a
  /// request beyond it waits for one to come back to the pool.
  std::size_t max_connections_per_host = 16;
  duration connect_timeout = "10s";
  /// Default bound of one request (see `client_request::timeout`).
  duration request_timeout = "30s";
  /// A pooled connection unused for this long is closed instead of reused.
  duration idle_timeout = "50s";
  /// Verify the server's certificate chain and host name (HTTPS): a refused
  /// certificate throws `tls_verification_error`. Turning it off is for
  /// tests only.
  bool verify_tls = true;
  /// PEM file of the CAs to trust instead of the system's (a private CA, or
  /// a self-signed server certificate to pin); empty: the system's default
  /// paths (/etc/ssl/certs).
  std::string ca_file{};
  /// Largest accepted response body.
  std::size_t max_response_bytes = 64 * 1024 * 1024;
  std::string user_agent = "botmesh";
  /// Finds the addresses of a host name (IP addresses as text, tried in
  /// order); throws to fail the lookup. Empty: the system's resolver
  /// (getaddrinfo). A lookup runs on a thread of its own and is given up at
  /// `connect_timeout`, the request's deadline or its stop, whichever comes
  /// first (getaddrinfo itself cannot be cut: its thread ends when it
  /// returns; while 64 given-up lookups still run in the process, a new
  /// one fails at once). An IP literal in the URL is used as it is, with no
  /// lookup.
  std::function<std::vector<std::string>(const std::string& host)> lookup{};
};

struct client_stats {
  std::uint64_t requests = 0;
  std::uint64_t connections_opened = 0;
  std::uint64_t reused = 0;  ///< requests sent on a pooled connection
  std::uint64_t retried = 0; ///< idempotent requests resent once after a pooled connection failed
  std::uint64_t stale = 0;   ///< pooled connections found closed before use
};

/// The server's certificate was refused during the TLS handshake (HTTPS with
/// `verify_tls`): an issuer not among the trusted CAs, a self-signed
/// certificate, one expired, or one issued for another host. `code()` is
/// `errc::provider_error`; `reason()` is OpenSSL's words for what failed
/// ("self-signed certificate", "unable to get local issuer certificate",
/// "hostname mismatch", "IP address mismatch"...). Trust a private CA with
/// `client_options::ca_file`.
class tls_verification_error : public error {
 public:
  tls_verification_error(std::string reason, const std::string& what);

  const std::string& reason() const noexcept {
    return reason_;
  }

 private:
  std::string reason_;
};

/// A blocking HTTP client, safe to share between threads. `request` runs
/// the exchange on the calling thread (a handler thread or a provider's
/// own), so it needs no I/O thread of its own.
///
/// Cost: a pooled connection is reused while the server keeps it alive;
/// a new one costs a TCP (and TLS) handshake. A pooled connection is looked
/// at before it is used: one the server closed (or that has anything
/// unasked to read) is dropped for a new one. An idempotent request that
/// still fails on a pooled connection before any answer arrived (the server
/// closed it meanwhile) is resent once on a new connection; any other one
/// fails, since the server may have run it (a POST is never sent twice).
class client {
 public:
  /// Throws `invalid_argument_error` for `max_connections_per_host` 0 or a
  /// non-positive timeout (named after the field), and `botmesh::error`
  /// (`errc::provider_error`) when `ca_file` cannot be loaded.
  explicit client(client_options opts = {});
  ~client();

  client(const client&) = delete;
  client& operator=(const client&) = delete;

  /// Sends `req` and returns the answer, whatever its status. Throws
  /// `invalid_argument_error` ("url") for a URL that is not http(s)://host...,
  /// `botmesh::error` with `errc::timeout` past the timeout and
  /// `errc::provider_error` for any other failure (resolve, connect, TLS, a
  /// broken answer), naming the host — `tls_verification_error` when the
  /// server's certificate was refused; `errc::stopped` when `req.stop`
  /// fired.
  client_response request(const client_request& req);

  client_stats stats() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// The parts of an http(s) URL. Throws `invalid_argument_error` ("url").
struct url_parts {
  bool tls = false;
  std::string host{};
  std::uint16_t port = 0;
  std::string target{}; ///< path and query, "/" at least
};

url_parts parse_url(std::string_view url);

} // namespace botmesh::http
