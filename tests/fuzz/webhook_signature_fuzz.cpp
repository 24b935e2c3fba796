// libFuzzer target: webhook authentication and request parsing helpers:
// X-Hub-Signature-256 checks, query strings, URLs. The first byte splits
// the input into a header and a body.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <botmesh/providers/http/http_client.hpp>
#include <botmesh/providers/http/http_server.hpp>
#include <botmesh/providers/http/signature.hpp>
#include <botmesh/runtime/core/error.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view in{reinterpret_cast<const char*>(data), size};
  std::size_t cut = size == 0 ? 0 : data[0] % (size + 1);
  auto header = in.substr(0, cut);
  auto body = in.substr(cut);
  botmesh::http::verify_hub_signature(header, "secret", body);
  botmesh::http::constant_time_equals(header, body);
  botmesh::http::request req;
  req.target = std::string{in};
  req.query_param("hub.verify_token");
  botmesh::http::percent_decode(in);
  try {
    botmesh::http::parse_url(in);
  } catch (const botmesh::invalid_argument_error&) {
    // nop
  }
  return 0;
}
