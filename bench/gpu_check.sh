#!/usr/bin/env bash
# The kernels' GPU check, for a machine with a GPU, CUDA and CMake (and
# optionally PyTorch) but none of the project's other dependencies: builds
# kernels/ as a project of its own, runs the GPU cases under their
# standalone runner (kernels_gpu_test: no Catch2 needed), the CPU cases when
# Catch2 happens to be there, the GPU benchmark, the PyTorch comparison and
# the Python binding's CUDA path (DeviceStats, built as the module
# _trainwatch_device with PyTorch's pybind11 headers: the product module
# needs gRPC) against torch, then prints one table of every GPU goal and the
# binding path's speed against torch operations. Meant to finish within 8
# minutes on an H200: every step has a time limit, capped by what is left of
# a GPU_CHECK_BUDGET_S budget (480 s).
#
#   bench/gpu_check.sh [--build DIR] [--quick] [--catch PATH/catch.hpp]
#
# Environment: GPU_CHECK_JOBS (build jobs, default nproc), GPU_CHECK_CMAKE_ARGS
# (extra configure arguments, split on spaces), GPU_CHECK_BUDGET_S, PYTHON.
#
# A GPU is present when `nvidia-smi -L` lists one. The verdict:
#   PASS (exit 0)    a GPU is present, kernels_gpu_test ran on it and passed,
#                    and (without --quick) the benchmark measured its goals;
#                    missed goals are shown in the table, not fatal;
#   FAIL (exit 1)    any failed step: a build error, a failed comparison, GPU
#                    tests that were not built or did not run on the device;
#   NOT TESTED ON A GPU (exit 3)   no GPU: whatever ran on the CPU, nothing
#                    was tested on a GPU, so this is never a PASS.

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
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

JOBS="${GPU_CHECK_JOBS:-$(nproc 2>/dev/null || echo 4)}"
STATUS=0
START=$(date +%s)
BUDGET="${GPU_CHECK_BUDGET_S:-480}"
step() { echo; echo "=== [$(( $(date +%s) - START ))s] $*"; }
# limit N: N seconds, or what is left of the budget when that is less.
limit() {
  local left=$(( BUDGET - ($(date +%s) - START) ))
  (( left < 1 )) && left=1
  echo $(( $1 < left ? $1 : left ))
}
fail() { echo "FAILED: $*"; STATUS=1; }

GPU=0
verdict() {
  step "done in $(( $(date +%s) - START ))s"
  if [[ $STATUS != 0 ]]; then
    echo "gpu_check: FAIL"
    exit 1
  fi
  if [[ $GPU == 0 ]]; then
    echo "gpu_check: NOT TESTED ON A GPU (no GPU found; nothing ran on one)"
    exit 3
  fi
  echo "gpu_check: PASS"
  exit 0
}

step "machine"
if command -v nvidia-smi >/dev/null 2>&1 &&
   GPUS="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" && (( GPUS > 0 )); then
  GPU=1
  nvidia-smi -L
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
else
  echo "no GPU listed by nvidia-smi: the GPU steps cannot pass here"
fi
NVCC="${CUDACXX:-}"
if [[ -z "$NVCC" ]]; then
  if command -v nvcc >/dev/null 2>&1; then NVCC="$(command -v nvcc)";
  elif [[ -x /usr/local/cuda/bin/nvcc ]]; then NVCC=/usr/local/cuda/bin/nvcc; fi
fi
echo "nvcc: ${NVCC:-none}; cmake: $(cmake --version 2>/dev/null | head -1)"
[[ -n "$NVCC" ]] || echo "warning: no nvcc: only the CPU kernels will build"

# Catch2 is optional: the GPU cases do not need it. Found, it adds the CPU
# cases (kernels_test).
CATCH_DIR=""
for c in "$CATCH" /usr/include/catch2/catch.hpp /usr/local/include/catch2/catch.hpp; do
  if [[ -n "$c" && -f "$c" ]]; then
    CATCH_DIR="$BUILD/third_party"
    mkdir -p "$CATCH_DIR/catch2"
    cp "$c" "$CATCH_DIR/catch2/catch.hpp"
    echo "Catch2: $c (the CPU cases build too)"
    break
  fi
