"""Rank FAIL_RANK exits with CODE after a moment; the others record their pid and sleep.

Usage: fail_rank.py PID_DIR FAIL_RANK CODE [kill]   ("kill": the failing rank SIGKILLs itself)
"""
import os
import signal
import sys
import time

from _common import rank, write_pid

pid_dir, fail_rank, code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
how = sys.argv[4] if len(sys.argv) > 4 else "exit"
write_pid(pid_dir, f"rank{rank()}", os.getpid())
if rank() == fail_rank:
    # Fail only once every rank is up, so the test sees each of them stopped while sleeping.
    deadline = time.monotonic() + 10
    while len([n for n in os.listdir(pid_dir) if n.startswith("rank")]) < int(os.environ["WORLD_SIZE"]):
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    print(f"rank {rank()} is failing on purpose", file=sys.stderr)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(code)
time.sleep(60)
