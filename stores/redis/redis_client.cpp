#include <botmesh/stores/redis/redis_client.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <optional>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/internal/text.hpp>
#include <botmesh/runtime/core/metrics.hpp>
#include <botmesh/stores/redis/internal/cluster.hpp>
#include <botmesh/stores/redis/internal/protocol.hpp>
#include <botmesh/stores/redis/internal/sha1.hpp>

namespace botmesh {

std::string_view to_string(redis_reply::kind k) noexcept {
  switch (k) {
    case redis_reply::kind::nil:
      return "nil";
    case redis_reply::kind::integer:
      return "integer";
    case redis_reply::kind::string:
      return "string";
    case redis_reply::kind::status:
      return "status";
    case redis_reply::kind::error:
      return "error";
    case redis_reply::kind::array:
      return "array";
  }
  return "nil";
}

void throw_redis_error(std::string_view what, const redis_reply& reply) {
  throw error(errc::store_error,
              fmt::format("redis {}: server error: {}", what, reply.str));
}

void expect_reply(std::string_view what, const redis_reply& reply,
                  redis_reply::kind want) {
  if (reply.type == redis_reply::kind::error)
    throw_redis_error(what, reply);
  if (reply.type != want)
    throw error(errc::store_error,
                fmt::format("redis {}: expected a reply of type {}, got {}",
                            what, to_string(want), to_string(reply.type)));
}

redis_script::redis_script(std::string name, std::string_view body)
  : name_(std::move(name)), body_(body), sha_(internal::sha1_hex(body)) {
  // nop
}

namespace {

using steady = std::chrono::steady_clock;
using internal::convert;
using internal::endpoint_info;
using internal::parse_url;

timeval to_timeval(std::chrono::milliseconds d) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(d.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((d.count() % 1000) * 1000);
  return tv;
}

// hiredis writes with write(2): a write to a connection the server closed
// (a Redis restart, a killed master) raises SIGPIPE, whose default action
// ends the whole process. The connection threads block it for themselves,
// so the write fails with EPIPE and the reply is lost like any other,
// without changing the application's own handling of the signal.
void block_sigpipe() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

// What a batch on a cluster gives a command whose node failed (no reply,
// lost connection): an error reply naming the failure, in the command's
// place. "BOTMESH-FAILED" is no error prefix Redis uses.
redis_reply failed_reply(const std::exception_ptr& e) {
  redis_reply r;
  r.type = redis_reply::kind::error;
  r.str = "BOTMESH-FAILED " + botmesh::internal::what_of(e);
  return r;
}

// Runs one command on a context that is not pipelining (connection set-up);
// returns the error text, or nothing on success.
std::optional<std::string> run_setup(redisContext* ctx,
                                     const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto r = static_cast<redisReply*>(redisCommandArgv(
    ctx, static_cast<int>(argv.size()), argv.data(), lens.data()));
  std::optional<std::string> err;
  if (!r)
    err = fmt::format("{} failed: {}", args[0], ctx->errstr);
  else if (r->type == REDIS_REPLY_ERROR)
    err = fmt::format("{} failed: {}", args[0], std::string{r->str, r->len});
  if (r)
    freeReplyObject(r);
  return err;
}

// AUTH (and SELECT when asked) from the URL; the error text on failure.
std::optional<std::string> authenticate(redisContext* ctx,
                                        const endpoint_info& ep, bool select) {
  if (!ep.password.empty()) {
    auto err = ep.user.empty() ? run_setup(ctx, {"AUTH", ep.password})
                               : run_setup(ctx, {"AUTH", ep.user, ep.password});
    if (err)
      return err;
  }
  if (select && ep.db != 0)
    return run_setup(ctx, {"SELECT", std::to_string(ep.db)});
  return std::nullopt;
}

void bound_reader(redisContext* ctx, internal::reader_guard* guard) {
  internal::bound_reader(ctx->reader, guard);
}

struct request {
  redis_client::command cmd;
  redis_client::callback done;
  /// Instead of `done`: also gets the command back (the cluster router
  /// keeps it for a resend without copying it).
  redis_client::keep_callback keep{};
  /// When the caller queued it: latency counts the queue too, as the
  /// caller sees it.
  std::chrono::steady_clock::time_point queued = std::chrono::steady_clock::now();
  /// The client's own (a script load): not a command of the figures.
  bool internal = false;
};

// Process-wide Redis figures for /metrics: every client adds to the same
// atomics (no lock), registered once with the global registry.
struct redis_metrics {
  metrics::histogram latency;
  metrics::counter failed;       // no reply: connection down, timeout
  metrics::counter error_replies; // the server answered with an error
  metrics::registry::registration reg;

