#pragma once

// For tests that pause a Redis (DEBUG SLEEP from another connection).

#include <chrono>
#include <exception>
#include <string>
#include <thread>

#include <botmesh/stores/redis/redis_client.hpp>

namespace test {

/// Waits (5 s at most) until the Redis at `url` stops answering: a DEBUG
/// SLEEP sent on another connection has begun. False if it never did.
inline bool await_unresponsive(const std::string& url) {
  for (int i = 0; i < 100; ++i) {
    botmesh::redis_client probe{
      {.url = url, .command_timeout = "50ms", .connections = 1}};
    try {
      probe.call({"PING"});
    } catch (const std::exception&) {
      return true; // no answer within 50 ms: asleep
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

} // namespace test
