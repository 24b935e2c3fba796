#include <botmesh/stores/redis/redis_durable_backend.hpp>

#include <charconv>
#include <functional>
#include <mutex>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/internal/scripts.hpp>

namespace botmesh {

namespace {

std::exception_ptr reply_error(std::string_view what, const redis_reply& r) {
  if (r.type == redis_reply::kind::error) {
    if (r.str.find("corrupted durable") != std::string::npos)
      return std::make_exception_ptr(
        error(errc::corrupted_record, fmt::format("{}: {}", what, r.str)));
    return std::make_exception_ptr(
      error(errc::store_error, fmt::format("{}: Redis error: {}", what, r.str)));
  }
  return nullptr;
}

std::exception_ptr bad_reply(std::string_view what, const redis_reply& r) {
  return std::make_exception_ptr(error(
    errc::corrupted_record,
    fmt::format("{}: unexpected Redis reply of type {}", what, to_string(r.type))));
}

// One operation's reply in a batch: the error to complete it with (the
// batch's, an error reply, or a reply that is no integer), or null.
std::exception_ptr integer_or_error(std::string_view what, const redis_reply* r,
                                    std::exception_ptr e) {
  if (!e)
    e = reply_error(what, *r);
  if (!e && r->type != redis_reply::kind::integer)
    e = bad_reply(what, *r);
  return e;
}

std::uint64_t to_u64(std::string_view what, std::string_view s) {
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size())
    throw error(errc::corrupted_record,
                fmt::format("{}: \"{}\" is not a count", what, s));
  return v;
}

// Flat id, key, message, seq, attempts lists of durable_claim.lua.
std::vector<journal_record> records_of(const redis_reply& r) {
  if (r.type != redis_reply::kind::array || r.elements.size() % 5 != 0)
    throw error(errc::corrupted_record,
                "durable_claim: a record list is not a multiple of 5 strings");
  std::vector<journal_record> out;
  for (std::size_t i = 0; i < r.elements.size(); i += 5) {
    for (std::size_t j = 0; j < 5; ++j)
      if (r.elements[i + j].type != redis_reply::kind::string)
        throw error(errc::corrupted_record,
                    "durable_claim: a record field is not a string");
    journal_record rec;
    rec.id = r.elements[i].str;
    rec.key = r.elements[i + 1].str;
    rec.message = r.elements[i + 2].str;
    auto what = fmt::format("durable record {}", rec.id);
    rec.seq = to_u64(what, r.elements[i + 3].str);
    rec.attempts = static_cast<std::uint32_t>(to_u64(what, r.elements[i + 4].str));
    out.push_back(std::move(rec));
  }
  return out;
}

} // namespace

// Record, confirm, release and outbox claims are queued, and what was
// queued while a call was in flight goes out as the next call: one
// durable_journal and one durable_outbox script for the whole batch,
// written back to back on one connection. A busy bot then pays one script
// call (one Redis command, one reply to parse, one wake-up) per batch
// rather than three per message, and a single call in flight costs an
// idle bot nothing. The completions run once both replies are in, in the
// order the operations were issued.
class op_batcher : public std::enable_shared_from_this<op_batcher> {
 public:
  // The reply of one operation (an element of its script's reply), or the
  // failure of the whole call.
  using done_fn = std::function<void(const redis_reply*, std::exception_ptr)>;

  op_batcher(std::shared_ptr<redis_client> client, std::string inbound,
             std::string outbox)
    : client_(std::move(client)),
      in_keys_{inbound + "rec", inbound + "open", inbound + "exp",
               inbound + "seq"},
      out_keys_{outbox + "sent", outbox + "fence", outbox + "fexp",
                outbox + "by"} {
    // nop
  }

  // `outbox` chooses the script; `args` are the operation's, appended to
  // that script's arguments.
  void submit(bool outbox, std::vector<std::string> args, done_fn done) {
    std::vector<op> batch;
    {
      std::lock_guard guard{mtx_};
      queued_.push_back(op{outbox, std::move(args), std::move(done)});
      if (in_flight_)
        return;
      in_flight_ = true;
      batch = take();
    }
    send(std::move(batch));
  }

