"""Three levels: run under shmrun -n 8 with SHMCOMM_SIMULATE_NODES=2 (two nodes of four ranks, gloo
between them) and SHMCOMM_SIMULATE_NUMA=2 (each node's group: two NUMA nodes of two ranks).
A large all_reduce crosses the nodes by shards, and each node's reduce-scatter and all-gather
compose inside its NUMA nodes. Prints ``numa-inside-nodes ok calls=K`` per rank."""
import numpy as np

import shmcomm as sc

pg = sc.init_process_group()
rank, size = sc.get_rank(), sc.get_world_size()
x = np.arange(700_000, dtype=np.float64) + rank  # 5.6 MB: past the hierarchy's 4 MiB, by shards
sc.all_reduce(x)
assert np.array_equal(x, np.arange(700_000) * size + sum(range(size))), x[:3]
numa = pg.node._comm.levels[0]
print(f"rank {rank}: numa-inside-nodes ok calls={numa.calls} {type(pg).__name__}", flush=True)
sc.destroy_process_group()
