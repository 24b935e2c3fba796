#pragma once

// Request authentication helpers for webhooks (OpenSSL stays in the .cpp).

#include <string>
#include <string_view>

namespace botmesh::http {

/// Compares in time that depends only on the lengths, not on where the
/// inputs differ (for secrets sent by a platform).
bool constant_time_equals(std::string_view a, std::string_view b) noexcept;

/// HMAC-SHA256 of `data` with `key`, as 64 lower-case hex digits.
std::string hmac_sha256_hex(std::string_view key, std::string_view data);

/// Checks a Meta `X-Hub-Signature-256` header ("sha256=<hex>") against the
/// HMAC-SHA256 of the raw body with the app secret, in constant time.
/// False for a missing prefix, a wrong length, non-hex digits or a mismatch
/// (hex digits of either case are accepted).
bool verify_hub_signature(std::string_view header, std::string_view app_secret,
                          std::string_view body);

/// Same check, saying what is wrong (a webhook's 401 tells it): empty when
/// the signature is right.
std::string_view hub_signature_problem(std::string_view header,
                                       std::string_view app_secret,
                                       std::string_view body);

} // namespace botmesh::http
