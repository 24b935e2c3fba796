#pragma once

#include <memory>
#include <string>

#include <botmesh/stores/durable_backend.hpp>
#include <botmesh/stores/redis/redis_client.hpp>

namespace botmesh {

struct redis_durable_options {
  /// The client (shared with a `redis_store`: `store->client()` through a
  /// shared_ptr, or one of its own). Required.
  std::shared_ptr<redis_client> client{};
  /// Key prefix; the same on every replica of a bot.
  std::string prefix = "botmesh";
};

/// The durable backend in Redis, shared by the replicas of a bot. One hash
/// slot per table, as the cluster layout requires:
///
///   p:{durable:inbound}:rec|open|exp|seq|hb   the inbound journal
///   p:{durable:outbox}:sent|fence|fexp        the outbox
///
/// (see lua/durable_*.lua for each key's encoding). Every operation is a
/// Lua script run through the client's asynchronous face (the completion
/// runs on a connection's thread). Record, confirm, release and outbox
/// claims are batched: one call is in flight at a time, and what was
/// issued meanwhile goes out as the next call (one journal and one outbox
/// script), so a busy bot pays one script call per batch instead of three
/// per message. Their completions run in the order the operations were
/// issued. The cost: an operation issued while a call is in flight waits
/// for that call's reply (one round trip; up to `command_timeout` when the
/// server does not answer). Times are the server's.
///
/// Errors (passed to the completion): `errc::store_error` naming the script
/// for a server error reply or a lost connection, `errc::timeout`, and
/// `errc::corrupted_record` naming the record when a stored record or a
/// reply is not what the scripts write. Throws `invalid_argument_error`
/// (field "client", "prefix") at construction.
class redis_durable_backend final : public durable_backend {
 public:
  explicit redis_durable_backend(redis_durable_options opts);
  ~redis_durable_backend() override;

  /// Loads the scripts on every connection.
  void start() override;

  void record(journal_record rec, std::string_view holder,
              std::chrono::milliseconds ttl,
              completion<journal_put> done) override;
  void confirm(std::string_view id, std::string_view holder,
               completion<bool> done) override;
  void release(std::string_view id, std::string_view holder,
               completion<bool> done) override;
  void release_unhandled(std::string_view id, std::string_view holder,
                         completion<bool> done) override;
  void beat_and_claim(std::string_view holder, std::chrono::milliseconds lease,
                      std::size_t limit, std::uint32_t max_attempts,
                      completion<claim_result> done) override;
  void retire(std::string_view holder, completion<bool> done) override;
  void outbox_claim(std::string_view send_id, std::string_view key,
                    std::uint64_t fence, std::string_view writer,
                    std::chrono::milliseconds ttl,
                    completion<outbox_verdict> done) override;
  void outbox_record(std::string_view send_id, std::string_view key,
                     std::uint64_t fence, std::string_view writer,
                     std::chrono::milliseconds ttl,
                     completion<outbox_verdict> done) override;
  void outbox_forget(std::string_view send_id, std::string_view writer,
                     completion<bool> done) override;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace botmesh
