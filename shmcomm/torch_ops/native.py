"""The native kernel of ``torch.ops.shmcomm.all_reduce_`` (``all_reduce.cpp``), built on first use.

A C++ kernel reaches the compiled core's C entry point with the tensor's pointer; a Python kernel
first goes back into the interpreter. Measured at 2 ranks, 8 bytes: the native op costs about 1 us
less a call, a third of a small all_reduce (``bench/bench_tp_decode.py`` prints both).

It is compiled once per torch build into torch's extension cache (``TORCH_EXTENSIONS_DIR``,
default ``~/.cache/torch_extensions``), under a name that carries the torch version, its C++ ABI
and a hash of the source, so an upgraded torch or shmcomm builds its own. The ranks of a job
share one build (torch's lock on the build directory): the first group of the first job waits
~20 s for it. Without a C++ compiler or ninja, or with ``SHMCOMM_TORCH_NATIVE=0``, the op runs
its Python kernel, and a warning says why once.

Example::

    if not load():                     # False: the Python kernel serves the op
        print(why_not())
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import sys
import warnings

import torch

SOURCE = pathlib.Path(__file__).with_name("all_reduce.cpp")
_STATE: dict = {}  # "loaded": bool, "why": the reason it is not


def _module_name() -> str:
    """One name per (torch version, C++ ABI, source): torch's cache keys a build by its name."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:10]
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
        if not _built(cpp_extension, name):  # the first group on this torch build: say why it waits
            print(f"shmcomm: building the native kernel of torch.ops.shmcomm.all_reduce_ for torch "
                  f"{torch.__version__} (once; about 20 s)", file=sys.stderr, flush=True)
        cpp_extension.load(name=name, sources=[str(SOURCE)], extra_cflags=["-O2"],
                           is_python_module=False, verbose=False)
    except Exception as exc:  # noqa: BLE001 - no compiler, no ninja, headers missing: the Python kernel serves
        last_line = (str(exc).strip().splitlines() or [""])[-1]  # a compiler's log ends with the cause
        return _give_up(f"{type(exc).__name__}: {last_line}")
    _STATE["loaded"] = True
    return True


def _built(cpp_extension, name: str) -> bool:
    """Whether torch's cache holds the build already (its private layout: True when unsure)."""
    try:
        return (pathlib.Path(cpp_extension._get_build_directory(name, verbose=False)) / f"{name}.so").exists()
    except Exception:  # noqa: BLE001 - only decides whether a message is printed
        return True


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
