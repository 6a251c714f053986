#!/usr/bin/env bash
# The Python agent built from source the ways a user does, from the source
# distribution of a copy of this repository (so nothing here is written to;
# `python -m build --sdist`, with Debian's tools):
#   1. `pip install --no-build-isolation --no-index SDIST` into a fresh venv
#      (--system-site-packages, for Debian's torch), with the system's build
#      tools; from a folder outside the repository, the README's Python
#      snippet runs against a real trainwatchd with the installed package;
#   2. `pip wheel SDIST` with build isolation: the build tools pyproject.toml
#      pins come from the package index alone (from a wheelhouse of them made
#      once per machine, then --no-index); a second fresh venv (no system
#      packages) installs the wheel and imports it;
#   3. the same build where neither CMake nor pkg-config finds the -dev
#      packages (CMake told to ignore /usr) stops before compiling, naming each
#      missing one and its Debian and Fedora package.
#   python_package_test.sh SOURCE_DIR TRAINWATCHD VERSION
#
# The package builds without CUDA unless TRAINWATCH_CMAKE_ARGS (setup.py's
# configure arguments) is set, empty included: what this tests is the
# packaging, the CUDA kernels compile and are tested in the main build, and
# nvcc was a quarter of this test's CPU time (53 of about 212 CPU-seconds).
# TRAINWATCH_CMAKE_ARGS= python_package_test.sh ... builds it as a user would.
set -euo pipefail
src=$1 trainwatchd=$2 version=$3
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset PYTHONPATH
export TRAINWATCH_CMAKE_ARGS=${TRAINWATCH_CMAKE_ARGS--DTRAINWATCH_WITH_CUDA=OFF}

mkdir "$tmp/src" "$tmp/elsewhere" "$tmp/empty"
tar -C "$src" --exclude=./build --exclude=./.git --exclude='*.egg-info' -cf - . |
  tar -C "$tmp/src" -xf -
echo "== the source distribution"
(cd "$tmp" && $py -m build --sdist --no-isolation --skip-dependency-check --outdir "$tmp/sdist" \
  "$tmp/src" >"$tmp/sdist.log" 2>&1) || { tail -40 "$tmp/sdist.log"; echo "FAIL: sdist"; exit 1; }
sdist=$(ls "$tmp"/sdist/*.tar.gz)
tar -tzf "$sdist" | grep -q '/tests/' && { echo "FAIL: the sdist carries tests/"; exit 1; }

# The build tools pyproject.toml pins, from the package index, once per
# machine (keyed by the pins): what an isolated build of the sdist fetches.
tools=$($py -c 'import sys, tomllib; print(" ".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' "$src/pyproject.toml")
wheelhouse=${TRAINWATCH_PYENV_CACHE:-$HOME/.cache/trainwatch/pyenv}/build-tools-$(echo "$tools" | sha256sum | cut -c1-12)
if [ ! -f "$wheelhouse/.complete" ]; then
  rm -rf "$wheelhouse"
  # shellcheck disable=SC2086  # the pins, one word each
  $py -m pip download -q --disable-pip-version-check --only-binary :all: -d "$wheelhouse" $tools
  touch "$wheelhouse/.complete"
fi

# Which trainwatch an interpreter imports, and its two version numbers.
check_import() {  # PYTHON VENV
  (cd "$tmp/elsewhere" && "$1" - "$2" "$version" <<'PY'
import importlib.metadata, os, sys
import trainwatch
venv, version = sys.argv[1], sys.argv[2]
where = os.path.realpath(trainwatch.__file__)
assert where.startswith(os.path.realpath(venv) + os.sep), f"imported from {where}"
assert trainwatch.__version__ == version, (trainwatch.__version__, version)
assert importlib.metadata.version("trainwatch-agent") == version
agent = trainwatch.Agent(server="", run_id="import-check")
assert agent.step(0, loss=2.0).decision == "continue"
agent.close()
print(f"trainwatch {trainwatch.__version__} from {where}")
PY
  )
}

echo "== pip install into a venv"
$py -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --no-build-isolation --no-index "$sdist" \
  >"$tmp/pip.log" 2>&1 || { tail -60 "$tmp/pip.log"; echo "FAIL: pip install"; exit 1; }
check_import "$tmp/venv/bin/python" "$tmp/venv"

echo "== the README's Python quick start, installed package, real trainwatchd"
(cd "$tmp/elsewhere" &&
  PYTHONPATH="$src/tests/readme:$src/tests/python" PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 \
  TRAINWATCHD="$trainwatchd" DOCS_ROOT="$src" \
  "$tmp/venv/bin/python" -m unittest -v test_readme)

echo "== a wheel of the sdist with the index's build tools (isolated), into a second venv"
(cd "$tmp/elsewhere" && "$tmp/venv/bin/python" -m pip wheel --no-index --find-links "$wheelhouse" \
  --no-deps --disable-pip-version-check -w "$tmp/dist" "$sdist" >"$tmp/wheel.log" 2>&1) ||
  { tail -60 "$tmp/wheel.log"; echo "FAIL: building the wheel"; exit 1; }
grep -q "cmake-3" "$tmp/wheel.log" || grep -qi "Installing build dependencies" "$tmp/wheel.log" ||
  { tail -20 "$tmp/wheel.log"; echo "FAIL: the wheel was not built in isolation"; exit 1; }
wheel=$(ls "$tmp"/dist/trainwatch_agent-"$version"-*.whl)
$py -m venv "$tmp/venv2"
"$tmp/venv2/bin/python" -m pip install --no-index "$wheel" >"$tmp/pip2.log" 2>&1 ||
  { cat "$tmp/pip2.log"; echo "FAIL: installing $wheel"; exit 1; }
check_import "$tmp/venv2/bin/python" "$tmp/venv2"

echo "== the sdist where the -dev packages are missing: named, nothing compiled"
if (cd "$tmp/elsewhere" && PKG_CONFIG_LIBDIR="$tmp/empty" PKG_CONFIG_PATH= \
    TRAINWATCH_CMAKE_ARGS="$TRAINWATCH_CMAKE_ARGS -DCMAKE_IGNORE_PREFIX_PATH=/usr" \
    "$tmp/venv/bin/python" -m pip wheel --no-index --find-links "$wheelhouse" --no-deps \
    --disable-pip-version-check -w "$tmp/dist-missing" "$sdist" >"$tmp/missing.log" 2>&1); then
  echo "FAIL: built without the system's libraries"; exit 1
fi
for line in "building the native module from source needs these, which this system lacks" \
            "grpc++ (Debian/Ubuntu: libgrpc++-dev; Fedora/RHEL: grpc-devel)" \
            "protobuf (Debian/Ubuntu: libprotobuf-dev; Fedora/RHEL: protobuf-devel)" \
            "absl_base (Debian/Ubuntu: libabsl-dev; Fedora/RHEL: abseil-cpp-devel)" \
            "re2 (Debian/Ubuntu: libre2-dev; Fedora/RHEL: re2-devel)" \
            "or install a built wheel, which needs none of them"; do
  grep -qF "$line" "$tmp/missing.log" || { cat "$tmp/missing.log"; echo "FAIL: no \"$line\""; exit 1; }
done
grep -q "Building CXX" "$tmp/missing.log" && { echo "FAIL: it compiled"; exit 1; }
echo "PASS: the sdist with the system's tools, with the index's, and without the -dev packages"
echo "PASS: pip install and $(basename "$wheel")"
