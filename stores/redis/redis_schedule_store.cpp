#include <botmesh/stores/redis/internal/schedule_store.hpp>
#include <botmesh/stores/store.hpp>

#include <algorithm>
#include <charconv>
#include <map>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/internal/async_schedule_store.hpp>
#include <botmesh/stores/internal/schedule_transitions.hpp>
#include <botmesh/stores/redis/internal/scripts.hpp>
#include <botmesh/stores/redis/internal/store_codec.hpp>

namespace botmesh::internal {

namespace {

using kind = redis_reply::kind;

// Decodes a schedule hash given as a flat field/value array from `offset`.
schedule_record read_record(std::string_view id, std::string_view key,
                            const redis_reply& r, size_t offset = 0) {
  std::map<std::string, std::string, std::less<>> f;
  for (size_t i = offset; i + 1 < r.elements.size(); i += 2)
    f.emplace(r.elements[i].str, r.elements[i + 1].str);
  auto get = [&](std::string_view name) -> const std::string& {
    auto i = f.find(name);
    if (i == f.end())
      throw error(errc::corrupted_record,
                  fmt::format("redis schedule {}: field \"{}\" is missing",
                              key, name));
    return i->second;
  };
  auto num = [&](std::string_view name) {
    auto& s = get(name);
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc{} || p != s.data() + s.size())
      throw error(errc::corrupted_record,
                  fmt::format("redis schedule {}: field \"{}\" is not an "
                              "integer: \"{}\"",
                              key, name, s));
    return v;
  };
  schedule_record rec;
  rec.id = std::string{id};
  rec.spec = get("spec");
  rec.next_run_at = from_unix_ms(num("next"));
  auto token = num("token");
  if (token < 0) // a fencing token only grows from 0: damage, not a number to wrap
    throw error(errc::corrupted_record,
                fmt::format("redis schedule {}: field \"token\" is negative: {}",
                            key, token));
  rec.fencing_token = static_cast<std::uint64_t>(token);
  rec.lease_owner = get("owner");
  rec.lease_until = from_unix_ms(num("until"));
  rec.claimed_at = from_unix_ms(num("claimed"));
  rec.done = num("done") != 0;
  rec.deleted = num("deleted") != 0;
  rec.updated_at = from_unix_ms(num("updated"));
  check_record_times(rec, fmt::format("redis schedule {}", key));
  return rec;
}

// An HGETALL of `key`'s schedule hash: the record, none when the hash is
// missing.
std::optional<schedule_record> hgetall_record(std::string_view id,
                                              const std::string& key,
                                              const redis_reply& r) {
  expect_reply("HGETALL " + key, r, kind::array);
  if (r.elements.empty())
    return std::nullopt;
  return read_record(id, key, r);
}

// Runs `decode(reply)` and hands its value, or what it or the call threw,
// to `done`: the asynchronous calls fail exactly as the synchronous ones.
template <class T, class Decode>
redis_client::callback settle(async_schedule_store::done<T> done,
                              Decode decode) {
  return [done = std::move(done), decode = std::move(decode)](
           redis_reply r, std::exception_ptr e) {
    if (e) {
      done(T{}, e);
      return;
    }
    T value{};
    try {
      value = decode(r);
    } catch (...) {
      done(T{}, std::current_exception());
      return;
    }
    done(std::move(value), nullptr);
  };
}

class redis_schedule_store final : public schedule_store,
                                   public async_schedule_store {
 public:
  redis_schedule_store(std::shared_ptr<redis_client> c, schedule_naming n)
    : c_(std::move(c)), n_(std::move(n)) {
    // nop
  }

  std::optional<schedule_record> get(std::string_view id) override {
    auto k = n_.record(id);
    return hgetall_record(id, k, c_->call({"HGETALL", k}));
  }

  schedule_record register_task(std::string_view id, std::string_view spec,
                                time_point first_run, time_point now) override {
    detail::check_key(id, "id");
    auto k = n_.record(id);
    auto r = c_->eval(lua().schedule_register, {k, n_.index_of(id)},
                      {std::string{id}, std::string{spec}, ms(first_run),
                       ms(now)});
    expect_reply("script schedule_register", r, kind::array);
    return read_record(id, k, r);
  }

  std::optional<schedule_claim> claim(std::string_view id,
                                      std::string_view owner, time_point now,
                                      std::chrono::milliseconds lease) override {
    auto k = n_.record(id);
    return read_claim(id, k, c_->eval(lua().schedule_claim, {k},
                                      claim_args(owner, now, lease)));
  }

  bool renew(std::string_view id, std::string_view owner, std::uint64_t token,
             time_point now, std::chrono::milliseconds lease) override {
    return flag("script schedule_renew",
                c_->eval(lua().schedule_renew, {n_.record(id)},
                         renew_args(owner, token, now, lease)));
  }

  bool commit(std::string_view id, std::string_view owner, std::uint64_t token,
              time_point next_run_at, bool done, time_point now) override {
    return flag("script schedule_commit",
                c_->eval(lua().schedule_commit, {n_.record(id)},
                         commit_args(owner, token, next_run_at, done, now)));
  }

  bool remove(std::string_view id, time_point now) override {
    return flag("script schedule_remove",
                c_->eval(lua().schedule_remove, {n_.record(id)}, {ms(now)}));
  }

  // -- the asynchronous face (the scheduler's task actors) ----------------

  void claim_async(std::string_view id, std::string_view owner, time_point now,
                   std::chrono::milliseconds lease,
                   done<claim_result> fn) override {
    std::vector<std::string> args;
    try {
      args = claim_args(owner, now, lease);
    } catch (...) {
      fn({}, std::current_exception());
      return;
    }
    auto k = n_.record(id);
    // Refused: the record as it stands, read by a second command (rare:
    // the slot was claimed elsewhere or is not due).
    // (The client is held, not the store: a pending reply may outlive it.)
    auto on_claim = [c = c_, id = std::string{id}, k,
                     fn = std::move(fn)](redis_reply r,
                                         std::exception_ptr e) mutable {
      std::optional<schedule_claim> got;
      if (!e) {
        try {
          got = read_claim(id, k, r);
        } catch (...) {
          e = std::current_exception();
        }
      }
      if (e || got) {
        fn({std::move(got), std::nullopt}, e);
        return;
      }
      c->async(k, {"HGETALL", k},
                settle<claim_result>(std::move(fn), [id, k](redis_reply& r) {
                  return claim_result{std::nullopt, hgetall_record(id, k, r)};
                }));
    };
    c_->eval_async(k, lua().schedule_claim, {k}, std::move(args),
                   std::move(on_claim));
  }

  void get_async(std::string_view id,
                 done<std::optional<schedule_record>> fn) override {
    auto k = n_.record(id);
    c_->async(k, {"HGETALL", k},
              settle<std::optional<schedule_record>>(
                std::move(fn), [id = std::string{id}, k](redis_reply& r) {
                  return hgetall_record(id, k, r);
                }));
  }

  void register_async(std::string_view id, std::string_view spec,
                      time_point first_run, time_point now,
                      done<schedule_record> fn) override {
    try {
      detail::check_key(id, "id");
    } catch (...) {
      fn({}, std::current_exception());
      return;
    }
    auto k = n_.record(id);
    c_->eval_async(k, lua().schedule_register, {k, n_.index_of(id)},
                   {std::string{id}, std::string{spec}, ms(first_run), ms(now)},
                   settle<schedule_record>(
                     std::move(fn), [id = std::string{id}, k](redis_reply& r) {
                       expect_reply("script schedule_register", r, kind::array);
                       return read_record(id, k, r);
                     }));
  }

  void remove_async(std::string_view id, time_point now,
                    done<bool> fn) override {
    auto k = n_.record(id);
    c_->eval_async(k, lua().schedule_remove, {k}, {ms(now)},
                   settle<bool>(std::move(fn), [](redis_reply& r) {
                     return flag("script schedule_remove", r);
                   }));
  }

  void renew_async(std::string_view id, std::string_view owner,
                   std::uint64_t token, time_point now,
                   std::chrono::milliseconds lease, done<bool> fn) override {
    std::vector<std::string> args;
    try {
      args = renew_args(owner, token, now, lease);
    } catch (...) {
      fn(false, std::current_exception());
      return;
    }
    auto k = n_.record(id);
    c_->eval_async(k, lua().schedule_renew, {k}, std::move(args),
                   settle<bool>(std::move(fn), [](redis_reply& r) {
                     return flag("script schedule_renew", r);
                   }));
  }

  void commit_async(std::string_view id, std::string_view owner,
                    std::uint64_t token, time_point next_run_at, bool done_flag,
                    time_point now, done<bool> fn) override {
    auto k = n_.record(id);
    c_->eval_async(k, lua().schedule_commit, {k},
                   commit_args(owner, token, next_run_at, done_flag, now),
                   settle<bool>(std::move(fn), [](redis_reply& r) {
                     return flag("script schedule_commit", r);
                   }));
  }

  std::vector<schedule_record> list() override {
    // One ZRANGE per index, then every hash, each in one pipeline.
    std::vector<redis_client::command> ranges;
    for (auto& idx : n_.indexes)
      ranges.push_back({"ZRANGE", idx, "0", "-1"});
    auto idx_replies = c_->pipeline(std::move(ranges));
    std::vector<std::string> ids;
    for (size_t i = 0; i < idx_replies.size(); ++i) {
      expect_reply("ZRANGE " + n_.indexes[i], idx_replies[i], kind::array);
      for (auto& id : idx_replies[i].elements)
        ids.push_back(id.str);
    }
    std::sort(ids.begin(), ids.end());
    std::vector<redis_client::command> cmds;
    for (auto& id : ids)
      cmds.push_back({"HGETALL", n_.record(id)});
    std::vector<schedule_record> out;
    if (cmds.empty())
      return out;
    auto replies = c_->pipeline(std::move(cmds));
    for (size_t i = 0; i < replies.size(); ++i) {
      auto& id = ids[i];
      expect_reply("HGETALL schedule", replies[i], kind::array);
      if (!replies[i].elements.empty())
        out.push_back(read_record(id, n_.record(id), replies[i]));
    }
    return out;
  }

 private:
  // The scripts' arguments, for the synchronous and asynchronous calls
  // alike (a bad lease throws before anything is sent).
  static std::vector<std::string> claim_args(std::string_view owner,
                                             time_point now,
                                             std::chrono::milliseconds lease) {
    detail::check_key(owner, "owner");
    detail::check_ttl(lease, "lease");
    return {std::string{owner}, ms(now), std::to_string(lease.count())};
  }

  static std::vector<std::string> renew_args(std::string_view owner,
                                             std::uint64_t token, time_point now,
                                             std::chrono::milliseconds lease) {
    detail::check_ttl(lease, "lease");
    return {std::string{owner}, std::to_string(token), ms(now),
            std::to_string(lease.count())};
  }

  static std::vector<std::string>
  commit_args(std::string_view owner, std::uint64_t token, time_point next,
              bool done, time_point now) {
    return {std::string{owner}, std::to_string(token), ms(next),
            done ? "1" : "0", ms(now)};
  }

  // The claim script's reply: nil (nothing claimable), or [interrupted,
  // field, value, ...]. An error reply throws, naming the script.
  static std::optional<schedule_claim>
  read_claim(std::string_view id, const std::string& k, const redis_reply& r) {
    if (r.is_nil())
      return std::nullopt;
    expect_reply("script schedule_claim", r, kind::array);
    if (r.elements.empty() || r.elements[0].type != kind::integer)
      throw error(errc::store_error, "redis script schedule_claim: malformed "
                                     "reply");
    auto rec = read_record(id, k, r, 1);
    return schedule_claim{rec, rec.fencing_token, r.elements[0].integer != 0};
  }

  std::shared_ptr<redis_client> c_;
  schedule_naming n_;
};

class redis_lease_provider final : public lease_provider {
 public:
  redis_lease_provider(std::shared_ptr<redis_client> c, schedule_naming n)
    : c_(std::move(c)), n_(std::move(n)) {
    // nop
  }

