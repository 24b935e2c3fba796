#pragma once

#include <cstddef>
#include <memory>

#include <botmesh/stores/store.hpp>

namespace botmesh {

struct memory_store_options {
  /// Time source for TTLs and lock expiry; the system clock when null.
  /// The store keeps the pointer: it must outlive the store.
  const botmesh::clock* clock = nullptr;
  /// A chat's log keeps its newest entries up to this many (at least 1:
  /// 0 is refused with `invalid_argument_error`, field "max_log_per_chat").
  std::size_t max_log_per_chat = 1000;
};

/// The in-process store: everything in maps guarded by mutexes (one per kind
/// of data, so checkpoints and locks do not contend with message logs).
///
/// It is the reference implementation of `store` and the default of a bot.
/// Costs: O(log n) per keyed operation; listing copies. Nothing survives the
/// process. Cleared checkpoint keys keep one integer (their last revision) so
/// revisions never repeat; locks keep their fence counter after release for
/// the same reason.
class memory_store final : public store {
 public:
  explicit memory_store(memory_store_options opts = {});
  ~memory_store() override;

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
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace botmesh
