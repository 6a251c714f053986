#!/usr/bin/env bash
# bench/gpu_check.sh must never report PASS without having tested a GPU:
#   1. a pretend GPU (a fake nvidia-smi on PATH) and no GPU tests built:
#      FAIL, naming the missing tests;
#   2. the same pretend GPU, the GPU runner built but no device to run on
#      (built without CUDA): FAIL;
#   3. no GPU at all (nvidia-smi lists none): NOT TESTED, exit 3.
# The builds are CPU-only and single-job, so the test runs anywhere.
#
#   gpu_check_test.sh WORK_DIR

set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${1:?usage: gpu_check_test.sh WORK_DIR}"
mkdir -p "$WORK/gpu-bin" "$WORK/no-gpu-bin"
cat > "$WORK/gpu-bin/nvidia-smi" <<'SH'
#!/bin/sh
# Pretends one GPU is present.
case "$1" in
  -L) echo "GPU 0: Pretend H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  *) echo "Pretend H200, 143771 MiB, 0.0" ;;
esac
SH
cat > "$WORK/no-gpu-bin/nvidia-smi" <<'SH'
#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
exit 9
SH
chmod +x "$WORK/gpu-bin/nvidia-smi" "$WORK/no-gpu-bin/nvidia-smi"

failures=0
# run NAME BIN_DIR WANT_RC WANT_TEXT CMAKE_ARGS...
run() {
  local name="$1" bin="$2" want_rc="$3" want_text="$4"
  shift 4
  local log="$WORK/$name.log"
  PATH="$bin:$PATH" GPU_CHECK_JOBS=1 GPU_CHECK_CMAKE_ARGS="$*" \
    "$ROOT/bench/gpu_check.sh" --quick --build "$WORK/build-$name" >"$log" 2>&1
  local rc=$?
  local ok=1
  [[ $rc == "$want_rc" ]] || ok=0
  grep -qF "$want_text" "$log" || ok=0
  grep -q "gpu_check: PASS" "$log" && ok=0
  if [[ $ok == 1 ]]; then
    echo "ok: $name (exit $rc)"
  else
    echo "WRONG: $name: exit $rc (want $want_rc), output:"
    sed 's/^/  | /' "$log"
    failures=$((failures + 1))
  fi
}

NO_CUDA="-DTRAINWATCH_KERNELS_WITH_CUDA=OFF -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=ON -DTRAINWATCH_CATCH2_INCLUDE_DIR="
run pretend-gpu-no-tests "$WORK/gpu-bin" 1 \
  "kernels_gpu_test was not built" \
  $NO_CUDA -DTRAINWATCH_KERNELS_BUILD_TESTS=OFF -DTRAINWATCH_KERNELS_BUILD_BENCH=OFF
run pretend-gpu-no-device "$WORK/gpu-bin" 1 \
  "ran none of its cases" \
  $NO_CUDA -DTRAINWATCH_KERNELS_BUILD_TESTS=ON -DTRAINWATCH_KERNELS_BUILD_BENCH=OFF
run no-gpu "$WORK/no-gpu-bin" 3 \
  "NOT TESTED ON A GPU" \
  $NO_CUDA -DTRAINWATCH_KERNELS_BUILD_TESTS=ON -DTRAINWATCH_KERNELS_BUILD_BENCH=OFF
exit $((failures > 0))
