#include <botmesh/providers/telegram/telegram_webhook.hpp>

#include <atomic>
#include <deque>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include <botmesh/providers/http/signature.hpp>
#include <botmesh/providers/internal/host_slot.hpp>
#include <botmesh/providers/internal/recent_ids.hpp>
#include <botmesh/providers/telegram/bot_api.hpp>
#include <botmesh/providers/telegram/internal/callback_answers.hpp>
#include <botmesh/providers/telegram/internal/methods.hpp>
#include <botmesh/providers/telegram/internal/update_parser.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/internal/text.hpp>
#include <botmesh/runtime/core/json.hpp>
#include <botmesh/runtime/core/log.hpp>

namespace botmesh::telegram {

using steady = std::chrono::steady_clock;

namespace {

// A reply kept for a held response: the message (for the API, should the
// response not carry it) and the response's body, made once.
struct kept_reply {
  outgoing_message msg;
  std::string body;
};

// A webhook response held for the first reply of its update's turn.
struct held_answer {
  http::responder r;
  std::string key; // chat '\n' message id
  std::string chat;
  std::string callback_query_id; // under held_mtx once held
  steady::time_point deadline;
  bool watched = false; // under held_mtx
  /// Released (its response goes or went without a new reply; under
  /// held_mtx): a reply sent after that goes through the API.
  bool released = false;
  /// The reply the response will carry, kept until the turn ends (under
  /// held_mtx).
  std::optional<kept_reply> reply{};
};

// Telegram drops what it cannot run from a webhook response without a
// word (there is no answer to read): a reply goes there only when nothing
// knowable would fail it, a plain text of 1 to 4096 UTF-16 units with
// something besides white space (Telegram refuses an empty text, and one
// of spaces alone). Media (a URL Telegram cannot fetch, a file id of
// another type) go through the API, whose errors reach the handler.
bool fits_response(const outgoing_message& msg) {
  if (msg.format != text_format::plain || msg.has_media()
      || botmesh::internal::trim(msg.text).empty())
    return false;
  std::size_t units = 0;
  for (unsigned char c : msg.text)
    if ((c & 0xC0) != 0x80)
      units += c >= 0xF0 ? 2 : 1;
  return units <= 4096u;
}

std::string held_key(std::string_view chat, std::string_view id) {
  std::string k;
  k.reserve(chat.size() + id.size() + 1);
  k += chat;
  k.push_back('\n');
  k += id;
  return k;
}

} // namespace

struct webhook_provider::impl : std::enable_shared_from_this<impl> {
  webhook_options opts;
  std::shared_ptr<http::server> srv;
  bool own_server = false;
  std::unique_ptr<bot_api> api;
  http::flood_control flood;

  botmesh::internal::host_slot hosts;
  std::atomic<provider_state> st{provider_state::closed};

  // Update ids seen lately; a duplicate of one whose acceptance is not
  // known yet waits for it (its responder gets the original's answer).
  using ids_t = botmesh::internal::pending_ids<std::int64_t, http::responder>;
  ids_t seen;

  std::mutex held_mtx;
  std::unordered_map<std::string, std::shared_ptr<held_answer>> held;
  std::deque<std::weak_ptr<held_answer>> held_order;
  bool ticking = false; // under held_mtx
  // Per chat: the held answer that keeps a reply (under held_mtx).
  std::unordered_map<std::string, std::shared_ptr<held_answer>> replying;
  // Requested by stop(): cancels the waits of a reply sent on a thread of
  // its own (under held_mtx; made anew by start()).
  std::stop_source closing;

  internal::callback_answers open_callbacks;

  std::atomic<std::uint64_t> n_updates{0}, n_accepted{0}, n_unauthorized{0},
    n_malformed{0}, n_skipped{0}, n_unknown{0}, n_duplicates{0}, n_refused{0},
    n_in_webhook{0}, n_expired{0}, n_sent{0}, n_retried{0};

  explicit impl(webhook_options o)
    : opts(std::move(o)), flood(opts.flood), seen(opts.dedup_window) {
    // nop
  }

  // A stop answers the duplicates still waiting: Telegram retries.
  void answer_parked() {
    for (auto& r : seen.take_all())
      r.respond(503);
  }

