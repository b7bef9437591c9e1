"""One rank fails (exit code 3) while every other rank computes without communicating, so only
the launchers can stop them: shmrun --nnodes must stop every node. FAIL_RANK names the rank."""
import os
import sys
import time

import shmcomm as sc

pg = sc.init_process_group()
sc.barrier()
print(f"rank {pg.rank} working", flush=True)
if pg.rank == int(os.environ["FAIL_RANK"]):
    time.sleep(1.0)
    print(f"rank {pg.rank} giving up", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(120)  # "computing": no collective would notice the failure
sc.destroy_process_group()
