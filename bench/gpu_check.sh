#!/usr/bin/env bash
# The kernels' GPU check, for a machine with a GPU, CUDA, CMake and
# (optionally) PyTorch, but none of the project's other dependencies: builds
# kernels/ as a project of its own, with its tests and benchmarks, runs the
# tests (the [gpu] cases included), then the GPU benchmark, then the PyTorch
# comparison when `import torch` works. Meant to finish well within 10
# minutes: every step has a time limit, capped by what is left of a 570 s
# budget (GPU_CHECK_BUDGET_S).
#
#   bench/gpu_check.sh [--catch PATH/catch.hpp] [--build DIR] [--quick]
#
# Catch2 v2's single header is needed for the tests. It is looked for at
# --catch, $CATCH_HPP, /usr/include/catch2/catch.hpp,
# /usr/local/include/catch2/catch.hpp and third_party/catch2/catch.hpp (not
# committed; copy it there when the GPU machine has none), and copied into
# the build directory. Without it the tests are skipped, not the benchmarks.
#
# Exit status: 0 when the build and every test passed (benchmark goals are
# reported, not enforced), non-zero otherwise.

set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build/gpu-check}"
CATCH="${CATCH_HPP:-}"
QUICK=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --catch) CATCH="$2"; shift 2 ;;
    --build) BUILD="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

JOBS="$(nproc 2>/dev/null || echo 4)"
STATUS=0
START=$(date +%s)
BUDGET="${GPU_CHECK_BUDGET_S:-570}"  # the whole script stays under 10 minutes
step() { echo; echo "=== [$(( $(date +%s) - START ))s] $*"; }
# limit N: N seconds, or what is left of the budget when that is less.
limit() {
  local left=$(( BUDGET - ($(date +%s) - START) ))
  (( left < 1 )) && left=1
  echo $(( $1 < left ? $1 : left ))
}
fail() { echo "FAILED: $*"; STATUS=1; }

step "machine"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
else
  echo "nvidia-smi not found"
fi
NVCC="${CUDACXX:-}"
if [[ -z "$NVCC" ]]; then
  if command -v nvcc >/dev/null 2>&1; then NVCC="$(command -v nvcc)";
  elif [[ -x /usr/local/cuda/bin/nvcc ]]; then NVCC=/usr/local/cuda/bin/nvcc; fi
fi
echo "nvcc: ${NVCC:-none}; cmake: $(cmake --version 2>/dev/null | head -1)"
[[ -n "$NVCC" ]] || echo "warning: no nvcc: only the CPU kernels will build"

step "Catch2 header"
CATCH_DIR=""
for c in "$CATCH" /usr/include/catch2/catch.hpp /usr/local/include/catch2/catch.hpp \
         "$ROOT/third_party/catch2/catch.hpp"; do
  if [[ -n "$c" && -f "$c" ]]; then
    CATCH_DIR="$BUILD/third_party"
    mkdir -p "$CATCH_DIR/catch2"
    cp "$c" "$CATCH_DIR/catch2/catch.hpp"
    echo "using $c"
    break
  fi
done
[[ -n "$CATCH_DIR" ]] || echo "no catch.hpp found: kernels_test will not be built (pass --catch PATH)"

step "configure kernels/ standalone"
CMAKE_ARGS=(-S "$ROOT/kernels" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release)
[[ -n "$NVCC" ]] && CMAKE_ARGS+=(-DCMAKE_CUDA_COMPILER="$NVCC")
[[ -n "$CATCH_DIR" ]] && CMAKE_ARGS+=(-DTRAINWATCH_CATCH2_INCLUDE_DIR="$CATCH_DIR")
timeout "$(limit 60)" cmake "${CMAKE_ARGS[@]}" || { fail "configure"; exit 1; }

step "build (-j$JOBS)"
timeout "$(limit 300)" cmake --build "$BUILD" -j"$JOBS" || { fail "build"; exit 1; }

step "kernels_test"
if [[ -x "$BUILD/bin/kernels_test" ]]; then
  # GPU cases first, so that their outcome shows even if a CPU case hangs.
  timeout "$(limit 90)" "$BUILD/bin/kernels_test" "[gpu]" || fail "kernels_test [gpu]"
  timeout "$(limit 60)" "$BUILD/bin/kernels_test" "~[gpu]" || fail "kernels_test (CPU cases)"
else
  echo "kernels_test not built (no Catch2)"
fi

if [[ "$QUICK" == 0 ]]; then
  step "kernels_gpu_bench"
  timeout "$(limit 150)" "$BUILD/bin/kernels_gpu_bench" || fail "kernels_gpu_bench"

  step "PyTorch comparison"
  LIB="$BUILD/lib/libtrainwatch_kernels_c.so"
  PY="${PYTHON:-python3}"
  if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    timeout "$(limit 120)" "$PY" "$ROOT/bench/kernels/grad_stats_vs_torch.py" --lib "$LIB" || fail "torch comparison"
  else
    echo "no python3 with CUDA-enabled torch: skipped"
  fi

  if [[ -x "$BUILD/bin/grad_stats_bench" ]]; then
    step "grad_stats_bench (CPU, for reference)"
    timeout "$(limit 40)" "$BUILD/bin/grad_stats_bench" --benchmark_min_time=0.2 || true
  fi
fi

step "done in $(( $(date +%s) - START ))s: $([[ $STATUS == 0 ]] && echo PASS || echo FAIL)"
exit $STATUS
