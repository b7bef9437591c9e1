"""How the ranks of a group being built meet: a few small strings exchanged before any shared
memory or link exists (each rank's host, a node's job name and secret, the links' addresses).

One protocol, ``Meeting``, with two homes: ``StoreMeeting`` over torch's key/value ``Store``
(the TCPStore of ``env://``, or the store torch hands its backends), and, under ``mpirun``, a
meeting over MPI (``shmcomm.multinode.mpi_link``). Every call is collective over the meeting's
ranks, made in the same order by each. ``share_job`` is the one place where a job's name and
secret are chosen and shared: by the torch backend (one node) and by each node of a hierarchy::

    meeting = StoreMeeting(store, "shmcomm/0", rank, size)
    hosts = meeting.all_gather("hosts", host_identity())
    job, secret = share_job(meeting, "job", source=0, prefix="torch-pg", secret_fn=new_secret)
"""

from __future__ import annotations

import datetime
import os
import uuid
from typing import Callable, Protocol

__all__ = ["Meeting", "StoreMeeting", "share_job", "from_environment", "torch_timeout"]

# torch polls its store's sockets with the timeout in int milliseconds: past 2**31 - 1 ms (24.8
# days; inf, or timedelta.max, shmcomm's and torch's "never") it wraps, and the store spins warning
# "poll ... returned 0, likely a timeout". timedelta itself refuses inf. So longer is 24.8 days.
_TORCH_TIMEOUT_MAX_S = ((1 << 31) - 1) / 1000


def torch_timeout(seconds: float) -> datetime.timedelta:
    """``seconds`` as the timedelta torch's stores and process groups take, capped where torch's
    clock arithmetic would wrap.

    Example::

        torch_timeout(float("inf"))   # datetime.timedelta(days=24, seconds=73883, microseconds=647000)
    """
    return datetime.timedelta(seconds=min(seconds, _TORCH_TIMEOUT_MAX_S))


class Meeting(Protocol):
    """The calls a meeting provides; every rank of it calls each, in the same order.

    Example::

        values = meeting.all_gather("hosts", "node-a")   # one string per rank, by rank
    """

    rank: int
    size: int

    def all_gather(self, name: str, value: str) -> list[str]:
        """Every rank's ``value``, by rank."""
        ...

    def from_rank(self, name: str, value: str | None, source: int) -> str:
        """Rank ``source``'s ``value`` (it passes it; the others pass None). Ranks may name
        different sources (each node's first rank, say): each source serves those naming it."""
        ...

    def among(self, name: str, members: list[int]) -> Meeting:
        """A meeting of ``members`` (ranks of this one; member i becomes rank i), collective over
        the members only, under ``name`` (unique among this meeting's sub-meetings)."""
        ...


class StoreMeeting:
    """A ``Meeting`` over a torch ``Store``: every key under ``key``, a prefix unique to the
    group being built (and to its incarnation: keys are never reused).

    Example::

        meeting = StoreMeeting(dist.FileStore(path, 4), "test", rank, 4)
    """

    def __init__(self, store, key: str, rank: int, size: int):
        self.store, self.key, self.rank, self.size = store, key, rank, size

    def all_gather(self, name: str, value: str) -> list[str]:
        """Every rank's ``value``, by rank (each rank sets its key, then reads the others')."""
        self.store.set(f"{self.key}/{name}/{self.rank}", value)
        return [value if r == self.rank else self.store.get(f"{self.key}/{name}/{r}").decode()
                for r in range(self.size)]

    def from_rank(self, name: str, value: str | None, source: int) -> str:
        """Rank ``source``'s ``value``: it sets the key, the others wait for it."""
        key = f"{self.key}/{name}/{source}"
        if self.rank == source:
            assert value is not None, "the source passes the value"
            self.store.set(key, value)
            return value
        return self.store.get(key).decode()

    def among(self, name: str, members: list[int]) -> StoreMeeting:
        """The members' meeting: the same store, under ``key/name``."""
        return StoreMeeting(self.store, f"{self.key}/{name}", members.index(self.rank), len(members))


def share_job(meeting: Meeting, name: str, source: int, prefix: str,
              secret_fn: Callable[[], str] | None = None) -> tuple[str, str | None]:
    """A job name (``prefix`` and a random suffix, unique to this incarnation) and a secret
    (``secret_fn()``; None without one), chosen by rank ``source`` and shared with every rank
    that names it. Collective over the meeting.

    Example::

        job, secret = share_job(meeting, "node1", source=2, prefix="job-42-n1", secret_fn=new_secret)
    """
    mine = meeting.rank == source
    job = meeting.from_rank(f"{name}/job", f"{prefix}-{uuid.uuid4().hex[:12]}" if mine else None,
                            source)
    secret = meeting.from_rank(f"{name}/secret", (secret_fn() if secret_fn else "") if mine else None,
                               source)
    return job, secret or None


def from_environment(rank: int, size: int, job: str, timeout: float) -> StoreMeeting:
    """The meeting of a job launched on several nodes by torchrun or ``shmrun --nnodes``: the
    store at ``MASTER_ADDR``/``MASTER_PORT``, as torch's ``env://`` (needs torch).

    Example::

        meeting = from_environment(rank=2, size=4, job="job-42", timeout=60.0)
    """
    import torch.distributed as dist

    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(var):
            raise ValueError(f"{var} is not set: ranks on several nodes meet through it "
                             "(torchrun and shmrun --nnodes set it)")
    store, _, _ = next(dist.rendezvous("env://", rank, size,
                                       timeout=torch_timeout(timeout)))
    return StoreMeeting(dist.PrefixStore(f"shmcomm/{job}", store), "np", rank, size)
