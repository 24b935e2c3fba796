// The Redis store in the legacy single-node layout (see redis_layout.hpp):
// the behaviour behind redis_store when its layout is "legacy".

#include <botmesh/stores/redis/internal/store_impl.hpp>

#include <algorithm>
#include <functional>

#include <fmt/format.h>

#include <botmesh/runtime/core/checkpoint.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/json.hpp>
#include <botmesh/stores/redis/internal/scripts.hpp>
#include <botmesh/stores/redis/internal/store_codec.hpp>

namespace botmesh::internal {

namespace {

using kind = redis_reply::kind;

class legacy_store final : public store {
 public:
  legacy_store(std::shared_ptr<redis_client> c,
               std::shared_ptr<const redis_layout> l, std::size_t max_log)
    : client_(std::move(c)), layout_(std::move(l)), max_log_(max_log) {
    // nop
  }

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
                     std::optional<std::chrono::milliseconds> ttl) override;
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

  std::shared_ptr<redis_client> client_;
  std::shared_ptr<const redis_layout> layout_;
  std::size_t max_log_;
};

} // namespace

// -- chats --------------------------------------------------------------------

void legacy_store::save_chat(const chat_record& rec) {
  detail::check_key(rec.key, "key");
  check_json("data", fmt::format("chat {}", rec.key), rec.data);
  auto& L = *layout_;
  client_->eval(lua().chat_save,
                {L.chat(rec.key), L.chat_index()},
                {rec.key, rec.provider, rec.chat, rec.participant,
                 ms(rec.created_at), ms(rec.last_message_at), rec.data});
}

namespace {

// Reads every hash of an index in one pipeline.
template <class Read>
auto read_index(redis_client& c, const std::string& index,
                const std::function<std::string(std::string_view)>& key_of,
                Read read) {
  auto ids = c.call({"ZRANGE", index, "0", "-1"});
  expect_reply("ZRANGE " + index, ids, kind::array);
  std::vector<redis_client::command> cmds;
  for (auto& id : ids.elements)
    cmds.push_back({"HGETALL", key_of(id.str)});
  std::vector<decltype(read(std::string_view{}, fields{}))> out;
  if (cmds.empty())
    return out;
  auto replies = c.pipeline(std::move(cmds));
  for (size_t i = 0; i < replies.size(); ++i) {
    auto key = key_of(ids.elements[i].str);
    auto f = to_fields("HGETALL " + key, replies[i]);
    if (!f.empty()) // deleted between the two calls
      out.push_back(read(key, f));
  }
  return out;
}

} // namespace

std::optional<chat_record> legacy_store::get_chat(std::string_view key) {
  auto k = layout_->chat(key);
  auto f = to_fields("HGETALL " + k, client_->call({"HGETALL", k}));
  if (f.empty())
    return std::nullopt;
  return read_chat(k, f);
}

bool legacy_store::delete_chat(std::string_view key) {
  auto& L = *layout_;
  return flag("script chat_delete",
              client_->eval(lua().chat_delete,
                            {L.chat(key), L.chat_index(), L.log(key),
                             L.log_seq(key)},
                            {std::string{key}}));
}

std::vector<chat_record> legacy_store::list_chats() {
  auto& L = *layout_;
  return read_index(*client_, L.chat_index(),
                    [&](std::string_view id) { return L.chat(id); },
                    read_chat);
}

// -- contacts -----------------------------------------------------------------

void legacy_store::save_contact(const contact_record& rec) {
  detail::check_key(rec.id, "id");
  check_json("data", fmt::format("contact {}", rec.id), rec.data);
  auto& L = *layout_;
  client_->eval(lua().record_save,
                {L.contact(rec.id), L.contact_index()},
                {rec.id, "id", rec.id, "name", rec.name, "phone", rec.phone,
                 "updated_at", ms(rec.updated_at), "data", rec.data});
}

std::optional<contact_record> legacy_store::get_contact(std::string_view id) {
  auto k = layout_->contact(id);
  auto f = to_fields("HGETALL " + k, client_->call({"HGETALL", k}));
  if (f.empty())
    return std::nullopt;
  return read_contact(k, f);
}

