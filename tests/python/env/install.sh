#!/usr/bin/env bash
# One torch 2.x test environment for this build: the machine's cached
# environment of LOCK (scripts/python-env.sh, made at its first use), under a
# venv of this build's own (OUT/NAME) into which trainwatch's wheel is
# pip-installed, as a user installs it. The cached packages are reached
# through a .pth file, so the cache itself is never written by a test run.
#   install.sh SOURCE_DIR OUT LOCK
set -euo pipefail
src=$1 out=$2 lock=$3
name=$(basename "$lock" .txt)
base=$("$src/scripts/python-env.sh" "$lock")
venv="$out/$name"
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
  >"$site/trainwatch_test_base.pth"
wheel=$(ls "$out"/dist/trainwatch_agent-*.whl)
"$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps --no-index \
  --force-reinstall "$wheel"
# From a folder outside the tree: the installed package, not the sources.
cd "$out"
"$venv/bin/python" - <<'PY'
import importlib.metadata as md, os, sys
import torch, trainwatch
assert os.path.realpath(trainwatch.__file__).startswith(os.path.realpath(sys.prefix)), trainwatch.__file__
# Typed (PEP 561): the marker and the binding's stub are installed with it.
for typed in ("py.typed", "_trainwatch.pyi"):
    assert os.path.isfile(os.path.join(os.path.dirname(trainwatch.__file__), typed)), typed
# The libraries under test, where the lock file has them.
libs = []
for dist in ("torch", "transformers", "lightning", "torchtitan", "tensorboard", "ai2-olmo-core"):
    try:
        libs.append(f"{dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        pass
print(f"python {sys.version.split()[0]}, {', '.join(libs)}, trainwatch {trainwatch.__version__} "
      f"({os.path.dirname(trainwatch.__file__)})")
PY
