// The Redis store in the cluster:v1 layout (see redis_cluster_layout.hpp):
// the behaviour behind redis_store when its layout is "cluster". Every
// script's keys share one hash tag; listings read the bucket indexes.

#include <botmesh/stores/redis/internal/store_impl.hpp>

#include <algorithm>
#include <functional>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include <botmesh/runtime/core/checkpoint.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/json.hpp>
#include <botmesh/stores/redis/internal/scripts.hpp>
#include <botmesh/stores/redis/internal/store_codec.hpp>

namespace botmesh::internal {

namespace {

using kind = redis_reply::kind;
using rk = redis_cluster_layout::record_kind;

int hex_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

class cluster_store final : public store {
 public:
  cluster_store(std::shared_ptr<redis_client> c, redis_cluster_layout l,
                std::size_t max_log)
    : client_(std::move(c)), L_(std::move(l)), max_log_(max_log) {
    // nop
  }

  // -- chats ------------------------------------------------------------------

  void save_chat(const chat_record& rec) override {
    detail::check_key(rec.key, "key");
    check_json("data", fmt::format("chat {}", rec.key), rec.data);
    client_->eval(lua().chat_save,
                  {L_.record(rk::chat, rec.key),
                   L_.record_index_of(rk::chat, rec.key)},
                  {rec.key, rec.provider, rec.chat, rec.participant,
                   ms(rec.created_at), ms(rec.last_message_at), rec.data});
  }

  std::optional<chat_record> get_chat(std::string_view key) override {
    return get_record<chat_record>(rk::chat, key, read_chat);
  }

  // The log lives in the chat's slot, the record in its bucket's: no single
  // script can take both. The log goes first, in atomic batches up to the
  // newest entry seen now (a message appended meanwhile survives), then
  // the record, so a failure half-way leaves the chat listed.
  bool delete_chat(std::string_view key) override {
    auto z = L_.message_log(key);
    auto last = client_->call({"ZRANGE", z, "-1", "-1", "WITHSCORES"});
    expect_reply("ZRANGE " + z, last, kind::array);
    if (last.elements.size() == 2) {
      auto upto = last.elements[1].str;
      for (;;) {
        auto batch = client_->call(
          {"ZRANGEBYSCORE", z, "-inf", upto, "LIMIT", "0",
           std::to_string(cluster_delete_batch)});
        expect_reply("ZRANGEBYSCORE " + z, batch, kind::array);
        if (batch.elements.empty()
            || delete_entries(key, z, upto, batch.elements) == 0)
          break;
      }
    }
    forget_seq(z);
    return delete_record(rk::chat, key);
  }

  std::vector<chat_record> list_chats() override {
    return list_records<chat_record>(rk::chat, read_chat);
  }

  // -- contacts ---------------------------------------------------------------

  void save_contact(const contact_record& rec) override {
    detail::check_key(rec.id, "id");
    check_json("data", fmt::format("contact {}", rec.id), rec.data);
    client_->eval(lua().record_save,
                  {L_.record(rk::contact, rec.id),
                   L_.record_index_of(rk::contact, rec.id)},
                  {rec.id, "id", rec.id, "name", rec.name, "phone", rec.phone,
                   "updated_at", ms(rec.updated_at), "data", rec.data});
  }

  std::optional<contact_record> get_contact(std::string_view id) override {
    return get_record<contact_record>(rk::contact, id, read_contact);
  }

  bool delete_contact(std::string_view id) override {
    return delete_record(rk::contact, id);
  }

  std::vector<contact_record> list_contacts() override {
    return list_records<contact_record>(rk::contact, read_contact);
  }

  // -- message log ------------------------------------------------------------

