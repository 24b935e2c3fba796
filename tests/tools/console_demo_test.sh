#!/usr/bin/env bash
# The example console bot as a user runs it: piped stdin, exit 0 at EOF, an
# order that resumes after a restart with the SQLite store, and a large pipe
# answered in full.
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

# A bad --db is a clear message and exit 1, never an abort.
for db in "$tmp/missing/dir/bot.db" "$tmp"; do
  out=$("$bot" --db "$db" </dev/null 2>&1); rc=$?
  check "--db $db exits 1" 1 "$rc"
  case "$out" in
    "console_bot: "*"$db"*) echo "ok: --db $db names the file" ;;
    *) echo "FAIL: --db $db: unexpected message: $out"; fail=1 ;;
  esac
done
head -c 65536 /dev/urandom > "$tmp/garbage.db"
out=$("$bot" --db "$tmp/garbage.db" </dev/null 2>&1); rc=$?
check "a damaged database file exits 1" 1 "$rc"
case "$out" in
  "console_bot: "*) echo "ok: the damaged file gets a message" ;;
  *) echo "FAIL: damaged file: unexpected message: $out"; fail=1 ;;
esac

# Sums that do not fit in 64 bits are said so, not wrapped.
out=$(printf '9223372036854775807 + 1
99999999999999999999 + 1
-5 + 3
' | "$bot" 2>&1); rc=$?
check "overflowing sums are refused in words" \
  "$(printf 'La suma no cabe en un entero de 64 bits.\nEse número es demasiado grande: sé sumar enteros de hasta 19 cifras.\n-5 + 3 = -2')" "$out"

# A 30,000-digit message is routed by the linear-time pattern, not a crash.
digits=$(head -c 30000 /dev/zero | tr '\0' '7')
out=$(printf '%s + 1\nhola\n' "$digits" | "$bot" 2>&1); rc=$?
check "a 30,000-digit sum exits 0" 0 "$rc"
check "and both lines are answered" \
  "$(printf "Ese número es demasiado grande: sé sumar enteros de hasta 19 cifras.\n¡Hola! Soy un bot de botmesh. Escribe 'pedido' para pedir o 'ayuda' para ver qué más sé hacer.")" "$out"
# A large pipe is answered line by line (backpressure), none refused as
# overloaded.
yes '1 + 1' | head -n 20000 > "$tmp/sums.txt"
cat "$tmp/sums.txt" | "$bot" > "$tmp/sums.out" 2> "$tmp/sums.err"; rc=$?
check "20,000 piped sums exit 0" 0 "$rc"
check "every one of them is answered" 20000 "$(grep -cx '1 + 1 = 2' "$tmp/sums.out")"
check "and nothing else is printed" 20000 "$(wc -l < "$tmp/sums.out")"
check "no error is reported" "" "$(cat "$tmp/sums.err")"

# SIGTERM while stdin is still open: the bot answers what it got, drains
# and exits 0.
mkfifo "$tmp/in"
"$bot" < "$tmp/in" > "$tmp/term.out" 2> "$tmp/term.err" &
pid=$!
exec 3> "$tmp/in"
echo '2 + 2' >&3
for _ in $(seq 1 500); do
  grep -q '2 + 2 = 4' "$tmp/term.out" && break
  sleep 0.02
done
kill -TERM "$pid"
wait "$pid"; rc=$?
exec 3>&-
check "SIGTERM with stdin open exits 0" 0 "$rc"
check "after answering" "2 + 2 = 4" "$(cat "$tmp/term.out")"
case "$(cat "$tmp/term.err")" in
  *"SIGTERM: stopping"*) echo "ok: says it is stopping" ;;
  *) echo "FAIL: SIGTERM message: $(cat "$tmp/term.err")"; fail=1 ;;
esac
exit $fail
