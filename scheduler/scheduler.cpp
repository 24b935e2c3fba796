#include <botmesh/scheduler/scheduler.hpp>
#include <botmesh/scheduler/internal/task.hpp>

namespace botmesh {

std::string_view to_string(missed_policy p) noexcept {
  switch (p) {
    case missed_policy::skip:
      return "skip";
    case missed_policy::run_once:
      return "run-once";
    case missed_policy::catch_up:
      return "catch-up";
  }
  return "skip";
}

namespace {

void append_escaped(std::string& out, std::string_view part) {
  for (char c : part) {
    if (c == '%')
      out += "%25";
    else if (c == ':')
      out += "%3A";
    else
      out += c;
  }
}

} // namespace

std::string task_namespace(std::string_view bot_id,
                           std::string_view provider_id,
                           std::string_view connection_id) {
  std::string out;
  append_escaped(out, bot_id);
  out += ':';
  append_escaped(out, provider_id);
  out += ':';
  append_escaped(out, connection_id);
  return out;
}

task_owner::~task_owner() {
  // nop
}

void scheduled_task::cancel() {
  if (!state_)
    return;
  state_->active = false;
  if (auto owner = state_->owner.lock())
    owner->cancel(state_);
}

const std::string& scheduled_task::id() const noexcept {
  static const std::string empty;
  return state_ && state_->named ? state_->named->id : empty;
}

const std::string& scheduled_task::time_zone() const noexcept {
  static const std::string empty;
  return state_ && state_->named ? state_->named->zone : empty;
}

bool scheduled_task::active() const noexcept {
  return state_ && state_->active.load();
}

} // namespace botmesh
