"""The Python packages attention_ops (the library's PyTorch operators, torch.ops.attention.*) and
attention_parity (the parity kit's recorder), built from this source tree for the Python that
runs pip, against that Python's own torch:

    python3 -m pip install --no-build-isolation .

--no-build-isolation lets the build see the installed torch (and works without a network).
CMake configures and builds libattention_ops in build/python/cmake (a static libattention
inside it), installs it into a staging folder and puts it beside the package's modules, where
attention_ops loads it: `import attention_ops` then needs no PYTHONPATH and no environment
variable. ATTENTION_BUILD_DIR names an existing CMake build of this tree to take the library
from instead (the test suite's, say, shared: its libattention comes along).
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD_BASE = os.path.join("build", "python")


def version():
    """The library's version, as include/attention/version.h states it."""
    with open(os.path.join(ROOT, "include", "attention", "version.h")) as f:
        text = f.read()
    return ".".join(re.search(rf"#define ATTENTION_VERSION_{part} (\d+)", text).group(1)
                    for part in ("MAJOR", "MINOR", "PATCH"))


def torch_cmake_prefix():
    """Where the running Python's torch keeps its CMake package, if it has one (PyPI's wheels
    do; Debian's python3-torch shares libtorch-dev's, which CMake finds by itself)."""
    import torch.utils
    prefix = torch.utils.cmake_prefix_path
    return prefix if os.path.isdir(os.path.join(prefix, "Torch")) else None


def run(command):
    print("attention_ops:", " ".join(command), flush=True)
    subprocess.check_call(command)


def build_libraries():
    """Builds libattention_ops and returns the shared libraries the package needs."""
    build = os.environ.get("ATTENTION_BUILD_DIR")
    if not build:
        build = os.path.join(ROOT, BUILD_BASE, "cmake")
        configure = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                     "-DBUILD_SHARED_LIBS=OFF", "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",
                     "-DATTENTION_BUILD_TESTS=OFF", "-DATTENTION_BUILD_TOOLS=OFF",
                     "-DATTENTION_BUILD_OPERATORS=ON"]
        prefix = torch_cmake_prefix()
        if prefix:
            configure.append(f"-DCMAKE_PREFIX_PATH={prefix}")
        run(configure)
    run(["cmake", "--build", build, "--target", "attention_ops", "-j", str(os.cpu_count() or 1)])
    staging = tempfile.mkdtemp(prefix="attention-ops-")
    # The installed library finds a shared libattention beside it ($ORIGIN), as it will in the
    # package folder.
    run(["cmake", "--install", build, "--prefix", staging])
    found = glob.glob(os.path.join(staging, "lib*", "libattention_ops.so")) + glob.glob(
        os.path.join(staging, "lib", "*", "libattention_ops.so"))
    if not found:
        raise RuntimeError(f"attention_ops: the build in {build} installed no libattention_ops.so "
                           "(is ATTENTION_BUILD_OPERATORS off, or the build sanitized?)")
    folder = os.path.dirname(found[0])
    # A shared libattention under its soname (libattention.so.MAJOR.MINOR), the name
    # libattention_ops asks for.
    shared = [p for p in glob.glob(os.path.join(folder, "libattention.so.*"))
              if re.fullmatch(r"libattention\.so\.\d+\.\d+", os.path.basename(p))]
    return staging, found + shared


class BuildWithLibraries(build_py):
    """build_py, and the shared libraries beside attention_ops's modules."""

    def run(self):
        super().run()
        staging, libraries = build_libraries()
        target = os.path.join(self.build_lib, "attention_ops")
        for stale in glob.glob(os.path.join(target, "*.so*")):  # an earlier build's
            os.remove(stale)
        for path in libraries:
            shutil.copy2(path, os.path.join(target, os.path.basename(path)))  # follows links
        shutil.rmtree(staging, ignore_errors=True)


class BinaryDistribution(Distribution):
    """A wheel for this platform and Python: it holds a native library."""

    def has_ext_modules(self):
        return True


os.makedirs(os.path.join(ROOT, BUILD_BASE), exist_ok=True)
setup(
    name="attention-ops",
    version=version(),
    description="attention-cpp's fused CPU attention kernels as PyTorch operators",
    packages=["attention_ops", "attention_parity"],
    package_dir={"": "python"},
    python_requires=">=3.8",
    # No install_requires: the library is built against the torch this Python already has (the
    # build imports it), and naming it would have pip re-check that torch's own pins (Debian's
    # python3-torch 2.6 pins a sympy its distribution does not ship).
    cmdclass={"build_py": BuildWithLibraries},
    distclass=BinaryDistribution,
    options={"build": {"build_base": BUILD_BASE}, "egg_info": {"egg_base": BUILD_BASE}},
    zip_safe=False,
)
