"""``--log-dir``: each rank's output in files, ``DIR/<run id>/attempt_<k>/rank<r>.out`` and
``.err``, the raw bytes as they come (no prefix), in a private directory that no earlier run
shares::

    run_dir = make_run_dir(cfg)                   # DIR/20250101-120000-4242
    logs = open_logs(cfg, run_dir, attempt=0)     # {(0, 1): Log(.../rank0.out), (0, 2): ...}
"""

from __future__ import annotations

import errno
import os
import time

from shmcomm import trust
from shmcomm.launcher.config import LaunchConfig

__all__ = ["Log", "make_run_dir", "open_logs"]


class Log:
    """One rank's log file of one stream: the raw bytes, written as they come. Example::

        log = Log("logs/run/attempt_0/rank0.out"); log.write(b"epoch 1\\n"); log.close()
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.file = os.fdopen(trust.open_private_output(path, "log file"), "wb")

    def write(self, data: bytes) -> None:
        self.file.write(data)

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def make_run_dir(cfg: LaunchConfig) -> str:
    """DIR/<run id>: a new private directory for this invocation of shmrun (never an earlier
    run's), named by its start time and pid (and node on several nodes)."""
    os.makedirs(cfg.log_dir, exist_ok=True)
    base = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    if cfg.nnodes > 1:
        base += f"-node{cfg.node_rank}"
    for i in range(1000):
        path = os.path.join(cfg.log_dir, base if i == 0 else f"{base}.{i}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue  # an earlier run (or anything else) has that name: never reuse it
        return path
    raise FileExistsError(errno.EEXIST, f"no free run directory name under {cfg.log_dir}")


def open_logs(cfg: LaunchConfig, run_dir: str | None, attempt: int) -> dict:
    """The log files of attempt ``attempt``, by (local rank, 1 or 2 for stdout or stderr), in a
    new ``attempt_<k>`` directory of ``run_dir``; ``{}`` without ``--log-dir`` (``run_dir`` None).
    Example::

        logs[(0, 2)].path    # DIR/<run id>/attempt_0/rank0.err
    """
    logs: dict = {}
    if run_dir is None:
        return logs
    attempt_dir = os.path.join(run_dir, f"attempt_{attempt}")
    os.mkdir(attempt_dir, 0o700)
    try:
        for r in range(cfg.nproc):
            for fd, ext in ((1, "out"), (2, "err")):
                logs[(r, fd)] = Log(os.path.join(attempt_dir, f"rank{r}.{ext}"))
    except BaseException:
        for f in logs.values():
            f.close()
        raise
    return logs
