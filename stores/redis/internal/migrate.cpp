// The migration between the legacy and the cluster:v1 layouts
// (redis_migration.hpp). One pass: scan the source, copy each kind record
// by record (one script per record, its keys in one slot), prune the
// target (rollback with mirror), write or delete the marker, delete the
// source keys whose data the target now holds.

#include <botmesh/stores/redis/redis_migration.hpp>

#include <algorithm>
#include <optional>
#include <set>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/json.hpp>
#include <botmesh/stores/redis/internal/keyspace.hpp>
#include <botmesh/stores/redis/internal/scripts.hpp>
#include <botmesh/stores/redis/internal/store_codec.hpp>
#include <botmesh/stores/redis/internal/store_impl.hpp>
#include <botmesh/stores/redis/redis_cluster_layout.hpp>
#include <botmesh/stores/redis/redis_layout.hpp>

namespace botmesh {

namespace {

using kind = redis_reply::kind;
using rk = redis_cluster_layout::record_kind;
using internal::lua;

// A script's arguments must fit Lua's stack: logs go in parts this long.
constexpr std::size_t log_part = 2000;

std::vector<std::string> flatten(const internal::fields& f) {
  std::vector<std::string> out;
  for (auto& [k, v] : f) {
    out.push_back(k);
    out.push_back(v);
  }
  return out;
}

std::int64_t to_int(const std::string& s, std::int64_t fallback = 0) {
  try {
    return std::stoll(s);
  } catch (...) {
    return fallback;
  }
}

class migration {
 public:
  migration(const redis_migration_options& o, redis_client& src,
            redis_client& dst)
    : o_(o), src_(src), dst_(dst), L_(o.prefix) {
    same_server_ = &src == &dst || src.endpoint() == dst.endpoint();
    for (auto& k : o.include)
      include_.insert(k);
    rep_.dry_run = o.dry_run;
    LL_ = make_legacy_layout(o.prefix);
  }

  redis_migration_report run() {
    bool forward = o_.direction == redis_migration_direction::legacy_to_cluster;
    rep_.direction = forward ? "legacy-to-cluster" : "cluster-to-legacy";
    for (auto& k : redis_data_kinds())
      if (wanted(k))
        rep_.kinds[k];
    auto keys = internal::scan_prefix(src_, o_.prefix);
    if (forward)
      forward_pass(keys);
    else
      backward_pass(keys);
    if (wanted("unchanged") && !same_server_)
      copy_unchanged(keys);
    for (auto& [k, c] : rep_.kinds)
      rep_.pruned += c.pruned;
    marker(forward);
    if (o_.delete_source && !o_.dry_run)
      delete_source();
    return std::move(rep_);
  }

 private:
  bool wanted(const std::string& k) const {
    return include_.empty() || include_.count(k) > 0;
  }

  std::string mode() const {
    return o_.overwrite ? "replace" : "keep";
  }

  // What is wrong with a user data value read as {GET, PTTL}, if anything.
  static std::optional<std::string>
  value_problem(const std::vector<redis_reply>& r) {
    if (r[0].type == kind::error)
      return fmt::format("reading the value: Redis error: {}", r[0].str);
    if (r[0].type != kind::string)
      return fmt::format("the value is a Redis {}, not a string",
                         to_string(r[0].type));
    if (!is_valid_json(r[0].str))
      return std::string{"the value is not JSON"};
    if (r[1].type != kind::integer)
      return fmt::format("reading its TTL: {}", r[1].type == kind::error
                                                  ? r[1].str
                                                  : "not an integer");
    return std::nullopt;
  }

  void problem(const std::string& kind_name, const std::string& key,
               const std::string& why) {
    rep_.problems.push_back(fmt::format("{}: {}", key, why));
    damaged_.insert(kind_name);
  }

  // A source key copied (or already in the target): deletable.
  void done_with(const std::string& kind_name, std::string key) {
    per_key_[kind_name].push_back(std::move(key));
  }
  // An index or counter of the source: deletable when the kind had no
  // damaged record.
  void aux(const std::string& kind_name, std::string key) {
    aux_[kind_name].push_back(std::move(key));
  }

