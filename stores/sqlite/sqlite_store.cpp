#include <botmesh/stores/sqlite/sqlite_store.hpp>

#include <algorithm>
#include <limits>
#include <string_view>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/json.hpp>
#include <botmesh/stores/internal/log_cap.hpp>
#include <botmesh/stores/sqlite/internal/db.hpp>
#include <botmesh/stores/sqlite/internal/schedule_store.hpp>

namespace botmesh {

namespace {

// The counter after `v` (a message seq, a revision, a fence): a stored one
// that is negative or at its limit is a damaged record, named, never
// wrapped into a number that repeats or goes back.
std::int64_t next_counter(std::int64_t v, std::string_view what,
                          std::string_view key) {
  if (v < 0 || v == std::numeric_limits<std::int64_t>::max())
    throw error(errc::corrupted_record,
                fmt::format("sqlite {} of \"{}\" is stored as {}: not a "
                            "counter that can go on",
                            what, key, v));
  return v + 1;
}

// Version 1 of the schema. Times are Unix milliseconds.
constexpr std::string_view schema = R"sql(
CREATE TABLE IF NOT EXISTS chats (
  key TEXT PRIMARY KEY, provider TEXT NOT NULL, chat TEXT NOT NULL,
  participant TEXT NOT NULL, created_at INTEGER NOT NULL,
  last_message_at INTEGER NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS contacts (
  id TEXT PRIMARY KEY, name TEXT NOT NULL, phone TEXT NOT NULL,
  updated_at INTEGER NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
  chat_key TEXT NOT NULL, seq INTEGER NOT NULL, dir INTEGER NOT NULL,
  id TEXT NOT NULL, sender TEXT NOT NULL, text TEXT NOT NULL,
  type TEXT NOT NULL, at INTEGER NOT NULL,
  PRIMARY KEY (chat_key, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
  key TEXT PRIMARY KEY, revision INTEGER NOT NULL,
  body TEXT, expires_at INTEGER);
CREATE TABLE IF NOT EXISTS user_data (
  user TEXT NOT NULL, ns TEXT NOT NULL, key TEXT NOT NULL,
  value TEXT NOT NULL, expires_at INTEGER,
  PRIMARY KEY (user, ns, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS locks (
  key TEXT PRIMARY KEY, token TEXT NOT NULL, fence INTEGER NOT NULL,
  expires_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS schedules (
  id TEXT PRIMARY KEY, spec TEXT NOT NULL, next_run_at INTEGER NOT NULL,
  fencing_token INTEGER NOT NULL, lease_owner TEXT NOT NULL,
  lease_until INTEGER NOT NULL, claimed_at INTEGER NOT NULL,
  done INTEGER NOT NULL, deleted INTEGER NOT NULL,
  updated_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS schedule_fences (
  id TEXT PRIMARY KEY, fencing_token INTEGER NOT NULL) WITHOUT ROWID;
)sql";

// Once per file (user_version 0 -> 1): the tombstones written before
// schedule_fences existed get their fences. Idempotent, should two
// processes open the file at once.
constexpr std::string_view fence_old_tombstones = R"sql(
INSERT INTO schedule_fences (id, fencing_token)
  SELECT id, fencing_token FROM schedules WHERE deleted = 1
  ON CONFLICT(id) DO UPDATE SET
    fencing_token = max(fencing_token, excluded.fencing_token);
PRAGMA user_version = 1;
)sql";

std::int64_t ms(time_point t) {
  return to_unix_ms(t);
}

// A checkpoint row is live when it has a body that has not expired.
constexpr std::string_view live_sql =
  "body IS NOT NULL AND (expires_at IS NULL OR expires_at > ?)";

void check_json(std::string_view field, std::string_view what,
                std::string_view value) {
  if (!is_valid_json(value))
    throw invalid_argument_error(std::string{field},
                                 fmt::format("{}: {} is not JSON", what, field));
}

void check_checkpoint(const flow_checkpoint& cp) {
  detail::check_key(cp.key, "key");
  check_json("state", fmt::format("checkpoint {}", cp.key), cp.state);
}

} // namespace

sqlite_store::sqlite_store(sqlite_store_options opts)
  : opts_(std::move(opts)),
    clock_(opts_.clock ? opts_.clock : &botmesh::clock::system()) {
  internal::check_log_cap(opts_.max_log_per_chat, "sqlite store");
}

sqlite_store::~sqlite_store() = default;

void sqlite_store::start() {
  if (db_)
    return;
  auto d = std::make_shared<internal::db>(opts_.path);
  if (opts_.path != ":memory:")
    d->exec("PRAGMA journal_mode=WAL");
  // FULL: in WAL mode NORMAL lets the last commits roll back after a power
  // cut or an OS crash, and a lock fence, checkpoint revision or task
  // token handed out (and acted on) before it would be handed out again.
  d->exec("PRAGMA synchronous=FULL");
  d->exec(schema);
  bool fenced = false;
  {
    internal::stmt v{*d, "PRAGMA user_version"};
    fenced = v.step() && v.int64(0) >= 1;
  }
  if (!fenced)
    d->exec(fence_old_tombstones);
  db_ = std::move(d);
  schedules_ = internal::make_sqlite_schedule_store(db_);
}

std::shared_ptr<schedule_store> sqlite_store::schedules() {
  start();
  return schedules_;
}

internal::db& sqlite_store::conn() {
  if (!db_)
    throw error(errc::store_error, "sqlite store used before start()");
  return *db_;
}

// -- chats --------------------------------------------------------------------

void sqlite_store::save_chat(const chat_record& rec) {
  detail::check_key(rec.key, "key");
  check_json("data", fmt::format("chat {}", rec.key), rec.data);
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  internal::stmt s{d, "INSERT INTO chats VALUES (?,?,?,?,?,?,?) "
                      "ON CONFLICT(key) DO UPDATE SET provider=excluded.provider,"
                      " chat=excluded.chat, participant=excluded.participant,"
                      " last_message_at=excluded.last_message_at,"
                      " data=excluded.data"};
  s.bind(1, rec.key).bind(2, rec.provider).bind(3, rec.chat);
  s.bind(4, rec.participant).bind(5, ms(rec.created_at));
  s.bind(6, ms(rec.last_message_at)).bind(7, rec.data);
  s.run();
}

namespace {

// Rows of `SELECT * FROM chats` (and contacts below), whose statement
// names the key in a damaged row's error (`about(..., 0)`).
chat_record read_chat(const internal::stmt& s) {
  return chat_record{s.text(0),
                     s.text(1),
                     s.text(2),
                     s.text(3),
                     from_unix_ms(s.int64(4)),
                     from_unix_ms(s.int64(5)),
                     s.text(6)};
}

contact_record read_contact(const internal::stmt& s) {
  return contact_record{s.text(0), s.text(1), s.text(2),
                        from_unix_ms(s.int64(3)), s.text(4)};
}

} // namespace

std::optional<chat_record> sqlite_store::get_chat(std::string_view key) {
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  internal::stmt s{d, "SELECT * FROM chats WHERE key=?"};
  s.about("sqlite store: chat ", 0);
  s.bind(1, key);
  if (!s.step())
    return std::nullopt;
  return read_chat(s);
}

bool sqlite_store::delete_chat(std::string_view key) {
  auto& d = conn();
  internal::transaction tx{d};
  internal::stmt m{d, "DELETE FROM messages WHERE chat_key=?"};
  m.bind(1, key).run();
  internal::stmt c{d, "DELETE FROM chats WHERE key=?"};
  bool existed = c.bind(1, key).run() > 0;
  tx.commit();
  return existed;
}

std::vector<chat_record> sqlite_store::list_chats() {
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  internal::stmt s{d, "SELECT * FROM chats ORDER BY key"};
  s.about("sqlite store: chat ", 0);
  std::vector<chat_record> out;
  while (s.step())
    out.push_back(read_chat(s));
  return out;
}

// -- contacts -----------------------------------------------------------------

void sqlite_store::save_contact(const contact_record& rec) {
  detail::check_key(rec.id, "id");
  check_json("data", fmt::format("contact {}", rec.id), rec.data);
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  internal::stmt s{d, "INSERT OR REPLACE INTO contacts VALUES (?,?,?,?,?)"};
  s.bind(1, rec.id).bind(2, rec.name).bind(3, rec.phone);
  s.bind(4, ms(rec.updated_at)).bind(5, rec.data);
  s.run();
}

std::optional<contact_record> sqlite_store::get_contact(std::string_view id) {
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  internal::stmt s{d, "SELECT * FROM contacts WHERE id=?"};
  s.about("sqlite store: contact ", 0);
  s.bind(1, id);
  if (!s.step())
    return std::nullopt;
  return read_contact(s);
}

bool sqlite_store::delete_contact(std::string_view id) {
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  internal::stmt s{d, "DELETE FROM contacts WHERE id=?"};
  return s.bind(1, id).run() > 0;
}

std::vector<contact_record> sqlite_store::list_contacts() {
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  internal::stmt s{d, "SELECT * FROM contacts ORDER BY id"};
  s.about("sqlite store: contact ", 0);
  std::vector<contact_record> out;
  while (s.step())
    out.push_back(read_contact(s));
  return out;
}

// -- message log --------------------------------------------------------------

std::uint64_t sqlite_store::append_message(std::string_view chat_key,
                                           const logged_message& msg) {
  detail::check_key(chat_key, "chat_key");
  auto& d = conn();
  internal::transaction tx{d};
  internal::stmt q{d, "SELECT COALESCE(MAX(seq), 0) FROM messages WHERE "
                      "chat_key=?"};
  q.bind(1, chat_key).about(
    fmt::format("sqlite store: message log {}", chat_key));
  q.step();
  auto seq = next_counter(q.int64(0), "message seq", chat_key);
  internal::stmt ins{d, "INSERT INTO messages VALUES (?,?,?,?,?,?,?,?)"};
  ins.bind(1, chat_key).bind(2, seq);
  ins.bind(3, static_cast<std::int64_t>(msg.dir));
  ins.bind(4, msg.id).bind(5, msg.sender).bind(6, msg.text);
  ins.bind(7, to_string(msg.type)).bind(8, ms(msg.at));
  ins.run();
  // A cap past what a seq can count ("unlimited", SIZE_MAX) keeps every
  // message; cast as it is it would be -1, and every append would delete
  // the whole log, the new message too.
  auto keep = static_cast<std::int64_t>(std::min<std::size_t>(
    opts_.max_log_per_chat,
    static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max())));
  if (seq > keep) {
    internal::stmt trim{d, "DELETE FROM messages WHERE chat_key=? AND seq<=?"};
    trim.bind(1, chat_key).bind(2, seq - keep).run();
  }
  tx.commit();
  return static_cast<std::uint64_t>(seq);
}

std::vector<logged_message> sqlite_store::messages(std::string_view chat_key,
                                                   std::size_t limit) {
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  internal::stmt s{d, "SELECT seq, dir, id, sender, text, type, at FROM "
                      "(SELECT * FROM messages WHERE chat_key=? ORDER BY seq "
                      "DESC LIMIT ?) ORDER BY seq"};
  s.bind(1, chat_key).bind(2, static_cast<std::int64_t>(limit));
  s.about(fmt::format("sqlite store: message {} #", chat_key), 0);
  std::vector<logged_message> out;
  while (s.step()) {
    logged_message m;
    m.seq = static_cast<std::uint64_t>(s.int64(0));
    auto dir = s.int64(1);
    if (dir != 0 && dir != 1)
      s.corrupted(1, fmt::format("holds {}, not a direction (0 in, 1 out)",
                                 dir));
    m.dir = dir == 0 ? direction::in : direction::out;
    m.id = s.text(2);
    m.sender = s.text(3);
    m.text = s.text(4);
    try {
      m.type = parse_message_type(s.text(5));
    } catch (const invalid_argument_error&) {
      throw error(errc::corrupted_record,
                  fmt::format("message {} #{}: unknown type \"{}\"", chat_key,
                              m.seq, s.text(5)));
    }
    m.at = from_unix_ms(s.int64(6));
    out.push_back(std::move(m));
  }
  return out;
}

// -- checkpoints --------------------------------------------------------------

namespace {

flow_checkpoint decode_checkpoint(std::string_view key, const std::string& body,
                                  std::int64_t revision) {
  try {
    auto cp = checkpoint_from_json(body);
    cp.revision = static_cast<std::uint64_t>(revision);
    return cp;
  } catch (const error& e) {
    throw corrupted_checkpoint_error(
      fmt::format("sqlite store: checkpoint row {}: {}", key, e.what()),
      static_cast<std::uint64_t>(revision));
  }
}

} // namespace

std::optional<flow_checkpoint>
sqlite_store::get_checkpoint(std::string_view key) {
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  internal::stmt s{d, fmt::format("SELECT body, revision FROM checkpoints "
                                  "WHERE key=? AND {}",
                                  live_sql)};
  s.bind(1, key).bind(2, ms(clock_->now()));
  s.about(fmt::format("sqlite store: checkpoint row {}", key));
  if (!s.step())
    return std::nullopt;
  auto revision = s.int64(1);
  if (revision < 0)
    s.corrupted(1, fmt::format("holds {}, not a revision", revision));
  return decode_checkpoint(key, s.text(0), revision);
}

namespace {

// Writes `cp` as the next revision of its key; the caller's transaction
// decided that the write may happen. Returns the new revision.
std::uint64_t write_checkpoint(internal::db& d, const flow_checkpoint& cp,
                               std::int64_t last_revision,
                               std::optional<time_point> created,
                               time_point now) {
  auto stored = cp;
  auto revision = next_counter(last_revision, "checkpoint revision", cp.key);
  stored.revision = static_cast<std::uint64_t>(revision);
  stored.created_at = created ? *created
                              : (cp.created_at == time_point{} ? now
                                                               : cp.created_at);
  stored.updated_at = now;
  internal::stmt s{d, "INSERT INTO checkpoints VALUES (?,?,?,?) "
                      "ON CONFLICT(key) DO UPDATE SET revision=excluded.revision,"
                      " body=excluded.body, expires_at=excluded.expires_at"};
  s.bind(1, cp.key).bind(2, revision).bind(3, to_json(stored, SIZE_MAX));
  if (cp.ephemeral)
    s.bind(4, ms(cp.expires_at));
  else
    s.bind_null(4);
  s.run();
  return stored.revision;
}

struct checkpoint_row {
  std::int64_t revision = 0;
  bool live = false;
  std::optional<time_point> created;
};

checkpoint_row read_row(internal::db& d, std::string_view key, time_point now) {
  internal::stmt s{d, fmt::format("SELECT revision, {}, body FROM checkpoints "
                                  "WHERE key=?",
                                  live_sql)};
  s.bind(1, ms(now)).bind(2, key);
  s.about(fmt::format("sqlite store: checkpoint row {}", key));
  checkpoint_row row;
  if (s.step()) {
    row.revision = s.int64(0);
    row.live = s.int64(1) != 0;
    if (row.live) {
      // Keep the conversation's creation time across writes; a body that
      // cannot be read gives no creation time rather than blocking writes.
      try {
        row.created = checkpoint_from_json(s.text(2)).created_at;
      } catch (const error&) {
        // nop
      }
    }
  }
  return row;
}

} // namespace

std::uint64_t sqlite_store::set_checkpoint(const flow_checkpoint& cp) {
  check_checkpoint(cp);
  auto& d = conn();
  internal::transaction tx{d};
  auto now = clock_->now();
  auto row = read_row(d, cp.key, now);
  auto rev = write_checkpoint(d, cp, row.revision, row.created, now);
  tx.commit();
  return rev;
}

std::optional<std::uint64_t>
sqlite_store::set_checkpoint_if(const flow_checkpoint& cp,
                                std::uint64_t expected_revision) {
  check_checkpoint(cp);
  auto& d = conn();
  internal::transaction tx{d};
  auto now = clock_->now();
  auto row = read_row(d, cp.key, now);
  auto current = row.live ? static_cast<std::uint64_t>(row.revision) : 0;
  if (current != expected_revision)
    return std::nullopt;
  auto rev = write_checkpoint(d, cp, row.revision, row.created, now);
  tx.commit();
  return rev;
}

bool sqlite_store::clear_checkpoint_if(std::string_view key,
                                       std::uint64_t expected_revision) {
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  // One statement: the revision stays behind so it never repeats.
  internal::stmt s{d, fmt::format("UPDATE checkpoints SET body=NULL, "
                                  "expires_at=NULL WHERE key=? AND revision=? "
                                  "AND {}",
                                  live_sql)};
  s.bind(1, key).bind(2, static_cast<std::int64_t>(expected_revision));
  s.bind(3, ms(clock_->now()));
  return s.run() > 0;
}

void sqlite_store::clear_checkpoint(std::string_view key) {
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  internal::stmt s{d, "UPDATE checkpoints SET body=NULL, expires_at=NULL "
                      "WHERE key=?"};
  s.bind(1, key).run();
}

// -- user data ----------------------------------------------------------------

std::optional<std::string>
sqlite_store::get_user_data(std::string_view user, std::string_view ns,
                            std::string_view key) {
  detail::check_user_data_args(user, ns, key);
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  internal::stmt s{d, "SELECT value FROM user_data WHERE user=? AND ns=? AND "
                      "key=? AND (expires_at IS NULL OR expires_at > ?)"};
  s.bind(1, user).bind(2, ns).bind(3, key).bind(4, ms(clock_->now()));
  if (!s.step())
    return std::nullopt;
  return s.text(0);
}

void sqlite_store::set_user_data(std::string_view user, std::string_view ns,
                                 std::string_view key,
                                 std::string_view value_json,
                                 std::optional<std::chrono::milliseconds> ttl) {
  detail::check_user_data_args(user, ns, key);
  if (ttl)
    detail::check_ttl(*ttl);
  check_json("value", fmt::format("user data {}/{}/{}", user, ns, key),
             value_json);
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  internal::stmt s{d, "INSERT OR REPLACE INTO user_data VALUES (?,?,?,?,?)"};
  s.bind(1, user).bind(2, ns).bind(3, key).bind(4, value_json);
  if (ttl)
    s.bind(5, ms(clock_->now() + *ttl));
  else
    s.bind_null(5);
  s.run();
}

bool sqlite_store::delete_user_data(std::string_view user, std::string_view ns,
                                    std::string_view key) {
  detail::check_user_data_args(user, ns, key);
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  internal::stmt s{d, "DELETE FROM user_data WHERE user=? AND ns=? AND key=? "
                      "AND (expires_at IS NULL OR expires_at > ?)"};
  s.bind(1, user).bind(2, ns).bind(3, key).bind(4, ms(clock_->now()));
  bool removed = s.run() > 0;
  internal::stmt gone{d, "DELETE FROM user_data WHERE user=? AND ns=? AND key=?"};
  gone.bind(1, user).bind(2, ns).bind(3, key).run();
  return removed;
}

std::vector<std::pair<std::string, std::string>>
sqlite_store::list_user_data(std::string_view user, std::string_view ns) {
  detail::check_key(user, "user");
  detail::check_key(ns, "ns");
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  internal::stmt s{d, "SELECT key, value FROM user_data WHERE user=? AND ns=? "
                      "AND (expires_at IS NULL OR expires_at > ?) ORDER BY key"};
  s.bind(1, user).bind(2, ns).bind(3, ms(clock_->now()));
  std::vector<std::pair<std::string, std::string>> out;
  while (s.step())
    out.emplace_back(s.text(0), s.text(1));
  return out;
}

// -- locks --------------------------------------------------------------------

std::optional<fenced_lock>
sqlite_store::acquire_lock_fenced(std::string_view key,
                                  std::chrono::milliseconds ttl) {
  detail::check_key(key);
  detail::check_ttl(ttl);
  auto& d = conn();
  internal::transaction tx{d};
  auto now = ms(clock_->now());
  internal::stmt q{d, "SELECT token, fence, expires_at FROM locks WHERE key=?"};
  q.bind(1, key).about(fmt::format("sqlite store: lock {}", key));
  std::int64_t fence = 0;
  if (q.step()) {
    if (!q.text(0).empty() && q.int64(2) > now)
      return std::nullopt;
    fence = q.int64(1);
  }
  auto next = next_counter(fence, "lock fence", key);
  fenced_lock lock{detail::random_token(), static_cast<std::uint64_t>(next)};
  internal::stmt w{d, "INSERT OR REPLACE INTO locks VALUES (?,?,?,?)"};
  w.bind(1, key).bind(2, lock.token).bind(3, next).bind(4, now + ttl.count());
  w.run();
  tx.commit();
  return lock;
}

bool sqlite_store::renew_lock(std::string_view key, std::string_view token,
                              std::chrono::milliseconds ttl) {
  detail::check_key(key);
  detail::check_ttl(ttl);
  if (token.empty())
    return false;
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  auto now = ms(clock_->now());
  internal::stmt s{d, "UPDATE locks SET expires_at=? WHERE key=? AND token=? "
                      "AND expires_at > ?"};
  s.bind(1, now + ttl.count()).bind(2, key).bind(3, token).bind(4, now);
  return s.run() > 0;
}

bool sqlite_store::release_lock(std::string_view key, std::string_view token) {
  detail::check_key(key);
  if (token.empty())
    return false;
  auto& d = conn();
  std::lock_guard guard{d.mutex()};
  // The row (and its fence) stays; only the holder goes.
  internal::stmt s{d, "UPDATE locks SET token='' WHERE key=? AND token=? AND "
                      "expires_at > ?"};
  s.bind(1, key).bind(2, token).bind(3, ms(clock_->now()));
  return s.run() > 0;
}

} // namespace botmesh
