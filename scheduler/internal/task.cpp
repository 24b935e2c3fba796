#include <botmesh/scheduler/internal/task.hpp>

#include <fmt/format.h>

namespace botmesh::internal {

std::string spec_of(const task& t) {
  switch (t.kind) {
    case task_kind::every:
      return fmt::format("every {}", t.interval.count());
    case task_kind::cron:
      return "cron " + t.cron->spec();
    case task_kind::delay:
      return fmt::format("delay {}", t.interval.count());
  }
  return {};
}

run_plan plan_claim(const task& t, const schedule_claim& c, time_point now,
                    std::chrono::milliseconds grace, std::size_t& skipped) {
  run_plan p;
  skipped = 0;
  auto slot = c.record.next_run_at;
  p.one_shot = t.kind == task_kind::delay;
  auto claimed = c.interrupted ? c.record.claimed_at : now;
  if (claimed - slot <= grace) {
    p.slots.push_back(slot);
    return p; // next decided at commit (depends on the policy and end time)
  }
  p.missed = true;
  switch (t.opts.missed) {
    case missed_policy::skip:
      break;
    case missed_policy::run_once:
      p.slots.push_back(slot);
      break;
    case missed_policy::catch_up:
      // Oldest first, up to max_catch_up; the rest are only counted,
      // arithmetically, so a record dated decades ago costs no walk.
      for (std::optional<time_point> s = slot; s && *s <= now;
           s = t.slot_after(*s)) {
        if (p.slots.size() < t.opts.max_catch_up) {
          p.slots.push_back(*s);
        } else if (t.kind == task_kind::every) {
          skipped = static_cast<std::size_t>((now - *s) / t.interval) + 1;
          break;
        } else if (t.kind == task_kind::cron) {
          // *s itself plus every run after it up to now.
          skipped = 1 + t.cron->count_between(*s, now);
          break;
        } else {
          ++skipped;
        }
      }
      break;
  }
  p.next_if_completed = t.first_slot_after(slot, now);
  return p;
}

} // namespace botmesh::internal