  void count(const std::string& kind_name, bool written) {
    auto& c = rep_.kinds[kind_name];
    (written ? c.copied : c.kept)++;
  }

  // HGETALL and PTTL of a source hash; empty fields when gone.
  std::pair<internal::fields, std::int64_t> read_hash(const std::string& k) {
    auto r = src_.pipeline({{"HGETALL", k}, {"PTTL", k}});
    auto f = internal::to_fields("HGETALL " + k, r[0]);
    expect_reply("PTTL " + k, r[1], kind::integer);
    return {std::move(f), r[1].integer > 0 ? r[1].integer : 0};
  }

  // Writes a hash record through mig_put_hash (or, dry, says whether it
  // would).
  bool put_hash(std::vector<std::string> keys, const std::string& m,
                const std::string& member, std::int64_t ttl,
                const std::string& score, const internal::fields& f) {
    if (o_.dry_run) {
      auto exists = dst_.call({"EXISTS", keys[0]}).integer == 1;
      if (!exists || m == "replace")
        return true;
      if (m == "token") {
        auto theirs = dst_.call({"HGET", keys[0], "token"});
        auto i = f.find("token");
        return i != f.end() && to_int(i->second) > to_int(theirs.str);
      }
      return false;
    }
    std::vector<std::string> args{m, member, std::to_string(ttl), score};
    auto flat = flatten(f);
    args.insert(args.end(), flat.begin(), flat.end());
    return internal::flag("script mig_put_hash",
                          dst_.eval(lua().mig_put_hash, keys, args));
  }

  // Raises a counter of the target to `v` (never lowers it).
  bool raise(const std::string& key, const std::string& v) {
    if (o_.dry_run) {
      auto cur = dst_.call({"GET", key});
      return cur.is_nil() || to_int(cur.str) < to_int(v);
    }
    return internal::flag("script mig_raise",
                          dst_.eval(lua().mig_raise, {key}, {v}));
  }

  bool put_value(const std::string& key, const std::string& index,
                 const std::string& m, const std::string& member,
                 std::int64_t ttl, const std::string& value) {
    if (o_.dry_run)
      return m == "replace" || dst_.call({"EXISTS", key}).integer == 0;
    return internal::flag("script user_data_set",
                          dst_.eval(lua().user_data_set, {key, index},
                                    {member, value, std::to_string(ttl), m}));
  }

  // -- legacy -> cluster ------------------------------------------------------

