#include <botmesh/stores/store.hpp>

#include <cerrno>
#include <cstdint>

#include <sys/random.h>

#include <system_error>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>

namespace botmesh {

store::~store() {
  // nop
}

void store::start() {
  // nop
}

void store::stop() {
  // nop
}

namespace detail {

void check_key(std::string_view key, std::string_view field) {
  if (key.empty())
    throw invalid_argument_error(std::string{field},
                                 fmt::format("\"{}\" must not be empty", field));
}

void check_user_data_args(std::string_view user, std::string_view ns,
                          std::string_view key) {
  check_key(user, "user");
  check_key(ns, "ns");
  check_key(key, "key");
}

void check_ttl(std::chrono::milliseconds ttl, std::string_view field) {
  if (ttl.count() <= 0)
    throw invalid_argument_error(
      std::string{field},
      fmt::format("\"{}\" must be positive, got {}ms", field, ttl.count()));
  // Far past any lease or cache, and far from where now + ttl overflows a
  // 64-bit count of milliseconds: milliseconds::max() (a natural "never")
  // wrapped to an expiry in the past, so a lock taken with it was free at
  // once and a value written with it read back as absent.
  constexpr std::chrono::milliseconds most = std::chrono::hours{24 * 365 * 100};
  if (ttl > most)
    throw invalid_argument_error(
      std::string{field},
      fmt::format("\"{}\" must be at most 100 years ({}ms), got {}ms", field,
                  most.count(), ttl.count()));
}

namespace {

// 128 bits from the kernel's generator. Ids, incarnations and lock tokens of
// different processes must not collide, which a generator seeded with one
// draw per thread could not promise.
void random_bits(std::uint64_t (&out)[2]) {
  auto* p = reinterpret_cast<unsigned char*>(out);
  std::size_t got = 0;
  while (got < sizeof(out)) {
    auto n = ::getrandom(p + got, sizeof(out) - got, 0);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      throw std::system_error(errno, std::generic_category(), "getrandom");
    }
    got += static_cast<std::size_t>(n);
  }
}

} // namespace

std::string random_token() {
  std::uint64_t r[2];
  random_bits(r);
  return fmt::format("{:016x}{:016x}", r[0], r[1]);
}

std::string random_uuid() {
  std::uint64_t r[2];
  random_bits(r);
  auto hi = r[0];
  auto lo = r[1];
  hi = (hi & 0xFFFFFFFFFFFF0FFFull) | 0x0000000000004000ull; // version 4
  lo = (lo & 0x3FFFFFFFFFFFFFFFull) | 0x8000000000000000ull; // variant 1
  return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", hi >> 32,
                     (hi >> 16) & 0xFFFF, hi & 0xFFFF, lo >> 48,
                     lo & 0xFFFFFFFFFFFFull);
}

} // namespace detail

} // namespace botmesh
