"""``init_method="shmcomm://"``: torch ranks on one machine meet with no address and no port.

torch's default ``env://`` needs ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``
for every rank, which mpirun and mpiexec do not set, nor a user starting ranks by hand. This
handler takes the rank, world size and job as ``sc.init_process_group`` does (the URL's
``rank``/``world_size`` that torch adds from its arguments, ``RANK``/``WORLD_SIZE``/
``SHMCOMM_JOB``, torchrun's variables, or mpirun's: ``shmcomm.launcher.mpirun``). Rank 0 opens
torch's TCPStore on a free loopback port and hands the port to the other ranks through a
shared-memory group of the job (shmcomm's own start-up, which needs no network), then leaves
that group. The store stays torch's, for the groups torch makes later (``new_group``).

Example::

    dist.init_process_group("shmcomm", init_method="shmcomm://")   # under mpirun -n 4
    # or, by hand: RANK=1 WORLD_SIZE=2 SHMCOMM_JOB=j python train.py
"""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import numpy as np

__all__ = ["rendezvous"]

LOOPBACK = "127.0.0.1"


def rendezvous(url: str, timeout: timedelta = timedelta(minutes=30), **_):
    """torch's rendezvous handler for ``shmcomm://``: yields ``(store, rank, world_size)``
    once; ValueError naming what is missing (rank, size or job) otherwise.

    Example::

        store, rank, size = next(rendezvous("shmcomm://?rank=0&world_size=1"))
    """
    import torch.distributed as dist

    import shmcomm._core as _core
    from shmcomm.world import job_arguments

    query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
    given_rank = int(query["rank"]) if "rank" in query else None
    given_size = int(query["world_size"]) if "world_size" in query else None
    seconds = timeout.total_seconds() if timeout.total_seconds() > 0 else None
    try:
        rank, size, job, seconds = job_arguments(given_rank, given_size, query.get("job"), seconds)
    except ValueError as exc:
        raise ValueError(f"shmcomm:// rendezvous: {exc} (here the job may also be named in the URL: "
                         f"shmcomm://?job=NAME)") from None
    port = np.zeros(1, np.int64)
    meeting = _core.Communicator(job, "torchstore", rank, size, seconds)
    try:
        if rank == 0:
            store = dist.TCPStore(LOOPBACK, 0, size, True, timeout, wait_for_workers=False)
            port[0] = store.port
        meeting.broadcast(port, 0)
        if rank != 0:
            store = dist.TCPStore(LOOPBACK, int(port[0]), size, False, timeout)
    finally:
        meeting.close()
    yield store, rank, size
    raise RuntimeError("shmcomm:// cannot meet again (torch asked to re-rendezvous)")
