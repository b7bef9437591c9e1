"""``sc.spawn``: start ranks from plain Python or a notebook and get their return values.

The ranks are started, watched and cleaned up by the launcher's own code (``shmcomm.launcher``,
what ``shmrun`` runs): output lines prefixed with ``[rank]``, the others stopped when one fails,
Ctrl-C forwarded, nothing left in ``/dev/shm``. The function and its arguments travel by value
(cloudpickle), so functions defined in ``__main__`` (a notebook cell, ``python -c``, a script)
work although every rank is a fresh interpreter (the spawn start method, never fork).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import tempfile
import threading
from typing import Any, Callable

from shmcomm.errors import ShmcommError

__all__ = ["spawn", "RemoteTraceback"]


class RemoteTraceback(Exception):
    """The traceback of an exception raised on a rank; ``spawn`` chains it (``raise exc from
    RemoteTraceback(text)``), so Python prints it above the re-raised exception. Example::

        try:
            sc.spawn(work, 2)
        except ValueError as e:
            print(e.__cause__)      # the rank's traceback, as the rank printed it
    """

    def __init__(self, rank: int, text: str) -> None:
        super().__init__(text)
        self.rank, self.text = rank, text

    def __str__(self) -> str:
        return f"\n\nRank {self.rank} raised:\n\n{self.text}"


# A rank's first lines: the caller's sys.path, then the rank's body (shmcomm._spawn_rank). Started
# as `python -m`, a rank would search the working directory first and never the caller's script
# directory: a module beside the script (`import helpers` in it, used by fn) was not found in the
# ranks, and a shmcomm in the working directory would have shadowed the caller's.
# multiprocessing's spawn hands its children the parent's sys.path for the same reason.
_RANK_BOOT = ("import json, pathlib, sys; "
              "sys.path[:] = json.loads(pathlib.Path(sys.argv[1], 'sys_path.json').read_text()); "
              "from shmcomm._spawn_rank import main; sys.exit(main(sys.argv[1]))")


def spawn(fn: Callable[..., Any], nprocs: int, args: tuple = (), timeout: float | None = None) -> list:
    """Run ``fn(rank, nprocs, *args)`` on ``nprocs`` new processes joined in one default group
    and return their return values in rank order.

    Each rank calls ``sc.init_process_group()`` (with ``timeout``, else the default) before
    ``fn`` and ``sc.destroy_process_group()`` after it, so ``fn`` uses the collectives at once.

    Args:
        fn (Callable): a function of ``(rank, nprocs, *args)``; defined anywhere, a notebook
            included. Its return value must be picklable.
        nprocs (int): how many ranks, at least 1.
        args (tuple): more arguments for ``fn`` (picklable by cloudpickle); default ``()``.
        timeout (float | None): the group's timeout: seconds before a blocked collective raises
            ``CommTimeoutError``; ``inf``: no limit; None (the default): ``SHMCOMM_TIMEOUT``,
            else 300.

    Returns:
        list: ``[fn's return value on rank 0, on rank 1, ...]``.

    Raises:
        TypeError: ``fn`` is not callable, ``args`` is not a tuple, or they cannot be pickled.
        ValueError: ``nprocs`` is not an int >= 1 or more than can start here (at most 4096,
            and what ``ulimit -u`` and ``-n`` allow), or ``timeout`` is <= 0 or nan.
        Exception: the exception a failing rank raised, as its own class (one defined in
            ``__main__`` or in a function included), chained from a ``RemoteTraceback`` holding
            the rank's traceback. The rank is the first that failed for a reason of its own,
            not the ranks that then failed with ``PeerFailureError`` waiting for it.
        ShmcommError: a rank died without a Python exception (a signal, ``os._exit``) or
            returned an unpicklable value; ``spawn`` was called outside the main thread.
        KeyboardInterrupt: on Ctrl-C (every rank is stopped first).

    Example::

        def work(rank, n):
            x = np.ones(3) * (rank + 1)
            sc.all_reduce(x)
            return float(x[0])

        sc.spawn(work, 3)     # [6.0, 6.0, 6.0]
    """
    import cloudpickle

    from shmcomm.world import timeout_arg
    from shmcomm.launcher.config import LaunchConfig
    from shmcomm.launcher.limits import too_many_ranks
    from shmcomm.launcher.outcome import signal_name
    from shmcomm.launcher.run import run_job

    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs must be an integer >= 1, got {nprocs!r}")
    too_many = too_many_ranks(nprocs)
    if too_many:
        raise ValueError(f"nprocs={nprocs} is too many: {too_many}")
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple, got {type(args).__name__}")
    if timeout is not None:
        timeout_arg(timeout)  # refused here, before any rank starts
    if threading.current_thread() is not threading.main_thread():
        raise ShmcommError("sc.spawn must run in the main thread: it forwards Ctrl-C and SIGTERM "
                           "to the ranks through signal handlers")
    with tempfile.TemporaryDirectory(prefix="shmcomm-spawn-") as workdir:  # mode 0700
        try:
            call = cloudpickle.dumps((fn, args, timeout))
        except Exception as exc:
            raise TypeError(f"fn and args must be picklable to reach the ranks: {exc}") from exc
        with open(os.path.join(workdir, "call.pkl"), "wb") as f:
            f.write(call)
        with open(os.path.join(workdir, "sys_path.json"), "w") as f:
            json.dump(sys.path, f)
        cfg = LaunchConfig(nproc=nprocs, summary=False, command=[sys.executable, "-c", _RANK_BOOT, workdir])
        outcome = run_job(cfg)
        if outcome.launcher_signal is not None:
            raise KeyboardInterrupt(f"sc.spawn: stopped every rank on "
                                    f"{signal_name(outcome.launcher_signal)}")
        if outcome.code != 0:
            _raise_failure(workdir, outcome.failed)
        return [_result(workdir, r)[1] for r in range(nprocs)]


def _result(workdir: str, rank: int):
    """What rank ``rank`` left: ("ok", value), ("error", exception or None, traceback text), or
    None when it left nothing (it died first)."""
    try:
        with open(os.path.join(workdir, f"rank{rank}.pkl"), "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - e.g. a class the caller cannot import
        return ("error", None, f"its result could not be unpickled here: {exc!r}")


def _raise_failure(workdir: str, failed) -> None:
    """Raise what ``failed``, the rank the launcher blamed (the root cause), left."""
    from shmcomm.launcher.outcome import how_ended

    if failed is None:
        raise ShmcommError("the ranks could not be started; see the message above")
    rank = failed.rank
    left = _result(workdir, rank)
    if left is not None and left[0] == "error":
        exc, text = left[1], left[2]
        if isinstance(exc, BaseException):
            raise exc from RemoteTraceback(rank, text)
        raise ShmcommError(f"rank {rank} failed:\n{text}")
    raise ShmcommError(f"rank {rank} failed with {how_ended(failed.returncode)} without a Python exception "
                       "(killed by a signal, or os._exit); see its output above")