  // The script names the item key of the seq it expects (every key a
  // script touches is declared, so a slot move answers ASK or TRYAGAIN
  // before anything runs): the seq after the last one this store appended
  // to the chat, else 1; when another writer took it, the script says
  // which seq is next and nothing was written. Trimming follows, as a
  // call of its own: the log may hold a few entries over the maximum
  // until it ends (a failed trim is done by the next append).
  std::uint64_t append_message(std::string_view chat_key,
                               const logged_message& msg) override {
    detail::check_key(chat_key, "chat_key");
    auto z = L_.message_log(chat_key);
    auto entry = encode_entry(msg);
    auto seq = expected_seq(z);
    for (int attempt = 1;; ++attempt) {
      auto r = client_->eval(lua().cl_log_append,
                             {z, L_.message_item(chat_key, std::to_string(seq))},
                             {entry, std::to_string(seq)});
      expect_reply("script cl_log_append", r, kind::array);
      if (r.elements.size() < 2 || r.elements[0].type != kind::integer
          || r.elements[1].type != kind::integer || r.elements[1].integer < 1)
        throw error(errc::store_error,
                    fmt::format("redis store: script cl_log_append on {}: "
                                "unexpected reply",
                                z));
      auto got = static_cast<std::uint64_t>(r.elements[1].integer);
      if (r.elements[0].integer == 1) {
        remember_seq(z, got + 1);
        if (r.elements.size() > 2 && r.elements[2].type == kind::integer
            && static_cast<std::uint64_t>(r.elements[2].integer) > max_log_)
          trim(chat_key, z);
        return got;
      }
      if (attempt == max_append_attempts)
        throw error(errc::store_error,
                    fmt::format("redis store: script cl_log_append on {}: "
                                "other writers took the next seq {} times "
                                "in a row",
                                z, attempt));
      seq = got;
    }
  }

  // The members first (one key), then their items in a script that names
  // them all and skips the ones deleted in between.
  std::vector<logged_message> messages(std::string_view chat_key,
                                       std::size_t limit) override {
    if (limit == 0)
      return {};
    auto z = L_.message_log(chat_key);
    auto n = std::min<std::size_t>(limit, std::size_t{1} << 62);
    auto members = client_->call(
      {"ZRANGE", z, "-" + std::to_string(n), "-1"});
    expect_reply("ZRANGE " + z, members, kind::array);
    if (members.elements.empty())
      return {};
    std::vector<std::string> keys{z}, args;
    keys.reserve(members.elements.size() + 1);
    args.reserve(members.elements.size());
    for (auto& m : members.elements) {
      keys.push_back(L_.message_item(chat_key, m.str));
      args.push_back(m.str);
    }
    auto r = client_->eval(lua().cl_log_range, keys, args);
    expect_reply("script cl_log_range", r, kind::array);
    std::vector<logged_message> out;
    out.reserve(r.elements.size() / 2);
    for (size_t i = 0; i + 1 < r.elements.size(); i += 2) {
      auto& member = r.elements[i].str;
      auto item = L_.message_item(chat_key, member);
      if (r.elements[i + 1].type != kind::string)
        corrupted(item, fmt::format("the log {} lists entry {} but its item "
                                    "is missing",
                                    z, member));
      auto m = decode_entry(r.elements[i + 1].str, "message " + item);
      if (std::to_string(m.seq) != member)
        corrupted(item, fmt::format("its seq {} is not its log entry {}",
                                    m.seq, member));
      out.push_back(std::move(m));
    }
    return out;
  }

  // -- checkpoints ------------------------------------------------------------

  std::optional<flow_checkpoint>
  get_checkpoint(std::string_view key) override {
    return get_record<flow_checkpoint>(rk::checkpoint, key, read_checkpoint);
  }

  std::uint64_t set_checkpoint(const flow_checkpoint& cp) override {
    auto rev = write_checkpoint(cp, "any");
    if (!rev)
      throw error(errc::store_error,
                  fmt::format("redis store: unconditional checkpoint write "
                              "of {} was refused",
                              cp.key));
    return *rev;
  }

  std::optional<std::uint64_t>
  set_checkpoint_if(const flow_checkpoint& cp,
                    std::uint64_t expected_revision) override {
    return write_checkpoint(cp, std::to_string(expected_revision));
  }

  bool clear_checkpoint_if(std::string_view key,
                           std::uint64_t expected_revision) override {
    return flag("script checkpoint_clear_if",
                client_->eval(lua().checkpoint_clear_if,
                              {L_.record(rk::checkpoint, key),
                               L_.record_index_of(rk::checkpoint, key)},
                              {std::to_string(expected_revision),
                               std::string{key}}));
  }

  bool clear_damaged_checkpoint(std::string_view key) override {
    return flag("script checkpoint_clear_if",
                client_->eval(lua().checkpoint_clear_if,
                              {L_.record(rk::checkpoint, key),
                               L_.record_index_of(rk::checkpoint, key)},
                              {"damaged", std::string{key}}));
  }

  void clear_checkpoint(std::string_view key) override {
    client_->eval(lua().record_delete,
                  {L_.record(rk::checkpoint, key),
                   L_.record_index_of(rk::checkpoint, key)},
                  {std::string{key}});
  }

