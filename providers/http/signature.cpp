#include <botmesh/providers/http/signature.hpp>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace botmesh::http {

bool constant_time_equals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size())
    return false;
  if (a.empty())
    return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string hmac_sha256_hex(std::string_view key, std::string_view data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac,
       &len);
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.resize(len * 2);
  for (unsigned int i = 0; i < len; ++i) {
    out[2 * i] = digits[mac[i] >> 4];
    out[2 * i + 1] = digits[mac[i] & 0xf];
  }
  return out;
}

std::string_view hub_signature_problem(std::string_view header,
                                       std::string_view app_secret,
                                       std::string_view body) {
  constexpr std::string_view prefix = "sha256=";
  constexpr std::string_view malformed =
    "X-Hub-Signature-256 is not sha256=<64 hex digits>";
  if (app_secret.empty())
    return "no app secret to check X-Hub-Signature-256 with";
  if (!header.starts_with(prefix))
    return malformed;
  auto given = header.substr(prefix.size());
  if (given.size() != 64)
    return malformed;
  std::string lower{given};
  for (auto& c : lower) {
    if (c >= 'A' && c <= 'F')
      c = static_cast<char>(c - 'A' + 'a');
    else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
      return malformed;
  }
  if (!constant_time_equals(lower, hmac_sha256_hex(app_secret, body)))
    return "X-Hub-Signature-256 does not match the body (another app secret?)";
  return {};
}

bool verify_hub_signature(std::string_view header, std::string_view app_secret,
                          std::string_view body) {
  return hub_signature_problem(header, app_secret, body).empty();
}

} // namespace botmesh::http
