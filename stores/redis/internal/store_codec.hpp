#pragma once

// Internal: how the Redis stores (legacy and cluster:v1 layouts) encode and
// decode records, shared so both layouts store the same bytes and the
// migration copies them unchanged.

#include <charconv>
#include <cstdint>
#include <functional>
#include <map>
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
