#include <botmesh/stores/redis/redis_layout.hpp>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/internal/keyspace.hpp>

namespace botmesh {

redis_layout::~redis_layout() {
  // nop
}

std::string encode_key_segment(std::string_view s) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '%': case ':': case '{': case '}': case '*': case '?': case '[':
      case ']': case ' ': case '\t': case '\n': case '\r':
        out.push_back('%');
        out.push_back(hex[c >> 4]);
        out.push_back(hex[c & 0xF]);
        break;
      default:
        out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

std::string redis_layout::turn(std::string_view chat,
                               std::string_view part) const {
  return fmt::format("{}:co:{{t:{}}}:{}", prefix_, encode_key_segment(chat),
                     part);
}

std::string redis_layout::heartbeat(std::string_view incarnation) const {
  return fmt::format("{}:co:rep:{}", prefix_, incarnation);
}

std::string redis_layout::lead(std::string_view name) const {
  return fmt::format("{}:co:{{ld:{}}}", prefix_, encode_key_segment(name));
}

std::string redis_layout::lead_term(std::string_view name) const {
  return lead(name) + ":term";
}

std::string redis_layout::grant_channel_prefix() const {
  return prefix_ + ":co:wake:";
}

namespace {

class legacy_layout final : public redis_layout {
 public:
  explicit legacy_layout(std::string p) : redis_layout(std::move(p)) {
    // nop
  }

  std::string name() const override {
    return "legacy";
  }
  std::string chat(std::string_view key) const override {
    return fmt::format("{}:chat:{}", prefix_, key);
  }
  std::string chat_index() const override {
    return prefix_ + ":chats";
  }
  std::string contact(std::string_view id) const override {
    return fmt::format("{}:contact:{}", prefix_, id);
  }
  std::string contact_index() const override {
    return prefix_ + ":contacts";
  }
  std::string log(std::string_view chat) const override {
    return fmt::format("{}:log:{}", prefix_, chat);
  }
  std::string log_seq(std::string_view chat) const override {
    return fmt::format("{}:logseq:{}", prefix_, chat);
  }
  std::string checkpoint(std::string_view key) const override {
    return fmt::format("{}:cp:{}", prefix_, key);
  }
  std::string checkpoint_revision(std::string_view key) const override {
    return fmt::format("{}:cprev:{}", prefix_, key);
  }
  std::string user_data(std::string_view user, std::string_view ns,
                        std::string_view key) const override {
    return fmt::format("{}:ud:{}:{}:{}", prefix_, user, ns, key);
  }
  std::string user_data_index(std::string_view user,
                              std::string_view ns) const override {
    return fmt::format("{}:udidx:{}:{}", prefix_, user, ns);
  }
  std::string lock(std::string_view key) const override {
    return fmt::format("{}:lock:{}", prefix_, key);
  }
  std::string fence(std::string_view key) const override {
    return fmt::format("{}:fence:{}", prefix_, key);
  }
  std::string schedule(std::string_view id) const override {
    return fmt::format("{}:sched:{}", prefix_, id);
  }
  std::string schedule_index() const override {
    return prefix_ + ":schedidx";
  }
  std::string lease(std::string_view name) const override {
    return fmt::format("{}:lease:{}", prefix_, name);
  }
};

} // namespace

namespace internal {

std::optional<std::string_view> legacy_data_kind(std::string_view prefix,
                                                 std::string_view key) {
  if (key.size() <= prefix.size() || !key.starts_with(prefix)
      || key[prefix.size()] != ':')
    return std::nullopt;
  auto rest = key.substr(prefix.size() + 1);
  // Whole names first, then "name:" families.
  static constexpr std::pair<std::string_view, std::string_view> whole[] = {
    {"chats", "chats"}, {"contacts", "contacts"}, {"schedidx", "schedules"}};
  for (auto [name, kind] : whole)
    if (rest == name)
      return kind;
  static constexpr std::pair<std::string_view, std::string_view> families[] = {
    {"chat:", "chats"},        {"contact:", "contacts"},
    {"log:", "messages"},      {"logseq:", "messages"},
    {"cp:", "checkpoints"},    {"cprev:", "checkpoints"},
    {"ud:", "user_data"},      {"udidx:", "user_data"},
    {"lock:", "locks"},        {"fence:", "locks"},
    {"sched:", "schedules"}};
  for (auto [name, kind] : families)
    if (rest.starts_with(name) && rest.size() > name.size())
      return kind;
  return std::nullopt;
}

std::string escape_glob(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\')
      out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

redis_layout_kind resolve_layout(redis_layout_kind asked, bool cluster_client,
                                 std::string_view prefix,
                                 std::string_view component) {
  if (prefix.empty())
    throw invalid_argument_error("prefix", "the Redis key prefix must not be "
                                           "empty");
  auto k = asked;
  if (k == redis_layout_kind::automatic)
    k = cluster_client ? redis_layout_kind::cluster : redis_layout_kind::legacy;
  if (k == redis_layout_kind::legacy && cluster_client)
    throw invalid_argument_error(
      "layout", fmt::format("{}: the legacy key layout cannot run on a Redis "
                            "Cluster (its scripts span hash slots); use the "
                            "cluster layout",
                            component));
  if (k == redis_layout_kind::cluster
      && prefix.find_first_of("{}") != std::string_view::npos)
    throw invalid_argument_error(
      "prefix", fmt::format("{}: the prefix \"{}\" holds {{ or }}: the cluster "
                            "layout's hash tags would break",
                            component, prefix));
  return k;
}

} // namespace internal

std::shared_ptr<const redis_layout> make_legacy_layout(std::string prefix) {
  if (prefix.empty())
    throw invalid_argument_error("prefix", "the Redis key prefix must not be "
                                           "empty");
  return std::make_shared<legacy_layout>(std::move(prefix));
}

} // namespace botmesh
