"""Remote procedure calls between the local processes of a job (``torch.distributed.rpc`` semantics).

Every worker joins under a unique name, then calls functions on any worker, itself included, by
name, rank or WorkerInfo. Requests and replies travel through shared-memory rings; arrays and
tensors are copied once into shared memory and once out, never pickled into bytes::

    import operator
    from shmcomm import rpc

    rpc.init_rpc(f"worker{rank}")                      # RANK, WORLD_SIZE, SHMCOMM_JOB (shmrun)
    if rank == 0:
        rpc.rpc_sync("worker1", operator.add, args=(1, 2))          # 3
        fut = rpc.rpc_async("worker1", operator.mul, args=(3, 4))   # shmcomm.Future
        rref = rpc.remote("worker1", dict, kwargs={"a": 1})         # the dict lives on worker1
        rref.rpc_sync().get("a")                                    # 1
    rpc.shutdown()                                     # waits for every worker's calls

Module-level functions travel by name. Lambdas and local functions, as arguments, callees or
return values, travel by value through the process pickler (``sc.set_pickler``; by default
cloudpickle, arrays still out of band): ``rpc.rpc_sync("worker1", lambda x: x + 1, args=(1,))``.

Tuning (environment): ``SHMCOMM_RPC_RING_BYTES`` (bytes per ring; default about 4 MiB of rings
per worker, 256 KiB to 1 MiB + 64 KiB each), ``SHMCOMM_RPC_YIELDS`` (times a waiting thread yields
the CPU before it sleeps, default 64) and ``SHMCOMM_RPC_SPIN_US`` (busy-polling before that,
default 0: on a loaded or virtualised machine a spinning thread takes the core its peer needs).
"""

from shmcomm.rpc import functions  # noqa: F401
from shmcomm.rpc.agent import WorkerInfo
from shmcomm.rpc.api import get_worker_info, init_rpc, remote, rpc_async, rpc_sync, shutdown
from shmcomm.rpc.rref import RRef
from shmcomm.rpc.serialization import RemoteError

__all__ = ["init_rpc", "shutdown", "rpc_sync", "rpc_async", "remote", "get_worker_info",
           "WorkerInfo", "RRef", "RemoteError", "functions"]
