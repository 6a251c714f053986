#!/usr/bin/env bash
# The Python test environments with real torch 2.x (and, where a lock file
# lists them, the trainers' libraries), made once per machine and reused.
#
#   scripts/python-env.sh LOCK      prints the environment's folder
#
# LOCK is a pinned requirements file (tests/python/env/*.txt). The
# environment is a venv of Debian's /usr/bin/python3 (the interpreter the
# native module is built for), kept under
#   ${TRAINWATCH_PYENV_CACHE:-$HOME/.cache/trainwatch/pyenv}/NAME-KEY
# where KEY hashes the lock file and the interpreter's version: a changed pin
# makes a new environment, an unchanged one is reused as it is (pip's own
# cache serves the packages again when it is rebuilt). A folder without its
# stamp (an install that died) is removed and made again. Concurrent callers
# wait on a lock; nothing but packages is downloaded.
set -euo pipefail
lock=$(realpath "$1")
py=/usr/bin/python3
root=${TRAINWATCH_PYENV_CACHE:-$HOME/.cache/trainwatch/pyenv}
name=$(basename "$lock" .txt)
key=$( (cat "$lock"; "$py" -VV) | sha256sum | cut -c1-12)
env="$root/$name-$key"
mkdir -p "$root"

exec 9>"$root/.lock"
flock 9
if [ ! -f "$env/.complete" ]; then
  rm -rf "$env"
  echo "trainwatch: making the Python environment $env from $lock (once per machine)" >&2
  "$py" -m venv "$env"
  # pip's progress to stderr, so that stdout stays the folder's name.
  "$env/bin/python" -m pip install --disable-pip-version-check -q -r "$lock" >&2
  touch "$env/.complete"
fi
echo "$env"
