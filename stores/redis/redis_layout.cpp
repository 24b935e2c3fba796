#include <botmesh/stores/redis/redis_layout.hpp>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>

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

std::shared_ptr<const redis_layout> make_legacy_layout(std::string prefix) {
  if (prefix.empty())
    throw invalid_argument_error("prefix", "the Redis key prefix must not be "
                                           "empty");
  return std::make_shared<legacy_layout>(std::move(prefix));
}

} // namespace botmesh
