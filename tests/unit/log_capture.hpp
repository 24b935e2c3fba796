#pragma once
// Captures the log records written while a `test::log_capture` lives.

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <botmesh/runtime/core/log.hpp>

namespace test {

struct captured {
  botmesh::log::level severity;
  std::string component, text, bot, chat, replica, message_id, code;
  std::uint64_t fence;
};

// Captures every record for the life of the object, then restores the
// default sink and level.
class log_capture {
 public:
  log_capture() {
    botmesh::log::set_sink([this](const botmesh::log::record& r) {
      std::lock_guard guard{mtx_};
      captured c{r.severity, std::string{r.component}, std::string{r.text},
                 {}, {}, {}, {}, {}, 0};
      if (r.f) {
        c.bot = r.f->bot;
        c.chat = r.f->chat;
        c.replica = r.f->replica;
        c.message_id = r.f->message_id;
        c.code = r.f->code;
        c.fence = r.f->fence;
      }
      all_.push_back(std::move(c));
    });
  }

  ~log_capture() {
    botmesh::log::set_sink({});
    botmesh::log::set_level(botmesh::log::level::warn);
    botmesh::log::set_log_text(false);
  }

  std::vector<captured> all() const {
    std::lock_guard guard{mtx_};
    return all_;
  }

  std::size_t count(std::string_view component, std::string_view needle) const {
    std::lock_guard guard{mtx_};
    std::size_t n = 0;
    for (auto& c : all_)
      if (c.component == component && c.text.find(needle) != std::string::npos)
        ++n;
    return n;
  }

 private:
  mutable std::mutex mtx_;
  std::vector<captured> all_;
};

} // namespace test
