#include <botmesh/stores/sqlite/sqlite_durable_backend.hpp>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/sqlite/internal/db.hpp>

namespace botmesh {

namespace {

// Times are Unix milliseconds. state: 0 held, 1 free, 2 done.
constexpr std::string_view schema = R"sql(
CREATE TABLE IF NOT EXISTS durable_inbound (
  id TEXT PRIMARY KEY, key TEXT NOT NULL, message TEXT NOT NULL,
  seq INTEGER NOT NULL, holder TEXT NOT NULL, state INTEGER NOT NULL,
  attempts INTEGER NOT NULL, expires_at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS durable_inbound_open
  ON durable_inbound (state, seq);
CREATE INDEX IF NOT EXISTS durable_inbound_seq ON durable_inbound (seq);
CREATE INDEX IF NOT EXISTS durable_inbound_expiry
  ON durable_inbound (expires_at);
CREATE TABLE IF NOT EXISTS durable_holders (
  holder TEXT PRIMARY KEY, until INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS durable_outbox (
  id TEXT PRIMARY KEY, expires_at INTEGER NOT NULL,
  writer TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS durable_outbox_expiry
  ON durable_outbox (expires_at);
CREATE TABLE IF NOT EXISTS durable_fences (
  key TEXT PRIMARY KEY, fence INTEGER NOT NULL, expires_at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS durable_fences_expiry
  ON durable_fences (expires_at);
)sql";

// Record states besides 0 (held), which the SQL writes literally; a
// corrupted row (3) is kept out of the open ones until it expires.
constexpr std::int64_t free_ = 1, done_ = 2, corrupted_ = 3;

// How long a corrupted row whose own expiry was damaged is kept.
constexpr std::chrono::milliseconds corrupted_kept = std::chrono::hours{24};

// The largest seq a record may have (2^53 - 1, as in the Redis journal):
// above it, a row is damaged.
constexpr std::int64_t max_seq = 9007199254740991;

} // namespace

struct sqlite_durable_backend::impl {
  sqlite_durable_options opts;
  const botmesh::clock* clk;
  std::unique_ptr<internal::db> db;
  std::mutex mtx; // guards the queue only, never held during I/O
  std::condition_variable cv;
  std::deque<std::function<void()>> jobs;
  bool closing = false;
  std::thread io;

  std::int64_t now() const {
    return to_unix_ms(clk->now());
  }

  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock guard{mtx};
        cv.wait(guard, [&] { return closing || !jobs.empty(); });
        if (jobs.empty())
          return;
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      job();
    }
  }

  // outbox_claim; with `made`, outbox_record.
  void take(std::string_view send_id, std::string_view key,
            std::uint64_t fence, std::string_view writer,
            std::chrono::milliseconds ttl, bool made,
            completion<outbox_verdict> done);

  // Runs `fn` on the I/O thread and hands its result (or exception) to
  // `done` there.
  template <class T, class Fn>
  void run(completion<T> done, Fn fn) {
    auto job = [this, done = std::move(done), fn = std::move(fn)]() mutable {
      T out{};
      std::exception_ptr err;
      try {
        if (!db)
          throw error(errc::store_error,
                      "sqlite durable backend: used before start()");
        out = fn();
      } catch (const error&) {
        err = std::current_exception();
      } catch (const std::exception& e) {
        err = std::make_exception_ptr(
          error(errc::store_error,
                fmt::format("sqlite durable backend: {}", e.what())));
      }
      try {
        done(std::move(out), err);
      } catch (...) {
        // A completion must not throw (durable_backend.hpp); if one does,
        // this thread, and every later call, goes on, as in the other
        // backends. Let out of the thread, it would end the process.
      }
    };
    {
      std::lock_guard guard{mtx};
      jobs.push_back(std::move(job));
    }
    cv.notify_one();
  }
};

sqlite_durable_backend::sqlite_durable_backend(sqlite_durable_options opts)
  : impl_(std::make_shared<impl>()) {
  impl_->opts = std::move(opts);
  impl_->clk = impl_->opts.clock ? impl_->opts.clock : &botmesh::clock::system();
  impl_->io = std::thread{[i = impl_.get()] { i->loop(); }};
}

sqlite_durable_backend::~sqlite_durable_backend() {
  {
    std::lock_guard guard{impl_->mtx};
    impl_->closing = true;
  }
  impl_->cv.notify_one();
  impl_->io.join();
}

void sqlite_durable_backend::start() {
  // Opened on the calling thread (start() may block), before any job runs
  // against it: the I/O thread sees it through the queue's mutex.
  std::lock_guard guard{impl_->mtx};
  if (impl_->db)
    return;
  auto d = std::make_unique<internal::db>(impl_->opts.path);
  if (impl_->opts.path != ":memory:")
    d->exec("PRAGMA journal_mode=WAL");
  d->exec(schema);
  // A file made before outbox entries named their writer gets the column;
  // its old entries name none, so no forget takes them back (they stay
  // sent, as they did).
  auto has_writer = [&] {
    internal::stmt s{*d,
                     "SELECT name FROM pragma_table_info('durable_outbox')"};
    bool found = false;
    while (s.step())
      found = found || s.text(0) == "writer";
    return found;
  };
  if (!has_writer()) {
    try {
      d->exec("ALTER TABLE durable_outbox ADD COLUMN writer TEXT NOT NULL "
              "DEFAULT ''");
    } catch (const error&) {
      if (!has_writer()) // (else another process added it just before)
        throw;
    }
  }
  impl_->db = std::move(d);
}

void sqlite_durable_backend::record(journal_record rec,
                                    std::string_view holder,
                                    std::chrono::milliseconds ttl,
                                    completion<journal_put> done) {
  impl_->run<journal_put>(std::move(done), [i = impl_.get(), rec = std::move(rec),
                                            h = std::string{holder}, ttl] {
    auto& d = *i->db;
    internal::transaction tx{d};
    auto t = i->now();
    {
      // Compared in SQL: a fractional expiry is a time too. One that is no
      // number (damaged) keeps a handled record's tombstone, and lets this
      // delivery of the same message take an open one's place (a refusal
      // would come back with every redelivery, for good).
      internal::stmt s{d, "SELECT CASE WHEN typeof(expires_at) IN "
                          "('integer', 'real') THEN expires_at > ? END, "
                          "state = 2 FROM durable_inbound WHERE id = ?"};
      s.bind(1, t).bind(2, rec.id).about(
        fmt::format("sqlite durable backend: record {}", rec.id));
      if (s.step()) {
        bool damaged = s.is_null(0);
        if (damaged ? s.int64(1) == 1 : s.int64(0) == 1)
          return journal_put::duplicate;
      }
    }
    // After the highest sound seq: a damaged row (a seq of text, which
    // sorts above every number, or one past 2^53) would make every new
    // record fail or restart at 1 until it expired; the claim sets it
    // aside. Read backwards on the seq index: one row, not the table.
    std::int64_t seq = 1;
    {
      internal::stmt s{d, "SELECT seq FROM durable_inbound "
                          "WHERE typeof(seq) = 'integer' "
                          "AND seq BETWEEN 0 AND ? ORDER BY seq DESC LIMIT 1"};
      s.bind(1, max_seq - 1);
      if (s.step())
        seq = s.int64(0) + 1;
    }
    internal::stmt s{d, "INSERT OR REPLACE INTO durable_inbound (id, key, "
                        "message, seq, holder, state, attempts, expires_at) "
                        "VALUES (?, ?, ?, ?, ?, 0, 1, ?)"};
    s.bind(1, rec.id).bind(2, rec.key).bind(3, rec.message).bind(4, seq);
    s.bind(5, h).bind(6, t + ttl.count());
    s.run();
    tx.commit();
    return journal_put::recorded;
  });
}

namespace {

// Moves record `id` held by `holder` to `state`; true when it did.
// `unhandled`: a release that gives its attempt back.
bool settle_record(internal::db& d, const std::string& id,
                   const std::string& holder, std::int64_t state,
                   bool unhandled = false) {
  internal::stmt s{d, state == done_
                        ? "UPDATE durable_inbound SET state = ?, holder = '', "
                          "message = '' WHERE id = ? AND holder = ? AND state = 0"
                      : unhandled
                        ? "UPDATE durable_inbound SET state = ?, holder = '', "
                          "attempts = MAX(attempts - 1, 0) "
                          "WHERE id = ? AND holder = ? AND state = 0"
                        : "UPDATE durable_inbound SET state = ?, holder = '' "
                          "WHERE id = ? AND holder = ? AND state = 0"};
  s.bind(1, state).bind(2, id).bind(3, holder);
  return s.run() > 0;
}

} // namespace

void sqlite_durable_backend::confirm(std::string_view id,
                                     std::string_view holder,
                                     completion<bool> done) {
  impl_->run<bool>(std::move(done), [i = impl_.get(), id = std::string{id},
                                     h = std::string{holder}] {
    return settle_record(*i->db, id, h, done_);
  });
}

void sqlite_durable_backend::release(std::string_view id,
                                     std::string_view holder,
                                     completion<bool> done) {
  impl_->run<bool>(std::move(done), [i = impl_.get(), id = std::string{id},
                                     h = std::string{holder}] {
    return settle_record(*i->db, id, h, free_);
  });
}

void sqlite_durable_backend::release_unhandled(std::string_view id,
                                               std::string_view holder,
                                               completion<bool> done) {
  impl_->run<bool>(std::move(done), [i = impl_.get(), id = std::string{id},
                                     h = std::string{holder}] {
    return settle_record(*i->db, id, h, free_, true);
  });
}

void sqlite_durable_backend::beat_and_claim(std::string_view holder,
                                            std::chrono::milliseconds lease,
                                            std::size_t limit,
                                            std::uint32_t max_attempts,
                                            completion<claim_result> done) {
  impl_->run<claim_result>(std::move(done), [i = impl_.get(),
                                             h = std::string{holder}, lease,
                                             limit, max_attempts] {
    auto& d = *i->db;
    internal::transaction tx{d};
    auto t = i->now();
    // On the expiry indexes. A handled record whose expiry is no number
    // (text and blobs sort above every number: ">= ''") is only a
    // tombstone, and would never expire: it goes too. An open one is set
    // aside below, kept a day.
    for (auto sql : {"DELETE FROM durable_inbound WHERE expires_at <= ? OR "
                     "(expires_at >= '' AND +state = 2)",
                     "DELETE FROM durable_outbox WHERE expires_at <= ?",
                     "DELETE FROM durable_fences WHERE expires_at <= ?",
                     "DELETE FROM durable_holders WHERE until <= ?"}) {
      internal::stmt s{d, sql};
      s.bind(1, t);
      s.run();
    }
    {
      internal::stmt s{d, "INSERT OR REPLACE INTO durable_holders (holder, "
                          "until) VALUES (?, ?)"};
      s.bind(1, h).bind(2, t + lease.count());
      s.run();
    }
    claim_result out;
    // A beat that claims nothing (limit 0: an old generation kept alive, a
    // new one's first beat) sets nothing aside either: its caller reads
    // no result, and a row set aside unreported would never be named.
    if (limit > 0) {
      // A state that is none of the four (a number out of range or between
      // two of them, text, a blob: those sort above every number) would
      // never be claimed, confirmed or reported, and would expire unseen
      // with its message: range scans of the (state, seq) index ("+seq":
      // walking the seq index to skip the sort would read every handled
      // row, since the LIMIT is seldom reached). An expiry
      // that is no number would never be swept (text sorts above every
      // time): the sweep above scans the table for it anyway.
      internal::stmt s{d, "SELECT id FROM durable_inbound WHERE state < 0 "
                          "OR state > 3 OR (state > 0 AND state < 1) "
                          "OR (state > 1 AND state < 2) "
                          "OR (state > 2 AND state < 3) "
                          "OR (state BETWEEN 0 AND 1 AND typeof(expires_at) "
                          "NOT IN ('integer', 'real')) ORDER BY +seq LIMIT ?"};
      s.bind(1, static_cast<std::int64_t>(limit));
      while (s.step())
        out.corrupted.push_back(s.text(0));
    }
    // Kept for a look until it expires; one whose expiry is no number, for
    // a day from now.
    auto set_aside = [&](const std::string& id) {
      internal::stmt s{d, "UPDATE durable_inbound SET state = ?, expires_at = "
                          "CASE WHEN typeof(expires_at) IN ('integer', 'real') "
                          "THEN expires_at ELSE ? END WHERE id = ?"};
      s.bind(1, corrupted_).bind(2, t + corrupted_kept.count()).bind(3, id);
      s.run();
    };
    // Before the open rows are read: an expiry that is no number leaves the
    // state open.
    for (auto& id : out.corrupted)
      set_aside(id);
    std::vector<std::pair<journal_record, bool>> picked; // (record, dropped)
    std::vector<std::string> damaged; // set aside once the read is done
    {
      internal::stmt s{
        d, "SELECT id, key, message, seq, attempts FROM durable_inbound "
           "WHERE state = 1 OR (state = 0 AND holder <> ? AND holder NOT IN "
           "(SELECT holder FROM durable_holders)) ORDER BY +seq"};
      s.bind(1, h);
      // Only records claimed to run count against `limit`, as in the
      // other backends: a beat's batch is not spent on given-up or
      // corrupted ones.
      std::size_t taking = 0;
      while (taking < limit && s.step()) {
        journal_record r;
        r.id = s.text(0);
        r.key = s.text(1);
        r.message = s.text(2);
        // A count that is not one (negative, too large, a real, text) is
        // taken out of the open records (named in `corrupted`), not
        // thrown: the whole beat would fail with it, every beat, on every
        // replica, and nothing else would be claimed.
        std::int64_t seq = -1, attempts = -1;
        try {
          seq = s.int64(3);
          attempts = s.int64(4);
        } catch (const error& e) {
          if (e.code() != errc::corrupted_record)
            throw; // still -1 where the column was not read
        }
        if (seq < 0 || seq > max_seq || attempts < 0
            || attempts > std::numeric_limits<std::uint32_t>::max()) {
          damaged.push_back(std::move(r.id));
          continue;
        }
        r.seq = static_cast<std::uint64_t>(seq);
        r.attempts = static_cast<std::uint32_t>(attempts);
        bool drop = r.attempts >= max_attempts;
        if (!drop)
          ++taking;
        picked.emplace_back(std::move(r), drop);
      }
    }
    for (auto& id : damaged) {
      set_aside(id);
      out.corrupted.push_back(std::move(id));
    }
    for (auto& [r, drop] : picked) {
      if (drop) {
        // Held until the caller reported it and confirms it (see
        // durable_backend::beat_and_claim); the confirm drops the message.
        internal::stmt s{d, "UPDATE durable_inbound SET state = 0, holder = ? "
                            "WHERE id = ?"};
        s.bind(1, h).bind(2, r.id);
        s.run();
        out.dropped.push_back(std::move(r));
        continue;
      }
      internal::stmt s{d, "UPDATE durable_inbound SET state = 0, holder = ?, "
                          "attempts = attempts + 1 WHERE id = ?"};
      s.bind(1, h).bind(2, r.id);
      s.run();
      ++r.attempts;
      out.records.push_back(std::move(r));
    }
    tx.commit();
    return out;
  });
}

void sqlite_durable_backend::retire(std::string_view holder,
                                    completion<bool> done) {
  impl_->run<bool>(std::move(done), [i = impl_.get(), h = std::string{holder}] {
    internal::stmt s{*i->db, "DELETE FROM durable_holders WHERE holder = ?"};
    s.bind(1, h);
    return s.run() > 0;
  });
}

void sqlite_durable_backend::outbox_claim(std::string_view send_id,
                                          std::string_view key,
                                          std::uint64_t fence,
                                          std::string_view writer,
                                          std::chrono::milliseconds ttl,
                                          completion<outbox_verdict> done) {
  impl_->take(send_id, key, fence, writer, ttl, false, std::move(done));
}

void sqlite_durable_backend::outbox_record(std::string_view send_id,
                                           std::string_view key,
                                           std::uint64_t fence,
                                           std::string_view writer,
                                           std::chrono::milliseconds ttl,
                                           completion<outbox_verdict> done) {
  impl_->take(send_id, key, fence, writer, ttl, true, std::move(done));
}

void sqlite_durable_backend::impl::take(std::string_view send_id,
                                        std::string_view key,
                                        std::uint64_t fence,
                                        std::string_view writer,
                                        std::chrono::milliseconds ttl,
                                        bool made,
                                        completion<outbox_verdict> done) {
  run<outbox_verdict>(std::move(done), [i = this,
                                               id = std::string{send_id},
                                               k = std::string{key}, fence,
                                               w = std::string{writer}, ttl,
                                               made] {
    auto& d = *i->db;
    internal::transaction tx{d};
    auto t = i->now();
    auto f = static_cast<std::int64_t>(fence);
    auto put = [&] {
      internal::stmt s{d, "INSERT OR REPLACE INTO durable_outbox (id, "
                          "expires_at, writer) VALUES (?, ?, ?)"};
      s.bind(1, id).bind(2, t + ttl.count()).bind(3, w);
      s.run();
    };
    bool fenced = false;
    {
      internal::stmt s{d, "SELECT fence FROM durable_fences WHERE key = ? AND "
                          "expires_at > ?"};
      s.bind(1, k).bind(2, t).about(
        fmt::format("sqlite durable backend: fence of {}", k));
      fenced = s.step() && s.int64(0) > f;
    }
    bool live = false;
    {
      internal::stmt s{d, "SELECT 1 FROM durable_outbox WHERE id = ? AND "
                          "expires_at > ?"};
      s.bind(1, id).bind(2, t);
      live = s.step();
    }
    if (fenced || live) {
      if (made) { // (see outbox_record)
        if (live) {
          // A send made over another writer's live entry: both believe
          // the entry is theirs and either may take it back, though the
          // made send must stay recorded. With no writer, no take-back
          // removes it.
          internal::stmt s{d, "UPDATE durable_outbox SET writer = '' WHERE "
                              "id = ? AND writer <> ?"};
          s.bind(1, id).bind(2, w);
          s.run();
        } else {
          put();
        }
        tx.commit();
      }
      return fenced ? outbox_verdict::fenced : outbox_verdict::duplicate;
    }
    put();
    {
      internal::stmt s{d, "INSERT OR REPLACE INTO durable_fences (key, fence, "
                          "expires_at) VALUES (?, ?, ?)"};
      s.bind(1, k).bind(2, f).bind(3, t + ttl.count());
      s.run();
    }
    tx.commit();
    return outbox_verdict::send;
  });
}

void sqlite_durable_backend::outbox_forget(std::string_view send_id,
                                           std::string_view writer,
                                           completion<bool> done) {
  impl_->run<bool>(std::move(done), [i = impl_.get(),
                                     id = std::string{send_id},
                                     w = std::string{writer}] {
    internal::stmt s{*i->db,
                     "DELETE FROM durable_outbox WHERE id = ? AND writer = ?"};
    s.bind(1, id).bind(2, w);
    return s.run() > 0;
  });
}

} // namespace botmesh
