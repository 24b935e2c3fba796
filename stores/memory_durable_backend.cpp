#include <botmesh/stores/memory_durable_backend.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/internal/text.hpp>

namespace botmesh {

// -- durable_backend (shared definitions) -------------------------------------

durable_backend::~durable_backend() {
  // nop
}

std::string_view to_string(journal_put p) noexcept {
  switch (p) {
    case journal_put::recorded:
      return "recorded";
    case journal_put::duplicate:
      return "duplicate";
  }
  return "?";
}

std::string_view to_string(outbox_verdict v) noexcept {
  switch (v) {
    case outbox_verdict::send:
      return "send";
    case outbox_verdict::duplicate:
      return "duplicate";
    case outbox_verdict::fenced:
      return "fenced";
  }
  return "?";
}

std::string journal_id(std::string_view chat_key, std::string_view message_id) {
  // Escaped when a part holds '#': "a#b" + "c" and "a" + "b#c" stay two
  // ids (one would be taken for the other's duplicate).
  return internal::join_escaped('#', {chat_key, message_id});
}

// -- memory_durable_backend ---------------------------------------------------

namespace {

enum class rstate { held, free, done };

struct row {
  journal_record rec;
  std::string holder;
  rstate state = rstate::held;
  std::int64_t expires = 0;
};

struct sent_row {
  std::int64_t expires = 0;
  std::string writer{}; // who took it (see outbox_forget)
};

} // namespace

struct memory_durable_backend::impl {
  const botmesh::clock* clk;
  mutable std::mutex mtx;
  std::unordered_map<std::string, row> rows;
  std::unordered_map<std::string, std::int64_t> beats; // holder -> until
  std::unordered_map<std::string, sent_row> sent;
  std::unordered_map<std::string, std::pair<std::uint64_t, std::int64_t>>
    fences; // chat -> (fence, expires)
  std::uint64_t seq = 0;

  std::int64_t now() const {
    return to_unix_ms(clk->now());
  }

  // Drops what expired (called under mtx).
  void purge(std::int64_t t) {
    std::erase_if(rows, [t](auto& kv) { return kv.second.expires <= t; });
    std::erase_if(sent, [t](auto& kv) { return kv.second.expires <= t; });
    std::erase_if(fences, [t](auto& kv) { return kv.second.second <= t; });
  }

  // A send made (written ahead) over another writer's live entry: both
  // believe the entry is theirs and either may take it back, though the
  // made send must stay recorded. With no writer, no take-back removes it.
  static void protect(sent_row& row, std::string_view writer) {
    if (row.writer != writer)
      row.writer.clear();
  }

