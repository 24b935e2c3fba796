#include <botmesh/runtime/core/internal/json_reader.hpp>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>

namespace botmesh::internal {

json_reader json_reader::parse(std::string_view json, std::string_view what) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto err = parser.parse(json.data(), json.size(), true).get(doc))
    throw error(errc::corrupted_record,
                fmt::format("{}: not valid JSON ({})", what,
                            simdjson::error_message(err)));
  simdjson::dom::object obj;
  if (doc.get(obj) != simdjson::SUCCESS)
    throw error(errc::corrupted_record,
                fmt::format("{}: expected a JSON object", what));
  return json_reader{obj, what};
}

void json_reader::fail(std::string_view field, std::string_view why) const {
  throw error(errc::corrupted_record,
              fmt::format("{}: field \"{}\" {}", what_, field, why));
}

simdjson::dom::element json_reader::get(std::string_view field) const {
  simdjson::dom::element e;
  if (obj_.at_key(field).get(e) != simdjson::SUCCESS)
    fail(field, "is missing");
  return e;
}

bool json_reader::has(std::string_view field) const noexcept {
  simdjson::dom::element e;
  return obj_.at_key(field).get(e) == simdjson::SUCCESS;
}

double json_reader::number(std::string_view field) const {
  auto e = get(field);
  double d;
  if (e.get(d) == simdjson::SUCCESS)
    return d;
  std::int64_t i;
  if (e.get(i) == simdjson::SUCCESS)
    return static_cast<double>(i);
  std::uint64_t u;
  if (e.get(u) == simdjson::SUCCESS)
    return static_cast<double>(u);
  fail(field, "is not a number");
}

bool json_reader::is_null(std::string_view field) const {
  return get(field).is_null();
}

std::string json_reader::string(std::string_view field) const {
  std::string_view v;
  if (get(field).get(v) != simdjson::SUCCESS)
    fail(field, "is not a string");
  return std::string{v};
}

std::int64_t json_reader::int64(std::string_view field) const {
  std::int64_t v;
  if (get(field).get(v) != simdjson::SUCCESS)
    fail(field, "is not an integer");
  return v;
}

std::uint64_t json_reader::uint64(std::string_view field) const {
  std::uint64_t v;
  if (get(field).get(v) != simdjson::SUCCESS)
    fail(field, "is not a non-negative integer");
  return v;
}

bool json_reader::boolean(std::string_view field) const {
  bool v;
  if (get(field).get(v) != simdjson::SUCCESS)
    fail(field, "is not a boolean");
  return v;
}

std::string json_reader::raw(std::string_view field) const {
  return simdjson::minify(get(field));
}

json_reader json_reader::object(std::string_view field) const {
  simdjson::dom::object o;
  if (get(field).get(o) != simdjson::SUCCESS)
    fail(field, "is not an object");
  return json_reader{o, what_};
}

botmesh::message_type json_reader::type(std::string_view field) const {
  auto name = string(field);
  try {
    return parse_message_type(name);
  } catch (const invalid_argument_error&) {
    fail(field, fmt::format("is an unknown message type \"{}\"", name));
  }
}

} // namespace botmesh::internal
