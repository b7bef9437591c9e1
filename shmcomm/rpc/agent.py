"""The RPC agent of one process: start-up, transport and the threads, assembled from one module
per concept.

Transport. A private group of the job (segment part ``rpc``) and, mapped through it, two lanes of
byte rings driven by the compiled ``RpcChannel``: requests travel on one, replies on the other,
each with its own doorbells, so the thread that serves requests and the threads that wait for
replies never read the same ring nor wake each other. At start-up the workers exchange their
names (unique in the job) over that group.

``Agent`` holds the state of all its parts (set up here, in ``__init__``); their code lives in:

* ``calls`` -- one object per outstanding call; sending requests without blocking ``rpc_async``;
* ``replies`` -- the *reply role*: whoever holds it reads the replies, waiting callers first;
* ``serving`` -- the listener thread that runs requests, its pool, ``async_execution`` replies;
* ``housekeeping`` -- the thread that replaces a blocked listener and fails late calls;
* ``rref`` -- reference ids and the drops ``RRef`` queues (``ReferencesMixin``);
* ``shutdown`` -- the shutdown barrier on the leader, and ``stop``;
* ``frames`` -- the kinds of frame on the lanes.

A request is ``(func, args, kwargs)``, a reply the value or the packed exception, pickled with
protocol 5; arrays and tensors travel out of band, as raw bytes read straight into new arrays on
the other side, and the common small forms skip pickle's slower paths (see ``serialization``).
Example (what ``shmcomm.rpc`` does for you)::

    agent = Agent("worker0", rank=0, world_size=2, job="job-42")
    agent.call_sync(1, operator.add, (1, 2), None, timeout=5.0)    # 3
    agent.stop()
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
import weakref
from typing import NamedTuple

from shmcomm import _core, objects, trust
from shmcomm.rpc.calls import CallsMixin, _Call
from shmcomm.rpc.housekeeping import HousekeepingMixin
from shmcomm.rpc.replies import RepliesMixin
from shmcomm.rpc.rref import ReferencesMixin
from shmcomm.rpc.serving import ServingMixin, _Pool
from shmcomm.rpc.shutdown import ShutdownMixin
from shmcomm.settings import find, read_int

__all__ = ["Agent", "WorkerInfo"]


class WorkerInfo(NamedTuple):
    """A worker's name and id (its rank), as returned by ``rpc.get_worker_info``.

    ``name`` is the name the worker passed to ``init_rpc``, ``id`` its rank. Usable wherever a
    destination (``to``) is expected.

    Example::

        info = rpc.get_worker_info("worker1")     # WorkerInfo(name='worker1', id=1)
        rpc.rpc_sync(info, operator.add, args=(1, 2))
    """

    name: str
    id: int


class Agent(CallsMixin, RepliesMixin, ServingMixin, HousekeepingMixin, ReferencesMixin, ShutdownMixin):
    """This process's RPC endpoint (internal: use ``shmcomm.rpc.init_rpc``)."""

    def __init__(self, name: str, rank: int, world_size: int, job: str, timeout: float = 300.0,
                 rpc_timeout: float = 60.0, num_worker_threads: int = 16):
        self.rank, self.size, self.job = rank, world_size, job
        self._pid = os.getpid()
        self.rpc_timeout = 0.0 if rpc_timeout == float("inf") else rpc_timeout
        self._comm = _core.Communicator(job, trust.private_part(job, "rpc"), rank, world_size, timeout)
        try:
            names: list = [None] * world_size
            objects.all_gather_object(self._comm, names, name)
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"init_rpc: worker names must be unique, {dupes} used more than "
                                 f"once (names by rank: {names})")
            # requests on one lane, replies on the other
            self.q, self.r = _core.rpc_channels(self._comm, _ring_bytes(world_size), 2)
        except BaseException:
            self._comm.close()
            raise
        self.infos = [WorkerInfo(n, r) for r, n in enumerate(names)]
        self.by_name = {info.name: info for info in self.infos}
        self.name = name
        # Waiting: yield the CPU a few times, then sleep on the doorbell. Busy-polling (the group
        # default when ranks fit the cores) cost 5-10x on a loaded or virtualised machine, where a
        # spinning thread takes the core its peer needs.
        spin_us = read_int(find("SHMCOMM_RPC_SPIN_US"), 0)
        yields = read_int(find("SHMCOMM_RPC_YIELDS"), 64)
        for chan in (self.q, self.r):
            chan.spin_ns, chan.yields = spin_us * 1000, yields
        self._ids = itertools.count(1)
        self._sync_pending: dict[int, _Call] = {}
        self._async_pending: dict[int, _Call] = {}
        self._outboxes: dict[int, collections.deque] = {}  # frames waiting for room, per rank
        self._senders: dict[int, threading.Thread] = {}
        self._outbox_lock = threading.Lock()
        self._stopping = False
        self._last_sweep = 0.0
        # reply role
        self._role = threading.Lock()
        self._role_waiters: dict[int, _Call] = {}
        self._agent_wake = threading.Lock()
        self._agent_wake.acquire()
        self._agent_parked = False
        # listener
        self._inbox: collections.deque = collections.deque()
        self._listen_lock = threading.Lock()
        self._listener_gen = 0
        self._executing = False
        self._exec_seq = 0
        self._listener_done = threading.Event()
        # references (see rref.py)
        self.owners: dict = {}
        self.owners_weak: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.owners_lock = threading.Lock()
        self.delrefs: collections.deque = collections.deque()
        self._rref_ids = itertools.count(1)
        # shutdown barrier (used on the leader)
        self._barrier_arrived: set[int] = set()
        self._barrier_future = None
        self._barrier_lock = threading.Lock()
        self._pool = _Pool(max(2, num_worker_threads), f"shmcomm-rpc-{rank}")
        self._stop_event = threading.Event()
        self._housekeeper = threading.Thread(target=self._housekeep, daemon=True,
                                             name=f"shmcomm-rpc-{rank}-housekeeper")
        self._replier = threading.Thread(target=self._reply_loop, daemon=True,
                                         name=f"shmcomm-rpc-{rank}-replies")

    def start(self) -> None:
        """Start serving (after init_rpc has published this agent)."""
        self._housekeeper.start()
        self._replier.start()
        self._pool.submit(self._listen, 0)

    # ---- destinations -------------------------------------------------------------------------
    def resolve(self, to) -> int:
        """Rank of ``to``: a worker name, a rank or a WorkerInfo."""
        if type(to) is int and 0 <= to < self.size:
            return to
        if isinstance(to, str):
            info = self.by_name.get(to)
            if info is None:
                raise ValueError(f"unknown worker name {to!r}; workers are {[i.name for i in self.infos]}")
            return info.id
        if isinstance(to, WorkerInfo):
            if not 0 <= to.id < self.size or self.infos[to.id].name != to.name:
                raise ValueError(f"{to} is not a worker of this RPC group")
            return to.id
        if isinstance(to, bool) or not isinstance(to, int):
            try:
                import operator

                to = operator.index(to)
            except TypeError:
                raise TypeError(f"to must be a worker name, a rank or a WorkerInfo, got "
                                f"{type(to).__name__}") from None
        if not 0 <= to < self.size:
            raise ValueError(f"to must be a rank in [0, {self.size}), got {to}")
        return to

    def _timeout(self, timeout) -> float:
        """Seconds for a call (0.0: none), from its ``timeout`` argument."""
        if timeout is None or timeout < 0:
            return self.rpc_timeout
        return 0.0 if timeout == float("inf") else float(timeout)


def _ring_bytes(world_size: int) -> int:
    """Bytes per ring: SHMCOMM_RPC_RING_BYTES, else about 4 MiB of rings per rank in all (two
    lanes, one ring from each rank), at least 256 KiB and at most 1 MiB + 64 KiB (a 1 MiB array
    and its frame pass without the sender waiting for room)."""
    default = max(256 << 10, min((1 << 20) + (64 << 10), ((2 << 20) + (128 << 10)) // max(1, world_size)))
    return read_int(find("SHMCOMM_RPC_RING_BYTES"), default)