 private:
  struct op {
    bool outbox;
    std::vector<std::string> args;
    done_fn done;
  };

  // A call carries at most this many operations and (past its first
  // operation) this many bytes of arguments, so one call never holds the
  // server for long; the rest waits for the next call.
  static constexpr std::size_t max_ops = 256;
  static constexpr std::size_t max_bytes = 1 << 20;

  std::vector<op> take() {
    std::size_t n = 0, bytes = 0;
    while (n < queued_.size() && n < max_ops) {
      for (auto& a : queued_[n].args)
        bytes += a.size();
      if (n > 0 && bytes > max_bytes)
        break;
      ++n;
    }
    std::vector<op> out;
    if (n == queued_.size()) {
      out.swap(queued_);
    } else {
      auto end = queued_.begin() + static_cast<std::ptrdiff_t>(n);
      out.assign(std::make_move_iterator(queued_.begin()),
                 std::make_move_iterator(end));
      queued_.erase(queued_.begin(), end);
    }
    return out;
  }

  struct call {
    std::vector<op> ops;
    int pending = 0;
    redis_reply journal, outbox;
    std::exception_ptr journal_error, outbox_error;
  };

  void send(std::vector<op> batch) {
    auto c = std::make_shared<call>();
    c->ops = std::move(batch);
    std::vector<std::string> in_args, out_args;
    for (auto& o : c->ops) {
      auto& to = o.outbox ? out_args : in_args;
      for (auto& a : o.args)
        to.push_back(std::move(a));
      o.args.clear();
    }
    c->pending = (in_args.empty() ? 0 : 1) + (out_args.empty() ? 0 : 1);
    auto self = shared_from_this();
    // One lane for both: on a standalone server they are written together
    // and answered in order (a cluster routes each by its slot).
    auto issue = [&](bool outbox, std::vector<std::string> args) {
      auto done = [self, c, outbox](redis_reply r, std::exception_ptr e) {
        (outbox ? c->outbox : c->journal) = std::move(r);
        (outbox ? c->outbox_error : c->journal_error) = e;
        // Both replies come on one connection's thread on a standalone
        // server; a cluster may answer them on two.
        std::unique_lock guard{self->mtx_};
        if (--c->pending > 0)
          return;
        self->ready_.push_back(c);
        if (self->delivering_)
          return; // the thread delivering takes it next, in order
        self->delivering_ = true;
        self->pump(guard);
      };
      // A call that cannot even be issued completes its operations with
      // the error, as a lost reply would: none is left hanging.
      try {
        client_->eval_async("durable",
                            outbox ? internal::lua().durable_outbox
                                   : internal::lua().durable_journal,
                            outbox ? out_keys_ : in_keys_, std::move(args),
                            done);
      } catch (...) {
        done({}, std::current_exception());
      }
    };
    if (!in_args.empty())
      issue(false, std::move(in_args));
    if (!out_args.empty())
      issue(true, std::move(out_args));
  }

  // Sends the next batch and runs the completions of completed calls, in
  // order. `guard` holds mtx_; it is released around the sends and the
  // completions (which may submit again).
  void pump(std::unique_lock<std::mutex>& guard) {
    while (!ready_.empty()) {
      auto c = std::move(ready_.front());
      ready_.erase(ready_.begin());
      std::vector<op> next;
      if (!queued_.empty())
        next = take();
      else
        in_flight_ = false;
      guard.unlock();
      if (!next.empty())
        send(std::move(next));
      complete(*c);
      guard.lock();
    }
    delivering_ = false;
  }

