"""Builds the compiled core ``shmcomm._core`` from ``src_cython/`` with cythonize."""

import os

import platform
import sysconfig

import Cython
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

debug = os.environ.get("SHMCOMM_DEBUG_BUILD") == "1"
# SHMCOMM_SANITIZE=address: an AddressSanitizer build (run with libasan preloaded into Python;
# .ci/asan does both). Never for a release.
sanitize = os.environ.get("SHMCOMM_SANITIZE", "")
# -ffp-contract=off in every build: a fused multiply-add rounds once where the C rounds twice, so
# the FMA-capable SIMD levels would give other bits than baseline (reduce_kernels.h).
compile_args = ["-O0", "-g", "-ffp-contract=off"] if debug else ["-O3", "-fno-strict-aliasing", "-ffp-contract=off"]
link_args = []
if sanitize:
    compile_args = ["-O1", "-g", "-fno-omit-frame-pointer", f"-fsanitize={sanitize}", "-fno-strict-aliasing",
                    "-ffp-contract=off"]
    link_args = [f"-fsanitize={sanitize}"]
extension = Extension(
    "shmcomm._core",
    sources=["src_cython/_core.pyx"],
    include_dirs=["src_cython", numpy.get_include()],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    extra_compile_args=compile_args,
    extra_link_args=link_args,
    libraries=["rt", "pthread"],
)

# What `shmcomm info` reports as the build: recorded here, at build time, not guessed later.
build_info = {
    "cython": Cython.__version__,
    "numpy (built against)": numpy.__version__,
    "python": platform.python_version(),
    "compiler": sysconfig.get_config_var("CC") or "unknown",
    "compile args": " ".join(compile_args),
    "sanitizer": sanitize or "none",
}
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "shmcomm", "_build_info.py"), "w") as f:
    f.write('"""Facts of the build of shmcomm._core, written by setup.py."""\n\n'
            f"BUILD_INFO = {build_info!r}\n")

setup(
    ext_modules=cythonize(
        [extension],
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True,
                             "embedsignature": False},
    ),
)