  void forward_pass(const std::vector<std::string>& keys) {
    if (src_.is_cluster())
      throw invalid_argument_error("source", "a legacy keyspace lives on one "
                                             "node: the source must not be a "
                                             "cluster client");
    auto& p = o_.prefix;
    auto has = [&](const std::string& k, const std::string& pre) {
      return k.size() > p.size() + 1 + pre.size()
             && k.compare(p.size() + 1, pre.size(), pre) == 0;
    };
    auto id_of = [&](const std::string& k, const std::string& pre) {
      return k.substr(p.size() + 1 + pre.size());
    };
    for (auto& k : keys) {
      auto lk = internal::legacy_data_kind(p, k);
      if (!lk || !wanted(std::string{*lk}))
        continue;
      std::string kn{*lk};
      try {
        if (has(k, "chat:")) {
          auto id = id_of(k, "chat:");
          auto [f, ttl] = read_hash(k);
          if (f.empty())
            continue;
          internal::read_chat(k, f);
          count(kn, put_hash({L_.record(rk::chat, id),
                              L_.record_index_of(rk::chat, id)},
                             mode(), id, 0, "0", f));
          done_with(kn, k);
        } else if (has(k, "contact:")) {
          auto id = id_of(k, "contact:");
          auto [f, ttl] = read_hash(k);
          if (f.empty())
            continue;
          internal::read_contact(k, f);
          count(kn, put_hash({L_.record(rk::contact, id),
                              L_.record_index_of(rk::contact, id)},
                             mode(), id, 0, "0", f));
          done_with(kn, k);
        } else if (has(k, "cp:")) {
          auto id = id_of(k, "cp:");
          auto [f, ttl] = read_hash(k);
          if (f.empty())
            continue;
          internal::read_checkpoint(k, f);
          count(kn, put_hash({L_.record(rk::checkpoint, id),
                              L_.record_index_of(rk::checkpoint, id)},
                             mode(), id, ttl, "exp", f));
          done_with(kn, k);
        } else if (has(k, "cprev:")) {
          auto v = src_.call({"GET", k});
          if (!v.is_nil())
            raise(L_.checkpoint_revision(id_of(k, "cprev:")), v.str);
          aux(kn, k);
        } else if (has(k, "sched:")) {
          auto id = id_of(k, "sched:");
          auto [f, ttl] = read_hash(k);
          if (f.empty())
            continue;
          internal::field(f, k, "token");
          count(kn, put_hash({L_.record(rk::schedule, id),
                              L_.record_index_of(rk::schedule, id)},
                             o_.overwrite ? "replace" : "token", id, 0, "0",
                             f));
          done_with(kn, k);
        } else if (has(k, "fence:")) {
          auto v = src_.call({"GET", k});
          if (!v.is_nil())
            count(kn, raise(L_.fence(id_of(k, "fence:")), v.str));
          done_with(kn, k);
        } else if (has(k, "log:")) {
          forward_log(k, id_of(k, "log:"));
        } else if (has(k, "udidx:")) {
          forward_user_data(k, id_of(k, "udidx:"));
        } else if (!has(k, "ud:")) {
          // Indexes, sequences, lock tokens: rebuilt or not carried over.
          // (User-data values are reached through their index and deleted
          // only once copied.)
          aux(kn, k);
        }
      } catch (const error& e) {
        if (e.code() != errc::corrupted_record)
          throw;
        problem(kn, k, e.what());
      }
    }
  }

  void forward_log(const std::string& k, const std::string& chat) {
    auto r = src_.call({"LRANGE", k, "0", "-1"});
    expect_reply("LRANGE " + k, r, kind::array);
    std::vector<std::string> pairs;
    bool bad = false;
    for (size_t i = 0; i < r.elements.size(); ++i) {
      try {
        auto m = internal::decode_entry(r.elements[i].str,
                                        fmt::format("message log {}", k));
        pairs.push_back(std::to_string(m.seq));
        pairs.push_back(r.elements[i].str);
      } catch (const error& e) {
        problem("messages", fmt::format("{}[{}]", k, i), e.what());
        bad = true;
      }
    }
    auto z = L_.message_log(chat);
    for (size_t at = 0; at < pairs.size(); at += 2 * log_part) {
      auto end = std::min(pairs.size(), at + 2 * log_part);
      std::size_t n = (end - at) / 2;
      std::size_t written = 0;
      if (o_.dry_run) {
        if (o_.overwrite) {
          written = n;
        } else {
          for (auto i = at; i < end; i += 2)
            written += dst_.call({"EXISTS", L_.message_item(chat, pairs[i])})
                           .integer == 0;
        }
      } else {
        std::vector<std::string> args{mode()};
        args.insert(args.end(), pairs.begin() + static_cast<long>(at),
                    pairs.begin() + static_cast<long>(end));
        std::vector<std::string> keys{z};
        for (auto i = at; i < end; i += 2)
          keys.push_back(L_.message_item(chat, pairs[i]));
        auto w = dst_.eval(lua().mig_put_log, keys, args);
        expect_reply("script mig_put_log", w, kind::integer);
        written = static_cast<std::size_t>(w.integer);
      }
      rep_.kinds["messages"].copied += written;
      rep_.kinds["messages"].kept += n - written;
    }
    if (!bad)
      done_with("messages", k);
  }

