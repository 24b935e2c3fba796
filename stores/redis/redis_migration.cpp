#include <botmesh/stores/redis/redis_migration.hpp>

#include <algorithm>
#include <charconv>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/json.hpp>
#include <botmesh/stores/redis/internal/cluster.hpp>
#include <botmesh/stores/redis/internal/keyspace.hpp>
#include <botmesh/stores/redis/internal/protocol.hpp>
#include <botmesh/stores/redis/internal/store_impl.hpp>
#include <botmesh/stores/redis/redis_cluster_layout.hpp>
#include <botmesh/stores/redis/redis_layout.hpp>

namespace botmesh {

namespace internal {

using kind = redis_reply::kind;

// -- scanning -------------------------------------------------------------------

void scan_node(redis_client& c, const std::string& match,
               const std::function<bool(const std::string&)>& visit) {
  std::string cursor = "0";
  do {
    auto r = c.call({"SCAN", cursor, "MATCH", match, "COUNT", "10000"});
    if (r.type != kind::array || r.elements.size() != 2
        || r.elements[1].type != kind::array)
      throw error(errc::store_error,
                  fmt::format("redis {}: SCAN answered something else than "
                              "[cursor, keys]",
                              c.endpoint()));
    cursor = r.elements[0].str;
    for (auto& k : r.elements[1].elements)
      if (!visit(k.str))
        return;
  } while (cursor != "0");
}

std::vector<std::string> cluster_masters(std::string_view nodes_text) {
  std::vector<std::string> out;
  std::vector<bool> served(cluster_slots, false);
  std::istringstream lines{std::string{nodes_text}};
  std::string line;
  while (std::getline(lines, line)) {
    // <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong>
    // <epoch> <link> <slot or first-last> ... ([slot->-id] while moving)
    std::istringstream f{line};
    std::vector<std::string> fields;
    for (std::string w; f >> w;)
      fields.push_back(std::move(w));
    if (fields.size() < 8
        || fields[2].find("master") == std::string::npos)
      continue;
    std::size_t slots = 0;
    for (std::size_t i = 8; i < fields.size(); ++i) {
      auto& r = fields[i];
      if (r.starts_with("["))
        continue; // a slot being imported or migrated: its owner lists it
      auto dash = r.find('-');
      std::size_t first = 0, last = 0;
      auto num = [&](std::string_view t, std::size_t& v) {
        auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
        return ec == std::errc{} && p == t.data() + t.size() && v < cluster_slots;
      };
      std::string_view sv{r};
      if (!(dash == std::string::npos
              ? num(sv, first) && num(sv, last)
              : num(sv.substr(0, dash), first) && num(sv.substr(dash + 1), last))
          || last < first)
        throw error(errc::store_error,
                    fmt::format("CLUSTER NODES: malformed slot range \"{}\" "
                                "in the line of {}",
                                r, fields[1]));
      for (auto s = first; s <= last; ++s)
        served[s] = true;
      slots += last - first + 1;
    }
    auto addr = fields[1].substr(0, fields[1].find('@'));
    if (fields[2].find("fail") != std::string::npos) {
      if (slots == 0)
        continue;
      throw error(errc::store_error,
                  fmt::format("redis cluster: the master at {} is flagged "
                              "{} and serves {} slots: their keys cannot be "
                              "read until its replica takes over or it "
                              "recovers; run this again once the cluster is "
                              "whole",
                              addr, fields[2], slots));
    }
    out.push_back(std::move(addr));
  }
  for (std::size_t s = 0; s < cluster_slots; ++s)
    if (!served[s]) {
      auto e = s;
      while (e + 1 < cluster_slots && !served[e + 1])
        ++e;
      throw error(errc::store_error,
                  fmt::format("redis cluster: no master serves slots {}-{}: "
                              "their keys cannot be read; run this again once "
                              "every slot is served",
                              s, e));
    }
  return out;
}

// Every key under the prefix: on one node, or on every master of a
// cluster (SCAN sees one node only).
std::vector<std::string> scan_prefix(redis_client& c,
                                     const std::string& prefix) {
  std::vector<std::string> out;
  auto match = escape_glob(prefix) + ":*";
  auto keep = [&out](const std::string& k) {
    out.push_back(k);
    return true;
  };
  c.for_each_master([&](redis_client& node) { scan_node(node, match, keep); });
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// -- key classification ---------------------------------------------------------

std::optional<cluster_key> parse_cluster_key(std::string_view prefix,
                                             std::string_view key) {
  if (!key.starts_with(prefix) || key.size() <= prefix.size() + 1
      || key[prefix.size()] != ':')
    return std::nullopt;
  auto rest = key.substr(prefix.size() + 1);
  if (rest == "{meta}:layout")
    return cluster_key{"marker", "meta", "", "", ""};
  if (!rest.starts_with("{"))
    return std::nullopt;
  auto close = rest.find("}:");
  auto colon = rest.find(':');
  if (close == std::string_view::npos || colon == std::string_view::npos
      || colon > close)
    return std::nullopt;
  cluster_key k;
  k.tag = std::string{rest.substr(1, colon - 1)};
  auto tagval = rest.substr(colon + 1, close - colon - 1);
  auto tail = rest.substr(close + 2);
  static const std::map<std::string, std::string, std::less<>> kinds = {
    {"m", "messages"},  {"ch", "chats"},     {"ct", "contacts"},
    {"cp", "checkpoints"}, {"sc", "schedules"}, {"ud", "user_data"},
    {"lk", "locks"}};
  auto i = kinds.find(k.tag);
  if (i == kinds.end())
    return std::nullopt;
  k.kind = i->second;
  auto c = tail.find(':');
  k.part = std::string{c == std::string_view::npos ? tail : tail.substr(0, c)};
  auto after = c == std::string_view::npos ? std::string_view{}
                                           : tail.substr(c + 1);
  if (k.tag == "m" || k.tag == "ud" || k.tag == "lk") {
    k.id = internal::decode_key_segment(tagval);
    k.member = std::string{after};
  } else {
    k.id = internal::decode_key_segment(after);
  }
  return k;
}

// Names the layouts share: copied only to another server.
bool is_unchanged(std::string_view prefix, std::string_view key) {
  if (!key.starts_with(prefix) || key.size() <= prefix.size() + 1
      || key[prefix.size()] != ':')
    return false;
  auto rest = key.substr(prefix.size() + 1);
  for (auto p : {"co:", "conv:", "cursor:", "lease:", "{durable:"})
    if (rest.starts_with(p))
      return true;
  return false;
}

// Live coordinator state under the prefix (heartbeats, pending turns).
std::pair<std::size_t, std::size_t>
live_state(redis_client& c, const std::string& prefix,
           const std::vector<std::string>& keys) {
  std::size_t beats = 0;
  std::vector<std::string> turns;
  auto rep = prefix + ":co:rep:";
  auto turn = prefix + ":co:{t:";
  for (auto& k : keys) {
    if (k.starts_with(rep))
      ++beats;
    else if (k.starts_with(turn) && (k.ends_with("}:q") || k.ends_with("}:h")))
      turns.push_back(k);
  }
  std::size_t pending = 0;
  if (turns.empty())
    return {beats, pending};
  auto t = c.call({"TIME"});
  auto time_ms = time_reply_ms(t);
  if (!time_ms)
    throw error(errc::store_error,
                fmt::format("redis TIME: malformed reply{}",
                            t.type == redis_reply::kind::error ? ": " + t.str
                                                               : std::string{}));
  auto now = *time_ms;
  for (auto& k : turns) {
    if (k.ends_with(":q")) {
      if (c.call({"LLEN", k}).integer > 0)
        ++pending;
      continue;
    }
    auto r = c.call({"HMGET", k, "o_inc", "o_dl"});
    if (r.elements.size() == 2 && !r.elements[0].str.empty()) {
      std::int64_t dl = 0;
      auto& s = r.elements[1].str;
      std::from_chars(s.data(), s.data() + s.size(), dl);
      if (dl > now)
        ++pending;
    }
  }
  return {beats, pending};
}

} // namespace internal

namespace {

using kind = redis_reply::kind;

std::string json_counts(const std::map<std::string, std::size_t>& m) {
  std::string out = "{";
  bool first = true;
  for (auto& [k, v] : m) {
    if (!first)
      out += ",";
    first = false;
    append_json_string(out, k);
    out += fmt::format(":{}", v);
  }
  return out + "}";
}

std::string json_list(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i)
      out += ",";
    append_json_string(out, v[i]);
  }
  return out + "]";
}

} // namespace

