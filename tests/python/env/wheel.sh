#!/usr/bin/env bash
# The trainwatch wheel the torch 2.x environments install: the self-contained
# wheel a user installs (scripts/build_wheels.py), for the CPython of
# Debian's /usr/bin/python3 (3.11), whose venvs these environments are. Its
# work folder (OUT/wheels: the build tools, one CMake folder) is kept, so a
# second make test rebuilds only what changed. With the CUDA kernels, as the
# user's wheel (nvcc is here): on this machine without a GPU, every torch test
# runs the path a CUDA wheel takes where no device is (has_cuda false).
#   wheel.sh SOURCE_DIR OUT   ->  OUT/dist/trainwatch_agent-*.whl (one)
set -euo pipefail
src=$1 out=$2
mkdir -p "$out"
rm -rf "$out/dist"
/usr/bin/python3 "$src/scripts/build_wheels.py" --python 3.11 --build "$out" --out "$out/dist" \
  >"$out/wheel.log" 2>&1 || { tail -60 "$out/wheel.log"; echo "FAIL: building the wheel"; exit 1; }
ls "$out"/dist/trainwatch_agent-*.whl