  void on_request(http::request& req, http::responder r) {
    // A configured secret is always checked: allow_unauthenticated only
    // excuses its absence (a flag left on would otherwise let any POST
    // deliver a forged update).
    if (!opts.secret_token.empty() || !opts.allow_unauthenticated) {
      auto* secret = req.header("x-telegram-bot-api-secret-token");
      if (!secret || !http::constant_time_equals(*secret, opts.secret_token)) {
        ++n_unauthorized;
        r.respond(401);
        return;
      }
    }
    // Held until the update is delivered: stop() waits for it.
    botmesh::internal::host_slot::use h{hosts};
    if (!h) {
      r.respond(503);
      return;
    }
    internal::parsed_update u;
    try {
      u = internal::parse_update_in_place(req.body, opts.id, true, opts.username);
    } catch (const invalid_argument_error& e) {
      if (e.field() == "body" || e.field() == "update_id") { // no update
        ++n_malformed;
        r.respond({.status = 400, .body = e.what()});
        return;
      }
      // An update of a known kind missing what it needs (a message without
      // its chat): answered 200, named and counted, as getUpdates skips
      // one. Refused, Telegram would send it again and again, and hold the
      // updates after it back meanwhile.
      ++n_skipped;
      log::warn("telegram", fmt::format("{}: skipping a webhook update: {}",
                                        opts.id, e.what()));
      r.respond(200);
      return;
    }
    ++n_updates;
    if (u.kind == internal::update_kind::unknown) {
      ++n_unknown;
      r.respond(200);
      return;
    }
    switch (seen.admit(u.update_id, r)) {
      case ids_t::admission::fresh:
        break;
      case ids_t::admission::parked:
        ++n_duplicates;
        return; // answered with the original
      case ids_t::admission::duplicate:
        ++n_duplicates;
        r.respond(200);
        return;
    }
    auto uid = u.update_id;
    try {
      deliver(std::move(u), std::move(r), *h.get());
    } catch (...) {
      // Not handed over: taken as new when Telegram retries.
      for (auto& d : seen.decided(uid, true))
        d.respond(503);
      throw;
    }
  }

  // Acceptance answered at once (no reply in the webhook).
  // Its parked duplicates get the same answer.
  void answer_acceptance(errc code, const http::responder& r,
                         std::int64_t update_id) {
    // Forgotten when refused for a retry, so Telegram's retry is taken.
    auto dups = seen.decided(update_id, code != errc::none && retry_later(code));
    int status = 200;
    if (code == errc::none) {
      ++n_accepted;
    } else if (retry_later(code)) {
      ++n_refused;
      status = 503;
    } else {
      ++n_refused; // over our limits: a retry would not help
    }
    r.respond(status);
    for (auto& d : dups)
      d.respond(status);
  }

  void deliver(internal::parsed_update u, http::responder r, provider_host& h) {
    auto self = shared_from_this();
    auto uid = u.update_id;
    delivery_callbacks cb;
    if (!opts.reply_in_webhook) {
      if (!u.callback_query_id.empty() && opts.answer_callback_queries) {
        open_callbacks.open(u.callback_query_id);
        cb.turn_ended = [self, id = u.callback_query_id](turn_outcome o) {
          self->open_callbacks.ended(*self->api, id, o);
        };
      }
      cb.accepted = [self, r = std::move(r), uid,
                     cq = cb.turn_ended ? u.callback_query_id : std::string{}](
                      errc code) {
        if (code != errc::none && !cq.empty())
          self->open_callbacks.refused(cq);
        self->answer_acceptance(code, r, uid);
      };
    } else {
      auto p = std::make_shared<held_answer>(held_answer{
        std::move(r), held_key(u.message.chat, u.message.id), u.message.chat,
        u.callback_query_id, steady::now() + opts.reply_wait.ms()});
      cb.accepted = [self, p, uid](errc code) {
        if (code == errc::none) {
          ++self->n_accepted;
          for (auto& d : self->seen.decided(uid, false))
            d.respond(200); // the reply goes in the original's answer
          self->hold(p);
        } else {
          self->answer_acceptance(code, p->r, uid);
        }
      };
      cb.turn_ended = [self, p](turn_outcome) { self->release(p, false); };
    }
    h.deliver(std::move(u.message), std::move(cb));
  }

