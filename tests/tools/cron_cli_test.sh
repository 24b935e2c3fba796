#!/usr/bin/env bash
# Checks `botmesh cron next`: output lines, validation messages, exit codes.
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

out=$("$tool" cron next '30 2 * * *' --tz America/New_York --from 2026-03-07T12:00:00-05:00 --count 2)
check "prints the next instants with offsets" \
  "$(printf '2026-03-08T03:30:00-04:00\n2026-03-09T02:30:00-04:00')" "$out"

out=$("$tool" cron next '0 0 * * *' --tz America/Santiago --from 2026-09-05T12:00:00-04:00 --count 1)
check "midnight transition" "2026-09-06T01:00:00-03:00" "$out"

err=$("$tool" cron next '0 0 30 2 *' 2>&1 >/dev/null); rc=$?
check "impossible expression exits 1" 1 "$rc"
case "$err" in *"day of month field"*) echo "ok: names the field";; *) echo "FAIL: message: $err"; fail=1;; esac

err=$("$tool" cron next '0 9 * * *' --tz Nowhere/City 2>&1 >/dev/null); rc=$?
check "unknown zone exits 1" 1 "$rc"
case "$err" in *'unknown time zone "Nowhere/City"'*) echo "ok: names the zone";; *) echo "FAIL: message: $err"; fail=1;; esac

"$tool" cron next '0 9 * * *' --count 0 >/dev/null 2>&1; rc=$?
check "bad --count exits 2" 2 "$rc"

"$tool" cron next '0 9 * * *' --from tomorrow >/dev/null 2>&1; rc=$?
check "bad --from exits 1" 1 "$rc"

out=$("$tool" cron next '30 2 * * *' --tz=America/New_York --from=2026-03-07T12:00:00-05:00 --count=2)
check "--opt=value reads like --opt value" \
  "$(printf '2026-03-08T03:30:00-04:00\n2026-03-09T02:30:00-04:00')" "$out"

out=$("$tool" --version); rc=$?
check "--version exits 0" 0 "$rc"
case "$out" in "botmesh "[0-9]*.[0-9]*.[0-9]*) echo "ok: prints the version";; *) echo "FAIL: version: $out"; fail=1;; esac
out=$("$tool" cron --version); rc=$?
check "a command's --version exits 0" 0 "$rc"
check "a command's --version is the tool's" "$("$tool" --version)" "$out"

out=$("$tool" --help); rc=$?
check "--help exits 0" 0 "$rc"
case "$out" in *"Exit codes"*) echo "ok: help lists exit codes";; *) echo "FAIL: help: $out"; fail=1;; esac

"$tool" cron next '0 9 * * *' --count= >/dev/null 2>&1; rc=$?
check "an empty --opt= value is bad usage" 2 "$rc"

"$tool" frobnicate >/dev/null 2>&1; rc=$?
check "an unknown command exits 2" 2 "$rc"

exit $fail
