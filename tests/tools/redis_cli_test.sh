#!/usr/bin/env bash
# Checks `botmesh redis inspect|migrate` against the servers scripts/test
# started (REDIS_URL, REDIS_CLUSTER_URL): reports, exit codes, --help.
# Fails, never skips, without them.
set -uo pipefail
tool="$1"
fail=0
check() { # name, expected, actual
  if [ "$2" != "$3" ]; then
    echo "FAIL: $1"; echo "  expected: $2"; echo "  actual:   $3"; fail=1
  else
    echo "ok: $1"
  fi
}
contains() { # name, needle, haystack
  case "$3" in *"$2"*) echo "ok: $1";; *) echo "FAIL: $1: no \"$2\" in: $3"; fail=1;; esac
}
if [ -z "${REDIS_URL:-}" ] || [ -z "${REDIS_CLUSTER_URL:-}" ]; then
  echo "FAIL: REDIS_URL and REDIS_CLUSTER_URL must be set: run scripts/test"
  exit 1
fi
port="${REDIS_URL##*:}"
r() { redis-cli -p "$port" "$@" >/dev/null; }
p="bmcli-$RANDOM$RANDOM"

# A legacy keyspace: a chat with its log, a lock fence, a live heartbeat.
r HSET "$p:chat:tg:1" key tg:1 provider tg chat 1 participant "" \
  created_at 1 last_message_at 2 data '{}'
r ZADD "$p:chats" 0 tg:1
r RPUSH "$p:log:tg:1" '{"seq":1,"dir":0,"id":"m1","sender":"u","text":"hola","type":"text","at":5}'
r SET "$p:logseq:tg:1" 1
r SET "$p:fence:job" 7
r SET "$p:co:rep:inc-1" r1 PX 60000

out=$("$tool" redis --help); rc=$?
check "--help exits 0" 0 "$rc"
contains "--help lists migrate's options" "--delete-source" "$out"

"$tool" redis migrate --source "$REDIS_URL" --bogus >/dev/null 2>&1; rc=$?
check "an unknown option exits 2" 2 "$rc"
"$tool" redis inspect --source "$REDIS_URL" --dry-run >/dev/null 2>&1; rc=$?
check "a migrate option on inspect exits 2" 2 "$rc"
"$tool" redis migrate --source "$REDIS_URL" --include chat >/dev/null 2>&1; rc=$?
check "an unknown --include kind exits 2" 2 "$rc"
"$tool" redis migrate --source "$REDIS_URL" --direction sideways >/dev/null 2>&1; rc=$?
check "a bad --direction exits 2" 2 "$rc"

out=$("$tool" redis inspect --source "$REDIS_URL" --prefix "$p"); rc=$?
check "inspect exits 0" 0 "$rc"
contains "inspect counts legacy chats" "legacy chats 2" "$out"
contains "inspect counts heartbeats" "heartbeats 1" "$out"

err=$("$tool" redis migrate --source "$REDIS_URL" --prefix "$p" 2>&1 >/dev/null); rc=$?
check "migrate refuses a live bot with exit 1" 1 "$rc"
contains "names the heartbeat" "live coordinator heartbeat" "$err"

out=$("$tool" redis migrate --source "$REDIS_URL" --target "$REDIS_CLUSTER_URL" \
  --prefix "$p" --allow-live --dry-run --json); rc=$?
check "a dry run to the cluster exits 0" 0 "$rc"
contains "dry run JSON" '"layout_marker":"not written: dry run"' "$out"

out=$("$tool" redis migrate --source "$REDIS_URL" --target="$REDIS_CLUSTER_URL" \
  --prefix "$p" --allow-live); rc=$?
check "migrate to the cluster exits 0" 0 "$rc"
contains "copies the messages" "messages 1 0 0 0" "$out"
contains "writes the marker" "layout_marker written" "$out"

out=$("$tool" redis inspect --source "$REDIS_CLUSTER_URL" --prefix "$p" --json); rc=$?
check "inspect on the cluster exits 0" 0 "$rc"
contains "the cluster holds the marker" '"marker":"cluster:v1"' "$out"
contains "the cluster holds the chat" '"chats":2' "$out"

# Back from the cluster onto the node, whose legacy keys are gone: mirror.
r DEL "$p:chat:tg:1" "$p:chats" "$p:log:tg:1" "$p:logseq:tg:1"
out=$("$tool" redis migrate --source "$REDIS_CLUSTER_URL" --target "$REDIS_URL" \
  --prefix "$p" --direction cluster-to-legacy --allow-live); rc=$?
check "rollback exits 0" 0 "$rc"
contains "rollback deletes the marker" "layout_marker deleted" "$out"
check "the chat is back in the legacy layout" "tg" \
  "$(redis-cli -p "$port" HGET "$p:chat:tg:1" provider)"

# A damaged record: reported, exit 1, left in place.
r HDEL "$p:chat:tg:1" provider
out=$("$tool" redis migrate --source "$REDIS_URL" --prefix "$p" --allow-live \
  --overwrite 2>/dev/null); rc=$?
check "a damaged record exits 1" 1 "$rc"
contains "names the damaged key" "problem $p:chat:tg:1" "$out"
check "the damaged record stays" 1 "$(redis-cli -p "$port" EXISTS "$p:chat:tg:1")"

exit $fail
