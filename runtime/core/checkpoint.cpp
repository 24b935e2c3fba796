#include <botmesh/runtime/core/checkpoint.hpp>

#include <fmt/format.h>
#include <simdjson.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/internal/json_reader.hpp>
#include <botmesh/runtime/core/json.hpp>

namespace botmesh {

// Encoding v1 (one JSON object, field order fixed, state embedded as JSON):
//
//   {"v":1,"key":s,"flow":s,"step":s,"waiting":b,"question":u,"state":<json>,
//    "revision":u,"created_at":ms,"updated_at":ms,"fingerprint":s,
//    "ephemeral":b,"expires_at":ms,"answer":<inbound message>|null,
//    "answer_ref":s[,"marker":true]}
namespace {

// The state goes one level down in the checkpoint's object: a state that
// nests as deep as a reader allows would make a checkpoint no reader takes
// back, written over the last good one. So it is checked one level short.
bool state_fits(std::string_view state) noexcept {
  thread_local simdjson::dom::parser parser = [] {
    simdjson::dom::parser p;
    (void) p.allocate(4096, simdjson::DEFAULT_MAX_DEPTH - 1);
    return p;
  }();
  simdjson::dom::element doc;
  return parser.parse(state.data(), state.size(), true).get(doc)
         == simdjson::SUCCESS;
}

} // namespace

std::string to_json(const flow_checkpoint& cp, std::size_t max_answer_bytes) {
  if (!state_fits(cp.state))
    throw invalid_argument_error(
      "state", fmt::format("checkpoint {}: state is not a JSON document (or "
                           "nests deeper than {} levels)",
                           cp.key, simdjson::DEFAULT_MAX_DEPTH - 1));
  std::string answer = "null";
  if (cp.saved_answer) {
    answer = to_json(*cp.saved_answer);
    if (answer.size() > max_answer_bytes)
      throw invalid_argument_error(
        "saved_answer",
        fmt::format("checkpoint {}: saved answer is {} bytes, over the bound "
                    "of {} bytes",
                    cp.key, answer.size(), max_answer_bytes));
  }
  std::string out;
  out.reserve(160 + cp.state.size() + answer.size() + cp.key.size());
  out += fmt::format("{{\"v\":{},\"key\":", checkpoint_encoding_version);
  append_json_string(out, cp.key);
  out += ",\"flow\":";
  append_json_string(out, cp.flow);
  out += ",\"step\":";
  append_json_string(out, cp.step);
  out += fmt::format(",\"waiting\":{},\"question\":{},\"state\":", cp.waiting,
                     cp.question);
  out += cp.state;
  out += fmt::format(",\"revision\":{},\"created_at\":{},\"updated_at\":{},"
                     "\"fingerprint\":",
                     cp.revision, to_unix_ms(cp.created_at),
                     to_unix_ms(cp.updated_at));
  append_json_string(out, cp.fingerprint);
  out += fmt::format(",\"ephemeral\":{},\"expires_at\":{},\"answer\":",
                     cp.ephemeral, to_unix_ms(cp.expires_at));
  out += answer;
  out += ",\"answer_ref\":";
  append_json_string(out, cp.answer_ref);
  if (cp.marker)
    out += ",\"marker\":true";
  out.push_back('}');
  return out;
}

flow_checkpoint checkpoint_from_json(std::string_view json) {
  auto r = internal::json_reader::parse(json, "checkpoint");
  auto version = r.int64("v");
  if (version != checkpoint_encoding_version)
    r.fail("v", fmt::format("has unknown encoding version {}", version));
  flow_checkpoint cp;
  cp.key = r.string("key");
  cp.flow = r.string("flow");
  cp.step = r.string("step");
  cp.waiting = r.boolean("waiting");
  auto question = r.uint64("question");
  if (question > UINT32_MAX)
    r.fail("question", "is out of range");
  cp.question = static_cast<std::uint32_t>(question);
  cp.state = r.raw("state");
  cp.revision = r.uint64("revision");
  cp.created_at = from_unix_ms(r.int64("created_at"));
  cp.updated_at = from_unix_ms(r.int64("updated_at"));
  cp.fingerprint = r.string("fingerprint");
  cp.ephemeral = r.boolean("ephemeral");
  cp.expires_at = from_unix_ms(r.int64("expires_at"));
  if (!r.is_null("answer"))
    cp.saved_answer = internal::read_inbound_message(r.object("answer"));
  cp.answer_ref = r.string("answer_ref");
  // Absent in checkpoints written before markers existed.
  if (r.has("marker"))
    cp.marker = r.boolean("marker");
  return cp;
}

} // namespace botmesh
