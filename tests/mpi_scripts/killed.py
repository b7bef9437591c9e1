"""The numpy API across simulated nodes over MPI, in a loop, until rank ``argv[1]`` kills itself
(run by tests/test_mpi_link.py under mpirun): the launcher must end the job, no rank may hang.
Every rank prints "rank R looping" once it has done a first round."""
import os
import signal
import sys

import numpy as np

import shmcomm as sc

victim = int(sys.argv[1])
pg = sc.init_process_group(timeout=20.0)
x = np.ones(1 << 14, np.float32)
for i in range(100_000):
    sc.all_reduce(x)
    x.fill(1.0)
    if i == 5:
        print(f"rank {pg.rank} looping", flush=True)
    if i == 50 and pg.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
sc.destroy_process_group()