  static void complete(call& c) {
    std::size_t in_i = 0, out_i = 0;
    for (auto& o : c.ops) {
      auto& r = o.outbox ? c.outbox : c.journal;
      auto e = o.outbox ? c.outbox_error : c.journal_error;
      auto& i = o.outbox ? out_i : in_i;
      const redis_reply* mine = nullptr;
      if (!e) {
        auto what = o.outbox ? "durable_outbox" : "durable_journal";
        if (r.type == redis_reply::kind::error)
          e = reply_error(what, r);
        else if (r.type != redis_reply::kind::array)
          e = bad_reply(what, r);
        else if (i >= r.elements.size())
          e = std::make_exception_ptr(error(
            errc::corrupted_record,
            fmt::format("{}: {} replies for more operations", what,
                        r.elements.size())));
        else
          mine = &r.elements[i];
      }
      ++i;
      try {
        o.done(mine, e);
      } catch (...) {
        // A completion must not throw; if one does, the others still run
        // and the batcher goes on.
      }
    }
  }

  std::shared_ptr<redis_client> client_;
  std::vector<std::string> in_keys_;
  std::vector<std::string> out_keys_;
  std::mutex mtx_;
  std::vector<op> queued_;
  bool in_flight_ = false;
  std::vector<std::shared_ptr<call>> ready_;
  bool delivering_ = false;
};

struct redis_durable_backend::impl {
  std::shared_ptr<redis_client> client;
  std::string inbound; // p:{durable:inbound}:
  std::string outbox;  // p:{durable:outbox}:
  std::shared_ptr<op_batcher> batch;

  std::vector<std::string> in_keys(std::initializer_list<const char*> parts) const {
    std::vector<std::string> out;
    for (auto p : parts)
      out.push_back(inbound + p);
    return out;
  }

  // outbox_claim and outbox_record; `ttl` is the script's argument.
  void take(std::string_view send_id, std::string_view key,
            std::uint64_t fence, std::string_view writer, std::string ttl,
            completion<outbox_verdict> done);
};

redis_durable_backend::redis_durable_backend(redis_durable_options opts)
  : impl_(std::make_unique<impl>()) {
  if (!opts.client)
    throw invalid_argument_error("client",
                                 "redis_durable_options.client is required");
  if (opts.prefix.empty())
    throw invalid_argument_error("prefix", "the Redis key prefix must not be "
                                           "empty");
  impl_->client = std::move(opts.client);
  impl_->inbound = opts.prefix + ":{durable:inbound}:";
  impl_->outbox = opts.prefix + ":{durable:outbox}:";
  impl_->batch = std::make_shared<op_batcher>(impl_->client, impl_->inbound,
                                              impl_->outbox);
}

redis_durable_backend::~redis_durable_backend() {
  // nop
}

void redis_durable_backend::start() {
  auto& l = internal::lua();
  for (auto* s : {&l.durable_journal, &l.durable_claim, &l.durable_outbox})
    impl_->client->preload(*s);
}

void redis_durable_backend::record(journal_record rec, std::string_view holder,
                                   std::chrono::milliseconds ttl,
                                   completion<journal_put> done) {
  impl_->batch->submit(
    false,
    {"r", std::move(rec.id), std::move(rec.key), std::move(rec.message),
     std::string{holder}, std::to_string(ttl.count())},
    [done = std::move(done)](const redis_reply* r, std::exception_ptr e) {
      if (auto x = integer_or_error("durable_journal (record)", r, e))
        return done(journal_put::duplicate, x);
      done(r->integer == 0 ? journal_put::duplicate : journal_put::recorded,
           nullptr);
    });
}

namespace {

void settle(op_batcher& b, std::string_view id, std::string_view holder,
            const char* mode, durable_backend::completion<bool> done) {
  b.submit(false, {mode, std::string{id}, std::string{holder}},
           [done = std::move(done)](const redis_reply* r, std::exception_ptr e) {
             e = integer_or_error("durable_journal (settle)", r, e);
             done(!e && r->integer == 1, e);
           });
}

} // namespace

void redis_durable_backend::confirm(std::string_view id,
                                    std::string_view holder,
                                    completion<bool> done) {
  settle(*impl_->batch, id, holder, "d", std::move(done));
}

void redis_durable_backend::release(std::string_view id,
                                    std::string_view holder,
                                    completion<bool> done) {
  settle(*impl_->batch, id, holder, "f", std::move(done));
}

