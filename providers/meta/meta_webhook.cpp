#include <botmesh/providers/meta/meta_webhook.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

#include <botmesh/providers/http/signature.hpp>
#include <botmesh/providers/internal/host_slot.hpp>
#include <botmesh/providers/internal/recent_ids.hpp>
#include <botmesh/providers/meta/internal/payload.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/internal/delivery_id.hpp>
#include <botmesh/runtime/core/internal/text.hpp>
#include <botmesh/runtime/core/log.hpp>

namespace botmesh::meta {

namespace {

// The answer to one POST: 200 once every message was accepted, 503 when
// one was refused for a reason a retry may overcome (the bot is stopping,
// the inbound journal failed). It starts with one pending part, the POST's
// own handling, so it cannot answer before every message was handed over.
struct payload_answer {
  http::responder r;
  std::atomic<std::size_t> pending{1};
  std::atomic<bool> retry{false};

  explicit payload_answer(http::responder resp) : r(std::move(resp)) {
    // nop
  }

  void one_done() {
    if (--pending == 0)
      r.respond(retry ? 503 : 200);
  }
};

} // namespace

struct webhook_provider::impl : std::enable_shared_from_this<impl> {
  webhook_options opts;
  std::shared_ptr<http::server> srv;
  bool own_server = false;
  http::client api;
  http::flood_control flood;
  std::string auth;

  botmesh::internal::host_slot hosts;
  std::atomic<provider_state> st{provider_state::closed};

  // Message and status ids seen lately; a POST that brings a message whose
  // acceptance is not known yet waits for it.
  using ids_t =
    botmesh::internal::pending_ids<std::string, std::shared_ptr<payload_answer>>;
  ids_t seen;

  std::atomic<std::uint64_t> n_payloads{0}, n_messages{0}, n_accepted{0},
    n_statuses{0}, n_unauthorized{0}, n_malformed{0}, n_unknown{0},
    n_duplicates{0}, n_verifications{0}, n_sent{0}, n_retried{0},
    n_platform_errors{0};
  // When a refused signature was last logged (steady clock).
  std::atomic<std::chrono::steady_clock::rep> last_unauthorized_log{
    std::numeric_limits<std::chrono::steady_clock::rep>::min() / 2};

  explicit impl(webhook_options o)
    : opts(std::move(o)), api(opts.http), flood(opts.flood),
      seen(opts.dedup_window) {
    auth = "Bearer " + opts.access_token;
  }

  bool remember(const std::string& id) {
    return id.empty() || seen.remember(id);
  }

  // Remembers message `id`; false for a duplicate, whose `answer` then
  // waits for the original when that is still pending (counted first: the
  // original may be decided at once, and the POST's own part keeps the
  // count above zero meanwhile).
  ids_t::admission admit(const std::string& id,
                         const std::shared_ptr<payload_answer>& answer) {
    if (id.empty())
      return ids_t::admission::fresh;
    ++answer->pending;
    auto w = answer;
    auto a = seen.admit(id, w);
    if (a != ids_t::admission::parked)
      --answer->pending;
    return a;
  }

  // Message `id`'s acceptance is known: the answers waiting for it get its
  // outcome (`again`: refused for a retry, and forgotten).
  void decided(const std::string& id, bool again) {
    for (auto& w : seen.decided(id, again)) {
      if (again)
        w->retry = true;
      w->one_done();
    }
  }

  // A stop answers the waiting ones 503: Meta redelivers.
  void answer_parked() {
    for (auto& w : seen.take_all()) {
      w->retry = true;
      w->one_done();
    }
  }

  void on_verify(http::request& req, http::responder r) {
    auto mode = req.query_param("hub.mode");
    auto token = req.query_param("hub.verify_token");
    auto challenge = req.query_param("hub.challenge");
    if (mode && *mode == "subscribe" && token && challenge
        && http::constant_time_equals(*token, opts.verify_token)) {
      ++n_verifications;
      r.respond({.status = 200, .body = *challenge});
      return;
    }
    r.respond(403);
  }

