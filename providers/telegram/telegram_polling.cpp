#include <botmesh/providers/telegram/telegram_polling.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>

#include <fmt/format.h>

#include <botmesh/providers/telegram/bot_api.hpp>
#include <botmesh/providers/telegram/internal/callback_answers.hpp>
#include <botmesh/providers/telegram/internal/methods.hpp>
#include <botmesh/providers/telegram/internal/update_parser.hpp>
#include <botmesh/runtime/core/duration.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/log.hpp>

namespace botmesh::telegram {

struct polling_provider::impl {
  polling_options opts;
  // Shared with the turn-end notices of pressed buttons, which may outlive
  // the provider.
  std::shared_ptr<bot_api> api;
  std::shared_ptr<internal::callback_answers> callbacks =
    std::make_shared<internal::callback_answers>();
  http::flood_control flood;
  // start() and stop() one at a time, whole: a start while a stop still
  // joins the old poller would run two pollers, and a stop that read the
  // stop source after a start replaced it would leave the old one running.
  std::mutex life;
  std::mutex mtx;
  std::condition_variable cv;
  provider_host* host = nullptr;
  std::thread thread;
  std::stop_source stop; // the running poller's (set under `life`)
  std::atomic<provider_state> st{provider_state::closed};
  std::atomic<std::int64_t> offset{0};
  std::atomic<std::uint64_t> n_polls{0}, n_updates{0}, n_unknown{0},
    n_conflicts{0}, n_errors{0}, n_sent{0}, n_malformed{0}, n_id_restarts{0};
  std::mutex err_mtx;
  std::string last_error; // under err_mtx

  explicit impl(polling_options o) : opts(std::move(o)), flood(opts.flood) {
    // nop
  }

  std::string offset_user() const {
    return "provider:" + opts.id;
  }

  // Update ids are the bot's own: a token of another bot under the same
  // provider id must not start from this one's offset.
  std::string offset_field() const {
    return "telegram_offset:" + internal::bot_id(opts.token);
  }

  void load_offset() {
    if (!opts.offset_store)
      return;
    std::optional<std::string> v;
    try {
      v = opts.offset_store->get_user_data(offset_user(), "botmesh",
                                          offset_field());
    } catch (const std::exception& e) {
      log::warn("telegram", fmt::format("{}: cannot read the stored offset "
                                        "({}): starting from Telegram's own",
                                        opts.id, e.what()));
      return;
    }
    if (!v)
      return;
    std::int64_t n = 0;
    auto r = std::from_chars(v->data(), v->data() + v->size(), n);
    if (r.ec != std::errc{} || r.ptr != v->data() + v->size() || n < 0) {
      log::warn("telegram",
                fmt::format("{}: the stored offset \"{}\" is no update id: "
                            "starting from Telegram's own",
                            opts.id, v->substr(0, 64)));
      return;
    }
    if (n > offset)
      offset = n;
  }

  void save_offset(std::int64_t n) {
    if (!opts.offset_store)
      return;
    try {
      opts.offset_store->set_user_data(offset_user(), "botmesh", offset_field(),
                                       std::to_string(n));
    } catch (const std::exception& e) {
      // Saved again with the next batch that moves it; meanwhile a new
      // leader starts from Telegram's own confirmation.
      log::warn("telegram", fmt::format("{}: cannot save the offset {} ({})",
                                        opts.id, n, e.what()));
    }
  }

  void set_state(provider_host& h, provider_state s) {
    if (st.exchange(s) != s)
      h.state_changed(s);
  }

  // Sleeps `d` unless stopping; false when stopping.
  bool pause(std::chrono::milliseconds d, std::stop_token token) {
    std::unique_lock guard{mtx};
    std::stop_callback wake{token, [this] { cv.notify_all(); }};
    cv.wait_for(guard, d, [&] { return token.stop_requested(); });
    return !token.stop_requested();
  }

  // Names a failed poll, every time (the waits between polls grow to 30
  // s): a revoked token or a webhook left set would otherwise keep the bot
  // `connecting` with nothing saying why.
  void failed(log::level l, const std::string& why) {
    {
      std::lock_guard guard{err_mtx};
      last_error = why;
    }
    log::write(l, "telegram", why);
  }