bool legacy_store::delete_contact(std::string_view id) {
  auto& L = *layout_;
  return flag("script record_delete",
              client_->eval(lua().record_delete,
                            {L.contact(id), L.contact_index()},
                            {std::string{id}}));
}

std::vector<contact_record> legacy_store::list_contacts() {
  auto& L = *layout_;
  return read_index(*client_, L.contact_index(),
                    [&](std::string_view id) { return L.contact(id); },
                    read_contact);
}

// -- message log --------------------------------------------------------------

std::uint64_t legacy_store::append_message(std::string_view chat_key,
                                          const logged_message& msg) {
  detail::check_key(chat_key, "chat_key");
  auto entry = encode_entry(msg);
  auto& L = *layout_;
  auto r = client_->eval(lua().log_append,
                         {L.log_seq(chat_key), L.log(chat_key)},
                         {entry, std::to_string(max_log_)});
  expect_reply("script log_append", r, kind::integer);
  return static_cast<std::uint64_t>(r.integer);
}

std::vector<logged_message> legacy_store::messages(std::string_view chat_key,
                                                  std::size_t limit) {
  if (limit == 0)
    return {};
  auto k = layout_->log(chat_key);
  auto r = client_->call({"LRANGE", k, "-" + std::to_string(limit), "-1"});
  expect_reply("LRANGE " + k, r, kind::array);
  std::vector<logged_message> out;
  out.reserve(r.elements.size());
  for (auto& item : r.elements) {
    auto m = decode_entry(item.str, "message log " + k);
    out.push_back(std::move(m));
  }
  return out;
}

// -- checkpoints --------------------------------------------------------------

std::optional<flow_checkpoint>
legacy_store::get_checkpoint(std::string_view key) {
  auto k = layout_->checkpoint(key);
  auto f = to_fields("HGETALL " + k, client_->call({"HGETALL", k}));
  if (f.empty())
    return std::nullopt;
  return read_checkpoint(k, f);
}

std::optional<std::uint64_t>
legacy_store::write_checkpoint(const flow_checkpoint& cp, std::string expected) {
  detail::check_key(cp.key, "key");
  if (!is_valid_json(cp.state))
    throw invalid_argument_error(
      "state", fmt::format("checkpoint {}: state is not a JSON document",
                           cp.key));
  auto now = std::chrono::time_point_cast<std::chrono::milliseconds>(
    std::chrono::system_clock::now());
  auto body = cp;
  body.updated_at = now;
  auto created = cp.created_at == time_point{} ? now : cp.created_at;
  auto& L = *layout_;
  auto r = client_->eval(lua().checkpoint_set,
                         {L.checkpoint(cp.key), L.checkpoint_revision(cp.key)},
                         {std::move(expected), to_json(body, SIZE_MAX),
                          ms(created), cp.ephemeral ? ms(cp.expires_at) : "0"});
  return rev_or_nil("script checkpoint_set", r);
}

std::uint64_t legacy_store::set_checkpoint(const flow_checkpoint& cp) {
  auto rev = write_checkpoint(cp, "any");
  if (!rev)
    throw error(errc::store_error, fmt::format("redis store: unconditional "
                                               "checkpoint write of {} was "
                                               "refused",
                                               cp.key));
  return *rev;
}

std::optional<std::uint64_t>
legacy_store::set_checkpoint_if(const flow_checkpoint& cp,
                               std::uint64_t expected_revision) {
  return write_checkpoint(cp, std::to_string(expected_revision));
}

bool legacy_store::clear_checkpoint_if(std::string_view key,
                                      std::uint64_t expected_revision) {
  return flag("script checkpoint_clear_if",
              client_->eval(lua().checkpoint_clear_if,
                            {layout_->checkpoint(key)},
                            {std::to_string(expected_revision)}));
}

bool legacy_store::clear_damaged_checkpoint(std::string_view key) {
  return flag("script checkpoint_clear_if",
              client_->eval(lua().checkpoint_clear_if,
                            {layout_->checkpoint(key)}, {"damaged"}));
}

