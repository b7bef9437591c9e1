"""One rank of ``sc.spawn``: ``main(WORKDIR)``, called by ``spawn._RANK_BOOT`` once it set the
caller's sys.path (the launcher sets RANK, WORLD_SIZE and the job's name and secret). Loads
``WORKDIR/call.pkl`` (fn, args, timeout), joins
the default group, runs ``fn(rank, nprocs, *args)``, and leaves ``WORKDIR/rank<r>.pkl``:
``("ok", value)`` or ``("error", exception or None, traceback text)``; a failure also goes to the
launcher's error file (shmcomm.launcher.error_file), so that it blames the root cause.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback


def _leave(workdir: str, rank: int, outcome: tuple) -> None:
    # cloudpickle for what pickle refuses: a lambda, or an exception class of the caller's
    # __main__ or of a function, comes back as the caller's own class
    from shmcomm.pickling import default_dumps

    path = os.path.join(workdir, f"rank{rank}.pkl")
    data = default_dumps(outcome)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)  # the caller never reads half a file


def _fail(workdir: str, rank: int, exc: BaseException) -> None:
    """Leave ``exc`` (or its text only, when even cloudpickle refuses it) as this rank's outcome."""
    from shmcomm.launcher import error_file

    error_file.record(exc)  # this rank handles its exceptions: no excepthook runs
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        _leave(workdir, rank, ("error", exc, text))
    except Exception:  # noqa: BLE001 - e.g. an exception holding a lock: its text only
        _leave(workdir, rank, ("error", None, text))


def main(workdir: str) -> int:
    import shmcomm as sc

    rank, nprocs = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    reported = False
    try:
        with open(os.path.join(workdir, "call.pkl"), "rb") as f:
            fn, args, timeout = pickle.load(f)
        sc.init_process_group(timeout=timeout)
        try:
            value = fn(rank, nprocs, *args)
        except BaseException as exc:
            # Left before the group is: the peers fail when this rank leaves it, and the launcher
            # must then know this rank's failure as the cause of theirs.
            _fail(workdir, rank, exc)
            reported = True
            raise
        finally:
            sc.destroy_process_group()
        try:
            _leave(workdir, rank, ("ok", value))
        except Exception as exc:  # noqa: BLE001
            raise TypeError(f"rank {rank}'s return value cannot be pickled back to the caller: "
                            f"{exc}") from exc
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
        if not reported:
            _fail(workdir, rank, exc)
        return 1
    return 0
