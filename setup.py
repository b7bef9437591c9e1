"""Builds the compiled core ``shmcomm._core`` from ``src_cython/`` with cythonize.

Two translation units: the Cython module (``_core.pyx`` and the files it includes) and the
reduction kernels (``reduce_kernels.c``). They compile in parallel, the kernels at -O3 (their
loops are vectorized at every SIMD level) and the module at -O2 (Python glue and wait loops, where
-O3 bought nothing measurable and cost a third of the build).

A finished build is kept under ``build/shmcomm-cache/``, keyed by everything that goes into it
(the sources, this file, the flags, Python, numpy, Cython, the compiler), so the README's second
command (``pip install -e ".[test]"`` after ``pip install .``) reuses the first build instead of
compiling the same bits again. ``SHMCOMM_BUILD_CACHE=0`` turns the reuse off.
"""

import hashlib
import os
import platform
import shutil
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor

import Cython
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

here = os.path.dirname(os.path.abspath(__file__))
debug = os.environ.get("SHMCOMM_DEBUG_BUILD") == "1"
# SHMCOMM_SANITIZE=address: an AddressSanitizer build (run with libasan preloaded into Python;
# .ci/asan does both). Never for a release.
sanitize = os.environ.get("SHMCOMM_SANITIZE", "")
# -ffp-contract=off in every build: a fused multiply-add rounds once where the C rounds twice, so
# the FMA-capable SIMD levels would give other bits than baseline (reduce_kernels.c).
common_args = ["-fno-strict-aliasing", "-ffp-contract=off"]
if debug:
    module_args, kernel_args = ["-O0", "-g"], ["-O0", "-g"]
elif sanitize:
    module_args = kernel_args = ["-O1", "-g", "-fno-omit-frame-pointer", f"-fsanitize={sanitize}"]
else:
    module_args, kernel_args = ["-O2"], ["-O3"]
link_args = [f"-fsanitize={sanitize}"] if sanitize else []
KERNELS = "src_cython/reduce_kernels.c"


def _per_source_args(source):
    """The optimisation flags of one translation unit (the common ones come from the Extension)."""
    return kernel_args if source.replace(os.sep, "/").endswith(KERNELS) else module_args


class ParallelCachedBuildExt(build_ext):
    """build_ext that compiles the extension's translation units in parallel, each with its own
    flags, and reuses an identical earlier build from the cache (see the module docstring)."""

    def build_extension(self, ext):
        target = self.get_ext_fullpath(ext.name)
        cached = os.path.join(self._cache_dir(ext), os.path.basename(target))
        if os.path.exists(cached):
            print(f"shmcomm: reusing the identical earlier build of {ext.name} ({cached})")
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
            # A new file under the final name, never the old one rewritten: processes running
            # from the old build keep their mapping of it.
            shutil.copyfile(cached, target + ".tmp")
            os.replace(target + ".tmp", target)
            return
        compile_one = self.compiler.compile

        def compile_parallel(sources, extra_postargs=None, **kwargs):
            def one(source):
                return compile_one([source], extra_postargs=[*(extra_postargs or []),
                                                              *_per_source_args(source)], **kwargs)
            with ThreadPoolExecutor(max_workers=len(sources)) as pool:
                return [obj for objs in pool.map(one, sources) for obj in objs]

        self.compiler.compile = compile_parallel
        try:
            super().build_extension(ext)
        finally:
            self.compiler.compile = compile_one
        if os.environ.get("SHMCOMM_BUILD_CACHE", "1") != "0":
            os.makedirs(os.path.dirname(cached), exist_ok=True)
            shutil.copyfile(target, cached + ".tmp")
            os.replace(cached + ".tmp", cached)  # never a half-written file under the final name

    def _cache_dir(self, ext):
        """build/shmcomm-cache/<hash of every input of the build>; a fresh name when any changes."""
        key = hashlib.sha256()
        facts = [sys.version, sysconfig.get_config_var("EXT_SUFFIX"), numpy.__version__,
                 Cython.__version__, os.environ.get("CC") or sysconfig.get_config_var("CC"),
                 repr((common_args, module_args, kernel_args, link_args, ext.define_macros))]
        key.update(repr(facts).encode())
        src = os.path.join(here, "src_cython")
        names = sorted(os.path.relpath(os.path.join(d, f), src) for d, _, files in os.walk(src) for f in files)
        for name in names:  # every source below src_cython/, coll/ included
            if name != "_core.c" and name.endswith((".pyx", ".pxi", ".pxd", ".h", ".c")):
                with open(os.path.join(src, name), "rb") as f:
                    key.update(name.encode() + b"\0" + f.read())
        with open(os.path.join(here, "setup.py"), "rb") as f:
            key.update(f.read())
        if os.environ.get("SHMCOMM_BUILD_CACHE", "1") == "0":
            return os.path.join(self.build_temp, "no-cache")
        return os.path.join(here, "build", "shmcomm-cache", key.hexdigest()[:20])


extension = Extension(
    "shmcomm._core",
    sources=["src_cython/_core.pyx", KERNELS],
    include_dirs=["src_cython", numpy.get_include()],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    extra_compile_args=common_args,
    extra_link_args=link_args,
    libraries=["rt", "pthread"],
)

# What `shmcomm info` reports as the build: recorded here, at build time, not guessed later.
build_info = {
    "cython": Cython.__version__,
    "numpy (built against)": numpy.__version__,
    "python": platform.python_version(),
    "compiler": sysconfig.get_config_var("CC") or "unknown",
    "compile args": " ".join([*common_args, *module_args]) + f" (kernels: {' '.join(kernel_args)})",
    "sanitizer": sanitize or "none",
}
with open(os.path.join(here, "shmcomm", "_build_info.py"), "w") as f:
    f.write('"""Facts of the build of shmcomm._core, written by setup.py."""\n\n'
            f"BUILD_INFO = {build_info!r}\n")

setup(
    cmdclass={"build_ext": ParallelCachedBuildExt},
    ext_modules=cythonize(
        [extension],
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True,
                             "embedsignature": False},
    ),
)