  redis_metrics() {
    reg = metrics::global_registry().add([this](metrics::exposition& e) {
      e.histogram("botmesh_redis_command_seconds",
                  "Redis command latency, from queueing to reply.", {},
                  latency.read());
      e.counter("botmesh_redis_errors_total",
                "Redis commands that failed, by kind.", {{"kind", "connection"}},
                failed.value());
      e.counter("botmesh_redis_errors_total",
                "Redis commands that failed, by kind.", {{"kind", "reply"}},
                error_replies.value());
    });
  }
};

redis_metrics& figures() {
  // Never destroyed: connection threads may complete during exit.
  static auto* m = new redis_metrics;
  return *m;
}

// Completes `r` once, with its command handed back when it asked for it.
void complete(request& r, redis_reply reply, std::exception_ptr e) {
  if (!r.internal) {
    auto& m = figures();
    m.latency.observe(std::chrono::steady_clock::now() - r.queued);
    if (e)
      m.failed.inc();
    else if (reply.type == redis_reply::kind::error)
      m.error_replies.inc();
  }
  if (r.keep)
    r.keep(std::move(reply), std::move(e), std::move(r.cmd));
  else
    r.done(std::move(reply), std::move(e));
}

// The client whose thread this is (connection or subscriber): a callback
// may drop the last reference to its own client, and a client must not
// join the thread that destroys it.
thread_local const void* current_client = nullptr;

} // namespace

const void* internal::calling_client() noexcept {
  return current_client;
}

namespace {

// Scripts every connection loads after it connects (see preload()).
struct preloaded {
  std::mutex mtx;
  std::vector<const redis_script*> scripts; // only grows
  /// scripts.size(), readable without the lock: a connection compares it
  /// with what it loaded before each write.
  std::atomic<std::size_t> count{0};

  std::vector<const redis_script*> all() {
    std::lock_guard guard{mtx};
    return scripts;
  }
};

// One connection and the thread that owns it: its queue is its mailbox.
class connection {
 public:
  connection(const void* owner, const endpoint_info& ep,
             const redis_options& opts, std::string endpoint,
             std::shared_ptr<preloaded> scripts)
    : owner_(owner),
      ep_(ep),
      opts_(opts),
      endpoint_(std::move(endpoint)),
      scripts_(std::move(scripts)) {
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0)
      throw error(errc::store_error, "redis client: eventfd failed");
    thread_ = std::thread{[this] {
      block_sigpipe();
      loop();
    }};
  }

  ~connection() {
    {
      std::lock_guard guard{mtx_};
      closing_ = true;
    }
    cv_.notify_all();
    kick();
    thread_.join();
    if (ctx_)
      redisFree(ctx_);
    ::close(wake_fd_);
  }

  // Queues several requests back to back (they go out in one write), or
  // fails them all at once while the server is unreachable.
  void enqueue_many(std::vector<request> rs) {
    {
      std::unique_lock guard{mtx_};
      if (down_ && steady::now() < next_attempt_) {
        auto why = last_error_;
        guard.unlock();
        for (auto& r : rs)
          complete(r, {}, std::make_exception_ptr(internal::unsent_error(
                       errc::store_error,
                       fmt::format("redis {} unavailable ({}): {} not sent",
                                   endpoint_, why,
                                   r.cmd.empty() ? "" : r.cmd[0]))));
        return;
      }
      for (auto& r : rs)
        queue_.push_back(std::move(r));
    }
    cv_.notify_one();
    kick();
  }

  void enqueue(request r) {
    {
      std::unique_lock guard{mtx_};
      // While the server is unreachable, fail at once instead of queueing
      // behind a connect attempt that is bound to wait. A quick failure
      // (refused: the server is restarting) allows the next attempt at
      // once, so the first command after the server is back reconnects.
      if (down_ && steady::now() < next_attempt_) {
        auto why = last_error_;
        guard.unlock();
        complete(r, {}, std::make_exception_ptr(internal::unsent_error(
                     errc::store_error,
                     fmt::format("redis {} unavailable ({}): {} not sent",
                                 endpoint_, why, r.cmd.empty() ? "" : r.cmd[0]))));
        return;
      }
      queue_.push_back(std::move(r));
    }
    cv_.notify_one();
    kick();
  }

 private:
  // Wakes the loop out of poll(), called after queueing (outside mtx_).
  // Only while it polls: otherwise the condition variable wakes it, or it
  // is running and looks at the queue before it polls again. The loop sets
  // polling_ under mtx_ after finding the queue empty, so a request queued
  // after that sees it set.
  void kick() {
    if (polling_.load() && !kicked_.exchange(true)) {
      std::uint64_t one = 1;
      (void) !::write(wake_fd_, &one, sizeof one);
    }
  }

  // The connection is pipelined across batches: requests queued while
  // earlier ones wait for their replies are written at once instead of
  // after those replies (a turn's enter must not wait a round trip behind
  // the release of the turn before). Replies come back in order, so the
  // in-flight requests are a FIFO.
  void loop() {
    current_client = owner_;
    std::vector<request> fresh;
    for (;;) {
      {
        std::unique_lock guard{mtx_};
        if (inflight_.empty()) {
          cv_.wait(guard, [this] { return closing_ || !queue_.empty(); });
          if (closing_ && queue_.empty())
            return;
        }
        fresh.assign(std::make_move_iterator(queue_.begin()),
                     std::make_move_iterator(queue_.end()));
        queue_.clear();
        polling_.store(fresh.empty());
      }
      if (!fresh.empty()) {
        send(fresh);
        fresh.clear();
        continue; // more may have been queued meanwhile
      }
      receive();
      polling_.store(false);
      if (kicked_.exchange(false)) {
        std::uint64_t n;
        (void) !::read(wake_fd_, &n, sizeof n);
      }
    }
  }

