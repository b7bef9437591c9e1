"""A shmcomm job needing no arguments under shmrun: one all_reduce; with "crash", rank 1 then
SIGKILLs itself while the others wait in a barrier (the launcher must clean up after it)."""
import os
import signal
import sys

import numpy as np

import shmcomm as sc

pg = sc.init_process_group()
x = np.full(4, pg.rank + 1.0)
sc.all_reduce(x)
print(f"rank {pg.rank} of {pg.size} sum {x[0]:g}", flush=True)
if len(sys.argv) > 1 and sys.argv[1] == "crash":
    if pg.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    sc.barrier()  # never completes: rank 1 is gone
sc.destroy_process_group()
