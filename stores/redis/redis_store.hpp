#pragma once

#include <memory>
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
  /// ...unless an existing client is given (then `url` is ignored).
  std::shared_ptr<redis_client> client{};
  /// Key prefix; use the same on every replica of a bot.
  std::string prefix = "botmesh";
  /// Settings of the client the store creates.
  redis_options client_options{};
  /// A chat's log keeps its newest entries up to this many.
  std::size_t max_log_per_chat = 1000;
};

/// The shared store for several replicas: everything in Redis under
/// `prefix`, in the legacy single-node layout (see redis_layout.hpp). A
/// Redis Cluster client is refused (`invalid_argument_error`, field
/// "layout"): the legacy scripts span hash slots.
///
/// Every compare-and-set (checkpoints, locks, schedules, leases) is one Lua
/// script that declares all its keys. TTLs (user data, locks, ephemeral
/// checkpoints) run on the server's clock; schedules and leases compare the
/// times their callers pass. Cost: one round trip per call (two for a
/// listing); concurrent callers share pipelined connections.
///
/// Errors: `errc::store_error` naming the command for server errors, a lost
/// connection or an unreachable server; `errc::timeout` past the command
/// timeout; `errc::corrupted_record` naming the key when a stored value
/// cannot be decoded.
class redis_store final : public store {
 public:
  explicit redis_store(redis_store_options opts = {});
  ~redis_store() override;

  /// Checks the server answers (PING).
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
  const redis_layout& layout() const noexcept;

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

  std::optional<fenced_lock>
  acquire_lock_fenced(std::string_view key,
                      std::chrono::milliseconds ttl) override;
  bool renew_lock(std::string_view key, std::string_view token,
                  std::chrono::milliseconds ttl) override;
  bool release_lock(std::string_view key, std::string_view token) override;

 private:
  std::optional<std::uint64_t> write_checkpoint(const flow_checkpoint& cp,
                                                std::string expected);

  redis_store_options opts_;
  std::shared_ptr<redis_client> client_;
  std::shared_ptr<const redis_layout> layout_;
  std::shared_ptr<schedule_store> schedules_;
  std::shared_ptr<lease_provider> leases_;
};

} // namespace botmesh
