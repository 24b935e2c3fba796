#include <botmesh/stores/sqlite/internal/db.hpp>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>

namespace botmesh::internal {

db::db(const std::string& path) {
  int rc = sqlite3_open_v2(path.c_str(), &db_,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE
                             | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close(db_);
    db_ = nullptr;
    throw error(errc::store_error,
                fmt::format("sqlite: opening {} failed: {}", path, msg));
  }
  // Writers from other processes wait instead of failing at once.
  sqlite3_busy_timeout(db_, 5000);
}

db::~db() {
  sqlite3_close_v2(db_);
}

void db::fail(std::string_view what) const {
  throw error(errc::store_error,
              fmt::format("sqlite: {} failed: {}", what, sqlite3_errmsg(db_)));
}

void db::exec(std::string_view sql) {
  std::lock_guard guard{mtx_};
  std::string s{sql};
  char* err = nullptr;
  if (sqlite3_exec(db_, s.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    throw error(errc::store_error,
                fmt::format("sqlite: executing \"{}\" failed: {}",
                            s.substr(0, 60), msg));
  }
}

stmt::stmt(db& d, std::string_view sql) : db_(d) {
  if (sqlite3_prepare_v2(d.handle(), sql.data(), static_cast<int>(sql.size()),
                         &s_, nullptr)
      != SQLITE_OK)
    d.fail(fmt::format("preparing \"{}\"", sql.substr(0, 60)));
}

stmt::~stmt() {
  sqlite3_finalize(s_);
}

stmt& stmt::bind(int i, std::string_view v) {
  // The 64-bit length: an int would wrap at 2 GiB, storing a value cut
  // short (or read up to its first NUL) without an error. Past SQLite's
  // own limit the bind fails with SQLITE_TOOBIG, named below.
  if (sqlite3_bind_text64(s_, i, v.data(),
                          static_cast<sqlite3_uint64>(v.size()),
                          SQLITE_TRANSIENT, SQLITE_UTF8)
      != SQLITE_OK)
    db_.fail(fmt::format("binding a text of {} bytes", v.size()));
  return *this;
}

stmt& stmt::bind(int i, std::int64_t v) {
  if (sqlite3_bind_int64(s_, i, v) != SQLITE_OK)
    db_.fail("binding an integer");
  return *this;
}

stmt& stmt::bind_null(int i) {
  if (sqlite3_bind_null(s_, i) != SQLITE_OK)
    db_.fail("binding null");
  return *this;
}

bool stmt::step() {
  int rc = sqlite3_step(s_);
  if (rc == SQLITE_ROW)
    return true;
  if (rc == SQLITE_DONE)
    return false;
  db_.fail(fmt::format("running \"{}\"",
                       std::string_view{sqlite3_sql(s_)}.substr(0, 60)));
}

int stmt::run() {
  while (step()) {
    // results ignored
  }
  return sqlite3_changes(db_.handle());
}

std::string stmt::text(int col) const {
  auto p = sqlite3_column_text(s_, col);
  auto n = sqlite3_column_bytes(s_, col);
  return p ? std::string{reinterpret_cast<const char*>(p),
                         static_cast<size_t>(n)}
           : std::string{};
}

std::int64_t stmt::int64(int col) const {
  switch (sqlite3_column_type(s_, col)) {
    case SQLITE_INTEGER:
      return sqlite3_column_int64(s_, col);
    case SQLITE_NULL:
      return 0;
    case SQLITE_FLOAT:
      corrupted(col, fmt::format("holds the real {}, not an integer",
                                 sqlite3_column_double(s_, col)));
    default: {
      auto shown = text(col);
      if (shown.size() > 40)
        shown = shown.substr(0, 40) + "...";
      corrupted(col, fmt::format("holds \"{}\", not an integer", shown));
    }
  }
}

void stmt::corrupted(int col, std::string_view why) const {
  auto column = fmt::format("column {} {}", sqlite3_column_name(s_, col), why);
  if (about_.empty())
    throw error(errc::corrupted_record, column);
  throw error(errc::corrupted_record,
              fmt::format("{}{}: {}", about_,
                          about_col_ >= 0 ? text(about_col_) : std::string{},
                          column));
}

bool stmt::is_null(int col) const {
  return sqlite3_column_type(s_, col) == SQLITE_NULL;
}

transaction::transaction(db& d) : db_(d), lock_(d.mutex()) {
  db_.exec("BEGIN IMMEDIATE");
}

transaction::~transaction() {
  if (!done_) {
    try {
      db_.exec("ROLLBACK");
    } catch (...) {
      // nop: the connection rolls back on its own when the statement failed
    }
  }
}

void transaction::commit() {
  db_.exec("COMMIT");
  done_ = true;
}

} // namespace botmesh::internal