  // Why a POST's signature is refused; empty when it is right.
  std::string_view signature_problem(const http::request& req) const {
    auto* sig = req.header("x-hub-signature-256");
    if (!sig)
      return "no X-Hub-Signature-256 header";
    return http::hub_signature_problem(*sig, opts.app_secret, req.body);
  }

  void on_post(http::request& req, http::responder r) {
    // A configured secret is always checked: allow_unauthenticated only
    // excuses its absence (a flag left on would otherwise let any POST
    // deliver a forged message).
    if (!opts.app_secret.empty() || !opts.allow_unauthenticated) {
      if (auto why = signature_problem(req); !why.empty()) {
        ++n_unauthorized;
        // Said once a minute at most: a rotated secret refuses every POST.
        auto now = std::chrono::steady_clock::now().time_since_epoch().count();
        auto last = last_unauthorized_log.load();
        if (now - last >= std::chrono::nanoseconds{std::chrono::minutes{1}}.count()
            && last_unauthorized_log.compare_exchange_strong(last, now))
          log::warn(opts.id, fmt::format("{}: refusing a webhook POST: {} ({} "
                                         "refused so far)",
                                         opts.id, why, n_unauthorized.load()));
        r.respond({.status = 401, .body = std::string{why}});
        return;
      }
    }
    if (!botmesh::internal::host_slot::use{hosts}) {
      r.respond(503); // stopped
      return;
    }
    internal::parsed_payload p;
    try {
      p = internal::parse_payload_in_place(req.body, opts.kind, opts.id);
    } catch (const invalid_argument_error& e) {
      ++n_malformed;
      r.respond({.status = 400, .body = e.what()});
      return;
    }
    ++n_payloads;
    n_unknown += p.unknown;
    n_platform_errors += p.errors.size();
    for (auto& e : p.errors)
      log::error(opts.id, fmt::format("{}: the webhook reports an error: {}",
                                      opts.id, e));
    n_statuses += p.statuses.size();
    for (auto& s : p.statuses) {
      if (!opts.on_status && s.status != "failed")
        continue;
      // Meta redelivers a whole POST when it is not answered 200 (and
      // this one may be, for its messages): each status is reported once.
      if (!remember(fmt::format("status:{}:{}:{}:{}", s.message_id,
                                s.recipient, s.status, to_unix_ms(s.at)))) {
        ++n_duplicates;
        continue;
      }
      if (!opts.on_status) {
        // A reply the platform did not deliver (outside the 24-hour
        // window, a blocked number...): with no listener, logged, so it
        // is not lost unsaid.
        log::warn(opts.id, fmt::format("{}: message {} to {} was not delivered: "
                                       "{}",
                                       opts.id, s.message_id, s.recipient,
                                       s.error.empty() ? "no reason given"
                                                       : s.error));
        continue;
      }
      try {
        opts.on_status(s);
      } catch (const std::exception&) {
        // nop: a listener's failure is not the platform's
      }
    }
    // Held while the messages are delivered: stop() waits for it (taken
    // after the status listener, user code that may stop the bot).
    botmesh::internal::host_slot::use h{hosts};
    if (!h) {
      r.respond(503);
      return;
    }
    // Each id is remembered as its message is handed over, so when handing
    // one over fails, the ones after it were never remembered and Meta's
    // retry brings them again.
    auto answer = std::make_shared<payload_answer>(std::move(r));
    // A chat's messages of this POST are handed over one after the other,
    // each once the one before was accepted: one refused for a retry (its
    // journal write failed) must not let the next one run first. The ones
    // after it are forgotten with it, and Meta's retry brings them again,
    // in order.
    std::unordered_map<std::string, std::shared_ptr<chat_chain>> chains;
    std::unordered_set<std::string> own; // the ids this POST admitted
    for (std::size_t i = 0; i < p.messages.size(); ++i) {
      auto& msg = p.messages[i];
      // The chat names the number it came to unless that is the
      // configured one: any replica, at any later time, replies from the
      // right number.
      if (auto& phone = p.phone_number_ids[i];
          !phone.empty() && phone != opts.phone_number_id) {
        msg.chat += '@';
        msg.chat += phone;
      }
      auto& chain = chains[msg.chat];
      if (!chain)
        chain = std::make_shared<chat_chain>();
      auto id = botmesh::internal::delivery_id(msg);
      auto a = admit(id, answer);
      if (a != ids_t::admission::fresh) {
        ++n_duplicates;
        // Still pending from an earlier POST (whose answer Meta gave up
        // on): the chat's later messages here must not run before it.
        // They are forgotten, and this POST's retry brings them again.
        // (A copy of one of this POST's own, which its chain hands over
        // in order, only waits for it.)
        if (a == ids_t::admission::parked && !own.contains(id)) {
          std::lock_guard guard{chain->mtx};
          chain->failed = true;
        }
        continue;
      }
      if (!id.empty())
        own.insert(id);
      ++n_messages;
      ++answer->pending;
      {
        std::lock_guard guard{chain->mtx};
        if (chain->failed) { // (one before was refused, or is pending)
          forget(id, *answer);
          continue;
        }
        if (chain->busy) {
          chain->queued.push_back({std::move(msg), std::move(id)});
          continue;
        }
        chain->busy = true;
      }
      hand_over(chain, std::move(msg), std::move(id), answer);
    }
    answer->one_done(); // the POST's own part
  }

