#pragma once

// Internal: the Redis Cluster side of `redis_client` — hash slots, the
// parsing of redirections and slot maps (pure, tested without a server),
// and the router that owns one single-node client per node. Not installed.

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <botmesh/stores/redis/redis_client.hpp>

namespace botmesh::internal {

/// Hash slots of a Redis Cluster.
inline constexpr std::size_t cluster_slots = 16384;

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0), as Redis hashes keys.
std::uint16_t crc16(std::string_view data) noexcept;

/// The key of `cmd` that decides its slot: the first key after `numkeys`
/// for EVAL, EVALSHA, EVAL_RO, EVALSHA_RO, FCALL and FCALL_RO; nothing for
/// commands without a key (PING, TIME, INFO, SCRIPT, CLUSTER, ASKING, ...)
/// or an EVAL with no keys; else the first argument.
std::optional<std::string_view> first_key(const redis_client::command& cmd);

/// A MOVED or ASK error reply: `MOVED <slot> <host>:<port>`.
struct redirection {
  bool ask = false;
  std::uint16_t slot = 0;
  /// `host:port` as the server wrote it (IPv6 hosts keep their colons).
  std::string address;
};

/// Parses a MOVED or ASK error text; nothing for any other text, or for a
/// malformed one (a slot out of range, no port). An empty or "?" host
/// (Redis 7's `cluster-preferred-endpoint-type unknown-endpoint`, or
/// `hostname` with none set) means the host the command went to:
/// `asked_host`, which the address then carries (none given: malformed).
std::optional<redirection> parse_redirection(std::string_view error,
                                             std::string_view asked_host = {});

/// One range of a CLUSTER SLOTS reply: its master's `host:port`.
struct slot_range {
  std::uint16_t first = 0;
  std::uint16_t last = 0;
  std::string master;
  /// Replicas' `host:port` (discovery seeds; commands never go there).
  std::vector<std::string> replicas;
};

/// Parses a CLUSTER SLOTS reply. A node announced with an empty host (or
/// "?") is on the host that was asked, `asked_host`. Throws
/// `errc::store_error` naming what is malformed.
std::vector<slot_range> parse_cluster_slots(const redis_reply& reply,
                                            std::string_view asked_host);

/// Splits `host:port` (the last colon separates the port).
std::pair<std::string, int> split_address(std::string_view address);

} // namespace botmesh::internal

namespace botmesh {

/// The router behind a cluster `redis_client`: the slot map, one
/// single-node client per node (never freed before the router, so the map
/// holds plain pointers read without a lock), and one thread for delayed
/// retries and slot map refreshes.
struct redis_client::cluster {
  struct node {
    std::string address;
    std::unique_ptr<redis_client> client;
  };

  /// One command on its way: resent on redirections and retries.
  struct op;

  explicit cluster(redis_cluster_options opts);
  ~cluster();

  /// Routes `cmd` by its first key (`affinity` picks the node's connection
  /// when given) and completes `done` with the final reply.
  void send(command cmd, std::optional<std::string> affinity, callback done,
            const redis_script* script = nullptr);

  /// An affinity for the commands of one batch or pipeline: those of one
  /// node share a connection, so they run in the order given.
  std::string batch_affinity() {
    return std::to_string(next_batch_.fetch_add(1, std::memory_order_relaxed));
  }

  /// Throws `invalid_argument_error` (field "keys") unless all `keys` of
  /// `script` hash to one slot.
  static void check_script_keys(const redis_script& script,
                                const std::vector<std::string>& keys);

  void preload(const redis_script& script);
  /// Subscribes on the master of the channel's slot; when that node stops
  /// answering, the subscription moves on (next_node) and `on_subscribed`
  /// runs again, as after any reconnection. `id` names it to unsubscribe.
  void subscribe(std::uint64_t id, std::string channel,
                 std::function<void(std::string_view)> on_message,
                 std::function<void()> on_subscribed);

  /// Ends subscription `id`, on whichever node it lives now.
  void unsubscribe(std::uint64_t id);

  /// The node a subscription tries after the one at `failed` (host:port)
  /// could not be reached: the next known node after it, masters first,
  /// then replicas and seeds (PUBLISH reaches every node of a cluster, so
  /// any of them serves). Also asks for a slot map refresh. Nothing once
  /// closed, or when no other node is known.
  std::optional<std::string> next_node(const std::string& failed);

  /// `redis_client::for_each_master`: CLUSTER NODES asked of one master,
  /// each master listed reached through its node client (mapped through
  /// `node_address_map`, with the cluster's credentials and node options).
  void for_each_master(const std::function<void(redis_client&)>& fn);

  /// Stops the retry thread and every node client; commands waiting for a
  /// retry fail with `errc::store_error`.
  void shutdown();

  /// True on one of this router's threads (a node's connection or the
  /// retry thread).
  bool on_own_thread() const;

  redis_cluster_options opts;
  std::string endpoint;

 private:
  void dispatch(const std::shared_ptr<op>& o);
  void resend(const std::shared_ptr<op>& o);
  void on_reply(const std::shared_ptr<op>& o, node* via, redis_reply r,
                std::exception_ptr e, bool was_asking);
  void retry_later(const std::shared_ptr<op>& o, std::string why,
                   std::optional<redis_reply> last);
  void finish(const std::shared_ptr<op>& o, redis_reply r,
              std::exception_ptr e);
  // Defined with the single-node client, whose subscriptions it extends.
  void subscribe_on(std::uint64_t id, node& n, std::string channel,
                    std::function<void(std::string_view)> on_message,
                    std::function<void()> on_subscribed);
  /// Throws when `address` cannot be made a client (nothing is kept then).
  node* node_at(const std::string& address);
  /// node_at for a redirection: on a throw, ends `o` with an error naming
  /// the address and gives nullptr.
  node* redirected_node(const std::shared_ptr<op>& o, const std::string& address);
  node* any_master();
  /// Every node known, once each: the slot map's masters first (in slot
  /// order; `masters`, when given, says how many), then the seeds and
  /// every node a client was made for.
  std::vector<std::string> known_nodes(std::size_t* masters = nullptr);
  bool refresh_once(std::string* why);
  void discover();
  void request_refresh();
  void timer_loop();
  void at(std::chrono::steady_clock::time_point when, std::function<void(bool)> fn);
  std::string mapped(std::string_view address) const;

  std::array<std::atomic<node*>, internal::cluster_slots> slots_{};
  mutable std::mutex nodes_mtx_;
  std::map<std::string, std::unique_ptr<node>> nodes_;
  std::vector<std::string> seeds_;
  std::vector<const redis_script*> scripts_;
  std::atomic<std::size_t> next_master_{0};
  std::atomic<std::uint64_t> next_batch_{0};

  std::mutex timer_mtx_;
  std::condition_variable timer_cv_;
  std::multimap<std::chrono::steady_clock::time_point, std::function<void(bool)>>
    timers_;
  bool refresh_wanted_ = false;
  bool stopping_ = false;
  // Apart from the map and from each other: read (closed_) or written
  // (dispatching_) by every thread.
  alignas(64) std::atomic<bool> closed_{false};
  alignas(64) std::atomic<int> dispatching_{0};
  std::chrono::steady_clock::time_point last_refresh_{};
  // What the last failed refresh (or the last left-out replicas) said,
  // logged again only when it changes: refreshes come every 100 ms while
  // commands ask for them. Written by refreshes, which never overlap (the
  // constructor's, then the timer thread's).
  std::string refresh_said_;
  std::string skipped_said_;
  std::thread timer_thread_;
};

} // namespace botmesh