void redis_durable_backend::release_unhandled(std::string_view id,
                                              std::string_view holder,
                                              completion<bool> done) {
  settle(*impl_->batch, id, holder, "u", std::move(done));
}

void redis_durable_backend::beat_and_claim(std::string_view holder,
                                           std::chrono::milliseconds lease,
                                           std::size_t limit,
                                           std::uint32_t max_attempts,
                                           completion<claim_result> done) {
  impl_->client->eval_async(
    holder, internal::lua().durable_claim,
    impl_->in_keys({"rec", "open", "exp", "hb"}),
    {std::string{holder}, std::to_string(lease.count()), std::to_string(limit),
     std::to_string(max_attempts)},
    [done = std::move(done)](redis_reply r, std::exception_ptr e) {
      if (!e)
        e = reply_error("durable_claim", r);
      claim_result out;
      if (!e) {
        try {
          if (r.type != redis_reply::kind::array || r.elements.size() != 3)
            throw error(errc::corrupted_record,
                        "durable_claim: the reply is not 3 lists");
          out.records = records_of(r.elements[0]);
          out.dropped = records_of(r.elements[1]);
          for (auto& id : r.elements[2].elements)
            out.corrupted.push_back(id.str);
        } catch (...) {
          e = std::current_exception();
        }
      }
      done(std::move(out), e);
    });
}

void redis_durable_backend::retire(std::string_view holder,
                                   completion<bool> done) {
  impl_->client->async(
    holder, {"ZREM", impl_->inbound + "hb", std::string{holder}},
    [done = std::move(done)](redis_reply r, std::exception_ptr e) {
      if (!e)
        e = reply_error("durable retire (ZREM)", r);
      done(!e && r.integer == 1, e);
    });
}

void redis_durable_backend::outbox_claim(std::string_view send_id,
                                         std::string_view key,
                                         std::uint64_t fence,
                                         std::string_view writer,
                                         std::chrono::milliseconds ttl,
                                         completion<outbox_verdict> done) {
  impl_->take(send_id, key, fence, writer, std::to_string(ttl.count()),
              std::move(done));
}

// A made send's TTL goes with an "r" ahead of it (see durable_outbox.lua).
void redis_durable_backend::outbox_record(std::string_view send_id,
                                          std::string_view key,
                                          std::uint64_t fence,
                                          std::string_view writer,
                                          std::chrono::milliseconds ttl,
                                          completion<outbox_verdict> done) {
  impl_->take(send_id, key, fence, writer, "r" + std::to_string(ttl.count()),
              std::move(done));
}

void redis_durable_backend::impl::take(std::string_view send_id,
                                       std::string_view key,
                                       std::uint64_t fence,
                                       std::string_view writer,
                                       std::string ttl,
                                       completion<outbox_verdict> done) {
  batch->submit(
    true,
    {std::string{send_id}, std::string{key}, std::to_string(fence),
     std::string{writer}, std::move(ttl)},
    [done = std::move(done)](const redis_reply* r, std::exception_ptr e) {
      if (auto x = integer_or_error("durable_outbox", r, e))
        return done(outbox_verdict::fenced, x);
      done(r->integer > 0    ? outbox_verdict::send
           : r->integer == 0 ? outbox_verdict::duplicate
                             : outbox_verdict::fenced,
           nullptr);
    });
}

void redis_durable_backend::outbox_forget(std::string_view send_id,
                                          std::string_view writer,
                                          completion<bool> done) {
  // In the outbox script's batch (a "forget" in place of the TTL): after
  // the claims issued before it, as the contract asks.
  impl_->batch->submit(
    true, {std::string{send_id}, "", "0", std::string{writer}, "forget"},
    [done = std::move(done)](const redis_reply* r, std::exception_ptr e) {
      if (auto x = integer_or_error("durable_outbox", r, e))
        return done(false, x);
      done(r->integer > 0, nullptr);
    });
}

} // namespace botmesh
