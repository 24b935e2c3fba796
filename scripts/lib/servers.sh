# Sourced by scripts/test and scripts/sanitize: starts the servers the tests
# use on loopback and stops them when the calling script exits.
#
#   servers_start     -> starts a standalone redis-server on a free loopback
#                        port, exports REDIS_URL; installs an EXIT trap that
#                        stops it and removes its files
#
# Needs redis-server and redis-cli (scripts/setup-deps installs them).

servers_run_dir=""
servers_redis_pid=""

servers_stop() {
  if [ -n "$servers_redis_pid" ]; then
    kill "$servers_redis_pid" 2>/dev/null || true
    wait "$servers_redis_pid" 2>/dev/null || true
    servers_redis_pid=""
  fi
  if [ -n "$servers_run_dir" ]; then
    rm -rf "$servers_run_dir"
    servers_run_dir=""
  fi
}

# Starts redis-server on a free loopback port; tries another port when the
# chosen one is taken.
servers_start_redis() {
  local attempt port
  for attempt in $(seq 1 20); do
    port=$((20000 + RANDOM % 20000))
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
      --dir "$servers_run_dir" --loglevel warning >"$servers_run_dir/redis.log" 2>&1 &
    servers_redis_pid=$!
    for _ in $(seq 1 100); do
      if redis-cli -p "$port" ping >/dev/null 2>&1; then
        export REDIS_URL="redis://127.0.0.1:$port"
        echo "test: redis-server on $REDIS_URL" >&2
        return 0
      fi
      kill -0 "$servers_redis_pid" 2>/dev/null || break
      sleep 0.05
    done
    kill "$servers_redis_pid" 2>/dev/null || true
    wait "$servers_redis_pid" 2>/dev/null || true
    servers_redis_pid=""
  done
  echo "test: could not start redis-server" >&2
  cat "$servers_run_dir/redis.log" >&2 || true
  return 1
}

servers_start() {
  servers_run_dir="$(mktemp -d)"
  trap servers_stop EXIT
  servers_start_redis
}
