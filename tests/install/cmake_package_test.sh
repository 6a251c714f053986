#!/usr/bin/env bash
# `cmake --install` into a scratch prefix, then a separate CMake project that
# finds it with find_package(trainwatch 0.1) and builds and runs the
# documentation's C++ agent snippet. Also: the installed package names no path
# of this tree, a version it is not is refused, and the installed binaries run.
#   cmake_package_test.sh BUILD_DIR SOURCE_DIR VERSION
set -euo pipefail
build=$1 src=$2 version=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log"
for f in bin/trainwatchd bin/twctl include/trainwatch/agent/agent.h \
         include/trainwatch/core/version.h include/trainwatch/kernels/grad_stats.h \
         lib/libtrainwatch_agent.a lib/cmake/trainwatch/trainwatchConfig.cmake \
         lib/cmake/trainwatch/trainwatchConfigVersion.cmake; do
  [ -e "$tmp/prefix/$f" ] || { echo "FAIL: not installed: $f"; exit 1; }
done
# Nothing written to the system: the service files are the package's only.
if find "$tmp/prefix" -path '*systemd*' -o -path '*/etc/*' | grep -q .; then
  echo "FAIL: cmake --install wrote service files"; exit 1
fi
if grep -rl -e "$src" -e "$build" "$tmp/prefix/lib/cmake"; then
  echo "FAIL: the installed CMake package names the build or source tree"; exit 1
fi
got=$("$tmp/prefix/bin/trainwatchd" --version | head -1)
[ "$got" = "trainwatchd $version" ] || { echo "FAIL: trainwatchd --version: $got"; exit 1; }
help=$("$tmp/prefix/bin/trainwatchd" --help 2>&1 || true)
grep -q "Flags from trainwatchd.cc:" <<<"$help" || { echo "$help"; echo "FAIL: trainwatchd --help"; exit 1; }
if grep -e "trainwatchd: trainwatchd" -e "$src" -e "src/trainwatchd_main" <<<"$help"; then
  echo "FAIL: trainwatchd --help repeats its name or names a build path"; exit 1
fi
got=$("$tmp/prefix/bin/twctl" version)
[ "$got" = "twctl $version" ] || { echo "FAIL: twctl version: $got"; exit 1; }

args=(-DCMAKE_PREFIX_PATH="$tmp/prefix" -DDOCS_ROOT="$src"
      -DREADME_TEST_DIR="$src/tests/readme" -DCMAKE_BUILD_TYPE=Release)
cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" "${args[@]}" >"$tmp/configure.log" ||
  { cat "$tmp/configure.log"; echo "FAIL: find_package(trainwatch 0.1)"; exit 1; }
cmake --build "$tmp/consumer" -j2 >"$tmp/build.log" ||
  { tail -40 "$tmp/build.log"; echo "FAIL: building the snippet against the package"; exit 1; }
"$tmp/consumer/readme_consumer"

# A version this is not must be refused, not silently taken.
major=${version%%.*}
if cmake -S "$src/tests/install/consumer" -B "$tmp/wrong" "${args[@]}" \
     -DTRAINWATCH_WANT="$((major + 1)).0" >"$tmp/wrong.log" 2>&1; then
  echo "FAIL: find_package(trainwatch $((major + 1)).0) accepted $version"; exit 1
fi
grep -q "compatible with requested version" "$tmp/wrong.log" ||
  { cat "$tmp/wrong.log"; echo "FAIL: the refusal does not say why"; exit 1; }
echo "PASS: installed to a prefix, found with find_package(trainwatch 0.1), snippet built and run"
