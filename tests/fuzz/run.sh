#!/usr/bin/env bash
# Runs a libFuzzer target for CTest (see tests/fuzz/CMakeLists.txt).
#
#   run.sh corpus BINARY CORPUS_DIR [LIBFUZZER FLAGS...]
#       every seed, then mutations, bounded (default -runs=50000), with a
#       fixed seed so each run explores the same inputs; new inputs go to a
#       scratch directory, never into the committed corpus
#   run.sh replay BINARY INPUT...
#       each input once (regressions), with BOTMESH_FUZZ_STRICT=1
#
# Exits non-zero when the target crashes, leaks, hits undefined behaviour or
# a timeout; the failing input is printed (libFuzzer prints small ones in
# hex and base64) and kept as BINARY's name under $TMPDIR.
set -uo pipefail
mode="$1" bin="$2"
shift 2
if [ ! -x "$bin" ]; then
  echo "run.sh: $bin is not built (the fuzz targets build with 'all')" >&2
  exit 1
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
artifacts="${TMPDIR:-/tmp}/botmesh-fuzz-$(basename "$bin")-"
common=(-timeout=10 -rss_limit_mb=2048 "-artifact_prefix=$artifacts"
        -print_final_stats=1)
case "$mode" in
  corpus)
    corpus="$1"
    shift
    "$bin" "${common[@]}" -seed=1 -runs=50000 "$@" "$scratch" "$corpus"
    ;;
  replay)
    BOTMESH_FUZZ_STRICT=1 "$bin" "${common[@]}" "$@"
    ;;
  *)
    echo "run.sh: unknown mode $mode" >&2
    exit 2
    ;;
esac
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "run.sh: $(basename "$bin") failed (exit $rc); inputs kept as ${artifacts}*" >&2
fi
exit "$rc"
