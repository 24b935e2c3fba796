#include <botmesh/stores/redis/internal/store_codec.hpp>

#include <algorithm>

#include <fmt/format.h>

#include <botmesh/runtime/core/internal/json_reader.hpp>
#include <botmesh/runtime/core/json.hpp>
#include <botmesh/stores/redis/internal/scripts.hpp>

namespace botmesh::internal {

using kind = redis_reply::kind;

void corrupted(std::string_view key, std::string_view why) {
  throw error(errc::corrupted_record,
              fmt::format("redis store: record {}: {}", key, why));
}

std::vector<std::pair<std::string, std::string>>
read_user_values(redis_client& c, std::vector<std::string> names,
                 const std::function<std::string(const std::string&)>& key_of) {
  std::sort(names.begin(), names.end());
  std::vector<std::pair<std::string, std::string>> out;
  if (names.empty())
    return out;
  redis_client::command mget{"MGET"};
  for (auto& n : names)
    mget.push_back(key_of(n));
  auto values = c.call(std::move(mget));
  expect_reply("MGET user data", values, kind::array);
  for (size_t i = 0; i < names.size() && i < values.elements.size(); ++i)
    if (!values.elements[i].is_nil())
      out.emplace_back(names[i], values.elements[i].str);
  return out;
}

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
  if (r.integer < 0) // revisions and fences only grow from 0
    throw error(errc::corrupted_record,
                fmt::format("redis {}: a negative revision or fence {} (the "
                            "stored counter is damaged)",
                            what, r.integer));
  return static_cast<std::uint64_t>(r.integer);
}

namespace {

// Sends lock_release for `token`: again once after its first answer, and
// again after each failure (it may time out behind the same busy server as
// the acquire), at most `failures` of them.
void give_back_lock(const std::weak_ptr<redis_client>& client, std::string lock,
                    std::string token, bool answered, int failures) {
  auto c = client.lock();
  if (!c)
    return;
  auto keys = std::vector<std::string>{lock};
  auto args = std::vector<std::string>{token};
  c->eval_async(lock, lua().lock_release, std::move(keys), std::move(args),
                [client, lock, token, answered,
                 failures](redis_reply, std::exception_ptr e) {
                  if (e && failures > 0)
                    give_back_lock(client, lock, token, answered, failures - 1);
                  else if (!e && !answered)
                    give_back_lock(client, lock, token, true, failures);
                });
}

} // namespace

std::optional<fenced_lock> acquire_lock(const std::shared_ptr<redis_client>& c,
                                        const std::string& lock,
                                        const std::string& fence,
                                        std::chrono::milliseconds ttl) {
  auto token = detail::random_token();
  redis_reply r;
  try {
    r = c->eval(lua().lock_acquire, {lock, fence},
                {token, std::to_string(ttl.count())});
  } catch (...) {
    // The release deletes the lock only while it holds this token, which
    // nobody else has: harmless when the acquire did not run (or an error
    // reply says the script left nothing taken). A server that was busy
    // runs what waited on the lost call's connection and on the release's
    // in the order it reads them, so the release may run first: it is sent
    // again once its answer came, when the server has read what waited.
    give_back_lock(c, lock, token, false, 8);
    throw;
  }
  auto f = rev_or_nil("script lock_acquire", r);
  if (!f)
    return std::nullopt;
  return fenced_lock{std::move(token), *f};
}

bool flag(std::string_view what, const redis_reply& r) {
  expect_reply(what, r, kind::integer);
  return r.integer != 0;
}

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

std::string encode_entry(const logged_message& msg) {
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
  return entry;
}

logged_message decode_entry(std::string_view json, std::string_view what) {
  auto j = json_reader::parse(json, what);
  logged_message m;
  m.seq = j.uint64("seq");
  m.dir = j.int64("dir") == 0 ? direction::in : direction::out;
  m.id = j.string("id");
  m.sender = j.string("sender");
  m.text = j.string("text");
  m.type = j.type("type");
  m.at = from_unix_ms(j.int64("at"));
  return m;
}

namespace {

flow_checkpoint decode_body(std::string_view key, const fields& f) {
  auto& body = field(f, key, "body"); // names the record when missing
  try {
    return checkpoint_from_json(body);
  } catch (const error& e) {
    if (e.code() != errc::corrupted_record)
      throw;
    corrupted(key, e.what());
  }
}

} // namespace

flow_checkpoint read_checkpoint(std::string_view key, const fields& f) {
  auto rev = int_field(f, key, "rev");
  // Taken as is, it would read as a revision past every real one, which no
  // compare-and-set ever matches again.
  if (rev < 0)
    throw corrupted_checkpoint_error(
      fmt::format("redis store: record {}: field \"rev\" is negative: {}",
                  key, rev),
      std::nullopt);
  try {
    auto created = int_field(f, key, "created");
    auto cp = decode_body(key, f);
    cp.revision = static_cast<std::uint64_t>(rev);
    cp.created_at = from_unix_ms(created);
    return cp;
  } catch (const error& e) {
    if (e.code() != errc::corrupted_record)
      throw;
    // With the revision read, a clear of this record can wait for it.
    throw corrupted_checkpoint_error(
      e.what(), rev >= 0 ? std::optional{static_cast<std::uint64_t>(rev)}
                         : std::nullopt);
  }
}

} // namespace botmesh::internal
