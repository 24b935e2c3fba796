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

class redis_coordinator;

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

/// Options of a Redis Cluster client (`redis_client(redis_cluster_options)`).
///
/// The client reads the slot map (CLUSTER SLOTS) from the first root node
/// that answers, then knows every node of the cluster; it sends each
/// command to the master serving the hash slot of its first key, never to
/// a replica (compare-and-set loops must read their own writes).
struct redis_cluster_options {
  /// Seed nodes, `redis://host:port` or `host:port`; at least one. Every
  /// reachable one is tried, in order, until one answers.
  std::vector<std::string> root_nodes{};
  /// Maps an address the cluster announces (`host:port`) to the one this
  /// process reaches (Docker, NAT); returns `host:port`. Identity if empty.
  /// A node that announces no host (an empty, `?` or nil one: Redis 7's
  /// `cluster-preferred-endpoint-type unknown-endpoint`) is given the host
  /// this process reached it by, already mapped, before the map is asked:
  /// a map for such a cluster must take that form too.
  std::function<std::string(std::string_view)> node_address_map{};
  /// Credentials sent to every node (AUTH [user] password).
  std::string user{};
  std::string password{};
  /// Most MOVED/ASK redirections one attempt of a command follows; one
  /// more counts as a redirection not followed: the map is read again and
  /// the command retried per `retry_attempts`, then it fails with the last
  /// redirection's text.
  std::size_t max_redirections = 16;
  /// Attempts of a command answered TRYAGAIN, CLUSTERDOWN, LOADING or with
  /// a redirection it cannot follow, or not sent because its node is
  /// unreachable (all of them come before anything ran). Attempt k+1 waits
  /// `retry_base * k`: 10 attempts over about 2.25 s by default. Also the
  /// attempts of the first discovery. A reply lost on the wire is never
  /// resent: the caller gets `errc::timeout`.
  std::size_t retry_attempts = 10;
  duration retry_base = "50ms";
  /// Settings of each node's connections: timeouts, `connections` per node,
  /// backoff, reply bounds. Its `url` is not used (nodes come from the
  /// slot map).
  redis_options node{};
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
/// Built from `redis_cluster_options`, the same interface talks to a Redis
/// Cluster: one single-node client per master (its connections pipelining
/// as above), each command routed by the hash slot of its first key (the
/// first key after `numkeys` for EVAL/EVALSHA; commands without a key go to
/// any master). MOVED updates the slot map and resends; ASK sends ASKING +
/// the command on one connection of the named node; see
/// `redis_cluster_options` for retries. A script whose keys hash to
/// different slots is refused before sending (`invalid_argument_error`,
/// field "keys", naming the keys and their slots).
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
  /// A callback that also gets its command back (used by the cluster
  /// router to resend without a copy).
  using keep_callback =
    std::function<void(redis_reply, std::exception_ptr, command&&)>;

  explicit redis_client(redis_options opts = {});

  /// A Redis Cluster client. Reads the slot map before returning, retrying
  /// per `retry_attempts`; throws `errc::store_error` naming every root
  /// node's failure when none answers, `invalid_argument_error` (field
  /// "cluster.root_nodes") for no or a malformed root node.
  explicit redis_client(redis_cluster_options opts);
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

  /// Same, on the connection chosen by `affinity` (a hash of it): commands
  /// with the same affinity run in the order they were sent.
  void async(std::string_view affinity, command cmd, callback done);

  using batch_callback =
    std::function<void(std::vector<redis_reply>, std::exception_ptr)>;

  /// Sends commands back to back on one connection; `done` runs once, on
  /// the connection's thread, with every raw reply in order, or with the
  /// first failure (a lost connection or timeout fails the whole batch).
  /// On a cluster the commands go to their slots' nodes, and a node's
  /// failure is its commands' alone: each of them gets, in its place, an
  /// error reply "BOTMESH-FAILED <what failed>" (whether it ran is then
  /// unknown), so one master down does not cost the others' replies.
  /// `done` gets the first failure only when no command was answered.
  void async_batch(std::vector<command> cmds, batch_callback done);

  /// Runs a script asynchronously (EVALSHA, EVAL on NOSCRIPT) on the
  /// connection chosen by `affinity`; `done` gets the raw reply (an error
  /// reply is not turned into an exception).
  void eval_async(std::string_view affinity, const redis_script& script,
                  std::vector<std::string> keys, std::vector<std::string> args,
                  callback done);

