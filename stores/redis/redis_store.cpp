#include <botmesh/stores/redis/redis_store.hpp>

#include <algorithm>
#include <charconv>
#include <map>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/internal/json_reader.hpp>
#include <botmesh/runtime/core/json.hpp>
#include <botmesh/stores/redis/internal/schedule_store.hpp>
#include <botmesh/stores/redis/internal/scripts.hpp>
#include <botmesh/stores/redis/redis_coordinator.hpp>

namespace botmesh {

namespace {

using kind = redis_reply::kind;
using fields = std::map<std::string, std::string, std::less<>>;

[[noreturn]] void corrupted(std::string_view key, std::string_view why) {
  throw error(errc::corrupted_record,
              fmt::format("redis store: record {}: {}", key, why));
}

// HGETALL's flat array as a map; empty when the key does not exist.
fields to_fields(std::string_view what, const redis_reply& r) {
  expect_reply(what, r, kind::array);
  fields out;
  for (size_t i = 0; i + 1 < r.elements.size(); i += 2)
    out.emplace(r.elements[i].str, r.elements[i + 1].str);
  return out;
}

const std::string& field(const fields& f, std::string_view key,
                         std::string_view name) {
  auto i = f.find(name);
  if (i == f.end())
    corrupted(key, fmt::format("field \"{}\" is missing", name));
  return i->second;
}

std::int64_t int_field(const fields& f, std::string_view key,
                       std::string_view name) {
  auto& s = field(f, key, name);
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size())
    corrupted(key, fmt::format("field \"{}\" is not an integer: \"{}\"", name,
                               s));
  return v;
}

std::string ms(time_point t) {
  return std::to_string(to_unix_ms(t));
}

void check_json(std::string_view field_name, std::string_view what,
                std::string_view value) {
  if (!is_valid_json(value))
    throw invalid_argument_error(std::string{field_name},
                                 fmt::format("{}: {} is not JSON", what,
                                             field_name));
}

std::optional<std::uint64_t> rev_or_nil(std::string_view what,
                                        const redis_reply& r) {
  if (r.is_nil())
    return std::nullopt;
  expect_reply(what, r, kind::integer);
  return static_cast<std::uint64_t>(r.integer);
}

bool flag(std::string_view what, const redis_reply& r) {
  expect_reply(what, r, kind::integer);
  return r.integer != 0;
}

} // namespace

redis_store::redis_store(redis_store_options opts) : opts_(std::move(opts)) {
  layout_ = make_legacy_layout(opts_.prefix);
  if (opts_.client) {
    client_ = opts_.client;
  } else {
    auto copts = opts_.client_options;
    copts.url = opts_.url;
    client_ = std::make_shared<redis_client>(copts);
  }
  if (client_->is_cluster())
    throw invalid_argument_error(
      "layout", fmt::format("redis store {}: the legacy key layout cannot run "
                            "on a Redis Cluster (its scripts span hash "
                            "slots); the cluster:v1 layout is not available "
                            "in this store yet",
                            client_->endpoint()));
  schedules_ = internal::make_redis_schedule_store(client_, layout_);
  leases_ = internal::make_redis_lease_provider(client_, layout_);
}

redis_store::~redis_store() = default;

void redis_store::start() {
  auto r = client_->call({"PING"});
  if (r.str != "PONG")
    throw error(errc::store_error,
                fmt::format("redis {}: PING answered \"{}\"",
                            client_->endpoint(), r.str));
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
                              .lease = lease});
}

redis_client& redis_store::client() noexcept {
  return *client_;
}

const redis_layout& redis_store::layout() const noexcept {
  return *layout_;
}

// -- chats --------------------------------------------------------------------

void redis_store::save_chat(const chat_record& rec) {
  detail::check_key(rec.key, "key");
  check_json("data", fmt::format("chat {}", rec.key), rec.data);
  auto& L = *layout_;
  client_->eval(internal::lua().chat_save,
                {L.chat(rec.key), L.chat_index()},
                {rec.key, rec.provider, rec.chat, rec.participant,
                 ms(rec.created_at), ms(rec.last_message_at), rec.data});
}

