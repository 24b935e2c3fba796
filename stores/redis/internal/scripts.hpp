#pragma once

// Internal: the Lua scripts of lua/*.lua, embedded at build time.

#include <botmesh/stores/redis/redis_client.hpp>

namespace botmesh::internal {

struct scripts {
  redis_script chat_save;
  redis_script chat_delete;
  redis_script record_save;
  redis_script record_delete;
  redis_script log_append;
  redis_script checkpoint_set;
  redis_script checkpoint_clear_if;
  redis_script user_data_set;
  redis_script lock_acquire;
  redis_script lock_renew;
  redis_script lock_release;
  redis_script schedule_register;
  redis_script schedule_claim;
  redis_script schedule_renew;
  redis_script schedule_commit;
  redis_script schedule_remove;
  redis_script lease_acquire;
  redis_script lease_release;
  redis_script co_enter;
  redis_script co_poll;
  redis_script co_release;
  redis_script co_leave;
  redis_script co_skip;
  redis_script co_renew;
  redis_script co_lead;
  redis_script co_unlead;
  redis_script co_batch;
  redis_script durable_journal;
  redis_script durable_claim;
  redis_script durable_outbox;
  // The cluster:v1 layout's own (the rest are shared with legacy).
  redis_script cl_log_append;
  redis_script cl_log_range;
  redis_script cl_log_delete;
  redis_script cl_index_live;
  // The migration's.
  redis_script mig_put_hash;
  redis_script mig_raise;
  redis_script mig_put_log;
  redis_script mig_put_legacy_log;
};

/// Built once; SHA-1s computed at first use.
const scripts& lua();

} // namespace botmesh::internal
