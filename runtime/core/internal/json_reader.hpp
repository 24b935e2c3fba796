#pragma once

// Internal: typed, error-naming access to a parsed JSON object. Included only
// by .cpp files (it pulls in simdjson).

#include <cstdint>
#include <string>
#include <string_view>

#include <simdjson.h>

#include <botmesh/runtime/core/message.hpp>

namespace botmesh {

namespace internal {

/// Reads fields of one JSON object. Every accessor throws `botmesh::error`
/// with `errc::corrupted_record` and a message "<what>: field \"x\" ..." when
/// the field is missing or has the wrong type. A reader made by `parse` is
/// valid until the next `parse` on the same thread (one parser per thread).
class json_reader {
 public:
  static json_reader parse(std::string_view json, std::string_view what);

  json_reader(simdjson::dom::object obj, std::string_view what)
    : obj_(obj), what_(what) {
    // nop
  }

  /// True when the object has `field` (of any type, null included).
  bool has(std::string_view field) const noexcept;
  bool is_null(std::string_view field) const;
  /// Any JSON number, as a double.
  double number(std::string_view field) const;
  std::string string(std::string_view field) const;
  std::int64_t int64(std::string_view field) const;
  std::uint64_t uint64(std::string_view field) const;
  bool boolean(std::string_view field) const;
  /// The field's value re-serialized as compact JSON (any type).
  std::string raw(std::string_view field) const;
  json_reader object(std::string_view field) const;
  /// A message type written by `to_string(message_type)`.
  botmesh::message_type type(std::string_view field) const;

  [[noreturn]] void fail(std::string_view field, std::string_view why) const;

  std::string_view what() const noexcept {
    return what_;
  }

 private:
  simdjson::dom::element get(std::string_view field) const;

  simdjson::dom::object obj_;
  std::string_view what_;
};

/// Reads an inbound message encoded by `to_json(const inbound_message&)`.
inbound_message read_inbound_message(const json_reader& r);

} // namespace internal
} // namespace botmesh
