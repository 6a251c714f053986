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

From the source distribution (`pip install trainwatch_agent-X.tar.gz`), pip
fetches the build tools pyproject.toml pins (setuptools, wheel, pybind11,
CMake) from the package index; the C++ libraries come from the system (or any
prefix CMake is pointed at), and when CMake cannot configure the build, the
ones pkg-config and PATH do not find either are named with the packages that
provide them (missing_system_packages), before anything is compiled.

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


# What the build needs from the system, as pkg-config and PATH name it, and
# the packages that provide it: (what, Debian/Ubuntu, Fedora/RHEL).
SYSTEM_LIBRARIES = [
    ("grpc++", "libgrpc++-dev", "grpc-devel"),
    ("protobuf", "libprotobuf-dev", "protobuf-devel"),
    ("absl_base", "libabsl-dev", "abseil-cpp-devel"),
    ("re2", "libre2-dev", "re2-devel"),
]
SYSTEM_TOOLS = [
    ("protoc", "protobuf-compiler", "protobuf-compiler"),
    ("grpc_cpp_plugin", "protobuf-compiler-grpc", "grpc-plugins"),
    ("c++", "g++", "gcc-c++"),
]


def missing_system_packages(env=None):
    """The lines naming what the build needs and the system lacks: each
    library pkg-config does not find, each tool not on PATH."""
    env = os.environ if env is None else env
    missing = []
    if shutil.which("pkg-config", path=env.get("PATH")) is None:
        missing.append(("pkg-config", "pkg-config", "pkgconf-pkg-config"))
    else:
        for name, debian, fedora in SYSTEM_LIBRARIES:
            found = subprocess.run(["pkg-config", "--exists", name], env=env).returncode == 0
            if not found:
                missing.append((name, debian, fedora))
    for tool, debian, fedora in SYSTEM_TOOLS:
        # CXX may carry a launcher or flags ("ccache g++"): its first word.
        program = shlex.split(env.get("CXX") or tool)[0] if tool == "c++" else tool
        if shutil.which(program, path=env.get("PATH")) is None:
            missing.append((tool, debian, fedora))
    return [f"  {what} (Debian/Ubuntu: {debian}; Fedora/RHEL: {fedora})"
            for what, debian, fedora in missing]


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
        # pybind11 from the build's own tools (the index's, in an isolated
        # build), unless the caller names one.
        if not any(a.startswith("-Dpybind11_DIR=") for a in configure):
            try:
                import pybind11
                configure.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
            except ImportError:
                pass  # the system's (Debian: pybind11-dev), found by CMake
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        try:
            subprocess.run(configure, check=True)
        except subprocess.CalledProcessError:
            # CMake said why above; what the system lacks, in packages.
            missing = missing_system_packages()
            if not missing:
                raise
            raise SystemExit(
                "trainwatch-agent: building the native module from source needs these, which "
                "this system lacks:\n" + "\n".join(missing) + "\nInstall them (Debian's full "
                "list: scripts/install-deps.sh in the repository), or install a built wheel, "
                "which needs none of them (docs/install.md).")
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