  // outbox_claim; with `made`, outbox_record.
  outbox_verdict take(std::string_view send_id, std::string_view key,
                      std::uint64_t fence, std::string_view writer,
                      std::chrono::milliseconds ttl, bool made);
};

memory_durable_backend::memory_durable_backend(const botmesh::clock* clock)
  : impl_(std::make_unique<impl>()) {
  impl_->clk = clock ? clock : &botmesh::clock::system();
}

memory_durable_backend::~memory_durable_backend() {
  // nop
}

void memory_durable_backend::record(journal_record rec, std::string_view holder,
                                    std::chrono::milliseconds ttl,
                                    completion<journal_put> done) {
  journal_put out;
  {
    std::lock_guard guard{impl_->mtx};
    auto t = impl_->now();
    auto i = impl_->rows.find(rec.id);
    if (i != impl_->rows.end() && i->second.expires > t) {
      out = journal_put::duplicate;
    } else {
      rec.seq = ++impl_->seq;
      rec.attempts = 1;
      auto id = rec.id;
      impl_->rows[id] = row{std::move(rec), std::string{holder}, rstate::held,
                            t + ttl.count()};
      out = journal_put::recorded;
    }
  }
  done(out, nullptr);
}

namespace {

// Moves record `id` held by `holder` to `to` (done: a tombstone, or free);
// true when it did. Called under the backend's mutex.
// `unhandled`: a release that gives its attempt back.
bool settle(std::unordered_map<std::string, row>& rows, std::string_view id,
            std::string_view holder, rstate to, bool unhandled = false) {
  auto i = rows.find(std::string{id});
  if (i == rows.end() || i->second.state != rstate::held
      || i->second.holder != holder)
    return false;
  i->second.state = to;
  i->second.holder.clear();
  if (to == rstate::done)
    i->second.rec.message.clear();
  if (unhandled && i->second.rec.attempts > 0)
    --i->second.rec.attempts;
  return true;
}

} // namespace

void memory_durable_backend::confirm(std::string_view id,
                                     std::string_view holder,
                                     completion<bool> done) {
  bool ok;
  {
    std::lock_guard guard{impl_->mtx};
    ok = settle(impl_->rows, id, holder, rstate::done);
  }
  done(ok, nullptr);
}

void memory_durable_backend::release(std::string_view id,
                                     std::string_view holder,
                                     completion<bool> done) {
  bool ok;
  {
    std::lock_guard guard{impl_->mtx};
    ok = settle(impl_->rows, id, holder, rstate::free);
  }
  done(ok, nullptr);
}

void memory_durable_backend::release_unhandled(std::string_view id,
                                               std::string_view holder,
                                               completion<bool> done) {
  bool ok;
  {
    std::lock_guard guard{impl_->mtx};
    ok = settle(impl_->rows, id, holder, rstate::free, true);
  }
  done(ok, nullptr);
}

void memory_durable_backend::beat_and_claim(std::string_view holder,
                                            std::chrono::milliseconds lease,
                                            std::size_t limit,
                                            std::uint32_t max_attempts,
                                            completion<claim_result> done) {
  claim_result out;
  {
    std::lock_guard guard{impl_->mtx};
    auto t = impl_->now();
    impl_->purge(t);
    impl_->beats[std::string{holder}] = t + lease.count();
    auto alive = [&](const std::string& h) {
      auto b = impl_->beats.find(h);
      return b != impl_->beats.end() && b->second > t;
    };
    std::vector<row*> take;
    for (auto& [id, r] : impl_->rows)
      if (r.state == rstate::free
          || (r.state == rstate::held && r.holder != holder && !alive(r.holder)))
        take.push_back(&r);
    std::sort(take.begin(), take.end(),
              [](row* a, row* b) { return a->rec.seq < b->rec.seq; });
    for (auto* r : take) {
      if (out.records.size() >= limit)
        break;
      if (r->rec.attempts >= max_attempts) {
        // Held until the caller reported it and confirms it (see
        // durable_backend::beat_and_claim); the confirm drops the message.
        r->state = rstate::held;
        r->holder = std::string{holder};
        out.dropped.push_back(r->rec);
        continue;
      }
      ++r->rec.attempts;
      r->state = rstate::held;
      r->holder = std::string{holder};
      out.records.push_back(r->rec);
    }
    std::erase_if(impl_->beats, [t](auto& kv) { return kv.second <= t; });
  }
  done(std::move(out), nullptr);
}

void memory_durable_backend::retire(std::string_view holder,
                                    completion<bool> done) {
  bool ok;
  {
    std::lock_guard guard{impl_->mtx};
    ok = impl_->beats.erase(std::string{holder}) > 0;
  }
  done(ok, nullptr);
}

void memory_durable_backend::outbox_claim(std::string_view send_id,
                                          std::string_view key,
                                          std::uint64_t fence,
                                          std::string_view writer,
                                          std::chrono::milliseconds ttl,
                                          completion<outbox_verdict> done) {
  done(impl_->take(send_id, key, fence, writer, ttl, false), nullptr);
}

void memory_durable_backend::outbox_record(std::string_view send_id,
                                           std::string_view key,
                                           std::uint64_t fence,
                                           std::string_view writer,
                                           std::chrono::milliseconds ttl,
                                           completion<outbox_verdict> done) {
  done(impl_->take(send_id, key, fence, writer, ttl, true), nullptr);
}

outbox_verdict memory_durable_backend::impl::take(std::string_view send_id,
                                                  std::string_view key,
                                                  std::uint64_t fence,
                                                  std::string_view writer,
                                                  std::chrono::milliseconds ttl,
                                                  bool made) {
  outbox_verdict out;
  {
    std::lock_guard guard{mtx};
    auto t = now();
    auto& f = fences[std::string{key}];
    if (f.second <= t)
      f = {0, 0};
    auto s = sent.find(std::string{send_id});
    bool live = s != sent.end() && s->second.expires > t;
    out = fence < f.first ? outbox_verdict::fenced
          : live          ? outbox_verdict::duplicate
                          : outbox_verdict::send;
    if (out == outbox_verdict::send)
      f = {fence, t + ttl.count()};
    if (live && made)
      protect(s->second, writer); // (see outbox_record)
    else if (!live && (made || out == outbox_verdict::send))
      sent[std::string{send_id}] = sent_row{t + ttl.count(),
                                            std::string{writer}};
  }
  return out;
}

void memory_durable_backend::outbox_forget(std::string_view send_id,
                                           std::string_view writer,
                                           completion<bool> done) {
  bool removed = false;
  {
    std::lock_guard guard{impl_->mtx};
    auto i = impl_->sent.find(std::string{send_id});
    if (i != impl_->sent.end() && i->second.writer == writer) {
      impl_->sent.erase(i);
      removed = true;
    }
  }
  done(removed, nullptr);
}

std::size_t memory_durable_backend::size() const {
  std::lock_guard guard{impl_->mtx};
  return impl_->rows.size();
}

} // namespace botmesh