namespace {

chat_record read_chat(std::string_view key, const fields& f) {
  return chat_record{field(f, key, "key"),
                     field(f, key, "provider"),
                     field(f, key, "chat"),
                     field(f, key, "participant"),
                     from_unix_ms(int_field(f, key, "created_at")),
                     from_unix_ms(int_field(f, key, "last_message_at")),
                     field(f, key, "data")};
}

contact_record read_contact(std::string_view key, const fields& f) {
  return contact_record{field(f, key, "id"), field(f, key, "name"),
                        field(f, key, "phone"),
                        from_unix_ms(int_field(f, key, "updated_at")),
                        field(f, key, "data")};
}

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

std::optional<chat_record> redis_store::get_chat(std::string_view key) {
  auto k = layout_->chat(key);
  auto f = to_fields("HGETALL " + k, client_->call({"HGETALL", k}));
  if (f.empty())
    return std::nullopt;
  return read_chat(k, f);
}

bool redis_store::delete_chat(std::string_view key) {
  auto& L = *layout_;
  return flag("script chat_delete",
              client_->eval(internal::lua().chat_delete,
                            {L.chat(key), L.chat_index(), L.log(key),
                             L.log_seq(key)},
                            {std::string{key}}));
}

std::vector<chat_record> redis_store::list_chats() {
  auto& L = *layout_;
  return read_index(*client_, L.chat_index(),
                    [&](std::string_view id) { return L.chat(id); },
                    read_chat);
}

// -- contacts -----------------------------------------------------------------

void redis_store::save_contact(const contact_record& rec) {
  detail::check_key(rec.id, "id");
  check_json("data", fmt::format("contact {}", rec.id), rec.data);
  auto& L = *layout_;
  client_->eval(internal::lua().record_save,
                {L.contact(rec.id), L.contact_index()},
                {rec.id, "id", rec.id, "name", rec.name, "phone", rec.phone,
                 "updated_at", ms(rec.updated_at), "data", rec.data});
}

std::optional<contact_record> redis_store::get_contact(std::string_view id) {
  auto k = layout_->contact(id);
  auto f = to_fields("HGETALL " + k, client_->call({"HGETALL", k}));
  if (f.empty())
    return std::nullopt;
  return read_contact(k, f);
}

bool redis_store::delete_contact(std::string_view id) {
  auto& L = *layout_;
  return flag("script record_delete",
              client_->eval(internal::lua().record_delete,
                            {L.contact(id), L.contact_index()},
                            {std::string{id}}));
}

std::vector<contact_record> redis_store::list_contacts() {
  auto& L = *layout_;
  return read_index(*client_, L.contact_index(),
                    [&](std::string_view id) { return L.contact(id); },
                    read_contact);
}

// -- message log --------------------------------------------------------------

std::uint64_t redis_store::append_message(std::string_view chat_key,
                                          const logged_message& msg) {
  detail::check_key(chat_key, "chat_key");
  std::string entry = fmt::format("{{\"dir\":{},\"id\":",
                                  static_cast<int>(msg.dir));
  append_json_string(entry, msg.id);
  entry += ",\"sender\":";
  append_json_string(entry, msg.sender);
  entry += ",\"text\":";
  append_json_string(entry, msg.text);
  entry += ",\"type\":";
  append_json_string(entry, to_string(msg.type));
  entry += fmt::format(",\"at\":{}}}", to_unix_ms(msg.at));
  auto& L = *layout_;
  auto r = client_->eval(internal::lua().log_append,
                         {L.log_seq(chat_key), L.log(chat_key)},
                         {entry, std::to_string(opts_.max_log_per_chat)});
  expect_reply("script log_append", r, kind::integer);
  return static_cast<std::uint64_t>(r.integer);
}

std::vector<logged_message> redis_store::messages(std::string_view chat_key,
                                                  std::size_t limit) {
  if (limit == 0)
    return {};
  auto k = layout_->log(chat_key);
  auto r = client_->call({"LRANGE", k, "-" + std::to_string(limit), "-1"});
  expect_reply("LRANGE " + k, r, kind::array);
  std::vector<logged_message> out;
  out.reserve(r.elements.size());
  for (auto& item : r.elements) {
    auto j = internal::json_reader::parse(item.str, "message log " + k);
    logged_message m;
    m.seq = j.uint64("seq");
    m.dir = j.int64("dir") == 0 ? direction::in : direction::out;
    m.id = j.string("id");
    m.sender = j.string("sender");
    m.text = j.string("text");
    m.type = j.type("type");
    m.at = from_unix_ms(j.int64("at"));
    out.push_back(std::move(m));
  }
  return out;
}

// -- checkpoints --------------------------------------------------------------

std::optional<flow_checkpoint>
redis_store::get_checkpoint(std::string_view key) {
  auto k = layout_->checkpoint(key);
  auto f = to_fields("HGETALL " + k, client_->call({"HGETALL", k}));
  if (f.empty())
    return std::nullopt;
  auto rev = int_field(f, k, "rev");
  auto created = int_field(f, k, "created");
  try {
    auto cp = checkpoint_from_json(field(f, k, "body"));
    cp.revision = static_cast<std::uint64_t>(rev);
    cp.created_at = from_unix_ms(created);
    return cp;
  } catch (const error& e) {
    if (e.code() != errc::corrupted_record)
      throw;
    corrupted(k, e.what());
  }
}

std::optional<std::uint64_t>
redis_store::write_checkpoint(const flow_checkpoint& cp, std::string expected) {
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
  auto r = client_->eval(internal::lua().checkpoint_set,
                         {L.checkpoint(cp.key), L.checkpoint_revision(cp.key)},
                         {std::move(expected), to_json(body, SIZE_MAX),
                          ms(created), cp.ephemeral ? ms(cp.expires_at) : "0"});
  return rev_or_nil("script checkpoint_set", r);
}

std::uint64_t redis_store::set_checkpoint(const flow_checkpoint& cp) {
  auto rev = write_checkpoint(cp, "any");
  if (!rev)
    throw error(errc::store_error, fmt::format("redis store: unconditional "
                                               "checkpoint write of {} was "
                                               "refused",
                                               cp.key));
  return *rev;
}

std::optional<std::uint64_t>
redis_store::set_checkpoint_if(const flow_checkpoint& cp,
                               std::uint64_t expected_revision) {
  return write_checkpoint(cp, std::to_string(expected_revision));
}

bool redis_store::clear_checkpoint_if(std::string_view key,
                                      std::uint64_t expected_revision) {
  return flag("script checkpoint_clear_if",
              client_->eval(internal::lua().checkpoint_clear_if,
                            {layout_->checkpoint(key)},
                            {std::to_string(expected_revision)}));
}

void redis_store::clear_checkpoint(std::string_view key) {
  client_->call({"DEL", layout_->checkpoint(key)});
}

// -- user data ----------------------------------------------------------------

std::optional<std::string>
redis_store::get_user_data(std::string_view user, std::string_view ns,
                           std::string_view key) {
  detail::check_user_data_args(user, ns, key);
  auto k = layout_->user_data(user, ns, key);
  auto r = client_->call({"GET", k});
  if (r.is_nil())
    return std::nullopt;
  expect_reply("GET " + k, r, kind::string);
  return r.str;
}

void redis_store::set_user_data(std::string_view user, std::string_view ns,
                                std::string_view key,
                                std::string_view value_json,
                                std::optional<std::chrono::milliseconds> ttl) {
  detail::check_user_data_args(user, ns, key);
  if (ttl)
    detail::check_ttl(*ttl);
  check_json("value", fmt::format("user data {}/{}/{}", user, ns, key),
             value_json);
  auto& L = *layout_;
  client_->eval(internal::lua().user_data_set,
                {L.user_data(user, ns, key), L.user_data_index(user, ns)},
                {std::string{key}, std::string{value_json},
                 std::to_string(ttl ? ttl->count() : 0)});
}

bool redis_store::delete_user_data(std::string_view user, std::string_view ns,
                                   std::string_view key) {
  detail::check_user_data_args(user, ns, key);
  auto& L = *layout_;
  auto replies = client_->pipeline(
    {{"DEL", L.user_data(user, ns, key)},
     {"ZREM", L.user_data_index(user, ns), std::string{key}}});
  return flag("DEL user data", replies[0]);
}

std::vector<std::pair<std::string, std::string>>
redis_store::list_user_data(std::string_view user, std::string_view ns) {
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
  std::sort(members.begin(), members.end());
  std::vector<std::pair<std::string, std::string>> out;
  if (members.empty())
    return out;
  redis_client::command mget{"MGET"};
  for (auto& m : members)
    mget.push_back(L.user_data(user, ns, m));
  auto values = client_->call(std::move(mget));
  expect_reply("MGET user data", values, kind::array);
  for (size_t i = 0; i < members.size() && i < values.elements.size(); ++i)
    if (!values.elements[i].is_nil())
      out.emplace_back(members[i], values.elements[i].str);
  return out;
}

// -- locks --------------------------------------------------------------------

std::optional<fenced_lock>
redis_store::acquire_lock_fenced(std::string_view key,
                                 std::chrono::milliseconds ttl) {
  detail::check_key(key);
  detail::check_ttl(ttl);
  auto token = detail::random_token();
  auto fence = rev_or_nil("script lock_acquire",
                          client_->eval(internal::lua().lock_acquire,
                                        {layout_->lock(key), layout_->fence(key)},
                                        {token, std::to_string(ttl.count())}));
  if (!fence)
    return std::nullopt;
  return fenced_lock{std::move(token), *fence};
}

bool redis_store::renew_lock(std::string_view key, std::string_view token,
                             std::chrono::milliseconds ttl) {
  detail::check_key(key);
  detail::check_ttl(ttl);
  if (token.empty())
    return false;
  return flag("script lock_renew",
              client_->eval(internal::lua().lock_renew, {layout_->lock(key)},
                            {std::string{token}, std::to_string(ttl.count())}));
}

bool redis_store::release_lock(std::string_view key, std::string_view token) {
  detail::check_key(key);
  if (token.empty())
    return false;
  return flag("script lock_release",
              client_->eval(internal::lua().lock_release, {layout_->lock(key)},
                            {std::string{token}}));
}

} // namespace botmesh
