#!/usr/bin/env bash
# Builds the fuzz targets with clang-14 in BUILD_DIR (configuring it the
# first time) and runs each for SECONDS on its seed corpus, then prints the
# executions per target. Fails if a target crashes; the input that did is
# left in BUILD_DIR/crashes/ (add it to fuzz/corpus/<target>/ with the fix).
#
#   fuzz/run.sh BUILD_DIR SECONDS
#
# FUZZ_OPT sets the optimization flags of a new BUILD_DIR (default -O1 with
# line tables). make test's short run uses -O0 in a folder of its own: for
# five seconds a target, a quicker build matters more than executions.
#
# New inputs a run finds go to BUILD_DIR/corpus/<target>/, not to the seed
# corpus checked in under fuzz/corpus/.
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR SECONDS}
seconds=${2:?usage: run.sh BUILD_DIR SECONDS}
src=$(cd "$(dirname "$0")/.." && pwd)
targets=(replay_fuzz rules_fuzz tokens_fuzz pager_config_fuzz agent_stream_fuzz)

command -v clang++-14 >/dev/null ||
  { echo "fuzz: clang++-14 not found (scripts/install-deps.sh installs it)" >&2; exit 1; }
launcher=()
command -v ccache >/dev/null &&
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
mkdir -p "$build"
if [ ! -f "$build/CMakeCache.txt" ]; then
  # -O1 and line tables only: quick to build, fast enough to fuzz, and
  # reports still name files and lines. No -DNDEBUG: asserts stay on.
  cmake -S "$src" -B "$build" -DTRAINWATCH_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="${FUZZ_OPT:--O1 -gline-tables-only}" \
    "${launcher[@]}" >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log" >&2; exit 1; }
fi
cmake --build "$build" -j"${FUZZ_JOBS:-2}" --target "${targets[@]}"

mkdir -p "$build/crashes"
summary=()
failed=0
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t"
  log="$build/$t.log"
  # -rss_limit_mb and -timeout turn a memory blow-up or a hang into a
  # reported crash; -max_len covers the largest seed.
  if ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$build/bin/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -max_len=16384 \
      -print_final_stats=1 -artifact_prefix="$build/crashes/$t-" \
      "$build/corpus/$t" "$src/fuzz/corpus/$t" >"$log" 2>&1; then
    status=ok
  else
    status=CRASH
    failed=1
    tail -n 60 "$log" >&2
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  summary+=("$(printf '%-20s %10s executions in %ss  %s' "$t" "${execs:-?}" "$seconds" "$status")")
done
printf '%s\n' "${summary[@]}"
exit "$failed"