done

# The binding's CUDA path needs a python3 with torch, Python's headers and
# pybind11's (torch/include has them; else the pybind11 package).
PY="${PYTHON:-python3}"
PYBIND_DIR=""
if "$PY" -c "import torch" 2>/dev/null; then
  PYBIND_DIR="$("$PY" - <<'EOF' 2>/dev/null
import os, sysconfig
import torch
d = os.path.join(os.path.dirname(torch.__file__), "include")
if not os.path.exists(os.path.join(d, "pybind11", "pybind11.h")):
    try:
        import pybind11
        d = pybind11.get_include()
    except ImportError:
        d = ""
if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
    d = ""
print(d)
EOF
)"
fi
if [[ -n "$PYBIND_DIR" ]]; then
  echo "binding path: pybind11 from $PYBIND_DIR, $("$PY" --version 2>&1)"
else
  echo "binding path: no python3 with torch, pybind11 and Python.h: DeviceStats not built"
fi

step "configure kernels/ standalone"
CMAKE_ARGS=(-S "$ROOT/kernels" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release)
[[ -n "$NVCC" ]] && CMAKE_ARGS+=(-DCMAKE_CUDA_COMPILER="$NVCC")
[[ -n "$CATCH_DIR" ]] && CMAKE_ARGS+=(-DTRAINWATCH_CATCH2_INCLUDE_DIR="$CATCH_DIR")
[[ -n "$PYBIND_DIR" ]] && CMAKE_ARGS+=(-DTRAINWATCH_KERNELS_BUILD_PYTHON_CHECK=ON
  -DTRAINWATCH_PYBIND11_INCLUDE_DIR="$PYBIND_DIR" -DPython_EXECUTABLE="$(command -v "$PY")")
# shellcheck disable=SC2206
[[ -n "${GPU_CHECK_CMAKE_ARGS:-}" ]] && CMAKE_ARGS+=(${GPU_CHECK_CMAKE_ARGS})
timeout "$(limit 60)" cmake "${CMAKE_ARGS[@]}" || { fail "configure"; verdict; }

step "build (-j$JOBS)"
timeout "$(limit 200)" cmake --build "$BUILD" -j"$JOBS" || { fail "build"; verdict; }

step "kernels_gpu_test (the GPU cases)"
RUNNER="$BUILD/bin/kernels_gpu_test"
if [[ -x "$RUNNER" ]]; then
  timeout "$(limit 120)" "$RUNNER"
  rc=$?
  if [[ $rc == 77 ]]; then
    if [[ $GPU == 1 ]]; then
      fail "a GPU is listed but kernels_gpu_test ran none of its cases (no CUDA device, or built without CUDA)"
    else
      echo "no device: GPU cases not run"
    fi
  elif [[ $rc != 0 ]]; then
    fail "kernels_gpu_test (exit $rc)"
  fi
elif [[ $GPU == 1 ]]; then
  fail "a GPU is listed but kernels_gpu_test was not built: nothing was tested on it"
else
  echo "kernels_gpu_test not built"
fi

if [[ -x "$BUILD/bin/kernels_test" ]]; then
  step "kernels_test (CPU cases)"
  timeout "$(limit 60)" "$BUILD/bin/kernels_test" "~[gpu]" || fail "kernels_test (CPU cases)"
fi

