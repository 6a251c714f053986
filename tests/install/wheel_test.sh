#!/usr/bin/env bash
# A self-contained wheel (scripts/build_wheels.py), as a user on another
# machine gets it: installed with --no-index into a bare venv of pyenv's
# CPython (no system site packages, no Debian Python), it imports and
# decides, its twctl answers --version, replays a log and reads a real
# trainwatchd's status, and loads gRPC, protobuf, Abseil and the rest from
# the wheel, never the system: every library its module needs is glibc's,
# the C++ runtime's, or one the wheel carries (readelf), and the loader
# takes none of them from the system (LD_DEBUG=libs).
#   wheel_test.sh SOURCE_DIR WHEEL_DIR AUDITWHEEL_PYTHON TRAINWATCHD VERSION [PYTHON_VERSION]
# WHEEL_DIR holds the wheels the torch environments install (pyenv_wheel);
# AUDITWHEEL_PYTHON, the interpreter build_wheels.py installed auditwheel in.
set -euo pipefail
src=$1 wheels=$2 repair=$3 trainwatchd=$4 version=$5 pyver=${6:-3.11}
tag=cp${pyver/./}
tmp=$(mktemp -d)
pid=
cleanup() {
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
unset PYTHONPATH

wheel=$(ls "$wheels"/trainwatch_agent-"$version"-"$tag"-"$tag"-manylinux_*.whl)
echo "== $(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB"
"$repair" -m auditwheel show "$wheel" | tee "$tmp/show.txt"
tr '\n' ' ' <"$tmp/show.txt" | grep -q 'consistent with the following platform tag: "manylinux_2_34_x86_64"' ||
  { echo "FAIL: auditwheel does not grant the wheel its tag"; exit 1; }

py=$(ls -d "$HOME"/.pyenv/versions/"$pyver".*/bin/python"$pyver" | sort -V | tail -n 1)
"$py" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --no-index --disable-pip-version-check "$wheel"
site=$("$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

echo "== what its native files need: glibc, the C++ runtime, or what the wheel carries"
for f in "$site"/trainwatch/_trainwatch.*.so "$site"/trainwatch_agent.libs/*; do
  for lib in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    case $lib in
      libc.so.6|libm.so.6|libpthread.so.0|libdl.so.2|librt.so.1|ld-linux-x86-64.so.2) ;;
      libstdc++.so.6|libgcc_s.so.1|libz.so.1) ;;  # in every manylinux policy
      *) [ -e "$site/trainwatch_agent.libs/$lib" ] ||
           { echo "FAIL: $(basename "$f") needs $lib, which the wheel lacks"; exit 1; } ;;
    esac
  done
done
ls "$site/trainwatch_agent.libs" | tr '\n' ' '; echo

mkdir "$tmp/elsewhere"
cd "$tmp/elsewhere"
echo "== import, and a step decided, with the loader watched"
# A wheel built where nvcc is carries the CUDA kernels (scripts/build_wheels.py).
WHEEL_CUDA=0
[ -x "${CUDACXX:-/usr/local/cuda/bin/nvcc}" ] && WHEEL_CUDA=1
export WHEEL_CUDA
LD_DEBUG=libs LD_DEBUG_OUTPUT="$tmp/ld" "$tmp/venv/bin/python" - "$tmp/venv" "$version" <<'PY'
import os, sys
import trainwatch
venv, version = sys.argv[1], sys.argv[2]
where = os.path.realpath(trainwatch.__file__)
assert where.startswith(os.path.realpath(venv) + os.sep), f"imported from {where}"
assert trainwatch.__version__ == version, (trainwatch.__version__, version)
agent = trainwatch.Agent(server="", run_id="wheel-check")
assert agent.step(0, loss=2.0).decision == "continue"
agent.close()
print(f"trainwatch {trainwatch.__version__} from {where}")
# The CUDA kernels travel in the wheel built with nvcc; where no GPU can run
# them (this machine), the module says so and the guard uses torch.
from trainwatch import _trainwatch
cuda = os.environ["WHEEL_CUDA"] == "1"
assert _trainwatch.built_with_cuda is cuda, _trainwatch.built_with_cuda
assert hasattr(_trainwatch, "DeviceStats") is cuda
assert _trainwatch.has_cuda is (cuda and os.path.exists("/dev/nvidiactl")), _trainwatch.has_cuda
print(f"CUDA kernels: built {_trainwatch.built_with_cuda}, usable here {_trainwatch.has_cuda}")
PY
LD_DEBUG=libs LD_DEBUG_OUTPUT="$tmp/ld-twctl" "$tmp/venv/bin/twctl" --version
# What the loader initialised: the wheel's copies, none of the system's, and
# no CUDA library at all (the runtime is linked in; the driver is opened only
# when a device is asked for).
if [ ! -e /dev/nvidiactl ] && cat "$tmp"/ld* | grep -E "calling init: .*/lib(cudart|cuda|nvrtc)\.so"; then
  echo "FAIL: importing loaded a CUDA library"; exit 1
fi
lib='lib(grpc|gpr|upb|protobuf|absl|cares|re2|address_sorting)'
if cat "$tmp"/ld* | grep -E "calling init: /(usr/)?lib.*/$lib"; then
  echo "FAIL: the lines above are the system's copies"; exit 1
fi
cat "$tmp"/ld* | grep -E "calling init: .*/trainwatch_agent.libs/libgrpc\+\+-" | head -n 1 | grep -q . ||
  { echo "FAIL: the wheel's gRPC was not loaded"; exit 1; }

echo "== twctl from the venv: replay, and status against a real trainwatchd"
"$tmp/venv/bin/twctl" replay "$src/tests/data/realdata/parameter-golf-behemoth-v10.log" --summary \
  | tee "$tmp/replay.txt"
grep -q "halted at step 1200" "$tmp/replay.txt" || { echo "FAIL: replay missed the NaN"; exit 1; }
"$trainwatchd" --listen 127.0.0.1:0 --metrics_listen= --db "$tmp/tw.db" >"$tmp/d.log" 2>&1 &
pid=$!
server=
for _ in $(seq 200); do
  server=$(grep -o 'listening on 127\.0\.0\.1:[0-9]*' "$tmp/d.log" | head -n 1 | cut -d' ' -f3 || true)
  [ -n "$server" ] && break
  sleep 0.05
done
[ -n "$server" ] || { cat "$tmp/d.log"; echo "FAIL: trainwatchd did not start"; exit 1; }
TRAINWATCH_SERVER=$server "$tmp/venv/bin/python" - <<'PY'
import trainwatch
agent = trainwatch.Agent(run_id="wheel-run")
for step in range(20):
    agent.step(step, loss=2.0 - 0.01 * step)
agent.close()
PY
"$tmp/venv/bin/twctl" --server "$server" status wheel-run | tee "$tmp/status.txt"
grep -q "run wheel-run: step 19," "$tmp/status.txt" ||
  { echo "FAIL: twctl status does not show the run's 20 steps"; exit 1; }

# With WHEEL_TEST_TORCH (a requirement, torch==X: make wheels gives the
# pinned torch of tests/python/env that has a wheel for this Python), the
# user's torch from the package index joins the venv as pip resolves it
# (pip's cache serves repeats), and the README's Python quick start runs with
# the installed wheel against a real trainwatchd. make test's install_wheel
# leaves it out: its torch environments run the quick start with this wheel.
if [ -n "${WHEEL_TEST_TORCH:-}" ]; then
  echo "== the README's Python quick start, with $WHEEL_TEST_TORCH from the index"
  "$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check "$WHEEL_TEST_TORCH" ||
    { echo "FAIL: installing $WHEEL_TEST_TORCH"; exit 1; }
  PYTHONPATH="$src/tests/readme:$src/tests/python" PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 \
    TRAINWATCHD="$trainwatchd" DOCS_ROOT="$src" "$tmp/venv/bin/python" -m unittest -v test_readme
fi
echo "PASS: $(basename "$wheel") in a bare venv of $(basename "$py")"
