#include <botmesh/stores/memory_schedule_store.hpp>

#include <algorithm>
#include <functional>

#include <botmesh/stores/internal/schedule_transitions.hpp>
#include <botmesh/stores/store.hpp>

namespace botmesh {

schedule_store::~schedule_store() {
  // nop
}

void schedule_store::start() {
  // nop
}

lease_provider::~lease_provider() {
  // nop
}

namespace {

constexpr std::size_t shard_count = 16;

} // namespace

struct memory_schedule_store::shard {
  alignas(64) std::mutex mtx;
  std::map<std::string, schedule_record, std::less<>> records;
};

memory_schedule_store::memory_schedule_store()
  : shards_(std::make_unique<shard[]>(shard_count)) {
  // nop
}

memory_schedule_store::~memory_schedule_store() = default;

memory_schedule_store::shard&
memory_schedule_store::shard_of(std::string_view id) {
  return shards_[std::hash<std::string_view>{}(id) % shard_count];
}

std::optional<schedule_record>
memory_schedule_store::get(std::string_view id) {
  auto& sh = shard_of(id);
  std::lock_guard guard{sh.mtx};
  auto i = sh.records.find(id);
  if (i == sh.records.end())
    return std::nullopt;
  return i->second;
}

schedule_record memory_schedule_store::register_task(std::string_view id,
                                                     std::string_view spec,
                                                     time_point first_run,
                                                     time_point now) {
  detail::check_key(id, "id");
  auto& sh = shard_of(id);
  std::lock_guard guard{sh.mtx};
  auto i = sh.records.find(id);
  bool exists = i != sh.records.end();
  if (!exists)
    i = sh.records.emplace(std::string{id}, schedule_record{}).first;
  internal::register_record(i->second, exists, id, spec, first_run, now);
  return i->second;
}

std::optional<schedule_claim>
memory_schedule_store::claim(std::string_view id, std::string_view owner,
                             time_point now, std::chrono::milliseconds lease) {
  detail::check_key(owner, "owner");
  detail::check_ttl(lease, "lease");
  auto& sh = shard_of(id);
  std::lock_guard guard{sh.mtx};
  auto i = sh.records.find(id);
  if (i == sh.records.end())
    return std::nullopt;
  return internal::claim_record(i->second, owner, now, lease);
}

bool memory_schedule_store::renew(std::string_view id, std::string_view owner,
                                  std::uint64_t token, time_point now,
                                  std::chrono::milliseconds lease) {
  detail::check_ttl(lease, "lease");
  auto& sh = shard_of(id);
  std::lock_guard guard{sh.mtx};
  auto i = sh.records.find(id);
  if (i == sh.records.end())
    return false;
  auto& rec = i->second;
  if (rec.deleted || rec.fencing_token != token || rec.lease_owner != owner
      || rec.lease_until <= now)
    return false;
  rec.lease_until = now + lease;
  rec.updated_at = now;
  return true;
}

bool memory_schedule_store::commit(std::string_view id, std::string_view owner,
                                   std::uint64_t token, time_point next_run_at,
                                   bool done, time_point now) {
  auto& sh = shard_of(id);
  std::lock_guard guard{sh.mtx};
  auto i = sh.records.find(id);
  if (i == sh.records.end())
    return false;
  auto& rec = i->second;
  if (rec.deleted || rec.fencing_token != token || rec.lease_owner != owner)
    return false;
  rec.next_run_at = next_run_at;
  rec.done = done;
  rec.lease_owner.clear();
  rec.lease_until = {};
  rec.claimed_at = {};
  rec.updated_at = now;
  return true;
}

bool memory_schedule_store::remove(std::string_view id, time_point now) {
  auto& sh = shard_of(id);
  std::lock_guard guard{sh.mtx};
  auto i = sh.records.find(id);
  if (i == sh.records.end() || i->second.deleted)
    return false;
  auto& rec = i->second;
  rec.deleted = true;
  rec.done = false;
  rec.lease_owner.clear();
  rec.lease_until = {};
  rec.claimed_at = {};
  rec.updated_at = now;
  return true;
}

std::vector<schedule_record> memory_schedule_store::list() {
  std::vector<schedule_record> out;
  for (std::size_t n = 0; n < shard_count; ++n) {
    auto& sh = shards_[n];
    std::lock_guard guard{sh.mtx};
    for (auto& [k, v] : sh.records)
      out.push_back(v);
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

std::optional<std::uint64_t>
memory_lease_provider::try_acquire(std::string_view name,
                                   std::string_view owner, time_point now,
                                   std::chrono::milliseconds ttl) {
  detail::check_key(name, "name");
  detail::check_key(owner, "owner");
  detail::check_ttl(ttl);
  std::lock_guard guard{mtx_};
  auto& s = leases_[std::string{name}];
  if (s.owner != owner) {
    if (!s.owner.empty() && s.until > now)
      return std::nullopt;
    s.owner = std::string{owner};
    ++s.token;
  }
  s.until = now + ttl;
  return s.token;
}

void memory_lease_provider::release(std::string_view name,
                                    std::string_view owner) {
  std::lock_guard guard{mtx_};
  auto i = leases_.find(name);
  if (i != leases_.end() && i->second.owner == owner)
    i->second.owner.clear();
}

} // namespace botmesh