  // `sent`: whether the commands may have reached the socket (their
  // replies are lost: never resent) or surely not (`unsent_error`: the
  // cluster router may resend them).
  template <class Requests>
  void fail_all(Requests& batch, errc code, const std::string& why,
                bool sent) {
    for (auto& r : batch) {
      auto name = r.cmd.empty() ? std::string{} : r.cmd[0];
      auto text = fmt::format("redis {} {}: {}", endpoint_, name, why);
      complete(r, {}, sent ? std::make_exception_ptr(error(code, text))
                           : std::make_exception_ptr(
                               internal::unsent_error(code, text)));
    }
    batch.clear();
  }

  // The connection failed: every request written on it fails (whether the
  // server ran it is unknown, so none is resent), then `fresh` (written
  // or not, as `fresh_sent` says).
  void fail_connection(std::vector<request>& fresh, errc code,
                       const std::string& why, bool fresh_sent) {
    reset(why);
    std::deque<request> lost;
    lost.swap(inflight_);
    fail_all(lost, code, why, true);
    fail_all(fresh, code, why, fresh_sent);
  }

  // `attempt_took`: how long the failed connection attempt waited. Only
  // slow failures (timeouts) back off; a refused connection costs nothing
  // to retry, so the next command tries again.
  void mark_down(const std::string& why,
                 steady::duration attempt_took = steady::duration::max()) {
    std::lock_guard guard{mtx_};
    down_ = true;
    last_error_ = why;
    if (attempt_took < std::chrono::milliseconds{20}) {
      next_attempt_ = steady::now();
      return;
    }
    backoff_ = std::min(opts_.max_backoff.ms(),
                        std::max(std::chrono::milliseconds{50}, backoff_ * 2));
    next_attempt_ = steady::now() + backoff_;
  }

  bool connect() {
    auto t0 = steady::now();
    auto ctx = redisConnectWithTimeout(ep_.host.c_str(), ep_.port,
                                       to_timeval(opts_.connect_timeout.ms()));
    if (!ctx || ctx->err) {
      mark_down(ctx ? ctx->errstr : "cannot allocate a connection",
                steady::now() - t0);
      if (ctx)
        redisFree(ctx);
      return false;
    }
    bound_reader(ctx, &guard_);
    redisSetTimeout(ctx, to_timeval(opts_.command_timeout.ms()));
    redisEnableKeepAlive(ctx);
    if (auto err = authenticate(ctx, ep_, true)) {
      mark_down(*err, steady::now() - t0);
      redisFree(ctx);
      return false;
    }
    // Scripts are loaded by SHA on every new connection: after a server
    // restart EVALSHA finds them (an error reply here only costs the EVAL
    // fallback later). A failed connection (a server that stopped
    // answering after it accepted) is one that did not connect: kept, it
    // would take the next commands and fail them as sent, "may have run",
    // when none of them left.
    auto scripts = scripts_->all();
    for (auto* script : scripts)
      if (run_setup(ctx, {"SCRIPT", "LOAD", script->body()}) && ctx->err) {
        mark_down(fmt::format("loading script {} failed: {}", script->name(),
                              ctx->errstr),
                  steady::now() - t0);
        redisFree(ctx);
        return false;
      }
    loaded_ = scripts.size();
    in_multi_ = false;
    ctx_ = ctx;
    last_used_ = steady::now();
    std::lock_guard guard{mtx_};
    down_ = false;
    backoff_ = std::chrono::milliseconds{0};
    return true;
  }

  // A connection that failed while in use: the next command reconnects at
  // once (a refused or slow attempt then decides the backoff).
  void reset(const std::string& why) {
    if (ctx_) {
      redisFree(ctx_);
      ctx_ = nullptr;
    }
    mark_down(why, steady::duration::zero());
  }

  // A connection idle for a while may have been closed by the server (a
  // restart, an idle timeout). Looking for its EOF before writing sends the
  // batch on a fresh connection instead of failing it; a busy connection
  // skips the check.
  bool closed_by_peer() {
    if (steady::now() - last_used_ < std::chrono::milliseconds{100})
      return false;
    pollfd pfd{ctx_->fd, POLLIN | POLLRDHUP, 0};
    // Readable with nothing asked means EOF, a reset or stray bytes: the
    // connection cannot be trusted either way.
    return ::poll(&pfd, 1, 0) > 0;
  }