  void forward_user_data(const std::string& k, const std::string& user_ns) {
    // p:udidx:<user>:<ns>: the legacy names are not encoded; a namespace
    // is taken to hold no ':' (user ids do: "telegram:42").
    auto colon = user_ns.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      problem("user_data", k, "not p:udidx:<user>:<ns>");
      return;
    }
    auto user = user_ns.substr(0, colon);
    auto ns = user_ns.substr(colon + 1);
    auto members = src_.call({"ZRANGE", k, "0", "-1"});
    expect_reply("ZRANGE " + k, members, kind::array);
    for (auto& m : members.elements) {
      auto vk = LL_->user_data(user, ns, m.str);
      auto r = src_.pipeline({{"GET", vk}, {"PTTL", vk}});
      if (r[0].is_nil())
        continue; // expired
      if (auto why = value_problem(r)) {
        problem("user_data", vk, *why);
        continue;
      }
      count("user_data",
            put_value(L_.user_data(user, ns, m.str), L_.user_data_index(user),
                      mode(), redis_cluster_layout::user_data_member(ns, m.str),
                      r[1].integer > 0 ? r[1].integer : 0, r[0].str));
      done_with("user_data", vk);
    }
    aux("user_data", k);
  }

  // -- cluster -> legacy ------------------------------------------------------

  void backward_pass(const std::vector<std::string>& keys) {
    if (dst_.is_cluster())
      throw invalid_argument_error("target", "the legacy layout lives on one "
                                             "node: the rollback target must "
                                             "not be a cluster client");
    auto rec_mode = o_.mirror || o_.overwrite ? std::string{"replace"}
                                              : std::string{"keep"};
    std::set<std::pair<std::string, std::string>> items; // (chat, member)
    std::vector<internal::cluster_key> item_keys;
    std::vector<std::string> item_names;
    for (auto& k : keys) {
      auto ck = internal::parse_cluster_key(o_.prefix, k);
      if (!ck || ck->kind == "marker" || !wanted(ck->kind))
        continue;
      auto& kn = ck->kind;
      try {
        if (ck->part == "r" && kn == "chats") {
          auto [f, ttl] = read_hash(k);
          if (f.empty())
            continue;
          internal::read_chat(k, f);
          seen_[kn].insert(ck->id);
          count(kn, put_hash({LL_->chat(ck->id), LL_->chat_index()}, rec_mode,
                             ck->id, 0, "0", f));
          done_with(kn, k);
        } else if (ck->part == "r" && kn == "contacts") {
          auto [f, ttl] = read_hash(k);
          if (f.empty())
            continue;
          internal::read_contact(k, f);
          seen_[kn].insert(ck->id);
          count(kn, put_hash({LL_->contact(ck->id), LL_->contact_index()},
                             rec_mode, ck->id, 0, "0", f));
          done_with(kn, k);
        } else if (ck->part == "r" && kn == "checkpoints") {
          auto [f, ttl] = read_hash(k);
          if (f.empty())
            continue;
          internal::read_checkpoint(k, f);
          seen_[kn].insert(ck->id);
          count(kn, put_hash({LL_->checkpoint(ck->id)}, rec_mode, ck->id, ttl,
                             "-", f));
          done_with(kn, k);
        } else if (ck->part == "v" && kn == "checkpoints") {
          auto v = src_.call({"GET", k});
          if (!v.is_nil())
            raise(LL_->checkpoint_revision(ck->id), v.str);
          aux(kn, k);
        } else if (ck->part == "r" && kn == "schedules") {
          auto [f, ttl] = read_hash(k);
          if (f.empty())
            continue;
          internal::field(f, k, "token");
          seen_[kn].insert(ck->id);
          count(kn, put_hash({LL_->schedule(ck->id), LL_->schedule_index()},
                             o_.mirror || o_.overwrite ? "replace" : "token",
                             ck->id, 0, "0", f));
          done_with(kn, k);
        } else if (ck->part == "f" && kn == "locks") {
          auto v = src_.call({"GET", k});
          if (!v.is_nil())
            count(kn, raise(LL_->fence(ck->id), v.str));
          done_with(kn, k);
        } else if (ck->part == "z" && kn == "messages") {
          backward_log(k, ck->id, rec_mode, items);
        } else if (ck->part == "i" && kn == "messages") {
          item_keys.push_back(*ck);
          item_names.push_back(k);
        } else if (ck->part == "idx" && kn == "user_data") {
          backward_user_data(k, ck->id, rec_mode);
        } else if (ck->part != "e") {
          // Bucket indexes, lock tokens. (User-data values are reached
          // through their index and deleted only once copied.)
          aux(kn, k);
        }
      } catch (const error& e) {
        if (e.code() != errc::corrupted_record)
          throw;
        problem(kn, k, e.what());
      }
    }
    for (size_t i = 0; i < item_keys.size(); ++i)
      if (!items.count({item_keys[i].id, item_keys[i].member})) {
        rep_.orphans.push_back(item_names[i]);
        // An orphan is not copied: it stays in the source.
      }
    // Mirror prunes only after a pass that read everything: a record that
    // could not be read is missing from the view, and pruning on it would
    // delete its legacy copy (the one the bot will run on).
    if (o_.mirror && rep_.problems.empty())
      prune_legacy();
  }

