"""The native code of shmcomm's torch support, built on first use: the kernel of
``torch.ops.shmcomm.all_reduce_`` (``all_reduce.cpp``) and the core's tensor reader
(``tensors.cpp``).

A C++ kernel reaches the compiled core's C entry point with the tensor's pointer; a Python kernel
first goes back into the interpreter. Measured at 2 ranks, 8 bytes: the native op costs about 1 us
less a call, a third of a small all_reduce (``bench/bench_tp_decode.py`` prints both). The tensor
reader gives the core a tensor's pointer, size and dtype in one C call instead of six attribute
reads through Python (~0.36 us a call, on every collective given a tensor: ``dist.all_reduce``,
``shmcomm.torch_ops.all_reduce_``, ``sc.all_reduce(tensor)``).

It is compiled once per torch build into torch's extension cache (``TORCH_EXTENSIONS_DIR``,
default ``~/.cache/torch_extensions``), under a name that carries the torch version, its C++ ABI
and a hash of the source, so an upgraded torch or shmcomm builds its own. The ranks of a job
share one build: the first group of the first job waits ~20 s for it. Without a C++ compiler or
ninja, or with ``SHMCOMM_TORCH_NATIVE=0``, the op runs its Python kernel, and a warning says why
once.

torch's own lock on a build directory is a file made with O_EXCL that later loaders wait for, for
as long as it exists: a builder killed mid-build (a Ctrl-C on a job's first run, a CI timeout)
leaves it behind, and every later job on the machine would hang in ``init_process_group``. So a
built kernel is loaded without torch's lock, and building goes through an flock of shmcomm's on
a file beside it, which the kernel drops with its holder: whoever holds it is the only shmcomm
process in torch's build of this name, so a torch lock it finds is stale and is removed. A
holder that keeps the flock past ``BUILD_WAIT_S`` (a hung compiler) gets the Python kernel, with
a warning naming the file, rather than a wait without end.

Example::

    if not load():                     # False: the Python kernel serves the op
        print(why_not())
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pathlib
import sys
import time
import warnings
from ctypes import CDLL, c_void_p, cast

import torch

HERE = pathlib.Path(__file__).parent
SOURCES = [HERE / "all_reduce.cpp", HERE / "tensors.cpp"]  # and tensors.h, which both include
HEADERS = [HERE / "tensors.h"]
_STATE: dict = {}  # "loaded": bool, "why": the reason it is not, "reader": its address
BUILD_WAIT_S = 600.0  # the most a rank waits for another's build (one takes ~20 s, ranks x that loaded)


def _module_name() -> str:
    """One name per (torch version, C++ ABI, source): torch's cache keys a build by its name."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES + HEADERS)).hexdigest()[:10]
    version = torch.__version__.split("+")[0].replace(".", "_")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return f"shmcomm_ops_t{version}_abi{abi}_{digest}"


def load() -> bool:
    """Build (first time only) and load the native kernel; True when it serves the op.

    Example::

        load()   # True on a machine with a C++ compiler
    """
    if "loaded" in _STATE:
        return _STATE["loaded"]
    setting = os.environ.get("SHMCOMM_TORCH_NATIVE", "1").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return _give_up("SHMCOMM_TORCH_NATIVE=0", warn=False)
    try:
        from torch.utils import cpp_extension

        name = _module_name()
        directory = pathlib.Path(cpp_extension._get_build_directory(name, verbose=False))
        library = directory / f"{name}.so"
        if not _load_built(library, directory / "lock"):
            with _build_flock(directory / "shmcomm.flock") as held:
                if not held:
                    return _give_up(f"another process held {directory / 'shmcomm.flock'} for "
                                    f"{BUILD_WAIT_S:.0f} s (a build that hangs?)")
                _build(cpp_extension, name, directory)
        _hand_reader(library)
    except Exception as exc:  # noqa: BLE001 - no compiler, no ninja, headers missing: the Python kernel serves
        last_line = (str(exc).strip().splitlines() or [""])[-1]  # a compiler's log ends with the cause
        return _give_up(f"{type(exc).__name__}: {last_line}")
    _STATE["loaded"] = True
    return True


def _load_built(library: pathlib.Path, torch_lock: pathlib.Path) -> bool:
    """Load a finished build without torch's lock; False where none is (no library, or a build
    under way or killed: torch's lock file beside it), or it does not load (cut short)."""
    if torch_lock.exists() or not library.exists():
        return False
    try:
        torch.ops.load_library(str(library))
    except OSError:
        return False
    return True


def _build(cpp_extension, name: str, directory: pathlib.Path) -> None:
    """torch's build (or its check that the build is current) and load, holding the flock."""
    torch_lock = directory / "lock"
    if torch_lock.exists():  # only a holder of the flock makes it: this one's maker is dead
        print(f"shmcomm: removing {torch_lock}, left by a build of the native kernel that was "
              f"stopped", file=sys.stderr, flush=True)
        torch_lock.unlink(missing_ok=True)
    if not (directory / f"{name}.so").exists():  # the first group on this torch build: say why it waits
        print(f"shmcomm: building the native kernel of torch.ops.shmcomm.all_reduce_ for torch "
              f"{torch.__version__} (once; about 20 s)", file=sys.stderr, flush=True)
    cpp_extension.load(name=name, sources=[str(p) for p in SOURCES], extra_cflags=["-O2"],
                       is_python_module=False, verbose=False)


def _hand_reader(library: pathlib.Path) -> None:
    """Give the core the loaded library's tensor reader (``tensors.cpp``). The library is in the
    process already (torch loaded it); CDLL finds that copy, and it stays loaded for the process.
    A library without the reader (never the case for one built here) leaves the Python reads."""
    from shmcomm import _core

    try:
        address = cast(CDLL(str(library)).shmcomm_read_tensor, c_void_p).value
    except (OSError, AttributeError):
        return
    _STATE["reader"] = address
    _core.use_tensor_reader(address)


class _build_flock:
    """``with _build_flock(path) as held``: hold an exclusive flock on ``path`` (made as needed)
    for the block; ``held`` is False when ``BUILD_WAIT_S`` passed first (nothing is held then)."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path, self.fd = path, -1

    def __enter__(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        start = time.monotonic()
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() - start > BUILD_WAIT_S:
                    os.close(self.fd)
                    self.fd = -1
                    return False
                time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock


def _give_up(why: str, warn: bool = True) -> bool:
    _STATE["loaded"], _STATE["why"] = False, why
    if warn:
        warnings.warn(f"shmcomm: torch.ops.shmcomm.all_reduce_ runs its Python kernel (about 1 us "
                      f"slower a call): the native kernel could not be built ({why}). A C++ compiler "
                      f"and ninja (pip install ninja) give the native one; SHMCOMM_TORCH_NATIVE=0 "
                      f"silences this.", RuntimeWarning, stacklevel=3)
    return False


def why_not() -> str | None:
    """Why the native kernel is not in use (None when it is, or was not tried yet).

    Example::

        why_not()   # e.g. "SHMCOMM_TORCH_NATIVE=0"
    """
    return _STATE.get("why")
