# Sourced by scripts/test and scripts/sanitize: starts the servers the tests
# use on loopback and stops them when the calling script exits.
#
#   servers_start     -> starts a standalone redis-server on a free loopback
#                        port and exports REDIS_URL; starts a 6-node Redis
#                        Cluster (3 masters + 3 replicas) on free loopback
#                        ports and exports REDIS_CLUSTER_URL (one seed
#                        node) and REDIS_CLUSTER_DIR (each node's files in
#                        cluster-<port>/: `start` starts the node again
#                        with its command line and nodes.conf, as a
#                        chaos test does after killing it; redis.pid);
#                        installs an EXIT trap that stops them all (also
#                        nodes started again) and removes their files;
#                        exports REDIS_CLUSTER_RESET, a command that makes
#                        the cluster anew on the same ports (see
#                        scripts/lib/cluster-reset)
#
# Needs redis-server and redis-cli (scripts/setup-deps installs them).

servers_run_dir=""
servers_lib_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
servers_redis_pid=""
servers_cluster_pids=()

# Waits (at most 5 s) until process $1 is gone. The nodes are disowned (a
# test may SIGKILL one, and bash would print "Killed" for a job), so `wait`
# cannot be used.
servers_await_exit() {
  local i
  for i in $(seq 1 100); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.05
  done
}

# Stops process $1: SIGTERM, and SIGKILL if it is still there after 5 s (a
# master may wait for its replicas on shutdown). Returns once it is gone, so
# that no server outlives the run that started it.
servers_kill() {
  kill "$1" 2>/dev/null || return 0
  servers_await_exit "$1"
  if kill -0 "$1" 2>/dev/null; then
    kill -9 "$1" 2>/dev/null || true
    servers_await_exit "$1"
  fi
}

# True when process $1 is a redis-server (a node made anew by
# cluster-reset has another pid, and the old one may have been reused).
servers_is_redis() {
  tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" | grep -q "^redis-server"
}