  void loop(provider_host& h, std::stop_token token) {
    load_offset();
    auto backoff = opts.retry_backoff.ms();
    // Waits `backoff` (or what Telegram asked for), then doubles it.
    auto again = [&](std::chrono::milliseconds asked = {}) {
      if (!pause(std::max(backoff, asked), token))
        return false;
      backoff = std::min(backoff * 2, std::chrono::milliseconds{30000});
      return true;
    };
    // Updates still to be asked one at a time: an answer that could not be
    // read at all (one update with an integer past 64 bits, invalid UTF-8)
    // is asked again with limit 1 until the update that breaks it comes
    // alone, and is stepped past. Telegram answers at most 100 at a time,
    // so the broken one is among the next 100.
    int one_by_one = 0;
    // The wait after an answer that moved nothing (see below).
    auto stuck = opts.retry_backoff.ms();
    while (!token.stop_requested()) {
      // Not leading (a lapse the session has not acted on yet): a poll
      // would cut the leader's own (409 there, and it yields). Wait until
      // the session stops this poller or the leadership comes back.
      if (!h.leads()) {
        if (!pause(opts.retry_backoff.ms(), token))
          return;
        continue;
      }
      std::string result;
      try {
        ++n_polls;
        auto secs = std::max<std::int64_t>(1, opts.poll_timeout.ms().count() / 1000);
        result = api->call(
          "getUpdates",
          fmt::format(R"({{"offset":{},"timeout":{}{},"allowed_updates":["message","edited_message","callback_query"]}})",
                      offset.load(), secs, one_by_one > 0 ? R"(,"limit":1)" : ""),
          opts.poll_timeout.ms() + std::chrono::seconds(10), token);
      } catch (const internal::unreadable_answer& e) {
        ++n_errors;
        // Only an OK answer whose JSON breaks is looked into; an error page
        // (a proxy's HTML 502) is a failed poll like any other.
        if (e.http_status() == 200) {
          if (one_by_one == 0) {
            one_by_one = 100;
            log::warn("telegram",
                      fmt::format("{}: {}: asking one update at a time to "
                                  "find the one that cannot be read",
                                  opts.id, e.what()));
            continue;
          }
          // One update alone, and it cannot be read: named, counted and
          // stepped past, as an update the parser reads but finds
          // malformed. (Without an id there is nothing to step past: a
          // failed poll.)
          if (auto id = internal::first_update_id(e.body())) {
            ++n_malformed;
            log::warn("telegram",
                      fmt::format("{}: skipping update {} of getUpdates: {}",
                                  opts.id, *id, e.what()));
            offset = *id + 1;
            save_offset(*id + 1);
            --one_by_one;
            continue;
          }
        }
        set_state(h, provider_state::connecting);
        failed(log::level::warn,
               fmt::format("{}: {}: polling again in {}", opts.id, e.what(),
                           format_duration(backoff)));
        if (!again())
          return;
        continue;
      } catch (const platform_error& e) {
        auto status = e.http_status();
        // Telegram answers 409 for a webhook left set too: no other
        // poller to yield to, and every replica would yield in turn.
        bool webhook = status == 409
                       && e.description().find("webhook") != std::string::npos;
        if (status == 409 && !webhook) {
          ++n_conflicts;
          failed(log::level::warn,
                 fmt::format("{}: {}: another connection polls this bot",
                             opts.id, e.what()));
          set_state(h, provider_state::closed);
          if (h.yield_leadership("conflict"))
            return; // the host stops us and starts us again later
          if (!pause(backoff, token))
            return;
          continue;
        }
        ++n_errors;
        set_state(h, provider_state::connecting);
        if (webhook)
          failed(log::level::error,
                 fmt::format("{}: {}: a webhook is set for this bot, and "
                             "Telegram answers no getUpdates while it is "
                             "(remove it with deleteWebhook, or receive "
                             "through the webhook provider)",
                             opts.id, e.what()));
        else if (status == 401 || status == 404)
          failed(log::level::error,
                 fmt::format("{}: {}: Telegram refuses the bot's token",
                             opts.id, e.what()));
        else
          failed(log::level::warn,
                 fmt::format("{}: {}: polling again in {}", opts.id, e.what(),
                             format_duration(std::max(backoff, e.retry_after()))));
        if (!again(e.retry_after()))
          return;
        continue;
      } catch (const error& e) {
        if (e.code() == errc::stopped || token.stop_requested())
          return;
        ++n_errors;
        set_state(h, provider_state::connecting);
        failed(log::level::warn,
               fmt::format("{}: getUpdates failed ({}): polling again in {}",
                           opts.id, e.what(), format_duration(backoff)));
        if (!again())
          return;
        continue;
      }
      std::vector<internal::parsed_update> updates;
      try {
        updates = internal::parse_updates(result, opts.id, opts.username);
      } catch (const invalid_argument_error& e) {
        ++n_errors;
        failed(log::level::warn,
               fmt::format("{}: getUpdates answered no list of updates ({}): "
                           "polling again in {}",
                           opts.id, e.what(), format_duration(backoff)));
        if (!again())
          return;
        continue;
      }
      backoff = opts.retry_backoff.ms();
      {
        std::lock_guard guard{err_mtx};
        last_error.clear();
      }
      set_state(h, provider_state::open);
      if (one_by_one > 0)
        one_by_one = updates.empty()
                       ? 0
                       : std::max(0, one_by_one - static_cast<int>(updates.size()));
      // In id order, a readable copy of an id before an unreadable one:
      // Telegram answers in order, but an item out of order was skipped
      // as handled once a later id moved the offset past it, and a
      // malformed copy ahead of a sound one took the sound one's place.
      std::stable_sort(updates.begin(), updates.end(), [](auto& a, auto& b) {
        bool a_bad = a.kind == internal::update_kind::malformed;
        bool b_bad = b.kind == internal::update_kind::malformed;
        return a.update_id != b.update_id ? a.update_id < b.update_id
                                          : !a_bad && b_bad;
      });
      auto next = offset.load();
      auto asked = next;
      // Telegram picks new update ids at random after a week without
      // updates, and then answers ids below the offset asked for. Skipping
      // them as handled would drop every message from then on: the batch
      // starts a new sequence.
      // An item without a readable id (parsed as id 0) says nothing of
      // the sequence.
      if (std::any_of(updates.begin(), updates.end(), [&](auto& u) {
            return u.kind != internal::update_kind::malformed
                   && u.update_id < next;
          })) {
        ++n_id_restarts;
        log::warn("telegram",
                  fmt::format("{}: getUpdates answered ids below the offset {} "
                              "(Telegram restarted its update ids): taking "
                              "them as new",
                              opts.id, next));
        next = 0;
      }
      bool refused = false;
      errc refused_code = errc::none;
      for (auto& u : updates) {
        if (u.kind == internal::update_kind::malformed) {
          // Skipped, named and counted; the offset moves past it like past
          // any other (Telegram would send it again, forever).
          ++n_malformed;
          log::warn("telegram",
                    fmt::format("{}: skipping update {} of getUpdates: {}",
                                opts.id, u.update_id, u.unknown_kind));
          if (u.update_id >= next)
            next = u.update_id + 1;
          continue;
        }
        if (u.update_id < next)
          continue; // twice in one answer
        if (u.kind == internal::update_kind::unknown) {
          ++n_unknown;
          next = u.update_id + 1;
          continue;
        }
        ++n_updates;
        // The offset moves past an update only once the bot accepted it.
        std::mutex m;
        std::condition_variable done_cv;
        bool done = false;
        errc code = errc::none;
        delivery_callbacks cb;
        std::string opened; // the press now waiting for its turn's end
        if (!u.callback_query_id.empty() && opts.answer_callback_queries) {
          opened = u.callback_query_id;
          callbacks->open(u.callback_query_id);
          cb.turn_ended = [api = api, cbs = callbacks,
                           id = u.callback_query_id](turn_outcome o) {
            cbs->ended(*api, id, o);
          };
        }
        cb.accepted = [&](errc c) {
          std::lock_guard guard{m};
          code = c;
          done = true;
          done_cv.notify_all();
        };
        h.deliver(std::move(u.message), std::move(cb));
        {
          std::unique_lock guard{m};
          done_cv.wait(guard, [&] { return done; });
        }
        if (code != errc::none && !opened.empty())
          callbacks->refused(opened);
        if (retry_later(code)) {
          // Not taken (stopping, or the inbound journal failed): the
          // offset stays, so the update comes again.
          refused = true;
          refused_code = code;
          break;
        }
        next = u.update_id + 1;
      }
      if (next != offset.load()) {
        offset = next;
        save_offset(next);
      }
      if (!refused && !updates.empty() && next == asked) {
        // Nothing taken and the offset where it was: items without a
        // readable id. Telegram answers them again at once, so polling on
        // would spin; they are skipped once a later update arrives. (Its
        // own wait: `backoff` starts over with every readable answer.)
        if (!pause(stuck, token))
          return;
        // At most 5 s (or the configured backoff): the next message of
        // any chat comes with the next answer, so this wait is its delay.
        stuck = std::min(stuck * 2,
                         std::max(opts.retry_backoff.ms(),
                                  std::chrono::milliseconds{5000}));
      } else {
        stuck = opts.retry_backoff.ms();
      }
      if (refused) {
        if (refused_code == errc::stopped)
          return;
        // The journal failed, or this replica's leadership lapsed (the
        // session stops this poller soon; if it leads again, it goes on):
        // poll the same updates again after a pause.
        if (!again())
          return;
      }
    }
  }
};

polling_provider::polling_provider(polling_options opts) {
  if (opts.token.empty())
    throw invalid_argument_error("token", "telegram polling: token is required");
  // Under a second is no long poll (Telegram's timeout counts whole
  // seconds): the loop would ask again at once, over and over.
  if (opts.poll_timeout.ms() < std::chrono::seconds{1})
    throw invalid_argument_error(
      "poll_timeout", fmt::format("telegram polling: poll_timeout must be at "
                                  "least 1s, not {}",
                                  format_duration(opts.poll_timeout.ms())));
  if (opts.retry_backoff.ms() <= std::chrono::milliseconds{0})
    throw invalid_argument_error(
      "retry_backoff", fmt::format("telegram polling: retry_backoff must be "
                                   "positive, not {}",
                                   format_duration(opts.retry_backoff.ms())));
  try {
    http::parse_url(opts.api_url);
  } catch (const invalid_argument_error& e) {
    throw invalid_argument_error("api_url", e.what());
  }
  impl_ = std::make_unique<impl>(std::move(opts));
  impl_->api = std::make_shared<bot_api>(
    bot_api_options{impl_->opts.token, impl_->opts.api_url, impl_->opts.http});
}

polling_provider::~polling_provider() {
  stop();
}

std::string polling_provider::id() const {
  return impl_->opts.id;
}

std::string polling_provider::connection_id() const {
  return internal::bot_id(impl_->opts.token);
}

provider_capabilities polling_provider::capabilities() const {
  return {.exclusive_session = true};
}

provider_state polling_provider::state() const {
  return impl_->st.load();
}

void polling_provider::start(provider_host& host) {
  auto& i = *impl_;
  std::lock_guard life{i.life};
  std::lock_guard guard{i.mtx};
  if (i.host)
    return;
  i.host = &host;
  i.stop = std::stop_source{};
  i.st = provider_state::connecting;
  i.thread = std::thread{
    [&i, &host, token = i.stop.get_token()] { i.loop(host, token); }};
}

void polling_provider::stop() {
  auto& i = *impl_;
  std::lock_guard life{i.life};
  provider_host* h;
  std::thread t;
  {
    std::lock_guard guard{i.mtx};
    h = i.host;
    i.host = nullptr;
    t = std::move(i.thread);
  }
  if (!h)
    return;
  i.stop.request_stop();
  {
    // Under the lock the poller's pause() waits with: a notice between its
    // look at the token and its wait would be lost otherwise.
    std::lock_guard guard{i.mtx};
    i.cv.notify_all();
  }
  if (t.joinable())
    t.join();
  if (i.st.exchange(provider_state::closed) != provider_state::closed)
    h->state_changed(provider_state::closed);
}

void polling_provider::send(const outgoing_message& msg,
                            std::stop_token cancel) {
  auto& i = *impl_;
  auto to = internal::split_chat(msg.chat);
  std::stop_token stopping;
  {
    std::lock_guard guard{i.mtx};
    if (i.host)
      stopping = i.host->stopping();
  }
  // Until it is written, the request gives up with the wait.
  http::send_with_retry(
    i.flood, to.chat_id, to.group(),
    [&](std::stop_token given_up) { i.api->send(msg, std::move(given_up)); },
    stopping, cancel);
  ++i.n_sent;
  if (!msg.reply_to.empty() && i.opts.answer_callback_queries)
    i.callbacks->replied(*i.api, msg.reply_to);
}

polling_stats polling_provider::stats() const {
  auto& i = *impl_;
  std::lock_guard guard{i.err_mtx};
  return polling_stats{i.n_polls,  i.n_updates, i.n_unknown,     i.n_conflicts,
                       i.n_errors, i.n_sent,    i.offset.load(), i.n_malformed,
                       i.n_id_restarts, i.last_error};
}

} // namespace botmesh::telegram