  // Messages of one chat within one POST, handed over in order.
  struct queued_message {
    inbound_message msg;
    std::string id;
  };
  struct chat_chain {
    std::mutex mtx;
    bool busy = false;   // one is being handed over or awaits acceptance
    bool failed = false; // one was refused for a retry: the rest is forgotten
    std::deque<queued_message> queued;
  };

  // Message `id` is not taken: forgotten (Meta's retry brings it again) and
  // its part of the answer done, which asks for that retry.
  void forget(const std::string& id, payload_answer& answer) {
    answer.retry = true;
    decided(id, true);
    answer.one_done();
  }

  // A chain being handed over on this thread: an acceptance of its
  // message reported on this same thread, from inside `deliver` (a bot
  // that accepts at once), marks the next one due here instead of handing
  // it over from within the report: one message after the other on the
  // stack would overflow it for a POST of thousands of one chat's.
  struct pump {
    const chat_chain* chain;
    bool due = false;
    bool failed = false;
  };
  static inline thread_local pump* pumping = nullptr;

  // Hands `msg` over, and then each next message of the chat accepted
  // meanwhile on this thread; an acceptance reported later (on a store's
  // thread) hands the next one over there (next_of). Once the provider
  // stops, the message and the rest of its chat are forgotten. A `deliver`
  // that throws is logged and taken as a refusal for a retry: it and the
  // rest of its chat are forgotten, and the POST is answered 503 once its
  // other messages are decided (an answer now would have Meta retry while
  // they are still pending).
  void hand_over(const std::shared_ptr<chat_chain>& chain, inbound_message msg,
                 std::string id, const std::shared_ptr<payload_answer>& answer) {
    pump me{chain.get()};
    auto* outer = std::exchange(pumping, &me);
    struct restore {
      pump* outer;
      ~restore() {
        pumping = outer;
      }
    } back{outer};
    for (;;) {
      botmesh::internal::host_slot::use h{hosts};
      if (!h) { // stopped meanwhile
        forget(id, *answer);
        take_next(chain, true, *answer); // (forgets the rest)
        return;
      }
      me.due = false;
      hand_over_one(*h.get(), chain, std::move(msg), std::move(id), answer);
      if (!me.due)
        return;
      auto next = take_next(chain, me.failed, *answer);
      if (!next)
        return;
      msg = std::move(next->msg);
      id = std::move(next->id);
    }
  }