  // -- user data --------------------------------------------------------------

  std::optional<std::string> get_user_data(std::string_view user,
                                           std::string_view ns,
                                           std::string_view key) override {
    detail::check_user_data_args(user, ns, key);
    auto k = L_.user_data(user, ns, key);
    auto r = client_->call({"GET", k});
    if (r.is_nil())
      return std::nullopt;
    expect_reply("GET " + k, r, kind::string);
    return r.str;
  }

  void set_user_data(std::string_view user, std::string_view ns,
                     std::string_view key, std::string_view value_json,
                     std::optional<std::chrono::milliseconds> ttl) override {
    detail::check_user_data_args(user, ns, key);
    if (ttl)
      detail::check_ttl(*ttl);
    check_json("value", fmt::format("user data {}/{}/{}", user, ns, key),
               value_json);
    client_->eval(lua().user_data_set,
                  {L_.user_data(user, ns, key), L_.user_data_index(user)},
                  {redis_cluster_layout::user_data_member(ns, key),
                   std::string{value_json},
                   std::to_string(ttl ? ttl->count() : 0)});
  }

  bool delete_user_data(std::string_view user, std::string_view ns,
                        std::string_view key) override {
    detail::check_user_data_args(user, ns, key);
    return flag("script record_delete",
                client_->eval(lua().record_delete,
                              {L_.user_data(user, ns, key),
                               L_.user_data_index(user)},
                              {redis_cluster_layout::user_data_member(ns,
                                                                      key)}));
  }

  std::vector<std::pair<std::string, std::string>>
  list_user_data(std::string_view user, std::string_view ns) override {
    detail::check_key(user, "user");
    detail::check_key(ns, "ns");
    auto index = L_.user_data_index(user);
    // Expired entries leave the index first, by the server's clock.
    auto pre = encode_key_segment(ns) + ":";
    auto live = client_->eval(lua().cl_index_live, {index}, {pre});
    expect_reply("script cl_index_live", live, kind::array);
    std::vector<std::string> keys;
    for (auto& m : live.elements)
      keys.push_back(decode_key_segment(
        std::string_view{m.str}.substr(pre.size())));
    return read_user_values(*client_, std::move(keys),
                            [&](const std::string& k) {
                              return L_.user_data(user, ns, k);
                            });
  }

  // -- locks ------------------------------------------------------------------

  std::optional<fenced_lock>
  acquire_lock_fenced(std::string_view key,
                      std::chrono::milliseconds ttl) override {
    detail::check_key(key);
    detail::check_ttl(ttl);
    return acquire_lock(client_, L_.lock(key), L_.fence(key), ttl);
  }

  bool renew_lock(std::string_view key, std::string_view token,
                  std::chrono::milliseconds ttl) override {
    detail::check_key(key);
    detail::check_ttl(ttl);
    if (token.empty())
      return false;
    return flag("script lock_renew",
                client_->eval(lua().lock_renew, {L_.lock(key)},
                              {std::string{token},
                               std::to_string(ttl.count())}));
  }

  bool release_lock(std::string_view key, std::string_view token) override {
    detail::check_key(key);
    if (token.empty())
      return false;
    return flag("script lock_release",
                client_->eval(lua().lock_release, {L_.lock(key)},
                              {std::string{token}}));
  }

 private:
  std::optional<std::uint64_t> write_checkpoint(const flow_checkpoint& cp,
                                                std::string expected) {
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
    auto r = client_->eval(lua().checkpoint_set,
                           {L_.record(rk::checkpoint, cp.key),
                            L_.checkpoint_revision(cp.key),
                            L_.record_index_of(rk::checkpoint, cp.key)},
                           {std::move(expected), to_json(body, SIZE_MAX),
                            ms(created),
                            cp.ephemeral ? ms(cp.expires_at) : "0", cp.key});
    return rev_or_nil("script checkpoint_set", r);
  }

  // Deletes the log entries `members` (and their items) of `chat`; returns
  // how many entries up to `upto` remain.
  long long delete_entries(std::string_view chat, const std::string& z,
                           const std::string& upto,
                           const std::vector<redis_reply>& members) {
    std::vector<std::string> keys{z}, args{upto};
    keys.reserve(members.size() + 1);
    args.reserve(members.size() + 1);
    for (auto& m : members) {
      keys.push_back(L_.message_item(chat, m.str));
      args.push_back(m.str);
    }
    auto r = client_->eval(lua().cl_log_delete, keys, args);
    expect_reply("script cl_log_delete", r, kind::integer);
    return r.integer;
  }

