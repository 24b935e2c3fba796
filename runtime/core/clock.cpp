#include <botmesh/runtime/core/clock.hpp>

namespace botmesh {

clock::~clock() {
  // nop
}

namespace {

class system_clock_source final : public clock {
 public:
  time_point now() const override {
    return std::chrono::time_point_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now());
  }
};

} // namespace

const clock& clock::system() {
  static system_clock_source instance;
  return instance;
}

manual_clock::manual_clock(time_point start) : ms_(to_unix_ms(start)) {
  // nop
}

time_point manual_clock::now() const {
  return from_unix_ms(ms_.load());
}

void manual_clock::set(time_point t) {
  ms_.store(to_unix_ms(t));
}

void manual_clock::advance(std::chrono::milliseconds d) {
  ms_.fetch_add(d.count());
}

} // namespace botmesh