  /// Loads `script` on every connection: an open one ahead of the next
  /// commands it writes (in the same write, never inside a MULTI block the
  /// caller left open), and each one again after every reconnect. So
  /// EVALSHA does not meet NOSCRIPT, neither on a connection opened before
  /// this call nor after a server restart. The EVAL fallback stays for a
  /// server that refused the load or lost its scripts otherwise (SCRIPT
  /// FLUSH, a reconnect while it was LOADING); that EVAL is queued behind
  /// what was sent meanwhile. The loads are not counted in the client's
  /// figures. The script must outlive the client.
  void preload(const redis_script& script);

  /// Runs a script (EVALSHA, EVAL on NOSCRIPT); throws on an error reply,
  /// naming the script.
  redis_reply eval(const redis_script& script,
                   const std::vector<std::string>& keys,
                   const std::vector<std::string>& args);

  /// Subscribes to `channel` on a connection of its own, read by a thread
  /// with a poll() loop (the hiredis 0.14 asynchronous API aborts on sharded
  /// messages). `on_message` runs on that thread with each payload and must
  /// not block. The subscription reconnects after a dropped connection
  /// (messages in between are lost: pub/sub is at most once), and after a
  /// silent one: quiet for `command_timeout`, it is pinged, and without an
  /// answer within `command_timeout` more it is made anew;
  /// `on_subscribed` runs on that thread after each (re)subscription, so
  /// the owner knows when messages may have been missed. Ends with the
  /// client, or with `unsubscribe` of the id returned. On a cluster it is
  /// made on the master serving the channel's slot at that moment (PUBLISH
  /// reaches every node) and stays there.
  std::uint64_t subscribe(std::string channel,
                          std::function<void(std::string_view)> on_message,
                          std::function<void()> on_subscribed = {});

  /// Ends a subscription: its connection closes and its thread is joined,
  /// so `on_message` is not running and will not run once this returns.
  /// Called from that subscription's own callback, it ends once the
  /// callback returns (its thread stays until the client goes). An unknown
  /// id does nothing.
  void unsubscribe(std::uint64_t id);

  /// "host:port", for messages ("cluster host:port,..." for a cluster).
  const std::string& endpoint() const noexcept;

  /// For commands that see one node only (SCAN): runs `fn` with a client
  /// of each master of the cluster, as CLUSTER NODES lists them now (with
  /// this client itself when it is no cluster client). Those clients are
  /// the router's own: they carry the cluster's credentials, its
  /// `node_address_map` and its node options. Throws `errc::store_error`
  /// when a master is flagged failing while it still serves slots or a
  /// slot has no master (its keys could not be reached), and what `fn`
  /// throws.
  void for_each_master(const std::function<void(redis_client&)>& fn);

  /// True for a Redis Cluster client.
  bool is_cluster() const noexcept {
    return cluster_ != nullptr;
  }

  /// The hash slot (0-16383) of `key`: CRC16 of the key, or of its hash tag
  /// (the text between the first `{` and the next `}` when not empty).
  static std::uint16_t key_slot(std::string_view key) noexcept;

 private:
  friend class redis_coordinator;

  // The connection `affinity` maps to (always 0 on a cluster client, which
  // routes by slot): commands sent with affinities of one lane run in the
  // order they were sent, so a batch of several keys keeps each key's
  // order when its keys share a lane (the coordinator's co_batch calls).
  std::size_t lane(std::string_view affinity) const noexcept;

  // For the cluster router: `async` on a single-node client that hands the
  // command back with the reply.
  void async_keep(const std::string* affinity, command cmd,
                  keep_callback done);

  // For the cluster router's ASK redirection: ASKING and `cmd` back to back
  // in one write, on the connection `affinity` maps to (as `async_keep`), so
  // commands of one affinity keep their order when they are redirected.
  // `done` gets cmd's reply.
  void async_asking(const std::string* affinity, command cmd, callback done);

  struct impl;
  struct cluster;
  friend struct cluster;
  std::shared_ptr<impl> impl_;
  std::shared_ptr<cluster> cluster_;
};

/// Builds the error thrown for a server error reply to `what`.
[[noreturn]] void throw_redis_error(std::string_view what,
                                    const redis_reply& reply);

/// Throws `errc::store_error` unless `reply` has type `want`.
void expect_reply(std::string_view what, const redis_reply& reply,
                  redis_reply::kind want);

} // namespace botmesh