const std::vector<std::string>& redis_data_kinds() {
  static const std::vector<std::string> all{
    "chats",     "contacts",  "messages", "checkpoints",
    "user_data", "locks",     "schedules", "unchanged"};
  return all;
}

// -- inspection -----------------------------------------------------------------

redis_keyspace_report inspect_keyspace(redis_client& client,
                                       const std::string& prefix) {
  if (prefix.empty())
    throw invalid_argument_error("prefix", "the Redis key prefix must not be "
                                           "empty");
  redis_keyspace_report rep;
  rep.prefix = prefix;
  auto keys = internal::scan_prefix(client, prefix);
  for (auto& k : keys) {
    if (auto lk = internal::legacy_data_kind(prefix, k)) {
      ++rep.legacy[std::string{*lk}];
    } else if (auto ck = internal::parse_cluster_key(prefix, k)) {
      if (ck->kind != "marker")
        ++rep.cluster[ck->kind];
    } else if (internal::is_unchanged(prefix, k)) {
      auto rest = std::string_view{k}.substr(prefix.size() + 1);
      ++rep.unchanged[std::string{rest.substr(0, rest.find(':'))}];
    }
  }
  auto m = client.call({"GET", redis_cluster_layout::marker_key(prefix)});
  if (!m.is_nil())
    rep.marker = m.str;
  std::tie(rep.heartbeats, rep.pending_turns) = internal::live_state(client, prefix, keys);
  return rep;
}