void legacy_store::clear_checkpoint(std::string_view key) {
  client_->call({"DEL", layout_->checkpoint(key)});
}

// -- user data ----------------------------------------------------------------

std::optional<std::string>
legacy_store::get_user_data(std::string_view user, std::string_view ns,
                           std::string_view key) {
  detail::check_user_data_args(user, ns, key);
  auto k = layout_->user_data(user, ns, key);
  auto r = client_->call({"GET", k});
  if (r.is_nil())
    return std::nullopt;
  expect_reply("GET " + k, r, kind::string);
  return r.str;
}

void legacy_store::set_user_data(std::string_view user, std::string_view ns,
                                std::string_view key,
                                std::string_view value_json,
                                std::optional<std::chrono::milliseconds> ttl) {
  detail::check_user_data_args(user, ns, key);
  if (ttl)
    detail::check_ttl(*ttl);
  check_json("value", fmt::format("user data {}/{}/{}", user, ns, key),
             value_json);
  auto& L = *layout_;
  client_->eval(lua().user_data_set,
                {L.user_data(user, ns, key), L.user_data_index(user, ns)},
                {std::string{key}, std::string{value_json},
                 std::to_string(ttl ? ttl->count() : 0)});
}

bool legacy_store::delete_user_data(std::string_view user, std::string_view ns,
                                   std::string_view key) {
  detail::check_user_data_args(user, ns, key);
  auto& L = *layout_;
  auto replies = client_->pipeline(
    {{"DEL", L.user_data(user, ns, key)},
     {"ZREM", L.user_data_index(user, ns), std::string{key}}});
  auto deleted = flag("DEL user data", replies[0]);
  // An index the key stays in (a damaged one: WRONGTYPE) would list a
  // value that is gone: said, not dropped.
  flag(fmt::format("ZREM user data index {}", L.user_data_index(user, ns)),
       replies[1]);
  return deleted;
}

std::vector<std::pair<std::string, std::string>>
legacy_store::list_user_data(std::string_view user, std::string_view ns) {
  detail::check_key(user, "user");
  detail::check_key(ns, "ns");
  auto& L = *layout_;
  auto index = L.user_data_index(user, ns);
  auto now = std::to_string(
    std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch())
      .count());
  // Expired entries leave the index before it is read.
  auto replies = client_->pipeline(
    {{"ZREMRANGEBYSCORE", index, "-inf", "(" + now}, {"ZRANGE", index, "0", "-1"}});
  expect_reply("ZRANGE " + index, replies[1], kind::array);
  std::vector<std::string> members;
  for (auto& m : replies[1].elements)
    members.push_back(m.str);
  return read_user_values(*client_, std::move(members),
                          [&](const std::string& m) {
                            return L.user_data(user, ns, m);
                          });
}

// -- locks --------------------------------------------------------------------

std::optional<fenced_lock>
legacy_store::acquire_lock_fenced(std::string_view key,
                                 std::chrono::milliseconds ttl) {
  detail::check_key(key);
  detail::check_ttl(ttl);
  return acquire_lock(client_, layout_->lock(key), layout_->fence(key), ttl);
}

bool legacy_store::renew_lock(std::string_view key, std::string_view token,
                             std::chrono::milliseconds ttl) {
  detail::check_key(key);
  detail::check_ttl(ttl);
  if (token.empty())
    return false;
  return flag("script lock_renew",
              client_->eval(lua().lock_renew, {layout_->lock(key)},
                            {std::string{token}, std::to_string(ttl.count())}));
}

bool legacy_store::release_lock(std::string_view key, std::string_view token) {
  detail::check_key(key);
  if (token.empty())
    return false;
  return flag("script lock_release",
              client_->eval(lua().lock_release, {layout_->lock(key)},
                            {std::string{token}}));
}


std::unique_ptr<store>
make_legacy_redis_store(std::shared_ptr<redis_client> client,
                        std::shared_ptr<const redis_layout> layout,
                        std::size_t max_log) {
  return std::make_unique<legacy_store>(std::move(client), std::move(layout),
                                        max_log);
}

} // namespace botmesh::internal
