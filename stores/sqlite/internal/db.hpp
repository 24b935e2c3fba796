#pragma once

// Internal: a thin RAII layer over one SQLite connection. Included only by
// .cpp files of stores/sqlite (it pulls in sqlite3.h).

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <sqlite3.h>

namespace botmesh::internal {

/// One connection, serialized by a mutex (SQLite connections are not meant
/// for concurrent use). Every error throws `botmesh::error` with
/// `errc::store_error` naming the operation and SQLite's message.
class db {
 public:
  explicit db(const std::string& path);
  ~db();

  db(const db&) = delete;
  db& operator=(const db&) = delete;

  void exec(std::string_view sql);

  sqlite3* handle() noexcept {
    return db_;
  }

  std::recursive_mutex& mutex() noexcept {
    return mtx_;
  }

  [[noreturn]] void fail(std::string_view what) const;

 private:
  sqlite3* db_ = nullptr;
  std::recursive_mutex mtx_;
};

/// A prepared statement; bind by 1-based index, step, read columns.
class stmt {
 public:
  stmt(db& d, std::string_view sql);
  ~stmt();

  stmt(const stmt&) = delete;
  stmt& operator=(const stmt&) = delete;

  stmt& bind(int i, std::string_view v);
  stmt& bind(int i, std::int64_t v);
  stmt& bind_null(int i);

  /// Names the record the rows belong to, so a damaged column's error says
  /// which record it is in: `what`, followed by the text of column
  /// `key_col` of the row when one is given (read only on an error).
  stmt& about(std::string what, int key_col = -1) {
    about_ = std::move(what);
    about_col_ = key_col;
    return *this;
  }

  /// True while a row is available.
  bool step();

  /// Runs a statement that returns no rows; returns changed rows.
  int run();

  std::string text(int col) const;
  /// The column's integer; NULL reads as 0 (an aggregate over no rows).
  /// Throws `errc::corrupted_record` naming the column when it holds text,
  /// a real or a blob: an INTEGER column only keeps those when something
  /// other than this store wrote the row, and reading them as 0 would turn
  /// a damaged record into a plausible one.
  std::int64_t int64(int col) const;
  bool is_null(int col) const;

  /// Throws `errc::corrupted_record`: the record (see `about`), the column
  /// and `why`.
  [[noreturn]] void corrupted(int col, std::string_view why) const;

 private:
  db& db_;
  sqlite3_stmt* s_ = nullptr;
  std::string about_;
  int about_col_ = -1;
};

/// BEGIN IMMEDIATE ... COMMIT, rolled back when not committed. Takes the
/// connection's mutex for its lifetime.
class transaction {
 public:
  explicit transaction(db& d);
  ~transaction();

  void commit();

 private:
  db& db_;
  std::unique_lock<std::recursive_mutex> lock_;
  bool done_ = false;
};

} // namespace botmesh::internal
