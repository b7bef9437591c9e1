"""Where the optional peer libraries live and how each one starts: Intel MPI (an ``mpiexec`` and
its ``libmpi``, which mpi4py must load instead of any other MPI's) and DeepSpeed's shared-memory
all_reduce op. Cheap to import: nothing here imports a peer until it starts one.

Example::

    impi = intel_mpi()
    if impi.reason:
        print("Intel MPI skipped:", impi.reason)
    else:
        print(impi.mpiexec, impi.libmpi)
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass

# Where an Intel MPI may be: this variable first (the prefix holding bin/ and lib/ of an install,
# or of a virtual environment with the impi-rt wheel), then oneAPI's I_MPI_ROOT, then the
# prefixes of this Python (the impi-rt wheel puts mpiexec in <prefix>/bin, libmpi in <prefix>/lib).
IMPI_VARIABLE = "SHMCOMM_BENCH_IMPI"


@dataclass(frozen=True)
class IntelMpi:
    """An Intel MPI found here (``mpiexec`` and ``libmpi`` set), or why none (``reason``)."""

    mpiexec: str = ""
    libmpi: str = ""
    reason: str = ""

    def environment(self) -> dict:
        """The variables its ranks need: mpi4py loads this libmpi (not the first MPI it finds);
        the shared-memory fabric only, as on one node (no network provider is probed)."""
        return {"MPI4PY_LIBMPI": self.libmpi, "I_MPI_FABRICS": "shm"}


def _is_intel_mpi(prefix: str) -> IntelMpi | None:
    """The Intel MPI under ``prefix`` if it has one: its impi_info tool tells it from MPICH,
    whose hydra ``mpiexec`` and ``libmpi.so.12`` look the same."""
    mpiexec, libmpi = os.path.join(prefix, "bin", "mpiexec"), os.path.join(prefix, "lib", "libmpi.so.12")
    if (os.access(mpiexec, os.X_OK) and os.path.exists(libmpi)
            and os.path.exists(os.path.join(prefix, "bin", "impi_info"))):
        return IntelMpi(mpiexec, libmpi)
    return None


def intel_mpi() -> IntelMpi:
    """Find Intel MPI: ``$SHMCOMM_BENCH_IMPI``, ``$I_MPI_ROOT``, else this Python's prefixes
    (``pip install impi-rt``, best in a virtual environment of its own: its ``mpirun`` would
    shadow another MPI's on PATH). mpi4py is needed too.

    Example::

        >>> intel_mpi().reason   # on a machine without it
        'no Intel MPI: install the impi-rt wheel (pip install impi-rt) or set SHMCOMM_BENCH_IMPI to its prefix'
    """
    if importlib.util.find_spec("mpi4py") is None:
        return IntelMpi(reason="mpi4py is not installed")
    given = os.environ.get(IMPI_VARIABLE)
    if given:
        found = _is_intel_mpi(given)
        return found or IntelMpi(reason=f"{IMPI_VARIABLE}={given} holds no Intel MPI "
                                        "(bin/mpiexec, bin/impi_info and lib/libmpi.so.12)")
    prefixes = [os.environ.get("I_MPI_ROOT"), sys.prefix, sys.exec_prefix, sys.base_prefix]
    for prefix in dict.fromkeys(p for p in prefixes if p):
        found = _is_intel_mpi(prefix)
        if found:
            return found
    return IntelMpi(reason="no Intel MPI: install the impi-rt wheel (pip install impi-rt) or set "
                           f"{IMPI_VARIABLE} to its prefix")


def deepspeed_missing() -> str | None:
    """Why DeepSpeed's op cannot run here (None if its package and torch import)."""
    for module in ("torch", "deepspeed"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install deepspeed)"
    return None


def start_deepspeed(local_size: int) -> str | None:
    """Start DeepSpeed's shared-memory all_reduce (``torch.ops.deepspeed.inference_all_reduce_``)
    on the world group of an initialised ``torch.distributed``; None once it runs, else why not.

    It reads ``LOCAL_SIZE`` (and crashes without it), needs ``DS_ACCELERATOR=cpu`` on a machine
    without GPUs and builds its kernel on first use. Its bfloat16 and float16 kernels need
    AVX-512BW: without it the note says that only float32 is served.

    Example::

        dist.init_process_group("gloo")
        note = start_deepspeed(dist.get_world_size())
        torch.ops.deepspeed.inference_all_reduce_(tensor)
    """
    missing = deepspeed_missing()
    if missing:
        return missing
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ["LOCAL_SIZE"] = str(local_size)
    import torch

    try:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")  # the torch group exists: reused
        if not hasattr(torch.ops, "deepspeed") or not hasattr(torch.ops.deepspeed, "inference_all_reduce_"):
            raise RuntimeError("its shared-memory op did not build")
    except Exception as exc:  # noqa: BLE001 - a peer that cannot start is reported, not fatal
        return f"DeepSpeed could not start: {exc}"
    return None


def deepspeed_half_missing() -> str | None:
    """Why DeepSpeed's bfloat16/float16 kernels cannot run here (they need AVX-512BW, else the op
    crashes with SIGILL or falls back to gloo), None where they can."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return "cannot read /proc/cpuinfo to check for AVX-512BW"
    return None if " avx512bw" in flags else "DeepSpeed's bfloat16/float16 kernels need AVX-512BW"


def deepspeed_leftovers() -> set[str]:
    """The files DeepSpeed's op leaves in /dev/shm (its buffers are never removed)."""
    return set(glob.glob("/dev/shm/deepspeed_*"))


def remove_deepspeed_buffers(before: set[str]) -> str | None:
    """Remove the files DeepSpeed's op left in /dev/shm since ``before`` (deepspeed_leftovers()
    taken before its run); a sentence saying what was removed, or None if nothing was.

    Example::

        before = deepspeed_leftovers()
        ...                                    # ranks that call torch.ops.deepspeed ops
        note = remove_deepspeed_buffers(before)
    """
    paths = deepspeed_leftovers() - before
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass
    if not paths:
        return None
    return (f"DeepSpeed's op left {len(paths)} file(s) in /dev/shm (it never removes its buffers); "
            f"removed: {', '.join(sorted(os.path.basename(p) for p in paths))}")


def mpirun() -> str | None:
    """The ``mpirun`` the ``mpi`` backend starts: ``$SHMCOMM_BENCH_MPIRUN``, else the first
    ``mpirun`` or ``mpiexec`` on PATH; None without one.

    Example::

        mpirun()   # '/usr/bin/mpirun' where Open MPI is installed
    """
    return os.environ.get("SHMCOMM_BENCH_MPIRUN") or shutil.which("mpirun") or shutil.which("mpiexec")
