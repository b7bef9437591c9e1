"""Rank ``LEAVER`` returns at once (exit code 0, its group left at exit) while the others wait
for it in an all_reduce: they fail with PeerFailureError, uncaught (so that their error files
tell shmrun whose failure it was), after printing ``rank R raised <class>: <message>``.

Usage: leave_early.py LEAVER
"""
import sys

import numpy as np

import shmcomm as sc

sc.init_process_group(timeout=30.0)
rank = sc.get_rank()
if rank == int(sys.argv[1]):
    sys.exit(0)
try:
    sc.all_reduce(np.ones(4))
except sc.ShmcommError as exc:
    print(f"rank {rank} raised {type(exc).__name__}: {exc}", flush=True)
    raise