  void backward_log(const std::string& z, const std::string& chat,
                    const std::string& m,
                    std::set<std::pair<std::string, std::string>>& items) {
    auto r = src_.call({"ZRANGE", z, "0", "-1"});
    expect_reply("ZRANGE " + z, r, kind::array);
    std::vector<redis_client::command> gets;
    for (auto& e : r.elements)
      gets.push_back({"GET", L_.message_item(chat, e.str)});
    std::vector<redis_reply> vals;
    if (!gets.empty())
      vals = src_.pipeline(std::move(gets));
    std::vector<std::string> entries;
    std::uint64_t last = 0;
    for (size_t i = 0; i < r.elements.size(); ++i) {
      auto& member = r.elements[i].str;
      auto item = L_.message_item(chat, member);
      items.insert({chat, member}); // referenced: never an orphan
      if (vals[i].type != kind::string) {
        problem("messages", item, fmt::format("listed by {} but missing", z));
        continue;
      }
      try {
        auto msg = internal::decode_entry(vals[i].str, "message " + item);
        if (std::to_string(msg.seq) != member) {
          rep_.foreign.push_back(item); // not this log's entry: skipped
          continue;
        }
        last = std::max(last, msg.seq);
      } catch (const error& e) {
        problem("messages", item, e.what());
        continue;
      }
      entries.push_back(vals[i].str);
      done_with("messages", item);
    }
    seen_["messages"].insert(chat);
    std::size_t written = 0;
    if (o_.dry_run) {
      written = m == "replace"
                    || dst_.call({"EXISTS", LL_->log(chat)}).integer == 0
                  ? entries.size()
                  : 0;
    } else {
      for (size_t at = 0; at == 0 || at < entries.size(); at += log_part) {
        auto end = std::min(entries.size(), at + log_part);
        std::vector<std::string> args{at == 0 ? m : std::string{"append"},
                                      std::to_string(last)};
        args.insert(args.end(), entries.begin() + static_cast<long>(at),
                    entries.begin() + static_cast<long>(end));
        auto w = dst_.eval(lua().mig_put_legacy_log,
                           {LL_->log(chat), LL_->log_seq(chat)}, args);
        if (!internal::flag("script mig_put_legacy_log", w))
          break;
        written = end;
        if (end >= entries.size())
          break;
      }
    }
    rep_.kinds["messages"].copied += written;
    rep_.kinds["messages"].kept += entries.size() - written;
    aux("messages", z);
  }