  // Writes `batch` behind whatever is in flight.
  void send(std::vector<request>& batch) {
    if (inflight_.empty() && ctx_ && closed_by_peer()) {
      redisFree(ctx_);
      ctx_ = nullptr;
    }
    if (!ctx_ && !connect()) {
      std::string why;
      {
        std::lock_guard guard{mtx_};
        why = last_error_;
      }
      fail_all(batch, errc::store_error, "unavailable: " + why, false);
      return;
    }
    if (!in_multi_ && scripts_->count.load(std::memory_order_acquire) > loaded_)
      load_new_scripts(batch);
    wbuf_.clear();
    for (auto& r : batch) {
      internal::append_command(wbuf_, r.cmd);
      track_multi(r.cmd);
    }
    auto appended = redisAppendFormattedCommand(ctx_, wbuf_.data(),
                                                wbuf_.size());
    // A rare huge batch does not keep its buffer for good.
    if (wbuf_.capacity() > (1u << 20))
      std::string{}.swap(wbuf_);
    if (appended != REDIS_OK) {
      fail_connection(batch, errc::store_error, ctx_->errstr, false);
      return;
    }
    int done = 0;
    while (!done) {
      if (redisBufferWrite(ctx_, &done) != REDIS_OK) {
        // Part of the batch may be on the wire: none of it is resent.
        fail_connection(batch, write_timed_out() ? errc::timeout
                                                 : errc::store_error,
                        write_timed_out() ? no_reply() : ctx_->errstr, true);
        return;
      }
    }
    if (inflight_.empty())
      progress_ = steady::now();
    for (auto& r : batch)
      inflight_.push_back(std::move(r));
    batch.clear();
  }

  // Scripts preloaded after this connection opened are loaded ahead of
  // `batch`, in the same write: an EVALSHA of one then never meets
  // NOSCRIPT, whose EVAL fallback would go behind commands sent after it
  // (a later command of the same key could run first). The replies only
  // matter to the fallback, which stays for a server that lost them.
  // Never inside a caller's MULTI block (its EXEC would answer for the
  // load too): a batch that starts in one waits for one that does not.
  void load_new_scripts(std::vector<request>& batch) {
    auto scripts = scripts_->all();
    std::vector<request> loads;
    for (auto i = loaded_; i < scripts.size(); ++i) {
      loads.push_back(request{{"SCRIPT", "LOAD", scripts[i]->body()},
                              [](redis_reply, std::exception_ptr) {}});
      loads.back().internal = true;
    }
    loaded_ = scripts.size();
    batch.insert(batch.begin(), std::make_move_iterator(loads.begin()),
                 std::make_move_iterator(loads.end()));
  }

  // Whether the commands written so far leave a MULTI block open.
  void track_multi(const redis_client::command& cmd) {
    if (cmd.empty())
      return;
    auto is = [&](const char* verb) {
      return ::strcasecmp(cmd[0].c_str(), verb) == 0;
    };
    if (is("MULTI"))
      in_multi_ = true;
    else if (is("EXEC") || is("DISCARD"))
      in_multi_ = false;
  }

  bool write_timed_out() const {
    return ctx_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
  }

  std::string no_reply() const {
    return fmt::format("no reply within {}",
                       format_duration(opts_.command_timeout.ms()));
  }

  // Waits for replies (or for new requests to write) and hands out every
  // complete reply. No reply for `command_timeout` since the last one (or
  // since the oldest request was written) fails what is in flight.
  void receive() {
    auto deadline = progress_ + opts_.command_timeout.ms();
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - steady::now());
    std::vector<request> none;
    if (left.count() <= 0) {
      fail_connection(none, errc::timeout, no_reply(), true);
      return;
    }
    pollfd fds[2] = {{ctx_->fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    int rc = ::poll(fds, 2, static_cast<int>(left.count()) + 1);
    if (rc > 0 && (fds[1].revents & POLLIN)) {
      // Drained whenever it is readable, not only when kicked_ says so: a
      // kick whose write came after the loop's read (kicked_ already
      // cleared) leaves a count that would wake every poll at once, and
      // the thread would spin until the replies came.
      std::uint64_t n;
      (void) !::read(wake_fd_, &n, sizeof n);
    }
    if (rc < 0 || (fds[0].revents == 0))
      return; // woken for new requests, a signal, or loop again to time out
    guard_.refused = -1;
    if (redisBufferRead(ctx_) != REDIS_OK) {
      fail_connection(none, errc::store_error, ctx_->errstr, true);
      return;
    }
    for (;;) {
      void* raw = nullptr;
      if (redisGetReplyFromReader(ctx_, &raw) != REDIS_OK) {
        // The stream's state is unknown now: start over on a new connection.
        auto why = guard_.refused != -1
                     ? fmt::format("the server announced an array of {} "
                                   "elements (the bound is {}): protocol error",
                                   guard_.refused, guard_.max_elements)
                     : std::string{ctx_->errstr};
        fail_connection(none, errc::store_error, why, true);
        return;
      }
      if (!raw)
        break;
      auto reply = convert(static_cast<redisReply*>(raw));
      freeReplyObject(raw);
      if (inflight_.empty()) {
        fail_connection(none, errc::store_error,
                        "a reply nobody asked for: protocol error", true);
        return;
      }
      auto r = std::move(inflight_.front());
      inflight_.pop_front();
      progress_ = steady::now();
      last_used_ = progress_;
      complete(r, std::move(reply), nullptr);
      if (!ctx_)
        return;
    }
  }

  const void* owner_;
  endpoint_info ep_;
  redis_options opts_;
  std::string endpoint_;
  std::shared_ptr<preloaded> scripts_;
  std::size_t loaded_ = 0; // scripts_ loaded on ctx_ (the thread's own)
  bool in_multi_ = false;   // a MULTI written on ctx_ awaits its EXEC
  std::string wbuf_;        // the batch being written, in RESP (reused)
  redisContext* ctx_ = nullptr;
  std::mutex mtx_;
  std::condition_variable cv_;
  std::deque<request> queue_;
  bool closing_ = false;
  bool down_ = false;
  std::string last_error_;
  std::chrono::milliseconds backoff_{0};
  steady::time_point next_attempt_{};
  steady::time_point last_used_{}; // owned by the connection's thread
  std::deque<request> inflight_;    // written, reply pending (same thread)
  steady::time_point progress_{};   // last reply, or first write since idle
  int wake_fd_ = -1;
  std::atomic<bool> polling_{false}; // the loop is (about to be) in poll()
  std::atomic<bool> kicked_{false};  // wake_fd_ was written
  internal::reader_guard guard_{opts_.max_reply_elements};
  std::thread thread_;
};

} // namespace

// A SUBSCRIBE connection read with poll(), so it can stop without input.
class subscriber {
 public:
  // `relocate`, when given, names another node (host, port) to try after
  // one that could not be reached: on a Redis Cluster, PUBLISH reaches
  // every node, so a subscription may live on any of them.
  using relocator =
    std::function<std::optional<std::pair<std::string, int>>(const std::string&, int)>;

