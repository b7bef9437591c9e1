"""The numpy API's all_reduce in a loop across nodes until a rank is stopped or killed (run by
tests/test_multinode.py): prints "looping" once every rank has done a first
round, and writes its pid to the file ``argv[1]/R`` (``argv[2]``: the group timeout); a rank whose call raises prints "rank R
raised at TIME NAME: message" and exits 1."""
import os
import sys
import time

import numpy as np

import shmcomm as sc

pg = sc.init_process_group(timeout=float(sys.argv[2]))
rank = pg.rank
with open(os.path.join(sys.argv[1], str(rank)), "w") as f:
    f.write(str(os.getpid()))
x = np.ones(1 << 16, np.float32)
deadline = time.monotonic() + 120
try:
    for i in range(1_000_000):
        sc.all_reduce(x)
        x.fill(1.0)
        if i == 20:
            sc.barrier()
            print("looping", flush=True)
        if time.monotonic() > deadline:
            break
        time.sleep(0.005)
except Exception as exc:  # noqa: BLE001 - gloo's own errors too (a link lost its peer)
    print(f"rank {rank} raised at {time.time():.3f} {type(exc).__name__}: {str(exc).splitlines()[0]}",
          flush=True)
    sc.destroy_process_group()
    sys.exit(1)
sc.destroy_process_group()
