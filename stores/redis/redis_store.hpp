#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <botmesh/stores/redis/redis_client.hpp>
#include <botmesh/stores/redis/redis_layout.hpp>
#include <botmesh/stores/coordinator.hpp>
#include <botmesh/stores/schedule_store.hpp>
#include <botmesh/stores/store.hpp>

namespace botmesh {

struct redis_store_options {
  /// Connects a client of its own to this URL (see redis_options::url)...
  std::string url = "redis://127.0.0.1:6379";
  /// ...unless an existing client is given (then `url` is ignored; the
  /// client is shared, not closed by the store)...
  std::shared_ptr<redis_client> client{};
  /// Key prefix; use the same on every replica of a bot. In the cluster
  /// layout it must not hold `{` or `}`.
  std::string prefix = "botmesh";
  /// Settings of the client the store creates.
  redis_options client_options{};
  /// A chat's log keeps its newest entries up to this many (at least 1:
  /// 0 is refused with `invalid_argument_error`, field "max_log_per_chat").
  std::size_t max_log_per_chat = 1000;
  /// ...or a Redis Cluster client of its own: not combinable with `url` or
  /// `client` (`invalid_argument_error`, field "cluster").
  std::optional<redis_cluster_options> cluster{};
  /// The key layout (see redis_layout_kind): `automatic` is `cluster` with
  /// a cluster client or `cluster` options, else `legacy`. `legacy` on a
  /// cluster throws `invalid_argument_error` (field "layout").
  /// coordinator(), schedules() and leases() inherit it.
  redis_layout_kind layout = redis_layout_kind::automatic;
  /// In the cluster layout on one node, start() refuses a prefix that still
  /// holds legacy keys and no layout marker (run the migration first);
  /// true starts anyway.
  bool allow_legacy_data = false;
  /// Where start() reports a warning (a legacy store on a prefix that holds
  /// the cluster layout's marker); stderr when empty.
  std::function<void(std::string_view)> warn{};
};

class redis_store final : public store {
 public:
  explicit redis_store(redis_store_options opts = {});
  ~redis_store() override;

  /// Checks the server answers (PING) and that the keyspace matches the
  /// layout:
  /// - legacy: a prefix holding the cluster layout's marker
  ///   (`p:{meta}:layout`) is reported through `warn`; the store starts.
  /// - cluster on one node: with no marker, the first 10,000 keys under the
  ///   prefix are scanned; a legacy key among them throws
  ///   `invalid_argument_error` (field "layout", naming the key and "run
  ///   the migration first") unless `allow_legacy_data`. A marker with
  ///   another value than "cluster:v1" throws the same error naming it.
  ///   With no legacy key found, the marker is written (SET NX), so a
  ///   legacy store started later on this prefix warns.
  /// - cluster on a Redis Cluster: the marker is checked and written the
  ///   same way (no legacy layout can live there).
  void start() override;

  /// Durable-task calendars in the same Redis (`p:sched:<id>`).
  std::shared_ptr<schedule_store> schedules();

  /// Leader leases in the same Redis (`p:lease:<name>`).
  std::shared_ptr<lease_provider> leases();

  /// A coordinator for this replica on the same client and prefix.
  /// `replica_id` must be unique among running replicas (random when empty).
  std::shared_ptr<botmesh::coordinator>
  coordinator(std::string replica_id = {},
              std::chrono::milliseconds lease = std::chrono::seconds(15));

  redis_client& client() noexcept;
  /// The client, to share (a durable backend, the migration).
  std::shared_ptr<redis_client> shared_client() const noexcept;
  const std::string& prefix() const noexcept;
  /// `legacy` or `cluster` (never `automatic`).
  redis_layout_kind layout() const noexcept;

  void save_chat(const chat_record& rec) override;
  std::optional<chat_record> get_chat(std::string_view key) override;
  bool delete_chat(std::string_view key) override;
  std::vector<chat_record> list_chats() override;

  void save_contact(const contact_record& rec) override;
  std::optional<contact_record> get_contact(std::string_view id) override;
  bool delete_contact(std::string_view id) override;
  std::vector<contact_record> list_contacts() override;

  std::uint64_t append_message(std::string_view chat_key,
                               const logged_message& msg) override;
  std::vector<logged_message> messages(std::string_view chat_key,
                                       std::size_t limit) override;

  std::optional<flow_checkpoint> get_checkpoint(std::string_view key) override;
  std::uint64_t set_checkpoint(const flow_checkpoint& cp) override;
  std::optional<std::uint64_t>
  set_checkpoint_if(const flow_checkpoint& cp,
                    std::uint64_t expected_revision) override;
  bool clear_checkpoint_if(std::string_view key,
                           std::uint64_t expected_revision) override;
  void clear_checkpoint(std::string_view key) override;
  bool clear_damaged_checkpoint(std::string_view key) override;

  std::optional<std::string> get_user_data(std::string_view user,
                                           std::string_view ns,
                                           std::string_view key) override;
  void set_user_data(std::string_view user, std::string_view ns,
                     std::string_view key, std::string_view value_json,
                     std::optional<std::chrono::milliseconds> ttl = {}) override;
  bool delete_user_data(std::string_view user, std::string_view ns,
                        std::string_view key) override;
  std::vector<std::pair<std::string, std::string>>
  list_user_data(std::string_view user, std::string_view ns) override;

  /// A call that fails (its reply lost to a timeout or a dropped
  /// connection: it may have taken the lock) gives the lock back before it
  /// throws: a release of the token it asked for, sent again once it was
  /// answered and after each failure (at most ten in all).
  std::optional<fenced_lock>
  acquire_lock_fenced(std::string_view key,
                      std::chrono::milliseconds ttl) override;
  bool renew_lock(std::string_view key, std::string_view token,
                  std::chrono::milliseconds ttl) override;
  bool release_lock(std::string_view key, std::string_view token) override;

 private:
  redis_store_options opts_;
  redis_layout_kind layout_;
  std::shared_ptr<redis_client> client_;
  std::unique_ptr<store> impl_;
  std::shared_ptr<schedule_store> schedules_;
  std::shared_ptr<lease_provider> leases_;
};

} // namespace botmesh
