#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need, and nothing when
# they are all present (apt-get runs only when something is missing).
set -euo pipefail

packages=(
  cmake g++ make pkg-config
  libabsl-dev libre2-dev  # libre2-dev: --pattern (logs/)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libsqlite3-dev prometheus-cpp-dev libcurl4-openssl-dev
  libpq-dev postgresql-15  # the PostgreSQL backend; its tests start real clusters
  libjemalloc-dev  # trainwatchd's allocator (TRAINWATCH_MALLOC)
  catch2 libbenchmark-dev
  clang-14 libclang-rt-14-dev  # fuzz/: libFuzzer and the sanitizers
  prometheus prometheus-alertmanager openssl
  pybind11-dev python3-dev python3-numpy python3-torch python3-yaml
  python3-venv python3-pip python3-setuptools python3-wheel python3-build
  dpkg-dev lintian
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "trainwatch: installing missing Debian packages: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
