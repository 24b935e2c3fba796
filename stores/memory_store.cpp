#include <botmesh/stores/memory_store.hpp>

#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/json.hpp>
#include <botmesh/stores/internal/log_cap.hpp>

namespace botmesh {

namespace {

// Heterogeneous lookup so string_view keys need no allocation.
template <class V>
using ordered_map = std::map<std::string, V, std::less<>>;

struct log_state {
  std::uint64_t next_seq = 1;
  std::deque<logged_message> entries;
};

struct checkpoint_slot {
  std::uint64_t last_revision = 0; // survives clears: revisions never repeat
  std::optional<flow_checkpoint> live;
};

struct user_value {
  std::string json;
  std::optional<time_point> expires_at;
};

struct lock_slot {
  std::uint64_t fence = 0; // survives release and expiry
  std::string token;       // empty when free
  time_point expires_at{};
};

} // namespace

struct memory_store::impl {
  explicit impl(memory_store_options o)
    : opts(o), clk(o.clock ? o.clock : &botmesh::clock::system()) {
    // nop
  }

  time_point now() const {
    return clk->now();
  }

  // Drops an ephemeral checkpoint whose expiry passed; caller holds cp_mtx.
  void expire(checkpoint_slot& slot) {
    if (slot.live && slot.live->ephemeral
        && slot.live->expires_at <= now())
      slot.live.reset();
  }

  std::uint64_t write(checkpoint_slot& slot, const flow_checkpoint& cp) {
    auto t = now();
    flow_checkpoint stored = cp;
    stored.revision = ++slot.last_revision;
    stored.created_at = slot.live ? slot.live->created_at
                                  : (cp.created_at == time_point{} ? t
                                                                   : cp.created_at);
    stored.updated_at = t;
    slot.live = std::move(stored);
    return slot.last_revision;
  }

  static void check_checkpoint(const flow_checkpoint& cp) {
    detail::check_key(cp.key, "key");
    if (!is_valid_json(cp.state))
      throw invalid_argument_error(
        "state",
        fmt::format("checkpoint {}: state is not a JSON document", cp.key));
  }

  bool live(const user_value& v) const {
    return !v.expires_at || *v.expires_at > now();
  }

  // "<size of user>:<user><size of ns>:<ns>", then the key: with the
  // sizes, no user or namespace can end where another's begins (with a
  // separator alone, "a\x1fb"/"c" and "a"/"b\x1fc" were one entry). The
  // keys of one (user, ns) share the prefix and sort after it by key.
  static std::string user_prefix(std::string_view user, std::string_view ns) {
    return fmt::format("{}:{}{}:{}", user.size(), user, ns.size(), ns);
  }

  static std::string user_key(std::string_view user, std::string_view ns,
                              std::string_view key) {
    auto k = user_prefix(user, ns);
    k.append(key);
    return k;
  }

  memory_store_options opts;
  const botmesh::clock* clk;

