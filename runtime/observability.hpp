#pragma once

// Operational HTTP endpoints of a bot process:
//
//   GET /metrics  the process's metrics (botmesh_*) in the Prometheus text
//                 format: every bot in the process and the Redis client
//   GET /healthz  200 "ok" while the process answers HTTP (liveness)
//   GET /readyz   200 "ready" while the bot's transport is open and this
//                 replica runs it (it leads an exclusive transport, or
//                 shares it); 503 "not ready" otherwise (readiness)
//
// A webhook bot adds them to its provider's server (same PORT); a bot
// without one (long polling, console) runs an `observability_server`.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <botmesh/providers/http/http_server.hpp>

namespace botmesh {

class bot;

/// Routes /metrics, /healthz and /readyz on `server` (replacing routes of
/// those paths). `b` may be destroyed before the server: /readyz then
/// answers 503. Cost per scrape: one pass over the registered collectors
/// under the registry's mutex; nothing on the bot's hot path.
void serve_observability(http::server& server, const bot& b);

/// Same, with any readiness test (for an application's own checks).
void serve_observability(http::server& server, std::function<bool()> ready);

/// A listener of its own for the three routes, for a bot without an HTTP
/// server (long polling, console). Starts listening in the constructor.
class observability_server {
 public:
  /// Throws `botmesh::error` (`errc::provider_error`) when the address
  /// cannot be bound, and `invalid_argument_error` for bad `opts`.
  observability_server(const bot& b, http::server_options opts);

  /// Stops listening (graceful, bounded by `opts.shutdown_timeout`).
  ~observability_server();

  observability_server(const observability_server&) = delete;
  observability_server& operator=(const observability_server&) = delete;

  std::uint16_t port() const noexcept;
  /// "http://<address>:<port>".
  std::string url() const;

 private:
  std::unique_ptr<http::server> server_;
};

} // namespace botmesh