BENCH_OUT="$BUILD/gpu_bench.txt"
: > "$BENCH_OUT"
if [[ "$QUICK" == 0 ]]; then
  step "kernels_gpu_bench"
  if [[ -x "$BUILD/bin/kernels_gpu_bench" ]]; then
    timeout "$(limit 90)" "$BUILD/bin/kernels_gpu_bench" | tee "$BENCH_OUT"
    rc=${PIPESTATUS[0]}
    [[ $rc == 0 ]] || fail "kernels_gpu_bench (exit $rc)"
  else
    echo "kernels_gpu_bench not built"
  fi
  if [[ $GPU == 1 ]] && ! grep -q '^GOAL|' "$BENCH_OUT"; then
    fail "a GPU is listed but the benchmark measured no goal"
  fi

  step "PyTorch comparison (torch tensors through the C ABI, ctypes)"
  # The pybind11 binding (agent/python) is not exercised here: it links
  # trainwatch::agent, which needs gRPC and Abseil, absent on the GPU
  # machine. The ctypes comparison drives the same kernels with torch
  # tensors' device pointers and needs only libtrainwatch_kernels_c.
  LIB="$BUILD/lib/libtrainwatch_kernels_c.so"
  if [[ $GPU == 1 ]] &&
     "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    timeout "$(limit 60)" "$PY" "$ROOT/bench/kernels/grad_stats_vs_torch.py" --lib "$LIB" ||
      fail "torch comparison"
  else
    echo "no GPU or no python3 with CUDA-enabled torch: skipped"
  fi
fi

step "the binding's CUDA path (DeviceStats) against torch"
BINDING_OUT="$BUILD/binding_check.txt"
: > "$BINDING_OUT"
if [[ $GPU == 0 ]]; then
  echo "no GPU: not run"
elif ! compgen -G "$BUILD/python/_trainwatch_device*.so" >/dev/null; then
  fail "a GPU is listed but _trainwatch_device was not built (needs python3 with torch, pybind11 and Python.h): the binding path is untested"
else
  STEPS=20
  [[ "$QUICK" == 1 ]] && STEPS=3
  timeout "$(limit 150)" "$PY" "$ROOT/bench/kernels/device_stats_vs_torch.py" \
    --module-dir "$BUILD/python" --steps "$STEPS" | tee "$BINDING_OUT"
  rc=${PIPESTATUS[0]}
  [[ $rc == 0 ]] || fail "the binding's CUDA path against torch (exit $rc)"
fi

step "GPU goals"
# kernels_gpu_bench prints each goal as GOAL|name|measured|goal|MET or MISSED.
EXPECTED=("grad stats, 1 tensor (% of copy bandwidth)"
          "grad stats, 300 tensors (% of copy bandwidth)"
          "kernels per step, 1000 tensors"
          "logit stats bf16 32k (% of copy bandwidth)"
          "logit stats fp32 32k (% of copy bandwidth)")
printf '%-48s %12s %10s  %s\n' "goal" "measured" "goal" "met"
printf '%-48s %12s %10s  %s\n' "----" "--------" "----" "---"
MISSED=0
for name in "${EXPECTED[@]}"; do
  line="$(grep -F "GOAL|$name|" "$BENCH_OUT" | head -1)"
  if [[ -z "$line" ]]; then
    printf '%-48s %12s %10s  %s\n' "$name" "-" "-" "not measured"
    MISSED=$((MISSED + 1))
    continue
  fi
  IFS='|' read -r _ n measured goal met <<<"$line"
  printf '%-48s %12s %10s  %s\n' "$n" "$measured" "$goal" "$met"
  [[ "$met" == MET ]] || MISSED=$((MISSED + 1))
done
# Goals the benchmark reports beyond the expected list.
grep '^GOAL|' "$BENCH_OUT" | while IFS='|' read -r _ n measured goal met; do
  printf '%s\n' "${EXPECTED[@]}" | grep -qxF "$n" ||
    printf '%-48s %12s %10s  %s\n' "$n" "$measured" "$goal" "$met"
done
echo "$MISSED of ${#EXPECTED[@]} goals missed or not measured (reported, not fatal)"
# device_stats_vs_torch.py prints RATIO|dtype|torch ops time / kernels time.
grep '^RATIO|' "$BINDING_OUT" | while IFS='|' read -r _ dtype ratio; do
  printf 'binding path, one step vs torch ops (%s): %sx faster\n' "$dtype" "$ratio"
done

verdict