  void backward_user_data(const std::string& idx, const std::string& user,
                          const std::string& m) {
    auto members = src_.call({"ZRANGE", idx, "0", "-1"});
    expect_reply("ZRANGE " + idx, members, kind::array);
    for (auto& e : members.elements) {
      auto colon = e.str.find(':');
      if (colon == std::string::npos) {
        problem("user_data", idx, fmt::format("member \"{}\" is not ns:key",
                                              e.str));
        continue;
      }
      auto ns = internal::decode_key_segment(e.str.substr(0, colon));
      auto key = internal::decode_key_segment(e.str.substr(colon + 1));
      auto vk = L_.user_data(user, ns, key);
      auto r = src_.pipeline({{"GET", vk}, {"PTTL", vk}});
      if (r[0].is_nil())
        continue; // expired
      if (auto why = value_problem(r)) {
        // An error reply (CLUSTERDOWN, WRONGTYPE) is no value to copy: the
        // record is reported and kept where it is.
        problem("user_data", vk, *why);
        continue;
      }
      seen_["user_data"].insert(LL_->user_data(user, ns, key));
      count("user_data", put_value(LL_->user_data(user, ns, key),
                                   LL_->user_data_index(user, ns), m, key,
                                   r[1].integer > 0 ? r[1].integer : 0,
                                   r[0].str));
      done_with("user_data", vk);
    }
    aux("user_data", idx);
  }

  // Mirror: legacy records the source no longer has go (schedules become
  // tombstones that keep their token).
  void prune_legacy() {
    auto& p = o_.prefix;
    auto dst_keys = internal::scan_prefix(dst_, p);
    auto pre = [&](const std::string& s) { return p + ":" + s; };
    for (auto& k : dst_keys) {
      auto lk = internal::legacy_data_kind(p, k);
      if (!lk || !wanted(std::string{*lk}) || damaged_.count(std::string{*lk}))
        continue;
      std::string kn{*lk};
      auto& c = rep_.kinds[kn];
      auto gone = [&](const std::string& family) {
        return k.starts_with(pre(family))
               && !seen_[kn].count(k.substr(pre(family).size()));
      };
      if (gone("chat:") || gone("contact:")) {
        auto id = k.substr(k.find(':', p.size() + 1) + 1);
        if (!o_.dry_run)
          dst_.pipeline({{"DEL", k},
                         {"ZREM", kn == "chats" ? LL_->chat_index()
                                                : LL_->contact_index(),
                          id}});
        ++c.pruned;
      } else if (gone("cp:")) {
        if (!o_.dry_run)
          dst_.call({"DEL", k});
        ++c.pruned;
      } else if (gone("log:")) {
        auto chat = k.substr(pre("log:").size());
        if (!o_.dry_run)
          dst_.call({"DEL", k, LL_->log_seq(chat)});
        ++c.pruned;
      } else if (gone("sched:")) {
        auto deleted = dst_.call({"HGET", k, "deleted"});
        if (deleted.str != "1") {
          if (!o_.dry_run)
            dst_.call({"HSET", k, "deleted", "1", "done", "0", "owner", "",
                       "until", "0", "claimed", "0"});
          ++c.pruned;
        }
      } else if (k.starts_with(pre("udidx:"))) {
        auto members = dst_.call({"ZRANGE", k, "0", "-1"});
        auto base = pre("ud:") + k.substr(pre("udidx:").size()) + ":";
        for (auto& m : members.elements) {
          auto vk = base + m.str;
          if (seen_[kn].count(vk))
            continue;
          if (!o_.dry_run)
            dst_.pipeline({{"DEL", vk}, {"ZREM", k, m.str}});
          ++c.pruned;
        }
      }
    }
  }

  // -- shared names, to another server ---------------------------------------

  void copy_unchanged(const std::vector<std::string>& keys) {
    auto& p = o_.prefix;
    for (auto& k : keys) {
      if (!internal::is_unchanged(p, k))
        continue;
      auto rest = std::string_view{k}.substr(p.size() + 1);
      // Heartbeats, turns and leadership holders are live state.
      if (rest.starts_with("co:rep:") || rest.starts_with("co:{t:"))
        continue;
      if (rest.starts_with("co:{ld:")) {
        if (rest.ends_with(":term")) {
          auto v = src_.call({"GET", k});
          if (!v.is_nil())
            count("unchanged", raise(k, v.str));
          done_with("unchanged", k);
        }
        continue;
      }
      auto r = src_.pipeline({{"DUMP", k}, {"PTTL", k}});
      if (r[0].is_nil())
        continue;
      auto ttl = r[1].integer > 0 ? r[1].integer : 0;
      bool exists = dst_.call({"EXISTS", k}).integer == 1;
      bool write = !exists || o_.overwrite;
      if (write && !o_.dry_run) {
        redis_client::command cmd{"RESTORE", k, std::to_string(ttl), r[0].str};
        if (exists)
          cmd.push_back("REPLACE");
        dst_.call(std::move(cmd));
      }
      count("unchanged", write);
      done_with("unchanged", k);
    }
  }

