"""Rank 1 fails (``exit``: sys.exit(3); ``raise``: ValueError) while the others wait for it in a
collective and so fail with PeerFailureError; with ``linger``, rank 1 leaves its group and then
waits until the others have exited (up to 30 s) before it exits, so that they surely exit first
(a fixed 0.3 s was not enough on a loaded machine: they exited after it in one CI run).

Usage: root_cause.py exit|raise [linger]
"""
import atexit
import os
import sys
import time

import psutil

pids: list = []


def _wait_for_the_others() -> None:
    deadline = time.monotonic() + 30
    for pid in pids:
        if pid == os.getpid():
            continue
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.01)


if os.environ["RANK"] == "1" and "linger" in sys.argv:
    atexit.register(_wait_for_the_others)  # registered before shmcomm's: runs after it left the group

import numpy as np  # noqa: E402

import shmcomm as sc  # noqa: E402

sc.init_process_group()
pids.extend([None] * sc.get_world_size())
sc.all_gather_object(pids, os.getpid())
if sc.get_rank() == 1:
    if sys.argv[1] == "exit":
        sys.exit(3)
    raise ValueError("rank 1 gives up")
sc.all_reduce(np.ones(4))
