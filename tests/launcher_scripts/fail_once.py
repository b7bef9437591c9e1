"""Rank 1 fails (exit 5) on the first attempt only, remembered by a marker file; then all succeed."""
import os
import sys

from _common import rank

marker = sys.argv[1]
if rank() == 1 and not os.path.exists(marker):
    open(marker, "w").close()
    print("first attempt fails", file=sys.stderr)
    sys.exit(5)
print(f"ok attempt={os.environ['TORCHELASTIC_RESTART_COUNT']} job={os.environ['SHMCOMM_JOB']}")
