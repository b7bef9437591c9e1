"""What this machine and this Python let shmcomm do, each as one line for ``shmcomm info``: the
torch backend (and why not), the peers ``shmcomm-bench`` can compare with, and whether ranks may
read each other's memory (single copy). Nothing here imports torch or an MPI: the answers come
from package metadata, ``mpirun --version`` and a probe between two forked processes.

Example::

    from shmcomm import capabilities
    print(capabilities.torch_backend())   # 'yes: torch 2.13.0, dist.init_process_group("shmcomm") ...'
    print(capabilities.single_copy())     # 'yes: sibling processes may read each other's memory ...'
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import subprocess

TORCH_RANGE = ((2, 7), (2, 16))  # the torch extra's range (pyproject.toml): 2.7 up to, not incl., 2.16


def _version_tuple(text: str) -> tuple[int, int]:
    """``(2, 13)`` for ``"2.13.0+cpu"``."""
    major, minor = (text.split("+")[0].split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def torch_backend() -> str:
    """Whether ``dist.init_process_group("shmcomm")`` works here, and why not.

    Example::

        >>> torch_backend().split(":")[0] in ("yes", "no")
        True
    """
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return 'no: torch is not installed (pip install ".[torch]" from a checkout)'
    low, high = TORCH_RANGE
    if not low <= _version_tuple(version) < high:
        return (f"no: torch {version} is outside the supported {low[0]}.{low[1]} to "
                f"{high[0]}.{high[1] - 1}")
    registered = any(ep.name == "shmcomm" for ep in importlib.metadata.entry_points(group="torch.backends"))
    how = ("registered through the torch.backends entry point" if registered else
           "not registered through an entry point here: import shmcomm.torch first")
    return f'yes: torch {version}, dist.init_process_group("shmcomm") ({how})'


def _mpi_name() -> str:
    """The MPI of the ``mpirun`` shmcomm-bench would start, by its own words."""
    from shmcomm.bench.peers import mpirun

    try:
        out = subprocess.run([mpirun(), "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "an mpirun"
    first = (out.stdout or out.stderr).strip().splitlines()[:1]
    return first[0].strip() if first else "an mpirun"


def bench_peers() -> str:
    """Which peers ``shmcomm-bench --backend`` can run here, and what the others lack.

    Example::

        >>> "gloo" in bench_peers()
        True
    """
    from shmcomm.bench.common import BACKENDS
    from shmcomm.bench.runner import backend_available

    ready, missing = [], []
    for name in BACKENDS[1:]:
        ok, why = backend_available(name)
        if ok:
            ready.append(f"mpi ({_mpi_name()})" if name == "mpi" else name)
        else:
            missing.append(f"{name} ({why})")
    if importlib.util.find_spec("matplotlib") is not None:
        ready.append("--plot")
    else:
        missing.append('--plot (matplotlib is not installed: pip install ".[plot]")')
    return f"{', '.join(ready) or 'none'}; missing: {', '.join(missing) or 'none'}"


def _ptrace_scope() -> int | None:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _sibling_can_read() -> bool:
    """Fork two processes; the second reads the first's memory with process_vm_readv, as ranks
    (siblings under a launcher) do."""
    libc = ctypes.CDLL(None, use_errno=True)

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    probe = ctypes.create_string_buffer(b"shmcomm", 8)
    read_fd, write_fd = os.pipe()
    first = os.fork()
    if first == 0:  # the one read: waits until the reader is done
        os.close(write_fd)
        os.read(read_fd, 1)
        os._exit(0)
    second = os.fork()
    if second == 0:
        got = ctypes.create_string_buffer(8)
        local, remote = IoVec(ctypes.addressof(got), 8), IoVec(ctypes.addressof(probe), 8)
        n = libc.process_vm_readv(first, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        os._exit(0 if n == 8 and got.raw == probe.raw else 1)
    _, status = os.waitpid(second, 0)
    os.close(read_fd)
    os.close(write_fd)  # the first one's read returns: it exits
    os.waitpid(first, 0)
    return os.waitstatus_to_exitcode(status) == 0


def single_copy() -> str:
    """Whether ranks may read each other's memory (process_vm_readv), which single copy needs;
    without it large collectives of private arrays go through the slots (one copy more).

    Example::

        >>> single_copy().split(":")[0] in ("yes", "no")
        True
    """
    scope = _ptrace_scope()
    where = "no Yama ptrace_scope" if scope is None else f"Yama ptrace_scope {scope}"
    try:
        ok = _sibling_can_read()
    except (OSError, AttributeError) as exc:
        return f"unknown: the probe failed ({exc}); {where}"
    if ok:
        return f"yes: sibling processes may read each other's memory ({where})"
    return (f"no: sibling processes may not read each other's memory ({where}); large collectives of "
            "private arrays go through the slots: use sc.empty arrays, or see Troubleshooting")
