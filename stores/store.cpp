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

} // namespace detail

} // namespace botmesh
