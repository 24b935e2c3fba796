// Stored records: a flow checkpoint as a store hands it back (any bytes, a
// damaged row included), and the JSON helpers it is built on.
//
// Contract checked: checkpoint_from_json throws only botmesh::error with
// errc::corrupted_record; an accepted record is valid JSON, encodes again
// and decodes to the same checkpoint; json_quote of any bytes is valid JSON.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <botmesh/runtime/core/checkpoint.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/json.hpp>

#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  std::string_view text{reinterpret_cast<const char*>(data), size};
  auto quoted = botmesh::json_quote(text);
  FUZZ_CHECK(botmesh::is_valid_json(quoted), quoted);
  if (botmesh::is_valid_utf8(text))
    FUZZ_CHECK(quoted.size() >= text.size() + 2, quoted);

  std::optional<botmesh::flow_checkpoint> cp;
  try {
    cp = botmesh::checkpoint_from_json(text);
  } catch (const botmesh::error& e) {
    FUZZ_CHECK(e.code() == botmesh::errc::corrupted_record, e.what());
    return 0;
  }
  FUZZ_CHECK(botmesh::is_valid_json(text), "accepted a record that is not JSON");
  std::string again;
  try {
    again = botmesh::to_json(*cp);
  } catch (const botmesh::invalid_argument_error& e) {
    // The only refusal an accepted record may meet: an embedded answer
    // over the bound (the decoder does not apply it).
    FUZZ_CHECK(e.field() == "saved_answer", e.what());
    again = botmesh::to_json(*cp, SIZE_MAX);
  }
  botmesh::flow_checkpoint back;
  try {
    back = botmesh::checkpoint_from_json(again);
  } catch (const botmesh::error& e) {
    FUZZ_CHECK(false, again + ": " + e.what());
  }
  FUZZ_CHECK(back == *cp, "round trip changed the checkpoint: " + again);
  return 0;
}
