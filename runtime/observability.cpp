#include <botmesh/runtime/observability.hpp>

#include <string_view>

#include <botmesh/runtime/bot.hpp>
#include <botmesh/runtime/core/metrics.hpp>

namespace botmesh {

void serve_observability(http::server& server, const bot& b) {
  serve_observability(server, b.readiness());
}

void serve_observability(http::server& server, std::function<bool()> ready) {
  server.route("GET", "/metrics", [](http::request&, http::responder r) {
    r.respond(http::response{200, metrics::global_registry().scrape(),
                             std::string{metrics::content_type}, {}});
  });
  server.route("GET", "/healthz", [](http::request&, http::responder r) {
    r.respond(http::response{200, "ok\n", "text/plain; charset=utf-8", {}});
  });
  server.route("GET", "/readyz",
               [ready = std::move(ready)](http::request&, http::responder r) {
                 bool ok = ready && ready();
                 r.respond(http::response{ok ? 200 : 503,
                                          ok ? "ready\n" : "not ready\n",
                                          "text/plain; charset=utf-8",
                                          {}});
               });
}

observability_server::observability_server(const bot& b,
                                           http::server_options opts)
  : server_(std::make_unique<http::server>(std::move(opts))) {
  serve_observability(*server_, b);
  server_->start();
}

// http::server's destructor stops listening.
observability_server::~observability_server() = default;

std::uint16_t observability_server::port() const noexcept {
  return server_->port();
}

std::string observability_server::url() const {
  return server_->url();
}

} // namespace botmesh