servers_stop() {
  local pid
  for pid in "$servers_redis_pid" "${servers_cluster_pids[@]}"; do
    [ -n "$pid" ] || continue
    servers_is_redis "$pid" || continue
    servers_kill "$pid"
  done
  # Nodes a test started again (cluster-<port>/start) are not our children:
  # their pid files name them.
  local f
  for f in "$servers_run_dir"/cluster-*/redis.pid; do
    [ -n "$servers_run_dir" ] && [ -f "$f" ] || continue
    pid="$(cat "$f" 2>/dev/null)" || continue
    [ -n "$pid" ] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" \
      | grep -q "redis-server.*:$(basename "$(dirname "$f")" | cut -d- -f2)" \
      || continue
    servers_kill "$pid"
  done
  servers_redis_pid=""
  servers_cluster_pids=()
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

# True when nothing listens on 127.0.0.1:$1.
servers_port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Starts one cluster node on a free port whose cluster bus port (+10000) is
# free too; prints the port. Another port is tried when the node does not
# come up (a port taken in between).
servers_start_cluster_node() {
  local attempt port dir pid taken
  for attempt in $(seq 1 20); do
    port=$((20000 + RANDOM % 20000))
    taken=0
    for p in "${servers_cluster_ports[@]}"; do
      [ "$p" != "$port" ] || taken=1
    done
    [ "$taken" = 0 ] || continue
    servers_port_free "$port" && servers_port_free $((port + 10000)) || continue
    dir="$servers_run_dir/cluster-$port"
    mkdir -p "$dir"
    # The command line, kept so a test can start a killed node again (it
    # rejoins from nodes.conf); the process is not the caller's child then.
    # Notices are logged: failure reports, elections and state changes,
    # which a cluster test that gives up writes out (dump_cluster).
    # Descriptors a test process had open (a pipe to ctest among them) are
    # closed first: a node it starts again outlives it, and a pipe held
    # open would make ctest wait for that node until its timeout.
    printf '%s\n' '#!/usr/bin/env bash' \
      'for fd in /proc/$$/fd/*; do fd="${fd##*/}"; [ "$fd" -gt 2 ] && [ "$fd" != 255 ] && eval "exec $fd>&-" 2>/dev/null; done' \
      "exec redis-server --port $port --bind 127.0.0.1 --save '' --appendonly no \\" \
      "  --dir '$dir' --cluster-enabled yes --cluster-config-file nodes.conf \\" \
      "  --cluster-node-timeout 2000 --enable-debug-command local \\" \
      "  --pidfile '$dir/redis.pid' --loglevel notice >>'$dir/redis.log' 2>&1" \
      >"$dir/start"
    chmod +x "$dir/start"
    "$dir/start" &
    pid=$!
    disown "$pid"
    for _ in $(seq 1 100); do
      if redis-cli -p "$port" ping >/dev/null 2>&1; then
        servers_cluster_pids+=("$pid")
        servers_cluster_ports+=("$port")
        return 0
      fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  echo "test: could not start a cluster node" >&2
  cat "$dir/redis.log" >&2 || true
  return 1
}

# True when the node on port $1 reports cluster_state:ok, all 16384 slots
# served and all 6 nodes known, and, for a replica, a replication link that
# is up (a replica that never synced would not take over from its master).
servers_cluster_node_ready() {
  local info repl
  info="$(redis-cli -p "$1" cluster info 2>/dev/null | tr -d '\r')" || return 1
  repl="$(redis-cli -p "$1" info replication 2>/dev/null | tr -d '\r')" || return 1
  grep -qx 'cluster_state:ok' <<<"$info" \
    && grep -qx 'cluster_slots_ok:16384' <<<"$info" \
    && grep -qx 'cluster_known_nodes:6' <<<"$info" \
    && { grep -qx 'role:master' <<<"$repl" \
      || grep -qx 'master_link_status:up' <<<"$repl"; }
}

# Starts 6 nodes, joins them with redis-cli --cluster create (3 masters,
# one replica each) and waits until every node sees a healthy cluster and
# every replica has synced with its master.
servers_start_cluster() {
  servers_cluster_ports=()
  local i
  for i in 1 2 3 4 5 6; do
    servers_start_cluster_node || return 1
  done
  # The order decides the masters: cluster-reset makes the cluster anew in it.
  printf '%s\n' "${servers_cluster_ports[@]}" >"$servers_run_dir/cluster-ports"
  servers_join_cluster "$servers_run_dir" "${servers_cluster_ports[@]}" || return 1
  export REDIS_CLUSTER_URL="redis://127.0.0.1:${servers_cluster_ports[0]}"
  export REDIS_CLUSTER_DIR="$servers_run_dir"
  export REDIS_CLUSTER_RESET="$servers_lib_dir/cluster-reset"
  echo "test: redis cluster (3 masters + 3 replicas) on ports" \
    "${servers_cluster_ports[*]}, seed $REDIS_CLUSTER_URL" >&2
}

# Joins the running nodes on ports $2... (3 masters, one replica each, in
# that order) with redis-cli --cluster create, its log in $1, and waits
# until every node sees a healthy cluster (servers_cluster_node_ready).
servers_join_cluster() {
  local dir="$1" port ready nodes=()
  shift
  for port in "$@"; do
    nodes+=("127.0.0.1:$port")
  done
  if ! redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 \
    --cluster-yes >"$dir/cluster-create.log" 2>&1; then
    echo "test: redis-cli --cluster create failed" >&2
    cat "$dir/cluster-create.log" >&2
    return 1
  fi
  for _ in $(seq 1 600); do
    ready=1
    for port in "$@"; do
      servers_cluster_node_ready "$port" || { ready=0; break; }
    done
    [ "$ready" = 1 ] && return 0
    sleep 0.1
  done
  echo "test: the redis cluster did not become ready within 60 s" >&2
  for port in "$@"; do
    echo "--- node $port" >&2
    redis-cli -p "$port" cluster info >&2 2>&1 || true
  done
  return 1
}

servers_start() {
  servers_run_dir="$(mktemp -d)"
  trap servers_stop EXIT
  servers_start_redis
  servers_start_cluster
}
