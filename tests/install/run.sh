#!/usr/bin/env bash
# Installs the built tree into a temporary prefix, then configures, builds and
# runs a consumer that finds it with find_package(botmesh).
set -euo pipefail
build_dir="$1"
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build_dir" --prefix "$tmp/prefix" >/dev/null
cmake -S "$here" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/build" -j2 >/dev/null
"$tmp/build/app"
echo "consumer built against the installed package and ran"
