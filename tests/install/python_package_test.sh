#!/usr/bin/env bash
# The Python agent installed the way a user installs it, from a copy of this
# repository (so nothing here is written to):
#   1. `pip install --no-build-isolation --no-index .` into a fresh venv
#      (--system-site-packages, for Debian's torch); from a folder outside the
#      repository, the README's Python snippet runs against a real trainwatchd
#      with the installed package;
#   2. `python -m build --wheel --no-isolation` makes a wheel, which a second
#      fresh venv (no system packages) installs and imports.
# --no-index: nothing may come from the network.
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

mkdir "$tmp/src" "$tmp/elsewhere"
tar -C "$src" --exclude=./build --exclude=./.git --exclude='*.egg-info' -cf - . |
  tar -C "$tmp/src" -xf -

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
"$tmp/venv/bin/python" -m pip install --no-build-isolation --no-index "$tmp/src" \
  >"$tmp/pip.log" 2>&1 || { tail -60 "$tmp/pip.log"; echo "FAIL: pip install"; exit 1; }
check_import "$tmp/venv/bin/python" "$tmp/venv"

echo "== the README's Python quick start, installed package, real trainwatchd"
(cd "$tmp/elsewhere" &&
  PYTHONPATH="$src/tests/readme:$src/tests/python" PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 \
  TRAINWATCHD="$trainwatchd" DOCS_ROOT="$src" \
  "$tmp/venv/bin/python" -m unittest -v test_readme)

echo "== a wheel, into a second venv"
(cd "$tmp/src" && "$tmp/venv/bin/python" -m build --wheel --no-isolation --outdir "$tmp/dist" \
  >"$tmp/wheel.log" 2>&1) || { tail -60 "$tmp/wheel.log"; echo "FAIL: building the wheel"; exit 1; }
wheel=$(ls "$tmp"/dist/trainwatch_agent-"$version"-*.whl)
$py -m venv "$tmp/venv2"
"$tmp/venv2/bin/python" -m pip install --no-index "$wheel" >"$tmp/pip2.log" 2>&1 ||
  { cat "$tmp/pip2.log"; echo "FAIL: installing $wheel"; exit 1; }
check_import "$tmp/venv2/bin/python" "$tmp/venv2"
echo "PASS: pip install and $(basename "$wheel")"
