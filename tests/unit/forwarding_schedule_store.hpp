#pragma once

// A schedule store that forwards every call to a memory store: tests derive
// from it and override only the calls they count, fail or hold back.

#include <botmesh/stores/memory_schedule_store.hpp>

namespace test {

class forwarding_schedule_store : public botmesh::schedule_store {
 public:
  botmesh::memory_schedule_store inner;

  std::optional<botmesh::schedule_record> get(std::string_view id) override {
    return inner.get(id);
  }
  botmesh::schedule_record register_task(std::string_view id,
                                         std::string_view spec,
                                         botmesh::time_point first_run,
                                         botmesh::time_point now) override {
    return inner.register_task(id, spec, first_run, now);
  }
  std::optional<botmesh::schedule_claim>
  claim(std::string_view id, std::string_view owner, botmesh::time_point now,
        std::chrono::milliseconds lease) override {
    return inner.claim(id, owner, now, lease);
  }
  bool renew(std::string_view id, std::string_view owner, std::uint64_t token,
             botmesh::time_point now, std::chrono::milliseconds lease) override {
    return inner.renew(id, owner, token, now, lease);
  }
  bool commit(std::string_view id, std::string_view owner, std::uint64_t token,
              botmesh::time_point next_run_at, bool done,
              botmesh::time_point now) override {
    return inner.commit(id, owner, token, next_run_at, done, now);
  }
  bool remove(std::string_view id, botmesh::time_point now) override {
    return inner.remove(id, now);
  }
  std::vector<botmesh::schedule_record> list() override {
    return inner.list();
  }
};

} // namespace test
