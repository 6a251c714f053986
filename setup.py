"""Builds the `trainwatch` Python package: the pure-Python modules from
agent/python/trainwatch and the native module `_trainwatch`, which CMake builds
with the interpreter running this script (its headers, its extension suffix).

The version is the C++ one: project(trainwatch VERSION ...) in CMakeLists.txt.

Environment:
  TRAINWATCH_CMAKE_ARGS  extra arguments for CMake's configure step, e.g.
                         "-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc"
  TRAINWATCH_CMAKE_BUILD_DIR  CMake's build folder (default: under setuptools'
                         build_temp); the wheels share one across Pythons
  TRAINWATCH_WITH_TWCTL=1  the module also carries twctl's commands, run by
                         the `twctl` console script (trainwatch/_twctl.py)
  CMAKE_BUILD_PARALLEL_LEVEL  build jobs (default: every CPU)

Built this way the module links the system's gRPC and Abseil shared libraries
(Debian: libgrpc++1.51, libabsl20220623), which must be present where it is
imported; the wheels (scripts/build_wheels.py) carry them inside, as
auditwheel bundles them.
"""

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent
WITH_TWCTL = os.environ.get("TRAINWATCH_WITH_TWCTL") == "1"


def cmake_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"project\(trainwatch\s+VERSION\s+([0-9.]+)", text)
    if m is None:
        raise RuntimeError("CMakeLists.txt: no project(trainwatch VERSION ...)")
    return m.group(1)


class CMakeExtension(Extension):
    def __init__(self, name, target):
        super().__init__(name, sources=[])
        self.target = target


class CMakeBuild(build_ext):
    """Configures the tree with only the agent and its binding (no server,
    tests or benchmarks), builds the one target and copies it where setuptools
    expects the extension."""

    def build_extension(self, ext):
        build_dir = pathlib.Path(os.environ.get("TRAINWATCH_CMAKE_BUILD_DIR") or
                                 pathlib.Path(self.build_temp) / "cmake").resolve()
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            # What an earlier configure found of another interpreter (the
            # wheels share a build folder) is looked for again (before -D:
            # CMake applies them in order).
            "-U", "Python_*", "-U", "_Python_*",
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DTRAINWATCH_BUILD_SERVER=OFF",
            f"-DTRAINWATCH_BUILD_TWCTL={'ON' if WITH_TWCTL else 'OFF'}",
            "-DTRAINWATCH_BUILD_TESTS=OFF",
            "-DTRAINWATCH_BUILD_BENCH=OFF",
        ] + shlex.split(os.environ.get("TRAINWATCH_CMAKE_ARGS", ""))
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", ext.target, "-j", jobs],
                       check=True)
        # The module of this interpreter: a shared build folder holds others'.
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = build_dir / "python" / "trainwatch" / (ext.target + suffix)
        if not built.exists():
            raise RuntimeError(f"expected the {ext.target} module at {built}")
        dest = pathlib.Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, dest)


setup(
    version=cmake_version(),
    package_dir={"": "agent/python"},
    packages=["trainwatch", "trainwatch.integrations"],
    # Typed (PEP 561): the marker and the native module's stub; and the
    # bootstrap folder `trainwatch run` puts first on PYTHONPATH (a
    # sitecustomize.py alone, no package).
    package_data={"trainwatch": ["py.typed", "_trainwatch.pyi", "_bootstrap/sitecustomize.py"]},
    entry_points={"console_scripts": ["trainwatch = trainwatch.cli:main"] +
                  (["twctl = trainwatch._twctl:main"] if WITH_TWCTL else [])},
    ext_modules=[CMakeExtension("trainwatch._trainwatch", target="_trainwatch")],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