  void hold(const std::shared_ptr<held_answer>& p) {
    bool start_tick = false;
    {
      std::lock_guard guard{held_mtx};
      if (!held.emplace(p->key, p).second) {
        // An edit of a message whose update is still held: answer it now;
        // its replies go through the API.
        p->r.respond(200);
        return;
      }
      held_order.push_back(p);
      if (!ticking) {
        ticking = true;
        start_tick = true;
      }
    }
    if (start_tick)
      schedule_tick();
  }

  // The held answer goes back with the reply it keeps, if any; else empty
  // (or answering the callback query). Called at the turn's end (on its
  // handler's thread: a turn that sent ran one), past `reply_wait`
  // (`expired`, on the server's thread) and by stop().
  void release(const std::shared_ptr<held_answer>& p, bool expired) {
    std::optional<kept_reply> reply;
    std::string callback;
    std::stop_token closed;
    {
      std::lock_guard guard{held_mtx};
      auto i = held.find(p->key);
      if (i != held.end() && i->second == p)
        held.erase(i);
      p->released = true;
      reply = take_reply(p);
      callback = p->callback_query_id;
      closed = closing.get_token();
    }
    if (reply) {
      if (!p->r.answered()
          && p->r.respond({.status = 200,
                           .body = std::move(reply->body),
                           .content_type = "application/json"})) {
        ++n_in_webhook;
        if (expired)
          ++n_expired;
        return;
      }
      // Telegram closed the request: the reply goes through the API, on
      // a thread of its own when this is the server's (rare: Telegram waits
      // far longer than reply_wait); the provider's stop cancels its waits.
      if (!expired) {
        send_kept(reply->msg, {});
        return;
      }
      try {
        std::thread{[self = shared_from_this(), m = std::move(reply->msg),
                     closed] { self->send_kept(m, closed); }}
          .detach();
      } catch (const std::exception& e) {
        log::error("telegram",
                   fmt::format("{}: the reply to message {} of chat {} could "
                               "not be sent: no thread for it ({})",
                               opts.id, reply->msg.reply_to, reply->msg.chat,
                               e.what()));
      }
      return;
    }
    if (p->r.answered())
      return;
    http::response res;
    if (!callback.empty() && opts.answer_callback_queries) {
      res.content_type = "application/json";
      res.body = "{\"method\":\"answerCallbackQuery\",\"callback_query_id\":";
      append_json_string(res.body, callback);
      res.body.push_back('}');
    }
    if (p->r.respond(std::move(res)) && expired)
      ++n_expired;
  }

  // The reply `p` keeps, taken (under held_mtx).
  std::optional<kept_reply> take_reply(const std::shared_ptr<held_answer>& p) {
    std::optional<kept_reply> out;
    out.swap(p->reply);
    if (auto i = replying.find(p->chat); i != replying.end() && i->second == p)
      replying.erase(i);
    return out;
  }

  // Keeps `msg` (with `body`, its response's body) for the response of
  // `p`, and takes the callback query id the response no longer answers
  // (into `callback`): false when that response was released already
  // (reply_wait passed, or the provider stops), so `msg` goes through the
  // API.
  bool keep(const std::shared_ptr<held_answer>& p, const outgoing_message& msg,
            std::string& body, std::string& callback) {
    std::lock_guard guard{held_mtx};
    if (p->released || p->r.answered())
      return false;
    p->reply = kept_reply{msg, std::move(body)};
    replying[p->chat] = p;
    callback.swap(p->callback_query_id);
    return true;
  }

  // Sends through the API the reply a held answer of `chat` keeps, if any:
  // Telegram runs a response's method once it has read the response, so
  // a send of the chat through the API could overtake it. That held
  // answer goes back without it.
  void flush_kept(const std::string& chat) {
    std::shared_ptr<held_answer> p;
    std::optional<kept_reply> reply;
    {
      std::lock_guard guard{held_mtx};
      auto i = replying.find(chat);
      if (i == replying.end())
        return;
      p = i->second;
      reply = take_reply(p);
    }
    release(p, false);
    // Its handler was told it went: a failure is logged, and the send
    // that flushed it goes on (not cancelled with it either).
    if (reply)
      send_kept(reply->msg, {});
  }

