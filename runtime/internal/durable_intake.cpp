#include <botmesh/runtime/internal/durable_intake.hpp>

#include <future>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include <botmesh/runtime/bot.hpp>
#include <botmesh/runtime/core/internal/delivery_id.hpp>
#include <botmesh/runtime/core/internal/text.hpp>
#include <botmesh/runtime/core/log.hpp>

namespace botmesh::internal {

namespace {

thread_local durable_turn* current = nullptr;

// The head of a record's outbox ids: its journal id, escaped by
// join_escaped when it holds a '/'. The head then ends at the first plain
// '/', so a message whose id spells another's send ("m/3:f\x1fs", a custom
// provider's) never makes one of that message's send ids (the second send
// would be skipped as a duplicate).
std::string outbox_head(const std::string& record) {
  return join_escaped('/', {record});
}

} // namespace

durable_turn* current_durable_turn() noexcept {
  return current;
}

durable_turn_scope::durable_turn_scope(durable_turn* t) noexcept
  : prev_(current) {
  current = t;
}

durable_turn_scope::~durable_turn_scope() {
  current = prev_;
}

durable_send_scope::durable_send_scope(std::string scope) : turn_(current) {
  if (turn_)
    prev_ = std::exchange(turn_->scope, std::move(scope));
}

durable_send_scope::~durable_send_scope() {
  if (turn_)
    turn_->scope = std::move(prev_);
}

durable_host::~durable_host() {
  // nop
}

durable_intake::durable_intake(const durability_options& opts,
                               std::string holder,
                               std::chrono::milliseconds lease,
                               std::chrono::milliseconds retry_window,
                               durable_host& host)
  : backend_(opts.backend),
    max_attempts_(opts.max_attempts),
    claim_batch_(opts.claim_batch),
    holder_(std::move(holder)),
    lease_(lease),
    retry_window_(retry_window),
    host_(host) {
  // nop
}

// Issues a backend operation: `run` gets a completion to hand the backend;
// wait_idle() waits for every issued operation to complete.
void durable_intake::op(std::function<void(std::function<void()>)> run) {
  {
    std::lock_guard guard{mtx_};
    ++inflight_;
  }
  run([this] {
    std::function<void()> go;
    {
      std::lock_guard guard{mtx_};
      if (--inflight_ == 0) {
        cv_.notify_all();
        go = take_retire();
      }
    }
    if (go)
      go();
  });
}

bool durable_intake::wait_idle(std::chrono::milliseconds bound) {
  std::unique_lock guard{mtx_};
  return cv_.wait_for(guard, bound, [this] { return inflight_ == 0; });
}

durable_counters durable_intake::stats() const noexcept {
  return {reprocessed_.load(), outbox_skipped_.load(), journal_errors_.load()};
}

// A backend operation failed (on a backend thread): an error event.
void durable_intake::failed(const std::string& key, std::string what,
                            std::exception_ptr e) {
  ++journal_errors_;
  auto code = errc::store_error;
  try {
    std::rethrow_exception(e);
  } catch (const error& x) {
    code = x.code();
    what += ": " + std::string{x.what()};
  } catch (const std::exception& x) {
    what += ": " + std::string{x.what()};
  }
  host_.report(code, std::move(what), key);
}

void durable_intake::start() {
  backend_->start();
  // The first beat lands before anything is recorded under this holder:
  // a record whose holder has no heartbeat yet would pass for a dead
  // replica's. (It takes nothing over: the transport is not open yet.)
  std::promise<void> first;
  beat([&first] { first.set_value(); });
  first.get_future().wait();
}

// The message takes its turn (and the provider hears it was accepted) only
// once the record landed. The completions of one chat come in order (see
// durable_backend), so the chat's order is kept.
void durable_intake::journal(std::string key, inbound_message msg,
                             delivery_callbacks cb) {
  // No beat landed yet (the first one failed at start): a record written
  // now would be held by a holder with no heartbeat, which another
  // replica's beat takes over while this one handles it. Refused until a
  // beat lands; the platform retries.
  if (!beat_landed_.load()) {
    ++journal_errors_;
    host_.report(errc::store_error,
                 fmt::format("message {} refused: durable processing has no "
                             "heartbeat yet (its beats failed)",
                             msg.id),
                 key);
    host_.refuse_write(cb, errc::store_error);
    return;
  }
  journal_record rec;
  rec.id = journal_id(key, delivery_id(msg));
  rec.key = key;
  rec.message = to_json(msg);
  // Read before the write leaves: a gap found while it travels counts.
  auto epoch = hb_gaps_.load();
  // Open from here: its generation is not retired under a write in flight.
  auto gen = open_one();
  op([&](std::function<void()> finished) {
    auto id = rec.id;
    backend_->record(
      std::move(rec), holder_of(gen), retry_window_,
      [this, key, id = std::move(id), epoch, gen, msg = std::move(msg),
       cb = std::move(cb),
       finished](journal_put put, std::exception_ptr e) mutable {
        if (e) {
          errc code = errc::store_error;
          try {
            std::rethrow_exception(e);
          } catch (const error& x) {
            code = x.code();
          } catch (...) {
            // store_error
          }
          // Before the provider hears (a chain's next message of the chat
          // may come from its report): the chat's later messages wait. Not
          // for a write the backend refused outright (it never landed).
          if (code != errc::corrupted_record && code != errc::invalid_argument)
            hold(key, id, gen);
          failed(key,
                 fmt::format("recording message {} in the inbound journal",
                             msg.id),
                 e);
          // Logged if it throws: what follows (and finished()) must run,
          // or stop() would wait for this operation for good.
          host_.refuse_write(cb, code);
          // The write may have landed with its reply lost (a timeout, a
          // dropped connection), leaving a record held here that nothing
          // handles while the platform's retry is dropped as a duplicate.
          // Its generation is retired once nothing of it is open, so a
          // beat takes such a record over, also one that lands late. It is
          // not released: a release names (id, holder) only, and this may
          // be a redelivery whose first delivery, held under the same
          // holder, is in its turn right now; freed, another replica would
          // handle it beside this one.
          suspect(gen);
          close_one(gen);
        } else if (put == journal_put::duplicate) {
          close_one(gen);
          host_.duplicate(std::move(cb));
        } else {
          chat_event ev{std::move(msg), 0, {}};
          ev.journal = std::move(id);
          ev.attempt = 1;
          ev.heartbeat_epoch = epoch;
          ev.journal_gen = gen;
          if (!held_back(key, ev, cb))
            host_.accept(std::move(ev), std::move(cb));
        }
        finished();
      });
  });
}

void durable_intake::settle(const std::string& key, const chat_event& ev,
                            bool keep) {
  {
    std::lock_guard guard{mtx_};
    if (auto i = unlanded_.find({ev.journal, ev.journal_gen});
        i != unlanded_.end()) {
      auto& u = i->second;
      u.settle_held = true;
      u.keep = keep;
      u.key = key;
      return; // settled once its entries landed (entry_landed)
    }
  }
  settle_as(key, ev.journal, keep, ev.journal_gen, true);
}

// An outbox entry of `record` was answered: written, or `failed` (kept to
// be written again at the next beat). The last one to land releases the
// settle held back for it.
void durable_intake::entry_landed(const held_record& record,
                                  const entry* failed) {
  std::string key;
  bool keep = false;
  bool held = false;
  std::optional<entry> again;
  {
    std::lock_guard guard{mtx_};
    auto i = unlanded_.find(record);
    if (i == unlanded_.end())
      return;
    auto& u = i->second;
    --u.in_flight;
    if (failed) {
      // Tried again at the next beat. A write of a send taken back since
      // (it may still land: a call that failed on its way) is taken back
      // again instead. While a retire waits for it, or once it is done (a
      // handler that outlived the stop), no beat comes: tried once more now.
      auto e = *failed;
      e.forget = e.forget || u.forgot(e.send_id);
      if ((retiring_ || retired_) && !e.last_try) {
        e.last_try = true;
        ++u.in_flight;
        again = std::move(e);
      } else {
        u.failed.push_back(std::move(e));
      }
    }
    if (u.in_flight == 0 && u.failed.empty()) {
      held = u.settle_held;
      key = std::move(u.key);
      keep = u.keep;
      unlanded_.erase(i);
    }
  }
  // (A retire waiting for this entry goes on once the entry's own call
  // finished: see op(). This runs inside it.)
  if (again)
    resend(record, std::move(*again));
  if (held)
    settle_as(key, record.first, keep, record.second, true);
}

// The send was made (or is being made) without waiting for the verdict:
// recorded even when fenced (outbox_record), or a replay would make it again.
void durable_intake::write_entry(const held_record& record, entry e) {
  op([&](std::function<void()> finished) {
    backend_->outbox_record(
      e.send_id, e.key, e.fence, e.writer, retry_window_,
      [this, record, e, finished](outbox_verdict v, std::exception_ptr x) {
        if (x) {
          failed(e.key, fmt::format("writing outbox entry {}", e.send_id), x);
          entry_landed(record, &e);
        } else {
          if (v == outbox_verdict::fenced)
            host_.report(errc::lease_lost,
                         fmt::format("chat {}: outbox entry {} was written "
                                     "after a later holder of the chat sent",
                                     e.key, e.send_id),
                         e.key);
          // An entry written again at a beat may land after its send was
          // taken back (issued from another thread): taken back again.
          bool forgotten = false;
          {
            std::lock_guard guard{mtx_};
            if (auto i = unlanded_.find(record);
                i != unlanded_.end() && i->second.forgot(e.send_id)) {
              forgotten = true;
              ++i->second.in_flight;
            }
          }
          if (forgotten)
            forget_entry(record,
                         entry{e.send_id, e.key, e.writer, e.fence, true});
          entry_landed(record, nullptr);
        }
        finished();
      });
  });
}

void durable_intake::give_back(const std::string& key,
                               const chat_event& ev) {
  // Never ran: no outbox entry of it can be in flight (see settle()).
  settle_as(key, ev.journal, false, ev.journal_gen, true, true);
}

// `counted`: the record was opened (open_one) and closes once this landed.
// `unhandled`: a release that gives its attempt back.
void durable_intake::settle_as(const std::string& key, const std::string& id,
                               bool keep, std::uint32_t gen, bool counted,
                               bool unhandled) {
  op([&](std::function<void()> finished) {
    auto done = [this, key, id, keep, gen, counted,
                 finished](bool did, std::exception_ptr e) {
      if (e) {
        failed(key,
               fmt::format("{} of journal record {}",
                           keep ? "confirming" : "releasing", id),
               e);
        // It may still be held here, with nothing left to handle it.
        suspect(gen);
      } else if (!did && keep) {
        // Handled here, but no longer held here: another replica may run
        // it again, or it is forgotten and a redelivery is taken as new.
        // (A release that finds it gone wanted it run elsewhere anyway.)
        ++journal_errors_;
        host_.report(
          errc::lease_lost,
          fmt::format("chat {}: journal record {} was no longer held by "
                      "this replica when it was confirmed: its heartbeat "
                      "lapsed and another replica may handle it again, or "
                      "it outlived retry_window",
                      key, id),
          key);
      }
      if (counted)
        close_one(gen);
      finished();
    };
    if (keep)
      backend_->confirm(id, holder_of(gen), std::move(done));
    else if (unhandled)
      backend_->release_unhandled(id, holder_of(gen), std::move(done));
    else
      backend_->release(id, holder_of(gen), std::move(done));
  });
}

std::string durable_intake::holder_of(std::uint32_t gen) const {
  return gen == 0 ? holder_ : fmt::format("{}~{}", holder_, gen);
}

// One more record of the current generation being written or in process.
std::uint32_t durable_intake::open_one() {
  std::lock_guard guard{mtx_};
  ++open_[gen_];
  return gen_;
}

void durable_intake::open_in(std::uint32_t gen) {
  std::lock_guard guard{mtx_};
  ++open_[gen];
}

void durable_intake::close_one(std::uint32_t gen) {
  std::lock_guard guard{mtx_};
  if (auto i = open_.find(gen); i != open_.end() && i->second > 0)
    --i->second;
}

void durable_intake::suspect(std::uint32_t gen) {
  std::lock_guard guard{mtx_};
  if (gen == gen_)
    rotate_ = true;
}

// A beat of the current generation landed (sent at `sent`): the heartbeat
// holds until `sent` + lease - a tenth. A new generation's first beat
// always counts as a gap: the old one's records are no longer known to be
// held without one.
void durable_intake::renewed(steady::rep sent, bool new_generation) {
  beat_landed_ = true;
  auto until = sent
               + std::chrono::duration_cast<steady::duration>(lease_
                                                               - lease_ / 10)
                   .count();
  auto prev = hb_valid_until_.load();
  // Completed after the last validity ran out: it may have run after, too
  // (a beat sent in time can wait in a stalled connection).
  if (new_generation
      || (prev != 0 && steady::now().time_since_epoch().count() >= prev))
    ++hb_gaps_; // it may have lapsed before this beat landed
  if (new_generation) {
    hb_valid_until_ = until;
    return;
  }
  while (prev < until && !hb_valid_until_.compare_exchange_weak(prev, until)) {
    // nop: another beat's completion moved it meanwhile
  }
}

// Renews this replica's heartbeat and takes over what is free or held by
// dead replicas, re-injected in arrival order (from one thread, so the
// router sees that order).
void durable_intake::beat(std::function<void()> done) {
  // The heartbeat this beat renews lasts a lease from when the backend ran
  // it, which is after `sent`: counted from `sent`, minus a margin, it is
  // never believed longer than it lasts.
  auto sent = steady::now().time_since_epoch().count();
  std::uint32_t gen = 0;
  bool rotate = false;
  std::vector<std::uint32_t> retire_now, keep_alive;
  // Outbox entries of first attempts that failed: written again, ahead of
  // the beat (their records' settles wait for them).
  std::vector<std::pair<held_record, entry>> rewrite;
  {
    std::lock_guard guard{mtx_};
    gen = gen_;
    rotate = rotate_;
    for (auto& [g, n] : open_)
      if (g != gen)
        (n == 0 ? retire_now : keep_alive).push_back(g);
    // Until the next generation's first beat landed, records still go
    // under this one: its heartbeat must not lapse meanwhile.
    if (rotate)
      keep_alive.push_back(gen);
    rewrite = take_failed(false);
  }
  for (auto& [record, e] : rewrite)
    resend(record, std::move(e));
  // Old generations: beaten while their events run, then retired (again
  // at the next beat if that failed).
  for (auto g : retire_now)
    op([&](std::function<void()> finished) {
      backend_->retire(holder_of(g), [this, g, finished](bool,
                                                         std::exception_ptr e) {
        if (!e) {
          std::lock_guard guard{mtx_};
          if (auto i = open_.find(g); i != open_.end() && i->second == 0)
            open_.erase(i);
        }
        finished();
      });
    });
  for (auto g : keep_alive)
    op([&](std::function<void()> finished) {
      backend_->beat_and_claim(
        holder_of(g), lease_, 0, max_attempts_,
        [this, finished](durable_backend::claim_result, std::exception_ptr e) {
          if (e)
            failed({}, "the journal beat of an earlier generation", e);
          finished();
        });
    });
  if (rotate) {
    // The new generation's first beat claims nothing: its heartbeat must
    // be in place before a record is written under it (a record whose
    // holder has no heartbeat passes for a dead replica's).
    auto next = gen + 1;
    op([&](std::function<void()> finished) {
      backend_->beat_and_claim(
        holder_of(next), lease_, 0, max_attempts_,
        [this, sent, gen, next, done = std::move(done),
         finished](durable_backend::claim_result, std::exception_ptr e) {
          if (e) {
            failed({}, "the journal beat (heartbeat and claim)", e);
          } else {
            {
              std::lock_guard guard{mtx_};
              if (gen_ == gen) {
                gen_ = next;
                rotate_ = false;
                open_.try_emplace(next, 0);
              }
            }
            renewed(sent, true);
          }
          expire_holds();
          done();
          finished();
        });
    });
    return;
  }
  auto limit = host_.may_claim() ? claim_batch_ : 0;
  // Waited-for ids whose generation was retired before this beat left:
  // a claim that takes all it may finds them, if they landed and no other
  // replica took them first.
  struct findable_id {
    std::string key, id;
    std::uint64_t serial;
  };
  std::vector<findable_id> findable;
  if (limit > 0) {
    std::lock_guard guard{mtx_};
    auto retired = [&](std::uint32_t g) {
      return g < gen && !open_.contains(g);
    };
    for (auto& [key, h] : held_)
      for (auto& item : h.items)
        if (!item.ev && !item.settled
            && std::all_of(item.gens.begin(), item.gens.end(), retired))
          findable.push_back({key, item.id, item.serial});
  }
  op([&](std::function<void()> finished) {
    backend_->beat_and_claim(
      holder_of(gen), lease_, limit, max_attempts_,
      [this, sent, gen, limit, findable = std::move(findable),
       done = std::move(done),
       finished](durable_backend::claim_result r, std::exception_ptr e) {
        if (e) {
          failed({}, "the journal beat (heartbeat and claim)", e);
          if (limit > 0)
            suspect(gen); // it may have claimed records, its reply lost
        } else {
          renewed(sent, false);
          bool whole = r.records.size() + r.dropped.size()
                         + r.corrupted.size()
                       < limit;
          claimed(std::move(r), gen);
          // Not found: it never landed, or another replica took it.
          if (whole)
            for (auto& f : findable)
              if (resolved(f.key, f.id, f.serial))
                release(f.key);
        }
        expire_holds();
        done();
        finished();
      });
  });
}

// -- a chat held back behind a write that failed (see held_) ----------------

void durable_intake::hold(const std::string& key, const std::string& id,
                          std::uint32_t gen) {
  std::lock_guard guard{mtx_};
  if (!holding_)
    return;
  auto& h = held_[key];
  any_held_ = true;
  if (auto item = item_of(h, id); item != h.items.end()) {
    if (item->ev)
      return; // parked: its record is held here and runs here
    // Its retry failed too: waited for under each generation it may be
    // held by, and again if it was settled.
    wait_again(*item, gen);
    return;
  }
  h.items.push_back(held_item{.id = id,
                              .gens = {gen},
                              .until = steady::now() + 2 * lease_,
                              .serial = ++held_serial_});
}

// `item` (waited for) may now be held by `gen` too (under mtx_).
void durable_intake::wait_again(held_item& item, std::uint32_t gen) {
  if (std::find(item.gens.begin(), item.gens.end(), gen) == item.gens.end())
    item.gens.push_back(gen);
  item.serial = ++held_serial_;
  if (item.settled) {
    item.settled = false;
    item.until = steady::now() + 2 * lease_;
  }
}

durable_intake::held_chat* durable_intake::held_of(const std::string& key) {
  if (held_.empty())
    return nullptr;
  auto i = held_.find(key);
  return i == held_.end() ? nullptr : &i->second;
}

std::deque<durable_intake::held_item>::iterator
durable_intake::item_of(held_chat& h, const std::string& id) {
  return std::find_if(h.items.begin(), h.items.end(),
                      [&](const held_item& x) { return x.id == id; });
}

bool durable_intake::waits_before(const held_chat& h,
                                  std::deque<held_item>::const_iterator end,
                                  std::uint32_t gen) {
  return std::any_of(h.items.begin(), end,
                     [&](const held_item& x) { return x.waits_in(gen); });
}

// A message of a chat held back, journaled (`ev.journal` written anew
// under `ev.journal_gen`): parked and acknowledged, or left to the claim.
// False when its chat is not held back (the caller accepts it).
bool durable_intake::held_back(const std::string& key, chat_event& ev,
                               delivery_callbacks& cb) {
  if (!any_held_.load())
    return false;
  delivery_callbacks ack;
  bool to_claim = false;
  std::string msg_id;
  {
    std::lock_guard guard{mtx_};
    auto* held = held_of(key);
    if (!held)
      return false;
    auto& h = *held;
    msg_id = ev.message.id;
    auto gen = ev.journal_gen;
    auto w = item_of(h, ev.journal);
    if (w != h.items.end() && w->ev) {
      // Parked already (a redelivery that was recorded anew after its
      // record was settled elsewhere): not run twice here.
      w = h.items.end();
    }
    if (w != h.items.end()) {
      // A retry written anew: the first write had not landed. It runs in
      // the place that one had, ahead of what came after it; or, written
      // under a generation an earlier id waits in, it is left to the
      // claim there, as a new message would be.
      if (waits_before(h, w, gen)) {
        wait_again(*w, gen);
        to_claim = true;
      } else {
        ack.accepted = std::exchange(cb.accepted, nullptr);
        w->ev = std::move(ev);
        w->cb = std::move(cb);
      }
    } else if (waits_before(h, h.items.end(), gen)) {
      // Held by a generation the chat waits in: the claim that takes the
      // earlier record over takes this one after it (arrival order).
      h.items.push_back(held_item{.id = ev.journal,
                                  .gens = {gen},
                                  .until = steady::now() + 2 * lease_,
                                  .serial = ++held_serial_});
      to_claim = true;
    } else {
      ack.accepted = std::exchange(cb.accepted, nullptr);
      h.items.push_back(
        held_item{.id = ev.journal, .ev = std::move(ev), .cb = std::move(cb)});
    }
    if (!to_claim)
      ++h.acking;
  }
  if (to_claim) {
    host_.acknowledge(cb, msg_id);
    if (cb.turn_ended)
      cb.turn_ended(turn_outcome::untracked);
    // Only once the provider heard: from here a beat may retire the
    // generation and the claim run it.
    close_one(ev.journal_gen); // nothing here handles it
    return true;
  }
  host_.acknowledge(ack, msg_id);
  acked(key);
  return true;
}

// A record taken over here that its held chat waits for (or has parked):
// it waits in its place, so it never overtakes what is ahead of it. False
// for any other (re-injected at once: a record given back, or a dead
// replica's, came before what is parked).
bool durable_intake::park_claimed(const std::string& key, chat_event& ev) {
  if (!any_held_.load())
    return false;
  std::optional<std::uint32_t> dropped_gen;
  delivery_callbacks dropped;
  {
    std::lock_guard guard{mtx_};
    auto* held = held_of(key);
    if (!held)
      return false;
    auto& h = *held;
    auto w = item_of(h, ev.journal);
    if (w == h.items.end() || w->claimed)
      return false;
    if (w->ev) {
      // Parked here, and taken over by this replica: the generation that
      // held it lapsed (its beats failed for a lease). The claim holds it
      // now; it runs once, in its place, as the claimed copy.
      dropped_gen = w->ev->journal_gen;
      dropped = std::exchange(w->cb, {});
    }
    w->ev = std::move(ev);
    w->claimed = true;
  }
  if (dropped_gen) {
    if (dropped.turn_ended)
      dropped.turn_ended(turn_outcome::untracked);
    close_one(*dropped_gen);
  }
  return true;
}

// A waited-for id of `key` is settled (`serial`, when not 0: only if the
// item is as the caller saw it); true when its chat may go on (the caller
// releases it).
bool durable_intake::resolved(const std::string& key, const std::string& id,
                              std::uint64_t serial) {
  std::lock_guard guard{mtx_};
  auto* h = held_of(key);
  if (!h)
    return false;
  auto w = item_of(*h, id);
  if (w == h->items.end() || w->ev || w->settled
      || (serial != 0 && w->serial != serial))
    return false;
  w->settled = true;
  return true;
}

// A parked message's acceptance was reported: its turn may come.
void durable_intake::acked(const std::string& key) {
  {
    std::lock_guard guard{mtx_};
    auto i = held_.find(key);
    if (i == held_.end() || --i->second.acking > 0)
      return;
  }
  release(key);
}

// Routes the chat's parked messages, in order, up to the first id still
// waited for, and while none is being acknowledged (a turn must not end
// before its acceptance is reported). One thread at a time: one that
// parks meanwhile leaves its message to the thread routing.
void durable_intake::release(const std::string& key) {
  bool mine = false;
  for (;;) {
    std::vector<held_item> batch;
    {
      std::lock_guard guard{mtx_};
      auto i = held_.find(key);
      if (i == held_.end())
        return;
      auto& h = i->second;
      if (h.releasing && !mine)
        return;
      if (h.acking == 0)
        while (!h.items.empty()
               && (h.items.front().ev || h.items.front().settled)) {
          if (h.items.front().ev)
            batch.push_back(std::move(h.items.front()));
          h.items.pop_front();
        }
      if (batch.empty()) {
        h.releasing = false;
        if (h.items.empty() && h.acking == 0) {
          held_.erase(i);
          any_held_ = !held_.empty();
        }
        return;
      }
      h.releasing = mine = true;
    }
    for (auto& item : batch)
      if (item.claimed)
        host_.reinject(std::move(*item.ev));
      else
        host_.accept(std::move(*item.ev), std::move(item.cb));
  }
}

// Ids waited for two leases: what is parked behind them runs now, and an
// error event names what it may overtake.
void durable_intake::expire_holds() {
  std::vector<std::pair<std::string, std::string>> expired;
  {
    std::lock_guard guard{mtx_};
    if (held_.empty())
      return;
    auto now = steady::now();
    for (auto& [key, h] : held_) {
      std::string ids;
      for (auto& item : h.items)
        if (!item.ev && !item.settled && now >= item.until) {
          ids += (ids.empty() ? "" : ", ") + item.id;
          item.settled = true;
        }
      if (!ids.empty())
        expired.emplace_back(key, std::move(ids));
    }
  }
  for (auto& [key, ids] : expired) {
    ++journal_errors_;
    host_.report(errc::store_error,
                 fmt::format("chat {}: its later messages run now, before "
                             "journal record(s) {} if they were recorded: "
                             "each one's write failed (or it was left to the "
                             "claim behind one that did), and no beat took "
                             "it over within two leases ({} ms)",
                             key, ids, 2 * lease_.count()),
                 key);
    release(key);
  }
}

void durable_intake::retire(std::function<void()> done) {
  // From here another replica may claim what this one holds while its
  // handlers still run (one that ignores its stop token): their sends wait
  // for the outbox's verdict instead of writing ahead (outbox_allows looks
  // under mtx_, so none slips in between).
  ++hb_gaps_;
  hb_valid_until_ = 0;
  std::vector<std::uint32_t> gens;
  std::vector<std::pair<held_record, entry>> rewrite;
  std::function<void()> go;
  // No beat comes after this: what is parked is refused as the bot stops,
  // its record given back before the generations are retired (given back
  // after, another replica could claim it first and spend an attempt).
  // A chat whose message is being acknowledged, or routed, right now
  // routes the rest itself, to the draining router, which refuses it.
  std::vector<std::pair<std::string, held_item>> parked;
  std::vector<std::string> busy;
  {
    std::lock_guard guard{mtx_};
    holding_ = false;
    for (auto i = held_.begin(); i != held_.end();) {
      auto& h = i->second;
      for (auto& item : h.items)
        item.settled = true;
      if (h.acking > 0 || h.releasing) {
        busy.push_back(i->first);
        ++i;
        continue;
      }
      for (auto& item : h.items)
        if (item.ev)
          parked.emplace_back(i->first, std::move(item));
      i = held_.erase(i);
    }
    any_held_ = !held_.empty();
  }
  for (auto& [key, item] : parked)
    host_.refuse_parked(key, std::move(*item.ev), std::move(item.cb),
                        item.claimed);
  for (auto& key : busy)
    release(key);
  {
    std::lock_guard guard{mtx_};
    for (auto& [g, n] : open_)
      gens.push_back(g);
    if (rotate_)
      gens.push_back(gen_ + 1); // its first beat may have landed unanswered
    // Entries of sends already made must be in the outbox before another
    // replica can claim their records, or its replay sends again: the
    // failed ones are written once more (no beat comes after this), and
    // the retire waits for every entry in flight.
    rewrite = take_failed(true);
    retiring_ = [this, gens, done = std::move(done)]() mutable {
      retire_generations(std::move(gens), std::move(done));
    };
    go = take_retire();
  }
  for (auto& [record, e] : rewrite)
    resend(record, std::move(e));
  if (go)
    go();
}

// Every failed entry, counted in flight again for its resend (under mtx_);
// `last_try`: not tried once more should it fail again.
std::vector<std::pair<durable_intake::held_record, durable_intake::entry>>
durable_intake::take_failed(bool last_try) {
  std::vector<std::pair<held_record, entry>> out;
  for (auto& [record, u] : unlanded_) {
    for (auto& e : u.failed) {
      e.last_try = e.last_try || last_try;
      out.emplace_back(record, std::move(e));
    }
    u.in_flight += u.failed.size();
    u.failed.clear();
  }
  return out;
}

// Writes `e` of `record` again, or takes it back when its send was taken
// back; counted in flight by the caller.
void durable_intake::resend(const held_record& record, entry e) {
  if (e.forget)
    forget_entry(record, std::move(e));
  else
    write_entry(record, std::move(e));
}

// The retire's continuation, once no backend call is in flight (under
// mtx_): the caller runs it after unlocking. Not before: a confirm still
// on its way (on another connection, or queued behind a batch) could land
// after the retire, and another replica's beat would take the handled
// record over and handle it again. Outbox entries must land first too,
// or a replay elsewhere would send again.
std::function<void()> durable_intake::take_retire() {
  if (!retiring_ || inflight_ > 0)
    return {};
  for (auto& [record, u] : unlanded_)
    if (u.in_flight > 0)
      return {};
  retired_ = true;
  return std::exchange(retiring_, {});
}

void durable_intake::retire_generations(std::vector<std::uint32_t> gens,
                                        std::function<void()> done) {
  auto left = std::make_shared<std::atomic<std::size_t>>(gens.size());
  auto shared_done = std::make_shared<std::function<void()>>(std::move(done));
  for (auto g : gens)
    op([&](std::function<void()> finished) {
      backend_->retire(holder_of(g), [left, shared_done,
                                      finished](bool, std::exception_ptr) {
        if (--*left == 0)
          (*shared_done)();
        finished();
      });
    });
}

void durable_intake::claimed(durable_backend::claim_result r,
                             std::uint32_t gen) {
  for (auto& id : r.corrupted)
    host_.report(errc::corrupted_record,
                 fmt::format("journal record {} cannot be decoded: set aside",
                             id),
                 {});
  // Confirmed once its event's listeners ran: a replica that dies before
  // (or a confirm that fails, which retires the generation) leaves the
  // record held by a holder that lapses, so the next one gives it up, and
  // reports it, again. Counted open in its generation until then, so the
  // generation is not retired under it (it would be given up twice).
  std::vector<std::string> go_on; // held chats whose items moved
  auto settled = [&](const std::string& key, const std::string& id) {
    if (resolved(key, id))
      go_on.push_back(key);
  };
  for (auto& rec : r.dropped) {
    settled(rec.key, rec.id);
    open_in(gen);
    host_.report(
      errc::handler_failed,
      fmt::format("chat {}: journal record {} was given up after {} "
                  "attempts (durability.max_attempts)",
                  rec.key, rec.id, rec.attempts),
      rec.key, [this, key = rec.key, id = rec.id, gen] {
        settle_as(key, id, true, gen, true);
      });
  }
  for (auto& rec : r.records) {
    inbound_message msg;
    try {
      msg = inbound_message_from_json(rec.message);
    } catch (const std::exception& e) {
      // Unusable: say so, and confirm it so it is not claimed forever.
      host_.report(errc::corrupted_record,
                   fmt::format("chat {}: journal record {} cannot be decoded "
                               "and is dropped: {}",
                               rec.key, rec.id, e.what()),
                   rec.key);
      settle_as(rec.key, rec.id, true, gen, false);
      settled(rec.key, rec.id);
      continue;
    }
    ++reprocessed_;
    chat_event ev{std::move(msg), 0, {}};
    ev.journal = rec.id;
    ev.attempt = rec.attempts;
    // Never written ahead, even as attempt 1 (a record whose earlier
    // holders only refused it, release_unhandled): its sends wait for the
    // outbox's verdict, as any taken-over record's do.
    ev.heartbeat_epoch = std::numeric_limits<std::uint64_t>::max();
    ev.journal_gen = gen;
    open_in(gen);
    if (park_claimed(rec.key, ev))
      go_on.push_back(rec.key);
    else
      host_.reinject(std::move(ev));
  }
  for (auto& key : go_on)
    release(key);
}

// The validity is read first: renewed() counts a gap before it moves the
// validity on, so a validity that a gap came with is never seen with the
// count from before it.
bool durable_intake::heartbeat_kept(std::uint64_t epoch) const noexcept {
  auto until = hb_valid_until_.load();
  return hb_gaps_.load() == epoch
         && steady::now().time_since_epoch().count() < until;
}

// On a record's first attempt no earlier send of it can exist while the
// holder's heartbeat was kept since the record was written (otherwise a
// replica may have claimed it and sent): the entry is
// written ahead of the send (queued to the backend before the provider is
// called, on the connection that later carries the record's confirm or
// release) without waiting for the verdict; the turn's fence was checked
// locally just before, as for every send. From the second attempt on, or
// after a gap in the heartbeat (a freeze, a backend outage), the send waits
// for the verdict.
bool durable_intake::outbox_allows(const std::string& chat_key) {
  auto* t = current;
  if (!t)
    return true;
  std::string send_id;
  if (t->scope.empty()) {
    send_id = fmt::format("{}/{}", outbox_head(*t->record), t->sends++);
  } else {
    auto i = std::find_if(t->scoped_sends.begin(), t->scoped_sends.end(),
                          [&](auto& s) { return s.first == t->scope; });
    if (i == t->scoped_sends.end())
      i = t->scoped_sends.emplace(t->scoped_sends.end(), t->scope, 0);
    // (The scope's length first: no two scopes make one id.)
    send_id = fmt::format("{}/{}:{}/{}", outbox_head(*t->record),
                          t->scope.size(), t->scope, i->second++);
  }
  t->taken.clear();
  if (t->writer.empty())
    t->writer = fmt::format("{}/{}", holder_, ++writers_);
  bool ahead = false;
  if (t->attempt == 1) {
    // Looked at under mtx_: a retire (which believes the heartbeat lapsed
    // first) either sees this entry in flight and waits for it, or this
    // send sees the heartbeat gone and waits for the verdict.
    std::lock_guard guard{mtx_};
    ahead = heartbeat_kept(t->heartbeat_epoch);
    if (ahead)
      ++unlanded_[{*t->record, t->gen}].in_flight;
  }
  if (ahead) {
    t->taken = send_id;
    write_entry({*t->record, t->gen},
                entry{std::move(send_id), chat_key, t->writer, t->fence});
    return true;
  }
  std::promise<outbox_verdict> p;
  auto f = p.get_future();
  backend_->outbox_claim(send_id, chat_key, t->fence, t->writer,
                         retry_window_,
                         [&p](outbox_verdict v, std::exception_ptr e) {
                           if (e)
                             p.set_exception(e);
                           else
                             p.set_value(v);
                         });
  outbox_verdict v;
  try {
    v = f.get();
  } catch (...) {
    t->lost = true;
    // The claim may have written the entry before its reply was lost (or
    // its call failed on the way back). The send is not made, so what
    // this turn wrote is taken back before the record is released: a
    // replay then makes the send instead of skipping it for good. An
    // entry of an earlier attempt (a send that may have been made) stays.
    take_back(*t, std::move(send_id), true);
    throw;
  }
  switch (v) {
    case outbox_verdict::send:
      t->taken = std::move(send_id);
      return true;
    case outbox_verdict::duplicate:
      ++outbox_skipped_;
      return false;
    case outbox_verdict::fenced:
      break;
  }
  t->lost = true;
  throw lease_lost_error(chat_key, "superseded");
}

void durable_intake::send_failed() {
  auto* t = current;
  if (!t || t->taken.empty())
    return;
  take_back(*t, std::exchange(t->taken, {}));
}

// Takes back `send_id`, written (or perhaps written) by `t`; counted as
// one of its record's entries in flight, so the record's settle waits
// for it.
void durable_intake::take_back(durable_turn& t, std::string send_id,
                               bool again) {
  {
    std::lock_guard guard{mtx_};
    auto& u = unlanded_[{*t.record, t.gen}];
    u.forgotten.push_back(send_id);
    // Not written again at the next beat if its write failed.
    std::erase_if(u.failed, [&](const entry& e) {
      return e.send_id == send_id && !e.forget;
    });
    ++u.in_flight;
  }
  entry e{std::move(send_id), *t.key, t.writer, t.fence, true};
  e.again = again;
  forget_entry({*t.record, t.gen}, std::move(e));
}

// Takes `e` of `record` back; the caller counted it as one of the
// record's entries in flight, so its settle waits for it. A failure is
// tried again at the next beat, as a failed entry write is.
void durable_intake::forget_entry(const held_record& record, entry e) {
  op([&](std::function<void()> finished) {
    auto id = e.send_id;
    auto writer = e.writer;
    backend_->outbox_forget(
      id, writer,
      [this, record, e = std::move(e), finished](bool, std::exception_ptr x) {
        if (x) {
          failed(e.key,
                 fmt::format("taking back outbox entry {} of a send that "
                             "failed or was not made",
                             e.send_id),
                 x);
          entry_landed(record, &e);
        } else if (e.again) {
          // Once more at the next beat (kept as failed entries are).
          auto later = e;
          later.again = false;
          entry_landed(record, &later);
        } else {
          entry_landed(record, nullptr);
        }
        finished();
      });
  });
}

} // namespace botmesh::internal
