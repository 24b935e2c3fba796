#pragma once

// The botmesh tool's commands. Each takes the arguments after its name and
// returns the process's exit code; a bad command line throws usage_error
// (main prints it with the command's usage and exits 2).

#include <stdexcept>
#include <string_view>
#include <vector>

namespace botmesh::tool {

using args = std::vector<std::string_view>;

/// A command line that cannot run: unknown option, missing value.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Exit codes shared by every command.
inline constexpr int exit_ok = 0;
/// The work failed: a rejected input (cron), a request the API refused or
/// that could not reach it (telegram); Redis failed or held damaged records
/// (redis).
inline constexpr int exit_failed = 1;
inline constexpr int exit_usage = 2;

extern const char* const cron_usage;
extern const char* const telegram_usage;
extern const char* const redis_usage;

/// `botmesh cron next ...`
int cron(const args& a);

/// `botmesh telegram set-webhook | delete-webhook | webhook-info ...`
int telegram(const args& a);

/// `botmesh redis inspect | migrate ...`
int redis(const args& a);

/// True when `a` asks for help (-h, --help, help).
bool is_help(std::string_view a);

} // namespace botmesh::tool