  // Drops the entries of a log older than its newest max_log_. Read by
  // rank now, not as a count of the append's own: appends of other threads
  // and replicas trim meanwhile, and two trims of one entry each would
  // delete the two oldest, then the next two. A failure is left to the next
  // append, which trims what is over the maximum then.
  void trim(std::string_view chat, const std::string& z) {
    try {
      auto old = client_->call(
        {"ZRANGE", z, "0", std::to_string(-static_cast<long long>(max_log_) - 1)});
      expect_reply("ZRANGE " + z, old, kind::array);
      if (!old.elements.empty())
        delete_entries(chat, z, "0", old.elements);
    } catch (const error&) {
      // nop: the log stays a little longer than its maximum until then
    }
  }

  std::uint64_t expected_seq(const std::string& z) {
    std::lock_guard guard{seq_mtx_};
    auto i = next_seq_.find(z);
    return i == next_seq_.end() ? 1 : i->second;
  }

  void remember_seq(const std::string& z, std::uint64_t next) {
    std::lock_guard guard{seq_mtx_};
    if (next_seq_.size() >= max_remembered_logs && !next_seq_.contains(z))
      next_seq_.clear(); // a guess only: forgetting costs one more call
    next_seq_[z] = next;
  }

  void forget_seq(const std::string& z) {
    std::lock_guard guard{seq_mtx_};
    next_seq_.erase(z);
  }

  // One record's hash; nothing when it does not exist.
  template <class Record, class Read>
  std::optional<Record> get_record(rk k, std::string_view id, Read read) {
    auto key = L_.record(k, id);
    auto f = to_fields("HGETALL " + key, client_->call({"HGETALL", key}));
    if (f.empty())
      return std::nullopt;
    return read(key, f);
  }

  // A record and its index entry, in one script; false when it was gone.
  bool delete_record(rk k, std::string_view id) {
    return flag("script record_delete",
                client_->eval(lua().record_delete,
                              {L_.record(k, id), L_.record_index_of(k, id)},
                              {std::string{id}}));
  }

  // Every index of a kind in one pipeline, then every hash in another;
  // ordered by id like the legacy single index.
  template <class Record, class Read>
  std::vector<Record> list_records(rk k, Read read) {
    std::vector<redis_client::command> ranges;
    for (std::uint32_t b = 0; b < redis_cluster_layout::buckets; ++b)
      ranges.push_back({"ZRANGE", L_.record_index(k, b), "0", "-1"});
    auto idx = client_->pipeline(std::move(ranges));
    std::vector<std::string> ids;
    for (std::uint32_t b = 0; b < idx.size(); ++b) {
      expect_reply("ZRANGE " + L_.record_index(k, b), idx[b], kind::array);
      for (auto& id : idx[b].elements)
        ids.push_back(id.str);
    }
    std::sort(ids.begin(), ids.end());
    std::vector<Record> out;
    if (ids.empty())
      return out;
    std::vector<redis_client::command> cmds;
    for (auto& id : ids)
      cmds.push_back({"HGETALL", L_.record(k, id)});
    auto replies = client_->pipeline(std::move(cmds));
    for (size_t i = 0; i < replies.size(); ++i) {
      auto key = L_.record(k, ids[i]);
      auto f = to_fields("HGETALL " + key, replies[i]);
      if (!f.empty()) // deleted between the two calls
        out.push_back(read(key, f));
    }
    return out;
  }

  static constexpr int max_append_attempts = 100;
  static constexpr std::size_t max_remembered_logs = 4096;

  std::shared_ptr<redis_client> client_;
  redis_cluster_layout L_;
  std::size_t max_log_;
  // The next seq of the logs this store appended to (a guess that saves
  // a call per append; another writer's appends make it stale).
  std::mutex seq_mtx_;
  std::unordered_map<std::string, std::uint64_t> next_seq_;
};

} // namespace

std::string decode_key_segment(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      auto hi = hex_value(s[i + 1]);
      auto lo = hex_value(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

std::unique_ptr<store>
make_cluster_redis_store(std::shared_ptr<redis_client> client,
                         redis_cluster_layout layout, std::size_t max_log) {
  return std::make_unique<cluster_store>(std::move(client), std::move(layout),
                                         max_log);
}

} // namespace botmesh::internal