  subscriber(std::uint64_t id, const void* owner, const endpoint_info& ep,
             const redis_options& opts, std::string channel,
             std::function<void(std::string_view)> fn,
             std::function<void()> on_subscribed, relocator relocate = {})
    : id_(id),
      owner_(owner),
      ep_(ep),
      opts_(opts),
      channel_(std::move(channel)),
      fn_(std::move(fn)),
      on_subscribed_(std::move(on_subscribed)),
      relocate_(std::move(relocate)) {
    thread_ = std::thread{[this] {
      block_sigpipe();
      loop();
    }};
  }

  ~subscriber() {
    stop_ = true;
    thread_.join();
  }

  std::uint64_t id() const noexcept {
    return id_;
  }

  // Ends the loop after what it runs now; the destructor joins it.
  void stop() noexcept {
    stop_ = true;
  }

  bool on_own_thread() const noexcept {
    return std::this_thread::get_id() == thread_.get_id();
  }

 private:
  redisContext* connect() {
    auto ctx = redisConnectWithTimeout(ep_.host.c_str(), ep_.port,
                                       to_timeval(opts_.connect_timeout.ms()));
    if (!ctx || ctx->err) {
      if (ctx)
        redisFree(ctx);
      return nullptr;
    }
    bound_reader(ctx, &guard_);
    // AUTH and SUBSCRIBE wait for their replies at most command_timeout (a
    // server that accepts and never answers would hold this thread, and
    // the client's destructor, for good); keepalive finds a peer gone
    // without a word.
    redisSetTimeout(ctx, to_timeval(opts_.command_timeout.ms()));
    redisEnableKeepAlive(ctx);
    // Pub/sub ignores the database: no SELECT.
    if (authenticate(ctx, ep_, false) || run_setup(ctx, {"SUBSCRIBE", channel_})) {
      redisFree(ctx);
      return nullptr;
    }
    return ctx;
  }

  void loop() {
    current_client = owner_;
    redisContext* ctx = nullptr;
    auto backoff = std::chrono::milliseconds{50};
    while (!stop_) {
      if (!ctx) {
        ctx = connect();
        if (!ctx) {
          // A node that does not answer may be gone for good (a killed
          // cluster master, replaced by its replica): staying would miss
          // every push until it came back, if ever.
          if (relocate_)
            if (auto to = relocate_(ep_.host, ep_.port)) {
              ep_.host = std::move(to->first);
              ep_.port = to->second;
            }
          std::this_thread::sleep_for(backoff);
          backoff = std::min(backoff * 2, opts_.max_backoff.ms());
          continue;
        }
        backoff = std::chrono::milliseconds{50};
        heard_ = steady::now();
        ping_sent_.reset();
        // Messages published before this point were not received.
        if (on_subscribed_)
          on_subscribed_();
      }
      pollfd pfd{ctx->fd, POLLIN, 0};
      int rc = ::poll(&pfd, 1, 100);
      auto t = steady::now();
      if (rc <= 0) {
        // A subscription that hears nothing may be dead without a word (a
        // dropped NAT entry, a hung server): nobody would know, and every
        // push would be missed until the process restarts. Quiet for
        // command_timeout, it is pinged; no answer within command_timeout
        // more, it is made anew (and on_subscribed says pushes were
        // missed).
        if (ping_sent_ && t - *ping_sent_ >= opts_.command_timeout.ms()) {
          redisFree(ctx);
          ctx = nullptr;
          continue;
        }
        if (!ping_sent_ && t - heard_ >= opts_.command_timeout.ms()) {
          int done = 0;
          redisAppendCommand(ctx, "PING");
          while (!done)
            if (redisBufferWrite(ctx, &done) != REDIS_OK)
              break;
          if (!done) {
            redisFree(ctx);
            ctx = nullptr;
            continue;
          }
          ping_sent_ = t;
        }
        continue;
      }
      if (redisBufferRead(ctx) != REDIS_OK) {
        redisFree(ctx);
        ctx = nullptr;
        continue;
      }
      heard_ = t; // anything read shows the connection alive
      ping_sent_.reset();
      void* raw = nullptr;
      // (Not once stopped: an unsubscribe from the callback ends it then.)
      while (!stop_ && redisGetReplyFromReader(ctx, &raw) == REDIS_OK && raw) {
        auto r = static_cast<redisReply*>(raw);
        // ["message", channel, payload]
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 3
            && r->element[0]->type == REDIS_REPLY_STRING
            && std::string_view{r->element[0]->str, r->element[0]->len}
                 == "message")
          fn_(std::string_view{r->element[2]->str, r->element[2]->len});
        freeReplyObject(raw);
        raw = nullptr;
      }
    }
    if (ctx)
      redisFree(ctx);
  }

