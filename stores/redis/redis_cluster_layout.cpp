#include <botmesh/stores/redis/redis_cluster_layout.hpp>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/redis_layout.hpp>

namespace botmesh {

redis_cluster_layout::redis_cluster_layout(std::string prefix)
  : prefix_(std::move(prefix)) {
  if (prefix_.empty())
    throw invalid_argument_error("prefix",
                                 "the Redis key prefix must not be empty");
  if (prefix_.find_first_of("{}") != std::string::npos)
    throw invalid_argument_error(
      "prefix", fmt::format("the prefix \"{}\" holds {{ or }}: the cluster "
                            "layout's hash tags would break",
                            prefix_));
}

std::uint32_t redis_cluster_layout::bucket(std::string_view id) noexcept {
  std::uint32_t h = 2166136261u;
  for (unsigned char c : id) {
    h ^= c;
    h *= 16777619u;
  }
  return h % buckets;
}

std::string_view redis_cluster_layout::tag(record_kind k) noexcept {
  switch (k) {
    case record_kind::chat:
      return "ch";
    case record_kind::contact:
      return "ct";
    case record_kind::checkpoint:
      return "cp";
    case record_kind::schedule:
      return "sc";
  }
  return "ch";
}

std::string redis_cluster_layout::marker_key(std::string_view prefix) {
  return std::string{prefix} + ":{meta}:layout";
}

std::string redis_cluster_layout::marker() const {
  return marker_key(prefix_);
}

std::string redis_cluster_layout::message_log(std::string_view chat) const {
  return fmt::format("{}:{{m:{}}}:z", prefix_, encode_key_segment(chat));
}

std::string redis_cluster_layout::message_item(std::string_view chat,
                                               std::string_view member) const {
  return fmt::format("{}:{{m:{}}}:i:{}", prefix_, encode_key_segment(chat),
                     encode_key_segment(member));
}

std::string redis_cluster_layout::record(record_kind k,
                                         std::string_view id) const {
  return fmt::format("{}:{{{}:{}}}:r:{}", prefix_, tag(k), bucket(id),
                     encode_key_segment(id));
}

std::string redis_cluster_layout::record_index(record_kind k,
                                               std::uint32_t b) const {
  return fmt::format("{}:{{{}:{}}}:idx", prefix_, tag(k), b % buckets);
}

std::string redis_cluster_layout::record_index_of(record_kind k,
                                                  std::string_view id) const {
  return record_index(k, bucket(id));
}

std::string redis_cluster_layout::user_data(std::string_view user,
                                            std::string_view ns,
                                            std::string_view key) const {
  return fmt::format("{}:{{ud:{}}}:e:{}:{}", prefix_, encode_key_segment(user),
                     encode_key_segment(ns), encode_key_segment(key));
}

std::string redis_cluster_layout::user_data_index(std::string_view user) const {
  return fmt::format("{}:{{ud:{}}}:idx", prefix_, encode_key_segment(user));
}

std::string redis_cluster_layout::user_data_member(std::string_view ns,
                                                   std::string_view key) {
  return encode_key_segment(ns) + ":" + encode_key_segment(key);
}

std::string
redis_cluster_layout::checkpoint_revision(std::string_view key) const {
  auto b = bucket(key);
  return fmt::format("{}:{{{}:{}}}:v:{}", prefix_, tag(record_kind::checkpoint),
                     b, encode_key_segment(key));
}

std::string redis_cluster_layout::lock(std::string_view key) const {
  return fmt::format("{}:{{lk:{}}}:l", prefix_, encode_key_segment(key));
}

std::string redis_cluster_layout::fence(std::string_view key) const {
  return fmt::format("{}:{{lk:{}}}:f", prefix_, encode_key_segment(key));
}

std::string redis_cluster_layout::turn(std::string_view chat,
                                       std::string_view part) const {
  return fmt::format("{}:co:{{t:{}}}:{}", prefix_, encode_key_segment(chat),
                     part);
}

std::string redis_cluster_layout::lead(std::string_view name) const {
  return fmt::format("{}:co:{{ld:{}}}", prefix_, encode_key_segment(name));
}

std::string redis_cluster_layout::lead_term(std::string_view name) const {
  return lead(name) + ":term";
}

std::string redis_cluster_layout::lease(std::string_view name) const {
  return fmt::format("{}:lease:{}", prefix_, name);
}

std::string redis_cluster_layout::heartbeat(std::string_view incarnation) const {
  return fmt::format("{}:co:rep:{}", prefix_, incarnation);
}

} // namespace botmesh
