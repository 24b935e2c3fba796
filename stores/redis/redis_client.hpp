#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <botmesh/runtime/core/duration.hpp>

namespace botmesh {

/// A Redis reply.
struct redis_reply {
  enum class kind : std::uint8_t { nil, integer, string, status, error, array };

  kind type = kind::nil;
  std::int64_t integer = 0;
  /// The text of string, status and error replies.
  std::string str{};
  std::vector<redis_reply> elements{};

  bool is_nil() const noexcept {
    return type == kind::nil;
  }
};

std::string_view to_string(redis_reply::kind k) noexcept;

struct redis_options {
  /// `redis://[user:password@]host:port[/db]` (a missing port is 6379).
  std::string url = "redis://127.0.0.1:6379";
  /// Longest wait for one reply; then the connection is reset and the
  /// commands in flight fail with `errc::timeout`.
  duration command_timeout = "5s";
  duration connect_timeout = "2s";
  /// Connections (each owned by one thread). Callers spread over them.
  std::size_t connections = 2;
  /// After a connection attempt that timed out, the next waits from 50 ms
  /// doubling up to this; a refused attempt (a restarting server) is
  /// retried by the next command at once.
  duration max_backoff = "2s";
  /// Most elements a reply array may announce. The server is trusted with
  /// the data, not with the memory a header makes the client allocate: a
  /// larger count fails the connection with a protocol error instead of
  /// an allocation of gigabytes.
  std::size_t max_reply_elements = 4 * 1024 * 1024;
};

/// A Lua script sent with EVALSHA (falling back to EVAL on NOSCRIPT, since
/// Redis 7 does not copy SCRIPT LOAD to replicas). `body` must start with
/// the `#!lua` line so Redis refuses keys the script did not declare.
class redis_script {
 public:
  redis_script(std::string name, std::string_view body);

  const std::string& name() const noexcept {
    return name_;
  }
  const std::string& body() const noexcept {
    return body_;
  }
  const std::string& sha() const noexcept {
    return sha_;
  }

 private:
  std::string name_;
  std::string body_;
  std::string sha_;
};

/// A client for one Redis server over hiredis' synchronous API.
///
/// Each connection is owned by one thread that takes everything queued for
/// it, writes it as one batch and reads the replies in order, so N callers
/// at once cost about one round trip, not N. Callers never touch a socket:
/// `call` waits on the reply from any non-CAF thread; `async` hands it to a
/// callback (an actor turns it into a message).
///
/// Errors (thrown as `botmesh::error`, never a crash): `errc::timeout` when
/// a reply takes longer than `command_timeout`; `errc::store_error` for a
/// server error reply (naming the command), a dropped connection, or while
/// the server is unreachable — commands then fail at once instead of
/// hanging, and the connection retries with backoff. `invalid_argument_error`
/// (field "url") for a malformed URL, at construction.
class redis_client {
 public:
  using command = std::vector<std::string>;
  using callback = std::function<void(redis_reply, std::exception_ptr)>;

  explicit redis_client(redis_options opts = {});
  ~redis_client();

  redis_client(const redis_client&) = delete;
  redis_client& operator=(const redis_client&) = delete;

  /// Sends one command and waits for its reply; throws on an error reply.
  redis_reply call(command cmd);

  /// Same, but an error reply is returned (type `kind::error`), not thrown.
  redis_reply call_raw(command cmd);

  /// Sends commands back to back on one connection; raw replies in order.
  std::vector<redis_reply> pipeline(std::vector<command> cmds);

  /// Sends one command; `done` runs on the connection's thread with the raw
  /// reply or an exception. It must not block.
  void async(command cmd, callback done);

  /// Runs a script (EVALSHA, EVAL on NOSCRIPT); throws on an error reply,
  /// naming the script.
  redis_reply eval(const redis_script& script,
                   const std::vector<std::string>& keys,
                   const std::vector<std::string>& args);

  /// Subscribes to `channel` on a connection of its own, read by a thread
  /// with a poll() loop (the hiredis 0.14 asynchronous API aborts on sharded
  /// messages). `on_message` runs on that thread with each payload and must
  /// not block. The subscription reconnects after a dropped connection
  /// (messages in between are lost: pub/sub is at most once). Ends with the
  /// client.
  void subscribe(std::string channel,
                 std::function<void(std::string_view)> on_message);

  /// "host:port", for messages.
  const std::string& endpoint() const noexcept;


 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

/// Builds the error thrown for a server error reply to `what`.
[[noreturn]] void throw_redis_error(std::string_view what,
                                    const redis_reply& reply);

/// Throws `errc::store_error` unless `reply` has type `want`.
void expect_reply(std::string_view what, const redis_reply& reply,
                  redis_reply::kind want);

} // namespace botmesh
