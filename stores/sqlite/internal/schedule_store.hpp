#pragma once

// Internal: the SQLite schedule store behind sqlite_store::schedules().

#include <memory>

#include <botmesh/stores/schedule_store.hpp>

namespace botmesh::internal {

class db;

/// Table `schedules` in the store's file; every call is one BEGIN IMMEDIATE
/// transaction on the shared connection. Removal is a soft delete that keeps
/// the row and its fencing token.
std::shared_ptr<schedule_store> make_sqlite_schedule_store(std::shared_ptr<db> d);

} // namespace botmesh::internal
