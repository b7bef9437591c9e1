"""Ranks on different nodes call different collectives (run by tests/test_multinode.py on 2 x 2
simulated nodes): ``python mismatch.py sizes|dtypes|kinds``. Node 1 calls something else than
node 0; every rank must raise (CollectiveMismatchError where it crossed, AbortedError with the
cause on its node peers), never crash, hang or return garbage. Prints one line per rank."""
import sys

import numpy as np

import shmcomm as sc

mode = sys.argv[1]
pg = sc.init_process_group(timeout=60.0)
rank = pg.rank
node = pg.topology.node_of[rank]
x = np.ones(4, np.float32)
try:
    if mode == "sizes":
        sc.all_reduce(np.ones(4 if node == 0 else 8, np.float32))
    elif mode == "dtypes":  # the same bytes
        sc.all_reduce(x if node == 0 else np.ones(4, np.int32))
    elif mode == "large":  # above the small size: sharded along the rails
        sc.all_reduce(np.ones(1 << 20 if node == 0 else 1 << 19, np.float32))
    else:
        sc.all_reduce(x) if node == 0 else sc.broadcast(x, src=0)
    print(f"rank {rank} returned {x.tolist()}", flush=True)
except sc.ShmcommError as exc:
    first = str(exc).splitlines()[0]
    detail = "mismatch" if "different collectives" in str(exc) else "other"
    print(f"rank {rank} raised {type(exc).__name__} ({detail}): {first}", flush=True)
sc.destroy_process_group()