  std::uint64_t id_;
  const void* owner_;
  endpoint_info ep_;
  redis_options opts_;
  std::string channel_;
  std::function<void(std::string_view)> fn_;
  std::function<void()> on_subscribed_;
  relocator relocate_;
  internal::reader_guard guard_{opts_.max_reply_elements};
  // The loop thread's: when it last read anything, and its unanswered PING.
  steady::time_point heard_{};
  std::optional<steady::time_point> ping_sent_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

struct redis_client::impl {
  redis_options opts;
  endpoint_info ep;
  std::string endpoint;
  std::shared_ptr<preloaded> scripts = std::make_shared<preloaded>();
  std::vector<std::unique_ptr<connection>> conns;
  std::vector<std::unique_ptr<subscriber>> subscribers;
  std::mutex sub_mtx;
  std::atomic<std::size_t> next{0};

  // Takes subscription `id` out, for the caller to destroy (join) outside
  // any lock; nullptr when it is not here. From its own thread (an
  // unsubscribe in its callback) it is only told to stop and stays until
  // the client goes: a thread cannot join itself.
  std::unique_ptr<subscriber> take_subscriber(std::uint64_t id) {
    std::lock_guard guard{sub_mtx};
    auto it = std::find_if(subscribers.begin(), subscribers.end(),
                           [&](auto& s) { return s->id() == id; });
    if (it == subscribers.end())
      return nullptr;
    if ((*it)->on_own_thread()) {
      (*it)->stop();
      return nullptr;
    }
    auto s = std::move(*it);
    subscribers.erase(it);
    return s;
  }

  connection& pick() {
    return *conns[next.fetch_add(1, std::memory_order_relaxed) % conns.size()];
  }

  std::size_t lane(std::string_view affinity) const noexcept {
    return std::hash<std::string_view>{}(affinity) % conns.size();
  }