  void hand_over_one(provider_host& host,
                     const std::shared_ptr<chat_chain>& chain,
                     inbound_message msg, std::string id,
                     const std::shared_ptr<payload_answer>& answer) {
    auto reported = std::make_shared<std::atomic<bool>>(false);
    delivery_callbacks cb;
    cb.accepted = [self = shared_from_this(), chain, answer, reported,
                   id](errc code) {
      if (reported->exchange(true))
        return;
      bool again = code != errc::none && retry_later(code);
      if (code == errc::none)
        ++self->n_accepted;
      self->decided(id, again);
      if (again)
        answer->retry = true;
      if (auto* p = pumping; p && p->chain == chain.get() && !p->due) {
        p->due = true; // handed over by the pump, once deliver returned
        p->failed = again;
      } else {
        self->next_of(chain, again, answer);
      }
      answer->one_done();
    };
    try {
      host.deliver(std::move(msg), std::move(cb));
    } catch (...) {
      log::error(opts.id, fmt::format("{}: handing message {} over failed: {} "
                                      "(Meta's retry brings it again)",
                                      opts.id, id,
                                      botmesh::internal::what_of(
                                        std::current_exception())));
      if (!reported->exchange(true)) {
        decided(id, true);
        answer->retry = true;
        take_next(chain, true, *answer); // (forgets the rest)
        answer->one_done();
      }
    }
  }

  // The chat's message before was decided (`failed`: refused for a retry,
  // or not handed over): the next one goes, or, after a failure, every one
  // left is forgotten.
  void next_of(const std::shared_ptr<chat_chain>& chain, bool failed,
               const std::shared_ptr<payload_answer>& answer) {
    if (auto next = take_next(chain, failed, *answer))
      hand_over(chain, std::move(next->msg), std::move(next->id), answer);
  }

  // The chat's next message to hand over, or none: the chain is done, or
  // after a failure every one left was forgotten. A message taken is the
  // chain's one in flight (busy stays set).
  std::optional<queued_message> take_next(const std::shared_ptr<chat_chain>& chain,
                                          bool failed, payload_answer& answer) {
    std::optional<queued_message> next;
    std::deque<queued_message> dropped;
    {
      std::lock_guard guard{chain->mtx};
      if (failed)
        chain->failed = true;
      if (chain->failed) {
        dropped.swap(chain->queued);
        chain->busy = false;
      } else if (chain->queued.empty()) {
        chain->busy = false;
      } else {
        next = std::move(chain->queued.front());
        chain->queued.pop_front();
      }
    }
    for (auto& q : dropped)
      forget(q.id, answer);
    return next;
  }

