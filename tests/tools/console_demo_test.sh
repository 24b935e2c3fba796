#!/usr/bin/env bash
# The example console bot as a user runs it: piped stdin, exit 0 at EOF, and
# an order that resumes after a restart with the SQLite store.
set -uo pipefail
bot="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail=0
check() {
  if [ "$2" != "$3" ]; then
    echo "FAIL: $1"; echo "  expected: $2"; echo "  actual:   $3"; fail=1
  else
    echo "ok: $1"
  fi
}

out=$(printf 'hola\n2 + 3\n' | "$bot" 2>&1); rc=$?
check "exits 0 when stdin ends" 0 "$rc"
check "answers each line in order" \
  "$(printf "¡Hola! Soy un bot de botmesh. Escribe 'pedido' para pedir o 'ayuda' para ver qué más sé hacer.\n2 + 3 = 5")" "$out"

out=$(printf 'pedido\ncafé\n2\n' | "$bot" --db "$tmp/bot.db" 2>&1)
check "asks up to the confirmation" "¿Confirmas 2 x café? (sí/no)" "$(echo "$out" | tail -n 1)"
out=$(printf 'sí\n' | "$bot" --db "$tmp/bot.db" 2>&1)
check "a restarted demo resumes the order" "✅ Pedido confirmado: 2 x café. ¡Gracias!" "$out"

"$bot" --bogus </dev/null >/dev/null 2>&1; rc=$?
check "a bad argument exits 2" 2 "$rc"
exit $fail