std::string redis_keyspace_report::to_text() const {
  std::string out = fmt::format("prefix {}\n", prefix);
  auto section = [&](std::string_view name,
                     const std::map<std::string, std::size_t>& m) {
    for (auto& [k, v] : m)
      out += fmt::format("{} {} {}\n", name, k, v);
  };
  section("legacy", legacy);
  section("cluster", cluster);
  section("unchanged", unchanged);
  out += fmt::format("marker {}\n", marker ? *marker : std::string{"none"});
  out += fmt::format("heartbeats {}\npending_turns {}\n", heartbeats,
                     pending_turns);
  return out;
}

std::string redis_keyspace_report::to_json() const {
  std::string out = "{\"prefix\":";
  append_json_string(out, prefix);
  out += ",\"legacy\":" + json_counts(legacy);
  out += ",\"cluster\":" + json_counts(cluster);
  out += ",\"unchanged\":" + json_counts(unchanged);
  out += ",\"marker\":";
  if (marker)
    append_json_string(out, *marker);
  else
    out += "null";
  out += fmt::format(",\"heartbeats\":{},\"pending_turns\":{}}}", heartbeats,
                     pending_turns);
  return out;
}

std::string redis_migration_report::to_text() const {
  std::string out = fmt::format("direction {}{}\n", direction,
                                dry_run ? " (dry run: nothing written)" : "");
  out += "kind copied kept pruned deleted\n";
  for (auto& [k, c] : kinds)
    out += fmt::format("{} {} {} {} {}\n", k, c.copied, c.kept, c.pruned,
                       c.deleted);
  out += fmt::format("pruned {}\n", pruned);
  out += fmt::format("orphans {}\n", orphans.size());
  for (auto& o : orphans)
    out += fmt::format("  orphan {}\n", o);
  out += fmt::format("foreign {}\n", foreign.size());
  for (auto& o : foreign)
    out += fmt::format("  foreign {}\n", o);
  out += fmt::format("problems {}\n", problems.size());
  for (auto& p : problems)
    out += fmt::format("  problem {}\n", p);
  out += fmt::format("layout_marker {}\n", layout_marker);
  return out;
}

std::string redis_migration_report::to_json() const {
  std::string out = fmt::format("{{\"dry_run\":{},\"direction\":",
                                dry_run ? "true" : "false");
  append_json_string(out, direction);
  out += ",\"kinds\":{";
  bool first = true;
  for (auto& [k, c] : kinds) {
    if (!first)
      out += ",";
    first = false;
    append_json_string(out, k);
    out += fmt::format(":{{\"copied\":{},\"kept\":{},\"pruned\":{},"
                       "\"deleted\":{}}}",
                       c.copied, c.kept, c.pruned, c.deleted);
  }
  out += fmt::format("}},\"pruned\":{},\"orphans\":", pruned);
  out += json_list(orphans) + ",\"foreign\":" + json_list(foreign)
         + ",\"problems\":" + json_list(problems) + ",\"layout_marker\":";
  append_json_string(out, layout_marker);
  return out + "}";
}

} // namespace botmesh