  std::string url_for(const outgoing_message& msg) {
    auto base = opts.api_url;
    while (!base.empty() && base.back() == '/')
      base.pop_back();
    if (opts.kind != platform::whatsapp)
      return fmt::format("{}/{}/me/messages", base, opts.api_version);
    std::string_view phone = internal::split_whatsapp_chat(msg.chat)
                               .phone_number_id;
    // A path segment of the Graph URL, with the access token on the
    // request: letters and digits only, as inbound ids are checked
    // ('/', '?', "..", a space would send elsewhere).
    if (!std::all_of(phone.begin(), phone.end(), [](unsigned char c) {
          return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z')
                 || (c >= 'a' && c <= 'z');
        }))
      throw invalid_argument_error(
        "chat", fmt::format("whatsapp {}: the phone number id of chat {:?} "
                            "is not letters and digits",
                            opts.id, msg.chat));
    if (phone.empty())
      phone = opts.phone_number_id;
    if (phone.empty())
      throw invalid_argument_error(
        "phone_number_id",
        fmt::format("whatsapp {}: no phone_number_id to send to {} from (set "
                    "webhook_options.phone_number_id, or send to "
                    "\"<wa_id>@<phone_number_id>\")",
                    opts.id, msg.chat));
    return fmt::format("{}/{}/{}/messages", base, opts.api_version, phone);
  }
};

namespace {

// A credential read from a file or an environment often keeps its newline:
// in a header it would break the request, and a secret with it never
// matches. Said at once, naming the option.
void check_credential(std::string_view field, const std::string& value) {
  for (unsigned char c : value)
    if (c < 0x20 || c == 0x7f)
      throw invalid_argument_error(
        std::string{field},
        fmt::format("meta webhook: {} holds a control character (byte {:#04x}: "
                    "a trailing newline from a secret file?)",
                    field, c));
  if (!value.empty() && (value.front() == ' ' || value.back() == ' '))
    throw invalid_argument_error(
      std::string{field},
      fmt::format("meta webhook: {} begins or ends with a space", field));
}

} // namespace

webhook_provider::webhook_provider(webhook_options opts) {
  check_credential("access_token", opts.access_token);
  check_credential("app_secret", opts.app_secret);
  check_credential("verify_token", opts.verify_token);
  if (opts.access_token.empty())
    throw invalid_argument_error("access_token",
                                 "meta webhook: access_token is required");
  if (opts.app_secret.empty() && !opts.allow_unauthenticated)
    throw invalid_argument_error("app_secret",
                                 "meta webhook: app_secret is required (or "
                                 "set allow_unauthenticated)");
  if (opts.verify_token.empty())
    throw invalid_argument_error("verify_token",
                                 "meta webhook: verify_token is required");
  if (opts.path.empty() || opts.path.front() != '/')
    throw invalid_argument_error("path", "meta webhook: path must start with '/'");
  try {
    http::parse_url(opts.api_url);
  } catch (const invalid_argument_error& e) {
    throw invalid_argument_error("api_url", e.what());
  }
  impl_ = std::make_shared<impl>(std::move(opts));
  auto& i = *impl_;
  if (i.opts.server) {
    i.srv = i.opts.server;
  } else {
    i.srv = std::make_shared<http::server>(i.opts.listen);
    i.own_server = true;
  }
  std::weak_ptr<impl> weak = impl_;
  i.srv->route("GET", i.opts.path, [weak](http::request& req, http::responder r) {
    if (auto self = weak.lock())
      self->on_verify(req, std::move(r));
    else
      r.respond(503);
  });
  i.srv->route("POST", i.opts.path, [weak](http::request& req, http::responder r) {
    if (auto self = weak.lock())
      self->on_post(req, std::move(r));
    else
      r.respond(503);
  });
}

webhook_provider::~webhook_provider() {
  stop();
  impl_->srv->remove_route("GET", impl_->opts.path);
  impl_->srv->remove_route("POST", impl_->opts.path);
}

std::string webhook_provider::id() const {
  return impl_->opts.id;
}

std::string webhook_provider::connection_id() const {
  return impl_->opts.phone_number_id;
}

provider_state webhook_provider::state() const {
  return impl_->st.load();
}

void webhook_provider::start(provider_host& host) {
  auto& i = *impl_;
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
                fmt::format("{}: send to {} while the transport is closed",
                            i.opts.id, msg.chat));
  http::client_request req;
  req.url = i.url_for(msg);
  req.body = internal::to_graph_body(msg, i.opts.kind);
  req.headers.emplace_back("Authorization", i.auth);
  // The flood-control wait gives up on the turn's end or the host's stop,
  // and so does the request until it is written (the wait for a pooled
  // connection, the connect): one already written may have been
  // delivered, and cutting it off would report a failure.
  std::stop_token stopping;
  if (botmesh::internal::host_slot::use h{i.hosts}; h)
    stopping = h->stopping();
  http::send_with_retry(
    i.flood, msg.chat, false,
    [&](std::stop_token given_up) {
      req.cancel_before_write = std::move(given_up);
      auto res = i.api.request(req);
      try {
        internal::check_graph_answer(res.status, res.body);
      } catch (const platform_error& e) {
        if (e.code() == errc::retry_after)
          ++i.n_retried;
        throw;
      }
    },
    stopping, cancel);
  ++i.n_sent;
}

http::server& webhook_provider::server() noexcept {
  return *impl_->srv;
}

webhook_stats webhook_provider::stats() const {
  auto& i = *impl_;
  return webhook_stats{i.n_payloads,     i.n_messages,  i.n_accepted,
                       i.n_statuses,     i.n_unauthorized, i.n_malformed,
                       i.n_unknown,      i.n_duplicates, i.n_verifications,
                       i.n_sent,         i.n_retried, i.n_platform_errors};
}

} // namespace botmesh::meta
