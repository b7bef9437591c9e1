"""The features that depend on how ranks met, run by one rank: shared arrays (zero copy), the
NUMA composition's groups, a sub-group (and the lanes of its split over each rank's threads)
and RPC. ``main(rank, size, job)`` returns a summary line; every check raises.

Run by tests/test_start_modes.py under each way users start ranks: shmrun, torchrun, sc.spawn,
multiprocessing with explicit arguments and no shared secret, and processes started by hand.
"""
import operator
import os
import sys

import numpy as np

import shmcomm as sc
from shmcomm import world


def main(rank: int, size: int, job: str | None) -> str:
    if not sc.is_initialized():
        sc.init_process_group(rank=rank, world_size=size, name=job, timeout=30.0)
    # shared arrays: a zero-copy all_reduce and all_gather_into on sc.empty memory
    x = sc.empty(70_000, np.float32)  # above the single-copy size: the zero-copy path
    x[...] = rank + 1
    sc.all_reduce(x)
    assert (x == size * (size + 1) // 2).all(), x[:4]
    whole = sc.zeros(1000 * size, np.int64)
    sc.all_gather_into(whole, np.full(1000, rank, np.int64))
    assert (whole == np.repeat(np.arange(size), 1000)).all()
    # a private array's all_reduce, inside each (simulated) NUMA node first: groups made through
    # the default group's segment, as sub-groups are
    w = np.full(300, float(rank))
    sc.all_reduce(w)
    assert (w == sum(range(size))).all(), w[:4]
    if os.environ.get("SHMCOMM_SIMULATE_NUMA") == "2" and size == 4:
        assert world.default_group()._comm.levels[0].calls == 1
    # a sub-group of every other rank, in reverse order
    members = list(range(size))[::-2]
    sub = sc.new_group(members)
    if rank in members:
        y = np.full(3, float(rank))
        sc.all_reduce(y, group=sub)
        assert (y == sum(members)).all(), y
        # split over each rank's threads (SHMCOMM_RANK_THREADS=2): lanes made through the sub-group
        big = np.full(1000, float(rank))
        sc.all_reduce(big, group=sub)
        assert (big == sum(members)).all(), big[:4]
        threads = [level for level in sub._comm.levels if type(level).__name__ == "ThreadsLevel"]
        assert threads and threads[0].calls == 1 and len(threads[0].lanes) == 2, sub._comm.levels
        z = sc.empty(5, np.float64, group=sub)
        z[...] = 1
        sc.all_reduce(z, group=sub)
        assert (z == len(members)).all(), z
    sc.barrier()
    # RPC: every worker asks the next one
    from shmcomm import rpc

    rpc.init_rpc(f"w{rank}", rank=rank, world_size=size, job=None if job is None else f"{job}-rpc",
                 timeout=30.0)
    got = rpc.rpc_sync(f"w{(rank + 1) % size}", operator.add, args=(rank, 100))
    assert got == rank + 100, got
    rpc.shutdown()
    return f"rank {rank}: ok"


if __name__ == "__main__":  # by hand: python features.py RANK SIZE JOB; under a launcher: no args
    if len(sys.argv) > 1:
        line = main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
    else:
        sc.init_process_group()
        line = main(sc.get_rank(), sc.get_world_size(), None)
    sc.destroy_process_group()
    print(line, flush=True)
