// botmesh redis inspect | migrate: the keyspace of a prefix per layout, and
// the migration legacy <-> cluster:v1 (stores/redis/redis_migration.hpp).

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/redis_client.hpp>
#include <botmesh/stores/redis/redis_migration.hpp>

#include "command.hpp"

namespace botmesh::tool {

const char* const redis_usage =
  "usage: botmesh redis inspect [--source URL] [--prefix P] [--json]\n"
  "       botmesh redis migrate [--source URL] [--target URL] [--prefix P]\n"
  "                     [--direction legacy-to-cluster|cluster-to-legacy]\n"
  "                     [--dry-run] [--include KIND,...] [--overwrite]\n"
  "                     [--delete-source] [--allow-live] [--no-mirror] [--json]\n"
  "inspect counts the keys under the prefix per layout (legacy, cluster,\n"
  "unchanged) and kind, the layout marker, live heartbeats and turns.\n"
  "migrate copies the keyspace between the layouts (stop every bot of the\n"
  "prefix first) and prints its report.\n"
  "  --source         redis://[user:password@]host:port of the data (default:\n"
  "                   $REDIS_URL); a Redis Cluster node is detected and the\n"
  "                   whole cluster used\n"
  "  --target         where the data goes (default: in place, the source)\n"
  "  --prefix         the bots' key prefix (default: botmesh)\n"
  "  --direction      legacy-to-cluster (default) or cluster-to-legacy\n"
  "  --dry-run        count what would be done; write nothing\n"
  "  --include        only these kinds: chats, contacts, messages,\n"
  "                   checkpoints, user_data, locks, schedules, unchanged\n"
  "                   (a limited pass never writes the layout marker)\n"
  "  --overwrite      replace records the target already has\n"
  "  --delete-source  delete the source keys once copied\n"
  "  --allow-live     run although a bot's heartbeat or turn is live\n"
  "  --no-mirror      cluster-to-legacy: copy only (existing legacy records\n"
  "                   win, nothing is pruned)\n"
  "  --json           print the report as JSON\n"
  "Exit codes: 0 done; 1 the work failed (Redis unreachable or an error\n"
  "reply, a live bot without --allow-live, or records that could not be\n"
  "read: listed under \"problems\", left in the source); 2 bad usage.\n";

namespace {

// A client for `url`: a cluster client when the node says it is part of
// a Redis Cluster.
std::shared_ptr<redis_client> connect(const std::string& url) {
  auto one = std::make_shared<redis_client>(redis_options{.url = url,
                                                          .connections = 1});
  auto info = one->call({"INFO", "cluster"}).str;
  if (info.find("cluster_enabled:1") == std::string::npos)
    return one;
  return std::make_shared<redis_client>(
    redis_cluster_options{.root_nodes = {url}});
}

std::vector<std::string> split_commas(std::string_view s) {
  std::vector<std::string> out;
  while (true) {
    auto comma = s.find(',');
    auto part = s.substr(0, comma);
    if (part.empty())
      throw usage_error("--include has an empty item");
    out.emplace_back(part);
    if (comma == std::string_view::npos)
      break;
    s.remove_prefix(comma + 1);
  }
  return out;
}

} // namespace

int redis(const args& all) {
  if (all.empty())
    throw usage_error("missing redis command (inspect or migrate)");
  auto verb = all[0];
  if (verb != "inspect" && verb != "migrate")
    throw usage_error("unknown redis command \"" + std::string{verb} + "\"");
  bool migrate = verb == "migrate";
  const char* env = std::getenv("REDIS_URL");
  std::string source = env ? env : "";
  std::string target;
  bool json = false;
  redis_migration_options o;
  args a{all.begin() + 1, all.end()};
  for (size_t i = 0; i < a.size(); ++i) {
    auto arg = a[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= a.size())
        throw usage_error(std::string{arg} + " needs a value");
      return std::string{a[++i]};
    };
    auto only_migrate = [&] {
      if (!migrate)
        throw usage_error(std::string{arg} + " is an option of migrate");
    };
    if (arg == "--source") {
      source = value();
    } else if (arg == "--prefix") {
      o.prefix = value();
      if (o.prefix.empty())
        throw usage_error("--prefix must not be empty");
    } else if (arg == "--json") {
      json = true;
    } else if (arg == "--target") {
      only_migrate();
      target = value();
    } else if (arg == "--direction") {
      only_migrate();
      auto d = value();
      if (d == "legacy-to-cluster")
        o.direction = redis_migration_direction::legacy_to_cluster;
      else if (d == "cluster-to-legacy")
        o.direction = redis_migration_direction::cluster_to_legacy;
      else
        throw usage_error("--direction must be legacy-to-cluster or "
                          "cluster-to-legacy, got \"" + d + "\"");
    } else if (arg == "--include") {
      only_migrate();
      o.include = split_commas(value());
      for (auto& k : o.include) {
        bool known = false;
        for (auto& n : redis_data_kinds())
          known = known || n == k;
        if (!known)
          throw usage_error("--include: unknown kind \"" + k + "\"");
      }
    } else if (arg == "--dry-run") {
      only_migrate();
      o.dry_run = true;
    } else if (arg == "--overwrite") {
      only_migrate();
      o.overwrite = true;
    } else if (arg == "--delete-source") {
      only_migrate();
      o.delete_source = true;
    } else if (arg == "--allow-live") {
      only_migrate();
      o.allow_live = true;
    } else if (arg == "--no-mirror") {
      only_migrate();
      o.mirror = false;
    } else {
      throw usage_error("unknown option " + std::string{arg});
    }
  }
  if (source.empty())
    throw usage_error("missing --source (and REDIS_URL is not set)");
  if (!migrate) {
    auto c = connect(source);
    auto rep = inspect_keyspace(*c, o.prefix);
    std::fputs(json ? (rep.to_json() + "\n").c_str() : rep.to_text().c_str(),
               stdout);
    return exit_ok;
  }
  o.source = connect(source);
  if (!target.empty())
    o.target = connect(target);
  auto rep = migrate_redis_layout(o);
  std::fputs(json ? (rep.to_json() + "\n").c_str() : rep.to_text().c_str(),
             stdout);
  if (!rep.problems.empty()) {
    std::fprintf(stderr,
                 "botmesh: %zu record(s) could not be read and were not "
                 "copied (see problems)\n",
                 rep.problems.size());
    return exit_failed;
  }
  return exit_ok;
}

} // namespace botmesh::tool