  // -- marker and source deletion --------------------------------------------

  void marker(bool forward) {
    auto key = redis_cluster_layout::marker_key(o_.prefix);
    std::string why;
    if (!include_.empty())
      why = "a pass limited by include";
    else if (o_.dry_run)
      why = "dry run";
    else if (!rep_.problems.empty())
      why = fmt::format("{} record(s) could not be read (see problems)",
                        rep_.problems.size());
    if (!why.empty()) {
      rep_.layout_marker = (forward ? "not written: " : "not deleted: ") + why;
      return;
    }
    if (forward) {
      dst_.call({"SET", key, std::string{redis_cluster_layout::marker_value}});
      rep_.layout_marker = "written";
    } else {
      src_.call({"DEL", key});
      if (!same_server_)
        dst_.call({"DEL", key});
      rep_.layout_marker = "deleted";
    }
  }

  void delete_source() {
    for (auto& [kn, list] : per_key_) {
      if (kn == "unchanged" && same_server_)
        continue;
      for (auto& k : list)
        rep_.kinds[kn].deleted += src_.call({"DEL", k}).integer;
    }
    for (auto& [kn, list] : aux_) {
      if (damaged_.count(kn))
        continue;
      for (auto& k : list)
        rep_.kinds[kn].deleted += src_.call({"DEL", k}).integer;
    }
  }

  const redis_migration_options& o_;
  redis_client& src_;
  redis_client& dst_;
  redis_cluster_layout L_;
  std::shared_ptr<const redis_layout> LL_;
  bool same_server_ = false;
  std::set<std::string> include_;
  redis_migration_report rep_;
  std::set<std::string> damaged_;
  std::map<std::string, std::vector<std::string>> per_key_;
  std::map<std::string, std::vector<std::string>> aux_;
  std::map<std::string, std::set<std::string>> seen_;
};

} // namespace

redis_migration_report migrate_redis_layout(const redis_migration_options& o) {
  if (!o.source)
    throw invalid_argument_error("source", "the migration needs a source "
                                           "client");
  for (auto& k : o.include)
    if (std::find(redis_data_kinds().begin(), redis_data_kinds().end(), k)
        == redis_data_kinds().end())
      throw invalid_argument_error(
        "include", fmt::format("unknown kind \"{}\" (one of {})", k,
                               fmt::join(redis_data_kinds(), ", ")));
  // The cluster:v1 names need a prefix without braces.
  internal::resolve_layout(redis_layout_kind::cluster, false, o.prefix,
                           "migration");
  auto& src = *o.source;
  auto& dst = o.target ? *o.target : *o.source;
  if (o.direction == redis_migration_direction::cluster_to_legacy && !o.target
      && src.is_cluster())
    throw invalid_argument_error("target", "a rollback from a Redis Cluster "
                                           "needs a single-node target");
  if (!o.allow_live) {
    auto check = [&](redis_client& c, std::string_view which) {
      auto keys = internal::scan_prefix(c, o.prefix);
      auto [beats, pending] = internal::live_state(c, o.prefix, keys);
      if (beats + pending > 0)
        throw error(errc::store_error,
                    fmt::format("migration: the {} {} has {} live coordinator "
                                "heartbeat(s) and {} pending turn(s) under "
                                "\"{}\": stop every bot of the prefix first "
                                "(or allow_live)",
                                which, c.endpoint(), beats, pending, o.prefix));
    };
    check(src, "source");
    if (o.target && o.target->endpoint() != src.endpoint())
      check(dst, "target");
  }
  return migration{o, src, dst}.run();
}

} // namespace botmesh