  std::optional<std::uint64_t> try_acquire(std::string_view name,
                                           std::string_view owner,
                                           time_point now,
                                           std::chrono::milliseconds ttl) override {
    detail::check_key(name, "name");
    detail::check_key(owner, "owner");
    detail::check_ttl(ttl);
    auto r = c_->eval(lua().lease_acquire, {n_.lease(name)},
                      {std::string{owner}, ms(now),
                       std::to_string(ttl.count())});
    if (r.is_nil())
      return std::nullopt;
    expect_reply("script lease_acquire", r, kind::integer);
    if (r.integer < 0)
      throw error(errc::corrupted_record,
                  fmt::format("redis lease {}: its fencing token is negative: {}",
                              n_.lease(name), r.integer));
    return static_cast<std::uint64_t>(r.integer);
  }

  void release(std::string_view name, std::string_view owner) override {
    c_->eval(lua().lease_release, {n_.lease(name)}, {std::string{owner}});
  }

 private:
  std::shared_ptr<redis_client> c_;
  schedule_naming n_;
};

} // namespace

schedule_naming legacy_schedule_naming(std::shared_ptr<const redis_layout> l) {
  schedule_naming n;
  n.record = [l](std::string_view id) { return l->schedule(id); };
  n.index_of = [l](std::string_view) { return l->schedule_index(); };
  n.indexes = {l->schedule_index()};
  n.lease = [l](std::string_view name) { return l->lease(name); };
  return n;
}

schedule_naming cluster_schedule_naming(const redis_cluster_layout& layout) {
  using rk = redis_cluster_layout::record_kind;
  auto l = std::make_shared<const redis_cluster_layout>(layout);
  schedule_naming n;
  n.record = [l](std::string_view id) { return l->record(rk::schedule, id); };
  n.index_of = [l](std::string_view id) {
    return l->record_index_of(rk::schedule, id);
  };
  for (std::uint32_t b = 0; b < redis_cluster_layout::buckets; ++b)
    n.indexes.push_back(l->record_index(rk::schedule, b));
  n.lease = [l](std::string_view name) { return l->lease(name); };
  return n;
}

std::shared_ptr<schedule_store>
make_redis_schedule_store(std::shared_ptr<redis_client> client,
                          schedule_naming naming) {
  return std::make_shared<redis_schedule_store>(std::move(client),
                                                std::move(naming));
}

std::shared_ptr<lease_provider>
make_redis_lease_provider(std::shared_ptr<redis_client> client,
                          schedule_naming naming) {
  return std::make_shared<redis_lease_provider>(std::move(client),
                                                std::move(naming));
}

} // namespace botmesh::internal
