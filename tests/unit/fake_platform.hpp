#pragma once

// Fake platform APIs on loopback for provider tests: every call captured
// with its body, scripted failures (429, 403, 409, silence).

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <botmesh/providers/http/http_client.hpp>
#include <botmesh/providers/http/http_server.hpp>

namespace test {

struct api_call {
  std::string method; ///< last path segment ("sendMessage", "messages")
  std::string body;
};

/// A fake HTTP API: routes POST <prefix><method> for the given methods and
/// answers `ok_body` unless a scripted answer is queued for the method.
class fake_api {
 public:
  fake_api(std::string prefix, std::vector<std::string> methods,
           std::string ok_body)
    : prefix_(std::move(prefix)), ok_body_(std::move(ok_body)) {
    for (auto& m : methods)
      srv_.route("POST", prefix_ + m,
                 [this, m](botmesh::http::request& req, botmesh::http::responder r) {
                   on_call(m, req, std::move(r));
                 });
    srv_.start();
  }

  ~fake_api() {
    release_held();
    srv_.stop();
  }

  std::string url() const {
    return srv_.url();
  }

  botmesh::http::server& server() {
    return srv_;
  }

  /// The next call of `method` gets this answer instead of `ok_body`.
  void script(const std::string& method, int status, std::string body) {
    std::lock_guard guard{mtx_};
    scripted_[method].push_back({status, std::move(body)});
  }

  /// Calls of `method` are never answered (until the fake is destroyed).
  void silence(const std::string& method) {
    std::lock_guard guard{mtx_};
    silent_.push_back(method);
  }

  /// A custom handler for `method` (called under no lock).
  void on(const std::string& method,
          std::function<void(const std::string& body, botmesh::http::responder)> fn) {
    std::lock_guard guard{mtx_};
    custom_[method] = std::move(fn);
  }

  std::vector<api_call> calls() const {
    std::lock_guard guard{mtx_};
    return calls_;
  }

  std::vector<api_call> calls(const std::string& method) const {
    std::lock_guard guard{mtx_};
    std::vector<api_call> out;
    for (auto& c : calls_)
      if (c.method == method)
        out.push_back(c);
    return out;
  }

  bool wait_for_calls(const std::string& method, std::size_t n,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock guard{mtx_};
    return cv_.wait_for(guard, timeout, [&] {
      std::size_t k = 0;
      for (auto& c : calls_)
        k += c.method == method;
      return k >= n;
    });
  }

  void release_held() {
    std::vector<botmesh::http::responder> held;
    {
      std::lock_guard guard{mtx_};
      held.swap(held_);
    }
    for (auto& r : held)
      r.respond(503);
  }

 private:
  void on_call(const std::string& method, botmesh::http::request& req,
               botmesh::http::responder r) {
    std::function<void(const std::string&, botmesh::http::responder)> custom;
    std::pair<int, std::string> answer{200, ok_body_};
    bool silent = false;
    {
      std::lock_guard guard{mtx_};
      calls_.push_back({method, req.body});
      cv_.notify_all();
      if (auto c = custom_.find(method); c != custom_.end())
        custom = c->second;
      for (auto& s : silent_)
        silent |= s == method;
      if (silent) {
        held_.push_back(r);
        return;
      }
      if (auto s = scripted_.find(method); s != scripted_.end() && !s->second.empty()) {
        answer = s->second.front();
        s->second.pop_front();
        custom = nullptr;
      }
    }
    if (custom) {
      custom(req.body, std::move(r));
      return;
    }
    r.respond({.status = answer.first, .body = answer.second,
               .content_type = "application/json"});
  }

  botmesh::http::server srv_;
  std::string prefix_;
  std::string ok_body_;
  mutable std::mutex mtx_;
  std::condition_variable cv_;
  std::vector<api_call> calls_;
  std::map<std::string, std::deque<std::pair<int, std::string>>> scripted_;
  std::map<std::string,
           std::function<void(const std::string&, botmesh::http::responder)>>
    custom_;
  std::vector<std::string> silent_;
  std::vector<botmesh::http::responder> held_;
};

/// A fake Telegram Bot API for token "123:abc" (or `token`).
inline constexpr const char* telegram_token = "123:abc";

inline std::unique_ptr<fake_api> fake_telegram(
  const std::string& token = telegram_token) {
  return std::make_unique<fake_api>(
    "/bot" + token + "/",
    std::vector<std::string>{"sendMessage", "sendPhoto", "sendDocument",
                             "answerCallbackQuery", "getUpdates", "setWebhook",
                             "deleteWebhook", "getWebhookInfo"},
    R"({"ok":true,"result":{"message_id":1}})");
}

/// A Telegram text update.
inline std::string tg_text_update(std::int64_t update_id, std::int64_t chat,
                                  const std::string& text,
                                  std::int64_t message_id = 0) {
  return "{\"update_id\":" + std::to_string(update_id)
         + ",\"message\":{\"message_id\":"
         + std::to_string(message_id ? message_id : update_id)
         + ",\"from\":{\"id\":" + std::to_string(chat)
         + ",\"is_bot\":false,\"first_name\":\"Ana\"},\"chat\":{\"id\":"
         + std::to_string(chat)
         + ",\"type\":\"private\"},\"date\":1700000000,\"text\":\"" + text
         + "\"}}";
}

} // namespace test
