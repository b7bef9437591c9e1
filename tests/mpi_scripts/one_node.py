"""SHMCOMM_LINK=mpi with every rank on this machine (run by tests/test_mpi_link.py under
mpirun): rank and size from MPI, a plain shared-memory group (no links), whose sub-groups and
shared arrays work as under shmrun. Prints "rank R one node ok"."""
import sys

import numpy as np

sys.modules["torch"] = None  # MPI alone: importing torch would fail
import shmcomm as sc  # noqa: E402
from mpi4py import MPI  # noqa: E402

pg = sc.init_process_group()
assert type(pg) is sc.ProcessGroup, pg
assert (pg.rank, pg.size) == (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
x = np.full(3, pg.rank + 1.0)
sc.all_reduce(x)
assert (x == pg.size * (pg.size + 1) / 2).all(), x
sub = sc.new_group([0, pg.size - 1])
if sub is not None:
    y = np.ones(2)
    sc.all_reduce(y, group=sub)
    assert (y == 2).all(), y
shared = sc.empty(4, np.float64)
shared[:] = pg.rank
sc.all_reduce(shared)
assert (shared == sum(range(pg.size))).all(), shared
print(f"rank {pg.rank} one node ok", flush=True)
sc.destroy_process_group()
