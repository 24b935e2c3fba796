// Stored schedule records as a store hands them back after damage (any
// next_run_at / claimed_at), planned by the scheduler for a claim:
// internal::plan_claim with every missed-run policy, for interval and cron
// tasks.
//
// Input: consumed with FuzzedDataProvider (binary; the seeds were written
// the same way).
//
// Contract checked: a record out of range is a corrupted record (as the
// stores report it) and is never planned; otherwise no UB or overflow,
// also for a cron catch-up from decades ago (counted, not walked); planned slots start at the stored
// slot, strictly increase, and stay within max_catch_up (at least one); a
// missed claim's next slot lies after the claim's time.
// fuzz-ctest: -timeout=5

#include <fuzzer/FuzzedDataProvider.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/scheduler/internal/task.hpp>
#include <botmesh/stores/internal/schedule_transitions.hpp>

#include "fuzz_check.hpp"

namespace {

using namespace std::chrono;
using botmesh::time_point;

constexpr std::array<const char*, 4> crons{"* * * * *", "0 9 * * 1-5",
                                           "*/15 * * * *", "0 0 29 2 *"};

time_point at(std::int64_t ms) {
  return time_point{milliseconds{ms}};
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  FuzzedDataProvider in{data, size};
  botmesh::internal::task t;
  auto kind = in.ConsumeIntegralInRange<int>(0, 2);
  t.kind = static_cast<botmesh::internal::task_kind>(kind);
  // Task definitions are validated when registered: a positive interval.
  t.interval = milliseconds{
    in.ConsumeIntegralInRange<std::int64_t>(1, 10LL * 366 * 86'400'000)};
  auto now_ms = in.ConsumeIntegralInRange<std::int64_t>(
    946'684'800'000, 4'102'444'800'000); // 2000 to 2100
  if (t.kind == botmesh::internal::task_kind::cron) {
    try {
      t.cron.emplace(crons[in.ConsumeIntegralInRange<std::size_t>(0, 3)],
                     "UTC", at(now_ms));
    } catch (const botmesh::invalid_argument_error&) {
      return 0; // an expression rejected at `now`
    }
  }
  t.opts.missed = static_cast<botmesh::missed_policy>(
    in.ConsumeIntegralInRange<int>(0, 2));
  t.opts.max_catch_up = in.ConsumeIntegralInRange<std::size_t>(0, 100);
  auto grace = milliseconds{in.ConsumeIntegralInRange<std::int64_t>(0, 3'600'000)};
  botmesh::schedule_claim c;
  c.interrupted = in.ConsumeBool();
  auto slot_ms = in.ConsumeIntegral<std::int64_t>();
  auto claimed_ms = in.ConsumeIntegral<std::int64_t>();
  c.record.next_run_at = at(slot_ms);
  c.record.claimed_at = at(claimed_ms);
  // The stores refuse records with a time outside years 1-9999 as
  // corrupted (issue 11 item 5): such a record never reaches planning.
  try {
    botmesh::internal::check_record_times(c.record, "fuzz");
  } catch (const botmesh::error& e) {
    FUZZ_CHECK(e.code() == botmesh::errc::corrupted_record, e.what());
    return 0;
  }

  std::size_t skipped = 0;
  auto p = botmesh::internal::plan_claim(t, c, at(now_ms), grace, skipped);
  auto what = "slot " + std::to_string(slot_ms) + " now "
              + std::to_string(now_ms);
  if (!p.missed) {
    FUZZ_CHECK(p.slots.size() == 1 && p.slots[0] == at(slot_ms), what);
    return 0;
  }
  FUZZ_CHECK(p.slots.size() <= std::max<std::size_t>(1, t.opts.max_catch_up),
             what);
  if (!p.slots.empty())
    FUZZ_CHECK(p.slots[0] == at(slot_ms), what);
  for (std::size_t i = 1; i < p.slots.size(); ++i)
    FUZZ_CHECK(p.slots[i] > p.slots[i - 1], what);
  if (p.next_if_completed)
    FUZZ_CHECK(*p.next_if_completed > at(now_ms), what);
  return 0;
}
