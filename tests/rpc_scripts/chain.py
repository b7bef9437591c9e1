"""Three workers started from the environment (RANK, WORLD_SIZE, SHMCOMM_JOB), as under shmrun:

    shmrun -n 3 tests/rpc_scripts/chain.py

worker0 runs torch's chained async_execution example on worker1, which calls worker2. The
functions live in this script's ``__main__``: every worker runs the same file, so they are found
by reference on the other side.
"""

import operator

import numpy as np
import torch

from shmcomm import rpc


@rpc.functions.async_execution
def async_add_chained(to, x, y, z):
    return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + z)


def scaled(a, k):
    return a * k


def main():
    rpc.init_rpc(f"worker{rpc_rank()}")
    if rpc.get_worker_info().id == 0:
        ret = rpc.rpc_sync("worker1", async_add_chained, args=("worker2", torch.ones(2), 1, 1))
        print("chained:", ret.tolist())
        out = rpc.rpc_sync("worker2", scaled, args=(np.arange(4.0), 3))
        print("scaled:", out.tolist())
        print("sum:", rpc.rpc_sync("worker1", operator.add, args=(2, 3)))
    rpc.shutdown()


def rpc_rank():
    import os

    return int(os.environ["RANK"])


if __name__ == "__main__":
    main()