  connection& pick(std::string_view affinity) {
    return *conns[lane(affinity)];
  }
};

redis_client::redis_client(redis_options opts)
  : impl_(std::make_shared<impl>()) {
  impl_->ep = parse_url(opts.url);
  impl_->endpoint = fmt::format("{}:{}", impl_->ep.host, impl_->ep.port);
  impl_->opts = std::move(opts);
  auto n = std::max<std::size_t>(1, impl_->opts.connections);
  for (std::size_t i = 0; i < n; ++i)
    impl_->conns.push_back(std::make_unique<connection>(
      impl_.get(), impl_->ep, impl_->opts, impl_->endpoint, impl_->scripts));
}

redis_client::redis_client(redis_cluster_options opts)
  : impl_(std::make_shared<impl>()),
    cluster_(std::make_shared<cluster>(std::move(opts))) {
  impl_->endpoint = cluster_->endpoint;
}

redis_client::~redis_client() {
  if (cluster_) {
    if (cluster_->on_own_thread())
      std::thread{[c = std::move(cluster_)] { c->shutdown(); }}.detach();
    else
      cluster_->shutdown();
    return;
  }
  if (current_client == impl_.get()) {
    // Destroyed by a callback on one of its own threads: that thread cannot
    // join itself, so another one takes the client down once the callback
    // has returned and its loop sees the client closing.
    std::thread{[i = std::move(impl_)]() mutable { i.reset(); }}.detach();
  }
}

const std::string& redis_client::endpoint() const noexcept {
  return impl_->endpoint;
}

namespace {

// Subscription ids, unique in the process: a cluster's subscription may
// live in any of its node clients.
std::atomic<std::uint64_t> next_subscription{1};

} // namespace

std::uint64_t
redis_client::subscribe(std::string channel,
                        std::function<void(std::string_view)> on_message,
                        std::function<void()> on_subscribed) {
  auto id = next_subscription.fetch_add(1);
  if (cluster_) {
    cluster_->subscribe(id, std::move(channel), std::move(on_message),
                        std::move(on_subscribed));
    return id;
  }
  std::lock_guard guard{impl_->sub_mtx};
  impl_->subscribers.push_back(std::make_unique<subscriber>(
    id, impl_.get(), impl_->ep, impl_->opts, std::move(channel),
    std::move(on_message), std::move(on_subscribed)));
  return id;
}

void redis_client::unsubscribe(std::uint64_t id) {
  if (cluster_) {
    cluster_->unsubscribe(id);
    return;
  }
  impl_->take_subscriber(id); // joined here, outside the lock
}

void redis_client::cluster::unsubscribe(std::uint64_t id) {
  std::unique_ptr<subscriber> gone;
  {
    std::lock_guard guard{nodes_mtx_};
    for (auto& [a, n] : nodes_)
      if ((gone = n->client->impl_->take_subscriber(id)))
        break;
  }
  // Joined outside the lock: a subscriber that is moving to another node
  // takes it (next_node).
  gone.reset();
}

void redis_client::cluster::subscribe_on(
  std::uint64_t id, node& n, std::string channel,
  std::function<void(std::string_view)> on_message,
  std::function<void()> on_subscribed) {
  auto& i = *n.client->impl_;
  std::lock_guard guard{i.sub_mtx};
  i.subscribers.push_back(std::make_unique<subscriber>(
    id, &i, i.ep, i.opts, std::move(channel), std::move(on_message),
    std::move(on_subscribed),
    [this](const std::string& host, int port)
      -> std::optional<std::pair<std::string, int>> {
      auto next = next_node(fmt::format("{}:{}", host, port));
      if (!next)
        return std::nullopt;
      return internal::split_address(*next);
    }));
}

void redis_client::async(command cmd, callback done) {
  if (cluster_) {
    cluster_->send(std::move(cmd), std::nullopt, std::move(done));
    return;
  }
  impl_->pick().enqueue(request{std::move(cmd), std::move(done)});
}

void redis_client::async_keep(const std::string* affinity, command cmd,
                              keep_callback done) {
  auto& conn = affinity ? impl_->pick(*affinity) : impl_->pick();
  conn.enqueue(request{std::move(cmd), {}, std::move(done)});
}

void redis_client::async_asking(const std::string* affinity, command cmd,
                                callback done) {
  auto& conn = affinity ? impl_->pick(*affinity) : impl_->pick();
  std::vector<request> both;
  both.reserve(2);
  // ASKING's own reply says nothing cmd's does not: a lost connection fails
  // both, and a command that ASKING did not let in is redirected again.
  both.push_back(request{{"ASKING"}, [](redis_reply, std::exception_ptr) {}});
  both.push_back(request{std::move(cmd), std::move(done)});
  conn.enqueue_many(std::move(both));
}

void redis_client::async(std::string_view affinity, command cmd,
                         callback done) {
  if (cluster_) {
    cluster_->send(std::move(cmd), std::string{affinity}, std::move(done));
    return;
  }
  impl_->pick(affinity).enqueue(request{std::move(cmd), std::move(done)});
}

void redis_client::async_batch(std::vector<command> cmds, batch_callback done) {
  if (cmds.empty()) {
    done({}, nullptr);
    return;
  }
  // The replies gather here; the last one to arrive completes the batch.
  struct state {
    std::mutex mtx;
    std::vector<redis_reply> replies;
    std::exception_ptr error;
    std::size_t left;
    std::size_t answered = 0;
    bool per_node = false;
    batch_callback done;
  };
  auto st = std::make_shared<state>();
  st->replies.resize(cmds.size());
  st->left = cmds.size();
  st->per_node = cluster_ != nullptr;
  st->done = std::move(done);
  std::vector<request> rs;
  rs.reserve(cmds.size());
  for (std::size_t i = 0; i < cmds.size(); ++i)
    rs.push_back(request{std::move(cmds[i]),
                         [st, i](redis_reply r, std::exception_ptr e) {
                           bool last = false;
                           {
                             std::lock_guard guard{st->mtx};
                             if (e) {
                               if (!st->error)
                                 st->error = e;
                               if (st->per_node)
                                 st->replies[i] = failed_reply(e);
                             } else {
                               st->replies[i] = std::move(r);
                               ++st->answered;
                             }
                             last = --st->left == 0;
                           }
                           if (!last)
                             return;
                           // On a cluster one node's failure is that node's
                           // commands' alone (see the header).
                           if (st->error && !(st->per_node && st->answered > 0))
                             st->done({}, st->error);
                           else
                             st->done(std::move(st->replies), nullptr);
                         }});
  if (cluster_) {
    // Each command goes to its own slot's node, those of one node on one
    // connection (in order, as on a single node); the replies gather above.
    auto affinity = cluster_->batch_affinity();
    for (auto& r : rs)
      cluster_->send(std::move(r.cmd), affinity, std::move(r.done));
    return;
  }
  impl_->pick().enqueue_many(std::move(rs));
}

std::size_t redis_client::lane(std::string_view affinity) const noexcept {
  return cluster_ ? 0 : impl_->lane(affinity);
}

void redis_client::eval_async(std::string_view affinity,
                              const redis_script& script,
                              std::vector<std::string> keys,
                              std::vector<std::string> args, callback done) {
  // `affinity` may view one of the keys: read it before they move.
  if (cluster_) {
    try {
      cluster::check_script_keys(script, keys);
    } catch (...) {
      done({}, std::current_exception());
      return;
    }
    std::string lane{affinity};
    cluster_->send(internal::script_command(script, std::move(keys),
                                            std::move(args)),
                   std::move(lane), std::move(done), &script);
    return;
  }
  auto& conn = impl_->pick(affinity);
  // The command comes back with its reply, so the NOSCRIPT fallback
  // rewrites it instead of keeping a copy of its keys and arguments for a
  // reply that almost never needs them.
  conn.enqueue(request{
    internal::script_command(script, std::move(keys), std::move(args)),
    {},
    [&conn, &script, done = std::move(done)](
      redis_reply r, std::exception_ptr e, command&& sent) mutable {
      if (!e && r.type == redis_reply::kind::error
          && r.str.starts_with("NOSCRIPT") && internal::to_eval(sent, script)) {
        // Rare (an admin's SCRIPT FLUSH).
        conn.enqueue(request{std::move(sent), std::move(done)});
        return;
      }
      done(std::move(r), e);
    }});
}

void redis_client::preload(const redis_script& script) {
  if (cluster_) {
    cluster_->preload(script);
    return;
  }
  std::lock_guard guard{impl_->scripts->mtx};
  for (auto* s : impl_->scripts->scripts)
    if (s == &script)
      return;
  impl_->scripts->scripts.push_back(&script);
  impl_->scripts->count.store(impl_->scripts->scripts.size(),
                              std::memory_order_release);
}

redis_reply redis_client::call_raw(command cmd) {
  std::promise<redis_reply> p;
  auto f = p.get_future();
  async(std::move(cmd), [&p](redis_reply r, std::exception_ptr e) {
    if (e)
      p.set_exception(e);
    else
      p.set_value(std::move(r));
  });
  return f.get();
}

redis_reply redis_client::call(command cmd) {
  auto name = cmd.empty() ? std::string{} : cmd[0];
  auto r = call_raw(std::move(cmd));
  if (r.type == redis_reply::kind::error)
    throw_redis_error(name, r);
  return r;
}

std::vector<redis_reply> redis_client::pipeline(std::vector<command> cmds) {
  if (cluster_) {
    // Routed one by one; those of one node go out together on one
    // connection, so they run in order.
    auto affinity = cluster_->batch_affinity();
    std::vector<std::promise<redis_reply>> ps(cmds.size());
    std::vector<std::future<redis_reply>> fs;
    fs.reserve(cmds.size());
    for (auto& p : ps)
      fs.push_back(p.get_future());
    for (std::size_t i = 0; i < cmds.size(); ++i)
      cluster_->send(std::move(cmds[i]), affinity,
                     [&p = ps[i]](redis_reply r, std::exception_ptr e) {
                       if (e)
                         p.set_exception(e);
                       else
                         p.set_value(std::move(r));
                     });
    std::vector<redis_reply> out;
    out.reserve(fs.size());
    for (auto& f : fs)
      f.wait();
    for (auto& f : fs)
      out.push_back(f.get());
    return out;
  }
  auto& conn = impl_->pick();
  // The promises are shared with the callbacks, and every reply is awaited
  // before the first error is thrown: the connection's thread may still be
  // completing later commands when an earlier one failed.
  auto promises =
    std::make_shared<std::vector<std::promise<redis_reply>>>(cmds.size());
  std::vector<std::future<redis_reply>> futures;
  futures.reserve(cmds.size());
  for (size_t i = 0; i < cmds.size(); ++i) {
    futures.push_back((*promises)[i].get_future());
    conn.enqueue(request{std::move(cmds[i]),
                         [promises, i](redis_reply r, std::exception_ptr e) {
                           auto& p = (*promises)[i];
                           if (e)
                             p.set_exception(e);
                           else
                             p.set_value(std::move(r));
                         }});
  }
  for (auto& f : futures)
    f.wait();
  std::vector<redis_reply> out;
  out.reserve(futures.size());
  for (auto& f : futures)
    out.push_back(f.get());
  return out;
}

redis_reply redis_client::eval(const redis_script& script,
                               const std::vector<std::string>& keys,
                               const std::vector<std::string>& args) {
  auto cmd = internal::script_command(script, keys, args);
  if (cluster_) {
    cluster::check_script_keys(script, keys);
    std::promise<redis_reply> p;
    auto f = p.get_future();
    cluster_->send(std::move(cmd), std::nullopt,
                   [&p](redis_reply r, std::exception_ptr e) {
                     if (e)
                       p.set_exception(e);
                     else
                       p.set_value(std::move(r));
                   },
                   &script);
    auto r = f.get();
    if (r.type == redis_reply::kind::error)
      throw_redis_error("script " + script.name(), r);
    return r;
  }
  auto r = call_raw(cmd);
  if (r.type == redis_reply::kind::error && r.str.starts_with("NOSCRIPT")
      && internal::to_eval(cmd, script))
    r = call_raw(std::move(cmd));
  if (r.type == redis_reply::kind::error)
    throw_redis_error("script " + script.name(), r);
  return r;
}

} // namespace botmesh
