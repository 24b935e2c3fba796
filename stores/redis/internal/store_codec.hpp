#pragma once

// Internal: how the Redis stores (legacy and cluster:v1 layouts) encode and
// decode records, shared so both layouts store the same bytes and the
// migration copies them unchanged.

#include <charconv>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/redis_client.hpp>
#include <botmesh/stores/store.hpp>

namespace botmesh::internal {

using fields = std::map<std::string, std::string, std::less<>>;

/// Throws `errc::corrupted_record` naming the key.
[[noreturn]] void corrupted(std::string_view key, std::string_view why);

/// HGETALL's flat array as a map; empty when the key does not exist.
fields to_fields(std::string_view what, const redis_reply& r);

/// A field of a record; a missing one is damage.
const std::string& field(const fields& f, std::string_view key,
                         std::string_view name);
std::int64_t int_field(const fields& f, std::string_view key,
                       std::string_view name);

/// Unix milliseconds as decimal text.
std::string ms(time_point t);

/// Throws `invalid_argument_error(field_name)` unless `value` is JSON.
void check_json(std::string_view field_name, std::string_view what,
                std::string_view value);

/// A revision, or nothing for a nil reply.
std::optional<std::uint64_t> rev_or_nil(std::string_view what,
                                        const redis_reply& r);
/// An integer reply as a yes/no.
bool flag(std::string_view what, const redis_reply& r);

/// `store::acquire_lock_fenced` on the lock key `lock` and fence counter
/// `fence` (each layout names them). When the call fails (its reply lost
/// to a timeout or a dropped connection, it may still have taken the
/// lock), a release of the token it asked for is sent at once, on a
/// connection that works, before the error is thrown, once more after its
/// answer, and again after each failure (at most eight): a lock taken by
/// the lost call would otherwise stay held, by a token nobody has, until
/// its ttl. If every give-back fails, the ttl ends it.
std::optional<fenced_lock> acquire_lock(const std::shared_ptr<redis_client>& c,
                                        const std::string& lock,
                                        const std::string& fence,
                                        std::chrono::milliseconds ttl);

/// The values of the user-data entries `names` (sorted here), read with
/// one MGET of `key_of(name)`; a name whose key is gone is left out.
std::vector<std::pair<std::string, std::string>>
read_user_values(redis_client& c, std::vector<std::string> names,
                 const std::function<std::string(const std::string&)>& key_of);

chat_record read_chat(std::string_view key, const fields& f);
contact_record read_contact(std::string_view key, const fields& f);

/// A log entry as stored JSON without its "seq" ("{"dir":..}").
std::string encode_entry(const logged_message& msg);
/// A stored entry ({"seq":N,...}); `what` names it in errors.
logged_message decode_entry(std::string_view json, std::string_view what);

/// A checkpoint hash (rev, body, created) read back; `key` names it.
flow_checkpoint read_checkpoint(std::string_view key, const fields& f);

} // namespace botmesh::internal
