#pragma once

/// Everything a bot needs: the bot facade, events, durations, errors, the
/// store interface with the memory store, and the bundled providers.

#include <botmesh/providers/console_provider.hpp>
#include <botmesh/providers/testing_provider.hpp>
#include <botmesh/runtime/bot.hpp>
#include <botmesh/runtime/core/duration.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/events.hpp>
#include <botmesh/runtime/flow.hpp>
#include <botmesh/runtime/observability.hpp>
#include <botmesh/runtime/texts.hpp>
#include <botmesh/scheduler/cron.hpp>
#include <botmesh/actors/scheduler.hpp>
#include <botmesh/stores/memory_schedule_store.hpp>
#include <botmesh/stores/memory_store.hpp>
#include <botmesh/stores/sqlite/sqlite_store.hpp>