  void send_api(const outgoing_message& msg, std::stop_token cancel) {
    auto to = internal::split_chat(msg.chat);
    std::stop_token stopping;
    if (botmesh::internal::host_slot::use h{hosts}; h)
      stopping = h->stopping();
    // Until it is written, the request gives up with the wait.
    http::send_with_retry(
      flood, to.chat_id, to.group(),
      [&](std::stop_token given_up) {
        try {
          api->send(msg, std::move(given_up));
        } catch (const platform_error& e) {
          if (e.code() == errc::retry_after)
            ++n_retried;
          throw;
        }
      },
      stopping, cancel);
    ++n_sent;
  }

  // A kept reply the response could not carry: the handler that sent it
  // was told it went, so a failure here is logged, naming it.
  void send_kept(const outgoing_message& msg, std::stop_token cancel) {
    try {
      send_api(msg, cancel);
    } catch (const std::exception& e) {
      log::error("telegram",
                 fmt::format("{}: the reply to message {} of chat {}, kept for "
                             "the webhook's response, could not be sent: {}",
                             opts.id, msg.reply_to, msg.chat, e.what()));
    }
  }

  std::chrono::milliseconds tick_period() const {
    return std::max(std::chrono::milliseconds{5}, opts.reply_wait.ms() / 4);
  }

  void schedule_tick() {
    std::weak_ptr<impl> weak = shared_from_this();
    srv->after(tick_period(), [weak] {
      if (auto self = weak.lock())
        self->tick();
    });
  }

  void tick() {
    std::vector<std::shared_ptr<held_answer>> expired;
    bool again;
    {
      std::lock_guard guard{held_mtx};
      auto now = steady::now();
      while (!held_order.empty()) {
        auto p = held_order.front().lock();
        if (p && !p->r.answered() && p->deadline > now)
          break;
        held_order.pop_front();
        if (p && !p->r.answered())
          expired.push_back(std::move(p));
      }
      // Held past a tick: should Telegram give up on the request (it
      // closes the connection), the reply goes through the API instead of
      // into the closed connection. Watched only from here, since most
      // replies come well within a tick, and a watch costs each request
      // a readiness wait on its socket.
      auto period = tick_period();
      for (auto& w : held_order)
        if (auto p = w.lock(); p && !p->watched && !p->r.answered()
                               && now - (p->deadline - opts.reply_wait.ms())
                                    >= period) {
          p->watched = true;
          p->r.watch_peer();
        }
      again = !held_order.empty();
      ticking = again;
    }
    for (auto& p : expired)
      release(p, true);
    if (again)
      schedule_tick();
  }

