#include <botmesh/stores/redis/internal/scripts.hpp>

#include <string_view>

// Generated at build time from lua/*.lua (see CMakeLists.txt).
#include "redis_lua.inc"

namespace botmesh::internal {

const scripts& lua() {
  static const scripts all{
    {"chat_save", lua_src::chat_save},
    {"chat_delete", lua_src::chat_delete},
    {"record_save", lua_src::record_save},
    {"record_delete", lua_src::record_delete},
    {"log_append", lua_src::log_append},
    {"checkpoint_set", lua_src::checkpoint_set},
    {"checkpoint_clear_if", lua_src::checkpoint_clear_if},
    {"user_data_set", lua_src::user_data_set},
    {"lock_acquire", lua_src::lock_acquire},
    {"lock_renew", lua_src::lock_renew},
    {"lock_release", lua_src::lock_release},
    {"schedule_register", lua_src::schedule_register},
    {"schedule_claim", lua_src::schedule_claim},
    {"schedule_renew", lua_src::schedule_renew},
    {"schedule_commit", lua_src::schedule_commit},
    {"schedule_remove", lua_src::schedule_remove},
    {"lease_acquire", lua_src::lease_acquire},
    {"lease_release", lua_src::lease_release},
    {"co_enter", lua_src::co_enter},
    {"co_poll", lua_src::co_poll},
    {"co_release", lua_src::co_release},
    {"co_leave", lua_src::co_leave},
    {"co_skip", lua_src::co_skip},
    {"co_renew", lua_src::co_renew},
    {"co_lead", lua_src::co_lead},
    {"co_unlead", lua_src::co_unlead},
    {"co_batch", lua_src::co_batch},
    {"durable_journal", lua_src::durable_journal},
    {"durable_claim", lua_src::durable_claim},
    {"durable_outbox", lua_src::durable_outbox},
    {"cl_log_append", lua_src::cl_log_append},
    {"cl_log_range", lua_src::cl_log_range},
    {"cl_log_delete", lua_src::cl_log_delete},
    {"cl_index_live", lua_src::cl_index_live},
    {"mig_put_hash", lua_src::mig_put_hash},
    {"mig_raise", lua_src::mig_raise},
    {"mig_put_log", lua_src::mig_put_log},
    {"mig_put_legacy_log", lua_src::mig_put_legacy_log},
  };
  return all;
}

} // namespace botmesh::internal
