#include <botmesh/stores/store.hpp>

#include <random>

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
}

std::string random_token() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{:016x}{:016x}", rng(), rng());
}

std::string random_uuid() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  auto hi = rng();
  auto lo = rng();
  hi = (hi & 0xFFFFFFFFFFFF0FFFull) | 0x0000000000004000ull; // version 4
  lo = (lo & 0x3FFFFFFFFFFFFFFFull) | 0x8000000000000000ull; // variant 1
  return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", hi >> 32,
                     (hi >> 16) & 0xFFFF, hi & 0xFFFF, lo >> 48,
                     lo & 0xFFFFFFFFFFFFull);
}

} // namespace detail

} // namespace botmesh
