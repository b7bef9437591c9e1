"""Rank 1 fails (``exit``: sys.exit(3); ``raise``: ValueError) while the others wait for it in a
collective and so fail with PeerFailureError; with ``linger``, rank 1 leaves its group and then
takes 0.3 s more to exit, so that the others surely exit first.

Usage: root_cause.py exit|raise [linger]
"""
import atexit
import os
import sys
import time

if os.environ["RANK"] == "1" and "linger" in sys.argv:
    atexit.register(time.sleep, 0.3)  # registered before shmcomm's: runs after it left the group

import numpy as np  # noqa: E402

import shmcomm as sc  # noqa: E402

sc.init_process_group()
if sc.get_rank() == 1:
    if sys.argv[1] == "exit":
        sys.exit(3)
    raise ValueError("rank 1 gives up")
sc.all_reduce(np.ones(4))
