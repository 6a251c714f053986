#!/usr/bin/env bash
# The trainwatch wheel the torch 2.x environments install, built as a user
# builds it (PEP 517, setup.py driving CMake) from a copy of the tree kept in
# OUT/src: the copy keeps its CMake folder, so a second make test rebuilds
# only what changed. CUDA is left out, as in the package test: these
# environments run on the CPU, and the kernels are tested in the main build.
#   wheel.sh SOURCE_DIR OUT   ->  OUT/dist/trainwatch-*.whl (one)
set -euo pipefail
src=$1 out=$2
mkdir -p "$out/src"
# tar keeps the files' times: unchanged sources stay older than their objects.
tar -C "$src" --exclude=./build --exclude='./build-*' --exclude=./.git --exclude='*.egg-info' \
  -cf - . | tar -C "$out/src" -xf -
rm -rf "$out/dist"
cd "$out/src"
TRAINWATCH_CMAKE_ARGS=${TRAINWATCH_CMAKE_ARGS--DTRAINWATCH_WITH_CUDA=OFF} \
  /usr/bin/python3 -m pip wheel --no-deps --no-build-isolation --no-index -w "$out/dist" . \
  >"$out/wheel.log" 2>&1 || { tail -60 "$out/wheel.log"; echo "FAIL: building the wheel"; exit 1; }
ls "$out"/dist/trainwatch-*.whl
