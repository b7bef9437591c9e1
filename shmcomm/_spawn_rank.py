"""One rank of ``sc.spawn``: ``python -m shmcomm._spawn_rank WORKDIR`` (the launcher sets RANK,
WORLD_SIZE and the job's name and secret). Loads ``WORKDIR/call.pkl`` (fn, args, timeout), joins
the default group, runs ``fn(rank, nprocs, *args)``, and leaves ``WORKDIR/rank<r>.pkl``:
``("ok", value)`` or ``("error", exception or None, traceback text)``.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback


def _leave(workdir: str, rank: int, outcome: tuple) -> None:
    from shmcomm.pickling import default_dumps  # a lambda or a local class comes back too

    path = os.path.join(workdir, f"rank{rank}.pkl")
    data = default_dumps(outcome)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)  # the caller never reads half a file


def main(workdir: str) -> int:
    import shmcomm as sc

    rank, nprocs = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        with open(os.path.join(workdir, "call.pkl"), "rb") as f:
            fn, args, timeout = pickle.load(f)
        sc.init_process_group(timeout=timeout)
        try:
            value = fn(rank, nprocs, *args)
        finally:
            sc.destroy_process_group()
        try:
            _leave(workdir, rank, ("ok", value))
        except Exception as exc:  # noqa: BLE001
            raise TypeError(f"rank {rank}'s return value cannot be pickled back to the caller: "
                            f"{exc}") from exc
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
        text = traceback.format_exc()
        try:
            pickle.dumps(exc)
        except Exception:  # noqa: BLE001 - an exception that does not pickle: its text only
            exc = None
        _leave(workdir, rank, ("error", exc, text))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