  // The held answer for (chat, inbound id), taken so no one else uses it.
  std::shared_ptr<held_answer> take_held(const outgoing_message& msg) {
    std::lock_guard guard{held_mtx};
    auto i = held.find(held_key(msg.chat, msg.reply_to));
    if (i == held.end())
      return nullptr;
    auto p = std::move(i->second);
    held.erase(i);
    return p;
  }
};

webhook_provider::webhook_provider(webhook_options opts) {
  if (opts.token.empty())
    throw invalid_argument_error("token", "telegram webhook: token is required");
  if (opts.secret_token.empty() && !opts.allow_unauthenticated)
    throw invalid_argument_error(
      "secret_token", "telegram webhook: secret_token is required (or set "
                      "allow_unauthenticated for a trusted network)");
  if (opts.path.empty() || opts.path.front() != '/')
    throw invalid_argument_error("path",
                                 "telegram webhook: path must start with '/'");
  try {
    http::parse_url(opts.api_url);
  } catch (const invalid_argument_error& e) {
    throw invalid_argument_error("api_url", e.what());
  }
  impl_ = std::make_shared<impl>(std::move(opts));
  auto& i = *impl_;
  i.api = std::make_unique<bot_api>(
    bot_api_options{i.opts.token, i.opts.api_url, i.opts.http});
  if (i.opts.server) {
    i.srv = i.opts.server;
  } else {
    i.srv = std::make_shared<http::server>(i.opts.listen);
    i.own_server = true;
  }
  std::weak_ptr<impl> weak = impl_;
  i.srv->route("POST", i.opts.path, [weak](http::request& req, http::responder r) {
    if (auto self = weak.lock())
      self->on_request(req, std::move(r));
    else
      r.respond(503);
  });
}

webhook_provider::~webhook_provider() {
  stop();
  impl_->srv->remove_route("POST", impl_->opts.path);
}

std::string webhook_provider::id() const {
  return impl_->opts.id;
}

std::string webhook_provider::connection_id() const {
  return internal::bot_id(impl_->opts.token);
}

provider_state webhook_provider::state() const {
  return impl_->st.load();
}

void webhook_provider::start(provider_host& host) {
  auto& i = *impl_;
  {
    std::lock_guard guard{i.held_mtx};
    i.closing = std::stop_source{};
    // A stop of its own server dropped the pending tick with the server's
    // timers (on a shared server it is still pending, and goes on).
    if (i.own_server)
      i.ticking = false;
  }
  i.hosts.set(host);
  if (i.own_server)
    i.srv->start();
  i.st = provider_state::open;
  host.state_changed(provider_state::open);
}

void webhook_provider::stop() {
  auto& i = *impl_;
  // Also waits for the requests still delivering to the host.
  auto* h = i.hosts.clear();
  if (!h)
    return;
  i.st = provider_state::closed;
  {
    std::lock_guard guard{i.held_mtx};
    i.closing.request_stop();
  }
  // Whatever is still held was accepted: answer it.
  std::vector<std::shared_ptr<held_answer>> rest;
  {
    std::lock_guard guard{i.held_mtx};
    for (auto& [k, p] : i.held)
      rest.push_back(p);
    for (auto& [chat, p] : i.replying)
      rest.push_back(p);
  }
  for (auto& p : rest)
    i.release(p, false);
  i.answer_parked();
  if (i.own_server)
    i.srv->stop();
  h->state_changed(provider_state::closed);
}

void webhook_provider::send(const outgoing_message& msg,
                            std::stop_token cancel) {
  auto& i = *impl_;
  if (i.st.load() != provider_state::open)
    throw error(errc::provider_error,
                fmt::format("telegram {}: send to {} while the transport is "
                            "closed",
                            i.opts.id, msg.chat));
  if (i.opts.reply_in_webhook) {
    i.flush_kept(msg.chat);
    if (!msg.reply_to.empty() && fits_response(msg)) {
      auto to = internal::split_chat(msg.chat);
      // Validates first; made once, here, not on the server's thread.
      auto body = internal::to_webhook_answer(internal::to_method_call(msg));
      if (auto p = i.take_held(msg)) {
        // A reply in the answer counts against the platform's limits like
        // any other: when the buckets say wait, the held update is
        // released (answered as without a reply) and the reply goes
        // through the API, which waits for them.
        if (!i.flood.try_acquire(to.chat_id, to.group())) {
          i.release(p, false);
        } else if (std::string callback; i.keep(p, msg, body, callback)) {
          // The response carries one method, the reply: a pressed
          // button's answer goes through the API.
          if (!callback.empty() && i.opts.answer_callback_queries)
            internal::callback_answers::answer(*i.api, callback);
          return;
        }
      }
    }
  }
  i.send_api(msg, cancel);
  if (!msg.reply_to.empty() && i.opts.answer_callback_queries)
    i.open_callbacks.replied(*i.api, msg.reply_to);
}

http::server& webhook_provider::server() noexcept {
  return *impl_->srv;
}

webhook_stats webhook_provider::stats() const {
  auto& i = *impl_;
  return webhook_stats{i.n_updates,  i.n_accepted,   i.n_unauthorized,
                       i.n_malformed, i.n_unknown,   i.n_duplicates,
                       i.n_refused,  i.n_in_webhook, i.n_expired,
                       i.n_sent,     i.n_retried,    i.n_skipped};
}

} // namespace botmesh::telegram