  std::mutex chats_mtx;
  ordered_map<chat_record> chats;
  std::mutex contacts_mtx;
  ordered_map<contact_record> contacts;
  std::mutex logs_mtx;
  std::unordered_map<std::string, log_state> logs;
  std::mutex cp_mtx;
  std::unordered_map<std::string, checkpoint_slot> checkpoints;
  std::mutex user_mtx;
  ordered_map<user_value> user;
  std::mutex lock_mtx;
  std::unordered_map<std::string, lock_slot> locks;
};

memory_store::memory_store(memory_store_options opts)
  : impl_((internal::check_log_cap(opts.max_log_per_chat, "memory store"),
           std::make_unique<impl>(opts))) {
  // nop
}

memory_store::~memory_store() {
  // nop
}

// -- chats --------------------------------------------------------------------

void memory_store::save_chat(const chat_record& rec) {
  detail::check_key(rec.key, "key");
  if (!is_valid_json(rec.data))
    throw invalid_argument_error("data", fmt::format(
                                           "chat {}: data is not JSON", rec.key));
  std::lock_guard guard{impl_->chats_mtx};
  auto i = impl_->chats.find(rec.key);
  if (i == impl_->chats.end()) {
    impl_->chats.emplace(rec.key, rec);
  } else {
    auto created = i->second.created_at;
    i->second = rec;
    if (created != time_point{})
      i->second.created_at = created;
  }
}

std::optional<chat_record> memory_store::get_chat(std::string_view key) {
  std::lock_guard guard{impl_->chats_mtx};
  auto i = impl_->chats.find(key);
  if (i == impl_->chats.end())
    return std::nullopt;
  return i->second;
}

bool memory_store::delete_chat(std::string_view key) {
  bool existed;
  {
    std::lock_guard guard{impl_->chats_mtx};
    auto i = impl_->chats.find(key);
    existed = i != impl_->chats.end();
    if (existed)
      impl_->chats.erase(i);
  }
  std::lock_guard guard{impl_->logs_mtx};
  impl_->logs.erase(std::string{key});
  return existed;
}

std::vector<chat_record> memory_store::list_chats() {
  std::lock_guard guard{impl_->chats_mtx};
  std::vector<chat_record> out;
  out.reserve(impl_->chats.size());
  for (auto& [k, v] : impl_->chats)
    out.push_back(v);
  return out;
}

// -- contacts -----------------------------------------------------------------

void memory_store::save_contact(const contact_record& rec) {
  detail::check_key(rec.id, "id");
  if (!is_valid_json(rec.data))
    throw invalid_argument_error(
      "data", fmt::format("contact {}: data is not JSON", rec.id));
  std::lock_guard guard{impl_->contacts_mtx};
  impl_->contacts.insert_or_assign(rec.id, rec);
}

std::optional<contact_record> memory_store::get_contact(std::string_view id) {
  std::lock_guard guard{impl_->contacts_mtx};
  auto i = impl_->contacts.find(id);
  if (i == impl_->contacts.end())
    return std::nullopt;
  return i->second;
}

bool memory_store::delete_contact(std::string_view id) {
  std::lock_guard guard{impl_->contacts_mtx};
  auto i = impl_->contacts.find(id);
  if (i == impl_->contacts.end())
    return false;
  impl_->contacts.erase(i);
  return true;
}

std::vector<contact_record> memory_store::list_contacts() {
  std::lock_guard guard{impl_->contacts_mtx};
  std::vector<contact_record> out;
  out.reserve(impl_->contacts.size());
  for (auto& [k, v] : impl_->contacts)
    out.push_back(v);
  return out;
}

// -- message log --------------------------------------------------------------

std::uint64_t memory_store::append_message(std::string_view chat_key,
                                           const logged_message& msg) {
  detail::check_key(chat_key, "chat_key");
  std::lock_guard guard{impl_->logs_mtx};
  auto& log = impl_->logs[std::string{chat_key}];
  auto& entry = log.entries.emplace_back(msg);
  entry.seq = log.next_seq++;
  while (log.entries.size() > impl_->opts.max_log_per_chat)
    log.entries.pop_front();
  return entry.seq;
}

std::vector<logged_message> memory_store::messages(std::string_view chat_key,
                                                   std::size_t limit) {
  std::lock_guard guard{impl_->logs_mtx};
  auto i = impl_->logs.find(std::string{chat_key});
  if (i == impl_->logs.end())
    return {};
  auto& entries = i->second.entries;
  auto n = std::min(limit, entries.size());
  return {entries.end() - static_cast<std::ptrdiff_t>(n), entries.end()};
}

// -- checkpoints --------------------------------------------------------------

std::optional<flow_checkpoint>
memory_store::get_checkpoint(std::string_view key) {
  std::lock_guard guard{impl_->cp_mtx};
  auto i = impl_->checkpoints.find(std::string{key});
  if (i == impl_->checkpoints.end())
    return std::nullopt;
  impl_->expire(i->second);
  return i->second.live;
}

std::uint64_t memory_store::set_checkpoint(const flow_checkpoint& cp) {
  impl::check_checkpoint(cp);
  std::lock_guard guard{impl_->cp_mtx};
  auto& slot = impl_->checkpoints[cp.key];
  impl_->expire(slot);
  return impl_->write(slot, cp);
}

std::optional<std::uint64_t>
memory_store::set_checkpoint_if(const flow_checkpoint& cp,
                                std::uint64_t expected_revision) {
  impl::check_checkpoint(cp);
  std::lock_guard guard{impl_->cp_mtx};
  auto& slot = impl_->checkpoints[cp.key];
  impl_->expire(slot);
  auto current = slot.live ? slot.live->revision : 0;
  if (current != expected_revision)
    return std::nullopt;
  return impl_->write(slot, cp);
}

bool memory_store::clear_checkpoint_if(std::string_view key,
                                       std::uint64_t expected_revision) {
  std::lock_guard guard{impl_->cp_mtx};
  auto i = impl_->checkpoints.find(std::string{key});
  if (i == impl_->checkpoints.end())
    return false;
  impl_->expire(i->second);
  if (!i->second.live || i->second.live->revision != expected_revision)
    return false;
  i->second.live.reset();
  return true;
}

void memory_store::clear_checkpoint(std::string_view key) {
  std::lock_guard guard{impl_->cp_mtx};
  auto i = impl_->checkpoints.find(std::string{key});
  if (i != impl_->checkpoints.end())
    i->second.live.reset();
}

// -- user data ----------------------------------------------------------------

std::optional<std::string>
memory_store::get_user_data(std::string_view user, std::string_view ns,
                            std::string_view key) {
  detail::check_user_data_args(user, ns, key);
  std::lock_guard guard{impl_->user_mtx};
  auto i = impl_->user.find(impl::user_key(user, ns, key));
  if (i == impl_->user.end() || !impl_->live(i->second))
    return std::nullopt;
  return i->second.json;
}

void memory_store::set_user_data(std::string_view user, std::string_view ns,
                                 std::string_view key,
                                 std::string_view value_json,
                                 std::optional<std::chrono::milliseconds> ttl) {
  detail::check_user_data_args(user, ns, key);
  if (ttl)
    detail::check_ttl(*ttl);
  if (!is_valid_json(value_json))
    throw invalid_argument_error(
      "value", fmt::format("user data {}/{}/{}: value is not JSON", user, ns,
                           key));
  user_value v{std::string{value_json}, std::nullopt};
  std::lock_guard guard{impl_->user_mtx};
  if (ttl)
    v.expires_at = impl_->now() + *ttl;
  impl_->user.insert_or_assign(impl::user_key(user, ns, key), std::move(v));
}

bool memory_store::delete_user_data(std::string_view user, std::string_view ns,
                                    std::string_view key) {
  detail::check_user_data_args(user, ns, key);
  std::lock_guard guard{impl_->user_mtx};
  auto i = impl_->user.find(impl::user_key(user, ns, key));
  if (i == impl_->user.end())
    return false;
  bool was_live = impl_->live(i->second);
  impl_->user.erase(i);
  return was_live;
}

std::vector<std::pair<std::string, std::string>>
memory_store::list_user_data(std::string_view user, std::string_view ns) {
  detail::check_key(user, "user");
  detail::check_key(ns, "ns");
  auto prefix = impl::user_prefix(user, ns);
  std::vector<std::pair<std::string, std::string>> out;
  std::lock_guard guard{impl_->user_mtx};
  for (auto i = impl_->user.lower_bound(prefix);
       i != impl_->user.end() && i->first.starts_with(prefix); ++i)
    if (impl_->live(i->second))
      out.emplace_back(i->first.substr(prefix.size()), i->second.json);
  return out;
}

// -- locks --------------------------------------------------------------------

std::optional<fenced_lock>
memory_store::acquire_lock_fenced(std::string_view key,
                                  std::chrono::milliseconds ttl) {
  detail::check_key(key);
  detail::check_ttl(ttl);
  std::lock_guard guard{impl_->lock_mtx};
  auto& slot = impl_->locks[std::string{key}];
  auto t = impl_->now();
  if (!slot.token.empty() && slot.expires_at > t)
    return std::nullopt;
  slot.token = detail::random_token();
  slot.expires_at = t + ttl;
  return fenced_lock{slot.token, ++slot.fence};
}

bool memory_store::renew_lock(std::string_view key, std::string_view token,
                              std::chrono::milliseconds ttl) {
  detail::check_key(key);
  detail::check_ttl(ttl);
  std::lock_guard guard{impl_->lock_mtx};
  auto i = impl_->locks.find(std::string{key});
  auto t = impl_->now();
  if (i == impl_->locks.end() || token.empty() || i->second.token != token
      || i->second.expires_at <= t)
    return false;
  i->second.expires_at = t + ttl;
  return true;
}

bool memory_store::release_lock(std::string_view key, std::string_view token) {
  detail::check_key(key);
  std::lock_guard guard{impl_->lock_mtx};
  auto i = impl_->locks.find(std::string{key});
  if (i == impl_->locks.end() || token.empty() || i->second.token != token
      || i->second.expires_at <= impl_->now())
    return false;
  i->second.token.clear();
  return true;
}

} // namespace botmesh
