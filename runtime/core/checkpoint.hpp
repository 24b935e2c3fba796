#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <caf/meta/type_name.hpp>

#include <botmesh/runtime/core/clock.hpp>
#include <botmesh/runtime/core/message.hpp>

namespace botmesh {

/// Default bound for embedding a saved answer in a checkpoint (16 KiB).
inline constexpr std::size_t default_max_answer_bytes = 16 * 1024;

/// The persisted position of a conversation flow in one chat.
///
/// Stores keep one per chat key. `revision` is assigned by the store on every
/// successful write and chains per key: it only grows, also across a clear,
/// so a writer that read revision N can be refused with compare-and-set
/// (`store::set_checkpoint_if`) once someone else wrote N+1.
struct flow_checkpoint {
  /// The chat key (see `chat_key`).
  std::string key{};
  /// Flow name and the step it is in.
  std::string flow{};
  std::string step{};
  /// True when the flow waits for an answer; `question` is then the index of
  /// the question inside the step that waits (0 = the step's first).
  bool waiting = false;
  std::uint32_t question = 0;
  /// The conversation state: one JSON document (an object by default).
  std::string state = "{}";
  /// Assigned by the store; 0 means "never written".
  std::uint64_t revision = 0;
  time_point created_at{};
  time_point updated_at{};
  /// Hash of the flow's structure, so a changed flow is not resumed blindly.
  std::string fingerprint{};
  /// Ephemeral checkpoints expire at `expires_at` (handover of non-persistent flows).
  bool ephemeral = false;
  time_point expires_at{};
  /// The answer the step already consumed when it was suspended, if any
  /// (embedded when it fits the answer bound).
  std::optional<inbound_message> saved_answer{};
  /// `<provider>#<delivery id>` of the message whose turn wrote this
  /// checkpoint: that message handled again (a journal record replayed)
  /// is in it already and answers nothing more. Empty when the message
  /// had no id.
  std::string answer_ref{};
  /// A waiting marker rather than a resumable position: a conversation that
  /// cannot be serialized (a coroutine, a state that is not plain JSON)
  /// waits in `flow`, so whoever takes the chat applies the handover
  /// fallback. `step` names the step; `state` is not meaningful.
  bool marker = false;

  friend bool operator==(const flow_checkpoint&,
                         const flow_checkpoint&) = default;
};

/// Current version of the checkpoint JSON encoding.
inline constexpr int checkpoint_encoding_version = 1;

/// Encodes a checkpoint as JSON (`{"v":1,...}`; `state` is embedded as a
/// JSON value, not a string; `"marker":true` is present only for markers, so
/// readers that predate it read every other checkpoint unchanged). Throws `invalid_argument_error` (field "state")
/// when `state` is not valid JSON, and (field "saved_answer") when the saved
/// answer encodes to more than `max_answer_bytes`.
std::string to_json(const flow_checkpoint& cp,
                    std::size_t max_answer_bytes = default_max_answer_bytes);

/// Decodes `to_json` output. Throws `botmesh::error` with
/// `errc::corrupted_record`, naming the field, for malformed JSON, a missing
/// or mistyped field, or an unknown encoding version.
flow_checkpoint checkpoint_from_json(std::string_view json);

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, flow_checkpoint& x) {
  auto created = to_unix_ms(x.created_at);
  auto updated = to_unix_ms(x.updated_at);
  auto expires = to_unix_ms(x.expires_at);
  bool has_answer = x.saved_answer.has_value();
  inbound_message answer = has_answer ? *x.saved_answer : inbound_message{};
  return detail::inspect_then(
    f,
    [&] {
      x.created_at = from_unix_ms(created);
      x.updated_at = from_unix_ms(updated);
      x.expires_at = from_unix_ms(expires);
      if (has_answer)
        x.saved_answer = std::move(answer);
      else
        x.saved_answer.reset();
    },
    caf::meta::type_name("botmesh.flow_checkpoint"), x.key, x.flow, x.step,
    x.waiting, x.question, x.state, x.revision, created, updated,
    x.fingerprint, x.ephemeral, expires, has_answer, answer, x.answer_ref,
    x.marker);
}

} // namespace botmesh
