#include <botmesh/stores/redis/redis_store.hpp>


#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/log.hpp>
#include <botmesh/stores/internal/log_cap.hpp>
#include <botmesh/stores/redis/internal/keyspace.hpp>
#include <botmesh/stores/redis/internal/schedule_store.hpp>
#include <botmesh/stores/redis/internal/store_impl.hpp>
#include <botmesh/stores/redis/redis_cluster_layout.hpp>
#include <botmesh/stores/redis/redis_coordinator.hpp>

namespace botmesh {

namespace {

// The spec's bound on start()'s look for legacy keys.
constexpr std::size_t legacy_scan_limit = 10'000;

// The first legacy key among the first `legacy_scan_limit` keys under the
// prefix, if any.
std::optional<std::string> find_legacy_key(redis_client& c,
                                           const std::string& prefix) {
  std::optional<std::string> found;
  std::size_t seen = 0;
  internal::scan_node(c, internal::escape_glob(prefix) + ":*",
                      [&](const std::string& k) {
                        if (internal::legacy_data_kind(prefix, k))
                          found = k;
                        return !found && ++seen < legacy_scan_limit;
                      });
  return found;
}

} // namespace

redis_store::redis_store(redis_store_options opts) : opts_(std::move(opts)) {
  if (opts_.cluster) {
    if (opts_.client)
      throw invalid_argument_error("cluster", "the store's cluster option "
                                              "cannot be combined with "
                                              "client");
    if (opts_.url != redis_store_options{}.url)
      throw invalid_argument_error("cluster", "the store's cluster option "
                                              "cannot be combined with url");
  }
  // Options are checked before a connection is made.
  internal::check_log_cap(opts_.max_log_per_chat, "redis store");
  bool cluster_client = opts_.cluster || (opts_.client
                                          && opts_.client->is_cluster());
  layout_ = internal::resolve_layout(opts_.layout, cluster_client, opts_.prefix,
                           "redis store");
  if (opts_.cluster) {
    client_ = std::make_shared<redis_client>(std::move(*opts_.cluster));
    opts_.cluster.reset();
  } else if (opts_.client) {
    client_ = opts_.client;
  } else {
    auto copts = opts_.client_options;
    copts.url = opts_.url;
    client_ = std::make_shared<redis_client>(copts);
  }
  if (layout_ == redis_layout_kind::legacy) {
    auto L = make_legacy_layout(opts_.prefix);
    impl_ = internal::make_legacy_redis_store(client_, L,
                                              opts_.max_log_per_chat);
    auto n = internal::legacy_schedule_naming(L);
    schedules_ = internal::make_redis_schedule_store(client_, n);
    leases_ = internal::make_redis_lease_provider(client_, n);
  } else {
    redis_cluster_layout L{opts_.prefix};
    impl_ = internal::make_cluster_redis_store(client_, L,
                                               opts_.max_log_per_chat);
    auto n = internal::cluster_schedule_naming(L);
    schedules_ = internal::make_redis_schedule_store(client_, n);
    leases_ = internal::make_redis_lease_provider(client_, n);
  }
}

redis_store::~redis_store() = default;

void redis_store::start() {
  auto r = client_->call({"PING"});
  if (r.str != "PONG")
    throw error(errc::store_error,
                fmt::format("redis {}: PING answered \"{}\"",
                            client_->endpoint(), r.str));
  auto marker_key = redis_cluster_layout::marker_key(opts_.prefix);
  auto m = client_->call({"GET", marker_key});
  if (layout_ == redis_layout_kind::legacy) {
    if (!m.is_nil()) {
      auto text = fmt::format(
        "botmesh: redis store {}: the prefix \"{}\" holds the layout marker "
        "{} = \"{}\" but this store uses the legacy layout; replicas with "
        "different layouts do not exclude each other: start every replica "
        "with the same layout",
        client_->endpoint(), opts_.prefix, marker_key, m.str);
      if (opts_.warn)
        opts_.warn(text);
      else
        log::warn("redis store", text);
    }
    return;
  }
  if (!m.is_nil()) {
    if (m.str != redis_cluster_layout::marker_value)
      throw invalid_argument_error(
        "layout", fmt::format("redis store {}: the layout marker {} holds "
                              "\"{}\", not \"{}\": this keyspace was written "
                              "by an unknown layout version",
                              client_->endpoint(), marker_key, m.str,
                              redis_cluster_layout::marker_value));
    return;
  }
  if (!client_->is_cluster() && !opts_.allow_legacy_data) {
    if (auto k = find_legacy_key(*client_, opts_.prefix))
      throw invalid_argument_error(
        "layout",
        fmt::format("redis store {}: the prefix \"{}\" holds keys of the "
                    "legacy layout (for example {}) and no layout marker: "
                    "run the migration first (botmesh redis migrate, or "
                    "migrate_to_cluster_layout()), or set allow_legacy_data",
                    client_->endpoint(), opts_.prefix, *k));
  }
  client_->call({"SET", marker_key,
                 std::string{redis_cluster_layout::marker_value}, "NX"});
}

std::shared_ptr<schedule_store> redis_store::schedules() {
  return schedules_;
}

std::shared_ptr<lease_provider> redis_store::leases() {
  return leases_;
}

std::shared_ptr<botmesh::coordinator>
redis_store::coordinator(std::string replica_id,
                         std::chrono::milliseconds lease) {
  return std::make_shared<redis_coordinator>(
    redis_coordinator_options{.client = client_,
                              .prefix = opts_.prefix,
                              .replica_id = std::move(replica_id),
                              .lease = lease,
                              .layout = layout_});
}

redis_client& redis_store::client() noexcept {
  return *client_;
}

std::shared_ptr<redis_client> redis_store::shared_client() const noexcept {
  return client_;
}

const std::string& redis_store::prefix() const noexcept {
  return opts_.prefix;
}

redis_layout_kind redis_store::layout() const noexcept {
  return layout_;
}

// -- the rest is the layout's ---------------------------------------------

void redis_store::save_chat(const chat_record& rec) {
  impl_->save_chat(rec);
}
std::optional<chat_record> redis_store::get_chat(std::string_view key) {
  return impl_->get_chat(key);
}
bool redis_store::delete_chat(std::string_view key) {
  return impl_->delete_chat(key);
}
std::vector<chat_record> redis_store::list_chats() {
  return impl_->list_chats();
}
void redis_store::save_contact(const contact_record& rec) {
  impl_->save_contact(rec);
}
std::optional<contact_record> redis_store::get_contact(std::string_view id) {
  return impl_->get_contact(id);
}
bool redis_store::delete_contact(std::string_view id) {
  return impl_->delete_contact(id);
}
std::vector<contact_record> redis_store::list_contacts() {
  return impl_->list_contacts();
}
std::uint64_t redis_store::append_message(std::string_view chat_key,
                                          const logged_message& msg) {
  return impl_->append_message(chat_key, msg);
}
std::vector<logged_message> redis_store::messages(std::string_view chat_key,
                                                  std::size_t limit) {
  return impl_->messages(chat_key, limit);
}
std::optional<flow_checkpoint>
redis_store::get_checkpoint(std::string_view key) {
  return impl_->get_checkpoint(key);
}
std::uint64_t redis_store::set_checkpoint(const flow_checkpoint& cp) {
  return impl_->set_checkpoint(cp);
}
std::optional<std::uint64_t>
redis_store::set_checkpoint_if(const flow_checkpoint& cp,
                               std::uint64_t expected_revision) {
  return impl_->set_checkpoint_if(cp, expected_revision);
}
bool redis_store::clear_checkpoint_if(std::string_view key,
                                      std::uint64_t expected_revision) {
  return impl_->clear_checkpoint_if(key, expected_revision);
}
void redis_store::clear_checkpoint(std::string_view key) {
  impl_->clear_checkpoint(key);
}
bool redis_store::clear_damaged_checkpoint(std::string_view key) {
  return impl_->clear_damaged_checkpoint(key);
}
std::optional<std::string>
redis_store::get_user_data(std::string_view user, std::string_view ns,
                           std::string_view key) {
  return impl_->get_user_data(user, ns, key);
}
void redis_store::set_user_data(std::string_view user, std::string_view ns,
                                std::string_view key,
                                std::string_view value_json,
                                std::optional<std::chrono::milliseconds> ttl) {
  impl_->set_user_data(user, ns, key, value_json, ttl);
}
bool redis_store::delete_user_data(std::string_view user, std::string_view ns,
                                   std::string_view key) {
  return impl_->delete_user_data(user, ns, key);
}
std::vector<std::pair<std::string, std::string>>
redis_store::list_user_data(std::string_view user, std::string_view ns) {
  return impl_->list_user_data(user, ns);
}
std::optional<fenced_lock>
redis_store::acquire_lock_fenced(std::string_view key,
                                 std::chrono::milliseconds ttl) {
  return impl_->acquire_lock_fenced(key, ttl);
}
bool redis_store::renew_lock(std::string_view key, std::string_view token,
                             std::chrono::milliseconds ttl) {
  return impl_->renew_lock(key, token, ttl);
}
bool redis_store::release_lock(std::string_view key, std::string_view token) {
  return impl_->release_lock(key, token);
}

} // namespace botmesh
