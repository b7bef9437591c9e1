"""The RPC agent of one process: transport, threads, pending calls, dispatch and shutdown.

Transport. A private group of the job (segment part ``rpc``) and, mapped through it, two lanes of
byte rings driven by the compiled ``RpcChannel``: requests travel on one, replies on the other,
each with its own doorbells, so the thread that serves requests and the threads that wait for
replies never read the same ring nor wake each other.

Requests. One *listener* thread reads requests and runs each one itself: no hand-off to another
thread, which is what a small call costs most. A housekeeping thread watches it; when one request
has run for more than a tick (a slow or blocking function), it makes another pool thread the
listener, and the old one returns to the pool once its function returns. So a blocking function
holds one thread and delays other requests by at most a few milliseconds.

Replies. Whoever holds the *reply role* reads the reply rings: a thread blocked in ``rpc_sync``
takes it itself and so wakes up on its own reply with no hand-off; while ``rpc_async`` calls are
outstanding and no synchronous caller reads, a reply thread does it and completes their Futures.

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
import logging
import os
import queue
import threading
import time
import weakref
from _thread import allocate_lock as _allocate_lock
from typing import NamedTuple

import numpy as np

from shmcomm import _core, objects, trust
from shmcomm.errors import CommTimeoutError, PeerFailureError, ShmcommError, future_error
from shmcomm.rpc.functions import is_async_execution
from shmcomm.rpc.serialization import (dumps_call, dumps_value, loads_call, loads_value,
                                       pack_exception, unpack_exception)

__all__ = ["Agent", "WorkerInfo"]

log = logging.getLogger("shmcomm.rpc")

KIND_REQUEST = 1   # run (func, args, kwargs) and reply
KIND_ONEWAY = 2    # run it, no reply (reference counting notes)
KIND_OK = 3        # reply: the pickled return value
KIND_ERR = 4       # reply: a packed exception

TICK_BUSY = 0.002     # housekeeping period while requests run: a blocked listener is replaced
TICK_IDLE = 0.02      # ... otherwise (timeouts, dead peers, reference notes)
SLICE = 0.02          # longest a waiting caller goes without checking its deadline and peer


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


class _CallFuture(_core.Future):
    """The Future of an rpc_async call: ``wait`` reads the replies itself when no other thread
    does (as rpc_sync), instead of sleeping until the reply thread hands the value over."""

    __slots__ = ("_agent",)

    def wait(self, timeout=None):
        if not self.done():
            agent = getattr(self, "_agent", None)
            if agent is not None:
                agent._drive(self, timeout)
        return super().wait(timeout)


class _Call:
    """One outstanding call: a Future (rpc_async) or a lock its blocked caller sleeps on."""

    __slots__ = ("dst", "deadline", "what", "future", "lock", "value", "error", "done")

    def __init__(self, dst: int, deadline: float, what, future):
        self.dst = dst
        self.deadline = deadline
        self.what = what
        self.future = future
        self.lock = None
        self.value = None
        self.error = None
        self.done = False

    def finish(self, value, error) -> None:
        if error is not None:  # a callee's SystemExit must not end the caller
            error = future_error(error)
        if self.future is not None:
            if error is None:
                self.future.set_result(value)
            else:
                self.future.set_exception(error)
            return
        self.value, self.error, self.done = value, error, True
        _wake(self.lock)


def _wake(lock) -> None:
    try:
        lock.release()
    except RuntimeError:  # already released: the sleeper is awake anyway
        pass


def _name_of(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


class _Pool:
    """Worker threads for requests that leave the listener (daemon threads, unlike
    ThreadPoolExecutor's, so that a function that never returns cannot keep a process alive)."""

    def __init__(self, max_workers: int, prefix: str):
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._max = max_workers
        self._prefix = prefix
        self._closed = False

    def submit(self, fn, *args) -> None:
        if self._closed:
            return
        self._tasks.put((fn, args))
        if self._idle.acquire(blocking=False):
            return
        with self._lock:
            if len(self._threads) < self._max:
                t = threading.Thread(target=self._work, daemon=True,
                                     name=f"{self._prefix}-{len(self._threads)}")
                self._threads.append(t)
                t.start()

    def _work(self) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - a pool thread must survive anything
                log.exception("shmcomm.rpc: unexpected error in a worker thread")
            del item, fn, args
            self._idle.release()

    def shutdown(self) -> None:
        self._closed = True
        for _ in self._threads:
            self._tasks.put(None)


class Agent:
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
        spin_us = int(os.environ.get("SHMCOMM_RPC_SPIN_US", "0"))
        yields = int(os.environ.get("SHMCOMM_RPC_YIELDS", "64"))
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

    # ---- calling ------------------------------------------------------------------------------
    def call_sync(self, dst: int, func, args, kwargs, timeout):
        """Run ``func(*args, **kwargs)`` on ``dst`` and return its value (or raise its error)."""
        if self._stopping:
            raise ShmcommError("RPC is shut down")
        data, bufs, flags = dumps_call(func, args, kwargs, dst)
        seconds = self.rpc_timeout if timeout is None else self._timeout(timeout)
        call = _Call(dst, time.monotonic() + seconds if seconds else 0.0, func, None)
        call.lock = lock = _allocate_lock()
        lock.acquire()
        rid = next(self._ids)
        self._sync_pending[rid] = call
        if dst == self.rank:
            # on a pool thread, as for a remote caller: the timeout holds even for a blocking call
            self._pool.submit(self._serve, (dst, KIND_REQUEST, rid, flags, data, _copies(bufs)))
            self._wait_local(rid, call)
        else:
            try:
                self.q.send(dst, KIND_REQUEST, rid, flags, data, bufs, seconds or -1.0)
            except BaseException:
                self._sync_pending.pop(rid, None)
                raise
            self._wait_sync(rid, call)
        if call.error is not None:
            raise call.error
        return call.value

    def call_async(self, dst: int, func, args, kwargs, timeout, kind: int = KIND_REQUEST):
        """Start ``func(*args, **kwargs)`` on ``dst``; returns a Future of its value."""
        if self._stopping:
            raise ShmcommError("RPC is shut down")
        data, bufs, flags = dumps_call(func, args, kwargs, dst)
        fut = _CallFuture()
        fut._agent = self
        if kind == KIND_ONEWAY:
            self._send_oneway(dst, data, bufs, flags)
            fut.set_result(None)
            return fut
        seconds = self.rpc_timeout if timeout is None else self._timeout(timeout)
        call = _Call(dst, time.monotonic() + seconds if seconds else 0.0, func, fut)
        rid = next(self._ids)
        self._async_pending[rid] = call
        if dst == self.rank:
            self._pool.submit(self._serve, (dst, KIND_REQUEST, rid, flags, data, _copies(bufs)))
            return fut
        try:
            self._post(dst, KIND_REQUEST, rid, flags, data, bufs, call.deadline)
        except ShmcommError as exc:
            if self._async_pending.pop(rid, None) is not None:
                fut.set_exception(exc)
            return fut
        except BaseException:
            self._async_pending.pop(rid, None)
            raise
        if self._agent_parked and not self._role.locked():
            _wake(self._agent_wake)
        return fut

    def _send_oneway(self, dst: int, data: bytes, bufs: list, flags: int) -> None:
        if dst == self.rank:
            self._pool.submit(self._serve, (dst, KIND_ONEWAY, 0, flags, data, _copies(bufs)))
        else:
            self._post(dst, KIND_ONEWAY, 0, flags, data, bufs, 0.0)

    # ---- sending without blocking the caller --------------------------------------------------
    def _post(self, dst: int, kind: int, rid: int, flags: int, data: bytes, bufs: list,
              deadline: float) -> None:
        """Send a frame of an rpc_async (or one-way) call without ever blocking its caller: at
        once if nothing is queued for ``dst`` and the frame fits its ring now, else queued, in
        order, for ``dst``'s sender thread (a callee that stops reading must not hold the caller,
        nor every other send to it). The call's Future fails at its deadline either way."""
        with self._outbox_lock:
            box = self._outboxes.setdefault(dst, collections.deque())
            if not box and self.q.send(dst, kind, rid, flags, data, bufs, 0.0, True):
                return
            box.append((kind, rid, flags, data, _copies(bufs), deadline))
            if dst not in self._senders:
                sender = threading.Thread(target=self._send_queued, args=(dst,), daemon=True,
                                          name=f"shmcomm-rpc-{self.rank}-send-{dst}")
                self._senders[dst] = sender
                sender.start()

    def _send_queued(self, dst: int) -> None:
        """Sender thread of ``dst``: writes its queued frames in order, each waiting for room up
        to its call's deadline; a frame whose call already failed is dropped unsent."""
        box = self._outboxes[dst]
        while True:
            with self._outbox_lock:
                if not box or self._stopping:
                    box.clear()
                    del self._senders[dst]
                    return
                kind, rid, flags, data, bufs, deadline = box.popleft()
            if kind == KIND_REQUEST and rid not in self._async_pending:
                continue
            left = deadline - time.monotonic() if deadline else -1.0
            try:
                if deadline and left <= 0:
                    raise CommTimeoutError(f"send to rank {dst}: no room in the ring before the "
                                           f"call's deadline")
                self.q.send(dst, kind, rid, flags, data, bufs, left)
            except ShmcommError as exc:
                if kind == KIND_REQUEST:
                    self._fail(rid, exc)
                else:
                    log.warning("shmcomm.rpc: a one-way call to rank %d was not sent: %s", dst, exc)
            except BaseException:  # noqa: BLE001 - a sender thread must survive anything
                log.exception("shmcomm.rpc: sending to rank %d failed", dst)

    # ---- waiting for replies ------------------------------------------------------------------
    def _wait_sync(self, rid: int, call: _Call) -> None:
        role = self._role
        try:
            while not call.done:
                if role.acquire(False):
                    try:
                        if call.done:
                            break
                        frames = self.r.recv(self._slice(call))
                    finally:
                        role.release()
                    if frames:
                        self._on_replies(frames)
                    elif not call.done:
                        self._check_call(rid, call)
                    self._maybe_sweep()
                else:
                    self._role_waiters[rid] = call
                    try:
                        call.lock.acquire(True, self._slice(call))
                    finally:
                        self._role_waiters.pop(rid, None)
                    if not call.done:
                        self._check_call(rid, call)
        finally:
            self._hand_over_role()

    def _wait_local(self, rid: int, call: _Call) -> None:
        # a call to this process (an async_execution function may still be running)
        while not call.done:
            call.lock.acquire(True, self._slice(call))
            if not call.done and call.deadline and time.monotonic() >= call.deadline:
                self._fail(rid, self._call_error(call, False))

    def _drive(self, fut, timeout) -> None:
        """Read replies on this thread until ``fut`` is done, while the reply role is free."""
        end = time.monotonic() + timeout if timeout is not None and timeout >= 0 else 0.0
        role = self._role
        try:
            while not fut.done() and not self._stopping:
                wait = SLICE if not end else min(SLICE, end - time.monotonic())
                if wait <= 0 or not role.acquire(False):
                    return   # another thread reads for us (or time is up): the plain wait follows
                try:
                    frames = self.r.recv(wait)
                finally:
                    role.release()
                if frames:
                    self._on_replies(frames)
                self._maybe_sweep()
        finally:
            self._hand_over_role()

    def _slice(self, call: _Call) -> float:
        if not call.deadline:
            return SLICE
        return max(0.0, min(SLICE, call.deadline - time.monotonic()))

    def _hand_over_role(self) -> None:
        """A synchronous caller is leaving: wake another one, or the reply thread."""
        if self._role_waiters:
            for call in list(self._role_waiters.values())[:1]:
                _wake(call.lock)
        elif self._async_pending and self._agent_parked:
            _wake(self._agent_wake)

    def _check_call(self, rid: int, call: _Call) -> None:
        """Fail ``call`` if its peer is gone or its deadline passed (a reply may still be queued:
        drain first)."""
        gone = call.dst != self.rank and self.r.peer_gone(call.dst)
        late = call.deadline and time.monotonic() >= call.deadline
        if not (gone or late):
            return
        if gone:
            # its last reply may still sit in the ring: drain before failing (or let the thread
            # that holds the reply role do it, and look again next slice)
            if not self._role.acquire(False):
                return
            try:
                frames = self.r.recv(0.0)
            finally:
                self._role.release()
            self._on_replies(frames)
            if call.done:
                return
        self._fail(rid, self._call_error(call, gone))

    def _call_error(self, call: _Call, gone: bool) -> BaseException:
        who = self.infos[call.dst].name
        if gone:
            pid = self.r.pid(call.dst)
            return PeerFailureError(f"RPC {_name_of(call.what)} on {who}: worker {who} (rank "
                                    f"{call.dst}, pid {pid}) died or shut down", call.dst, pid)
        return CommTimeoutError(f"RPC {_name_of(call.what)} on {who} timed out")

    def _fail(self, rid: int, error: BaseException) -> None:
        call = self._sync_pending.pop(rid, None) or self._async_pending.pop(rid, None)
        if call is not None:
            call.finish(None, error)

    def _on_replies(self, frames: list) -> None:
        for src, kind, rid, flags, data, bufs in frames:
            call = self._sync_pending.pop(rid, None) or self._async_pending.pop(rid, None)
            if call is None:
                continue  # its caller gave up (timeout) before the reply came
            try:
                value = loads_value(data, bufs, flags)
                error = unpack_exception(value) if kind == KIND_ERR else None
            except BaseException as exc:  # noqa: BLE001 - e.g. a type missing on this side
                value, error = None, exc
            if error is not None:
                value = None
            try:
                call.finish(value, error)
            except BaseException:  # noqa: BLE001 - never let one reply break the others
                log.exception("shmcomm.rpc: completing a call failed")

    def _reply_loop(self) -> None:
        """Reads replies while rpc_async calls are outstanding and no blocked caller does."""
        role = self._role
        while not self._stopping:
            if not self._async_pending or not role.acquire(False):
                self._agent_parked = True
                if self._async_pending and not role.locked():
                    self._agent_parked = False
                    continue
                self._agent_wake.acquire(True, 0.05)
                self._agent_parked = False
                continue
            try:
                frames = self.r.recv(SLICE)
            except BaseException:  # noqa: BLE001
                if not self._stopping:
                    log.exception("shmcomm.rpc: reading replies failed")
                frames = []
            finally:
                role.release()
            if frames:
                self._on_replies(frames)
            self._maybe_sweep()
            if self._role_waiters:  # a blocked caller wants the role: let it read for itself
                self._hand_over_role()

    # ---- serving requests ---------------------------------------------------------------------
    def _listen(self, gen: int) -> None:
        inbox, lock, q = self._inbox, self._listen_lock, self.q
        while True:
            with lock:
                if gen != self._listener_gen or self._stopping:
                    if gen == self._listener_gen:
                        self._listener_done.set()
                    return
                self._executing = False
            if inbox:
                try:
                    frame = inbox.popleft()
                except IndexError:
                    continue
            else:
                try:
                    frames = q.recv(0.5)
                except BaseException:  # noqa: BLE001 - e.g. a corrupt frame: keep serving others
                    if not self._stopping:
                        log.exception("shmcomm.rpc: reading requests failed")
                    continue
                if not frames:
                    continue
                inbox.extend(frames)
                continue
            with lock:
                self._executing = True
                self._exec_seq += 1
            try:
                self._serve(frame)
            except BaseException:  # noqa: BLE001
                log.exception("shmcomm.rpc: serving a request failed")
            del frame

    def _serve(self, frame) -> None:
        src, kind, rid, flags, data, bufs = frame
        del frame
        try:
            func, args, kwargs = loads_call(data, bufs, flags)
            del data, bufs
            result = func(*args, **kwargs) if kwargs else func(*args)
            if is_async_execution(func):
                if not (hasattr(result, "add_done_callback") and hasattr(result, "value")):
                    raise TypeError(f"{_name_of(func)} is marked async_execution but returned "
                                    f"{type(result).__name__}, not a Future")
                result.add_done_callback(lambda f: self._reply_future(src, kind, rid, f))
                return
        except BaseException as exc:  # noqa: BLE001 - goes back to the caller
            self._reply_error(src, kind, rid, exc)
            return
        self._reply_value(src, kind, rid, result)

    def _reply_future(self, src: int, kind: int, rid: int, fut) -> None:
        try:
            value = fut.value()
        except BaseException as exc:  # noqa: BLE001
            self._reply_error(src, kind, rid, exc)
            return
        self._reply_value(src, kind, rid, value)

    def _reply_value(self, src: int, kind: int, rid: int, value) -> None:
        if kind == KIND_ONEWAY:
            return
        try:
            data, bufs, flags = dumps_value(value, src)
        except BaseException as exc:  # noqa: BLE001
            self._reply_error(src, kind, rid, exc)
            return
        self._deliver(src, KIND_OK, rid, data, bufs, flags)

    def _reply_error(self, src: int, kind: int, rid: int, exc: BaseException) -> None:
        if kind == KIND_ONEWAY:
            log.error("shmcomm.rpc: one-way request from rank %d failed", src,
                      exc_info=(type(exc), exc, exc.__traceback__))
            return
        data, bufs, flags = dumps_value(pack_exception(exc, self.name), src)
        self._deliver(src, KIND_ERR, rid, data, bufs, flags)

    def _deliver(self, dst: int, kind: int, rid: int, data: bytes, bufs: list, flags: int) -> None:
        if dst == self.rank:
            self._on_replies([(dst, kind, rid, flags, data, _copies(bufs))])
            return
        try:
            self.r.send(dst, kind, rid, flags, data, bufs)
        except ShmcommError as exc:
            log.debug("shmcomm.rpc: reply to rank %d dropped: %s", dst, exc)

    # ---- housekeeping -------------------------------------------------------------------------
    def _housekeep(self) -> None:
        last_seq, last_checks = -1, 0.0
        while not self._stop_event.is_set():
            busy = self._executing or self._exec_seq != last_seq
            self._stop_event.wait(TICK_BUSY if busy else TICK_IDLE)
            try:
                last_seq = self._watch_listener(last_seq)
                if self.delrefs:
                    self.flush_delrefs()
                now = time.monotonic()
                if now - last_checks >= TICK_IDLE:
                    last_checks = now
                    self._maybe_sweep()
                    self._check_barrier()
            except BaseException:  # noqa: BLE001
                if not self._stopping:
                    log.exception("shmcomm.rpc: housekeeping failed")

    def _watch_listener(self, last_seq: int) -> int:
        """Replace a listener that has run one request for a whole tick."""
        with self._listen_lock:
            seq = self._exec_seq
            if not (self._executing and seq == last_seq) or self._stopping:
                return seq
            self._listener_gen += 1
            self._executing = False
            gen = self._listener_gen
        self._pool.submit(self._listen, gen)
        return seq

    def _maybe_sweep(self) -> None:
        if time.monotonic() - self._last_sweep >= TICK_IDLE:
            self._sweep()

    def _sweep(self) -> None:
        """Fail calls whose peer is gone or whose deadline passed. A gone peer's last replies may
        still sit in its ring: they are read first, by whoever can take the reply role now (the
        thread holding it sweeps too, so none is skipped for long)."""
        now = time.monotonic()
        calls = list(self._async_pending.items()) + list(self._sync_pending.items())
        if not calls:
            self._last_sweep = now
            return
        gone, stamp = {}, now
        for _rid, call in calls:
            if call.dst not in gone:
                gone[call.dst] = call.dst != self.rank and self.r.peer_gone(call.dst)
        if any(gone.values()):
            if self._role.acquire(False):
                try:
                    frames = self.r.recv(0.0)
                finally:
                    self._role.release()
                self._on_replies(frames)
            else:
                gone = {}   # not swept: the role holder sweeps as soon as it can
                stamp = self._last_sweep
        self._last_sweep = stamp
        for rid, call in calls:
            if gone.get(call.dst) or (call.deadline and now >= call.deadline):
                self._fail(rid, self._call_error(call, bool(gone.get(call.dst))))

    # ---- references (rref.py calls these) -----------------------------------------------------
    def new_rref_id(self) -> tuple:
        return (self.rank, next(self._rref_ids))

    def flush_delrefs(self) -> None:
        """Send queued reference drops to their owners (one one-way note per owner)."""
        from shmcomm.rpc import rref

        by_owner: dict[int, list] = {}
        while self.delrefs:
            try:
                owner, rid = self.delrefs.popleft()
            except IndexError:
                break
            by_owner.setdefault(owner, []).append(rid)
        for owner, rids in by_owner.items():
            if owner == self.rank:
                rref._owner_decref(rids)
                continue
            try:
                self.call_async(owner, rref._owner_decref, (rids,), None, None, kind=KIND_ONEWAY)
            except ShmcommError:
                pass  # the owner is gone: nothing to free

    # ---- shutdown -----------------------------------------------------------------------------
    def barrier_arrive(self, rank: int):
        """On the leader: a worker reached shutdown; the Future completes once all live ones did."""
        with self._barrier_lock:
            if self._barrier_future is None:
                self._barrier_future = _core.Future()
            self._barrier_arrived.add(rank)
            fut = self._barrier_future
        self._check_barrier()
        return fut

    def _check_barrier(self) -> None:
        with self._barrier_lock:
            fut = self._barrier_future
            if fut is None or fut.done():
                return
            missing = [r for r in range(self.size) if r not in self._barrier_arrived
                       and (r == self.rank or not self.q.peer_gone(r))]
            if missing:
                return
        try:
            fut.set_result(None)
        except ShmcommError:
            pass

    def wait_outstanding(self, deadline: float) -> None:
        """Block until every call this process made has completed (or ``deadline`` passed)."""
        while self._sync_pending or self._async_pending:
            if deadline and time.monotonic() > deadline:
                raise CommTimeoutError(f"shutdown: {len(self._sync_pending) + len(self._async_pending)} "
                                       f"RPCs still outstanding")
            time.sleep(0.001)

    def leader(self) -> int:
        for r in range(self.size):
            if r == self.rank or not self.q.peer_gone(r):
                return r
        return self.rank

    def wait_others_left(self, deadline: float) -> None:
        """On the leader after the barrier: wait until every other worker closed its channels, so
        none is still reading our last reply when we leave."""
        while any(r != self.rank and not self.q.peer_gone(r) for r in range(self.size)):
            if time.monotonic() > deadline:
                return
            time.sleep(0.001)

    def stop(self) -> None:
        """Stop the threads, fail what is pending, leave the groups. Safe to call twice."""
        if self._stopping:
            return
        self._stopping = True
        if os.getpid() != self._pid:
            return   # a forked child: its parent still uses these groups
        self._stop_event.set()
        try:
            self.q.kick()
            self.r.kick()
        except ShmcommError:
            pass
        _wake(self._agent_wake)
        self._listener_done.wait(2.0)
        for t in (self._housekeeper, self._replier):
            if t is not threading.current_thread():
                t.join(2.0)
        self._pool.shutdown()
        error = ShmcommError("RPC was shut down before the call completed")
        for rid in list(self._sync_pending) + list(self._async_pending):
            self._fail(rid, error)
        with self.owners_lock:
            self.owners.clear()
        self._comm.close()


def _ring_bytes(world_size: int) -> int:
    """Bytes per ring: SHMCOMM_RPC_RING_BYTES, else about 4 MiB of rings per rank in all (two
    lanes, one ring from each rank), at least 256 KiB and at most 1 MiB + 64 KiB (a 1 MiB array
    and its frame pass without the sender waiting for room)."""
    raw = os.environ.get("SHMCOMM_RPC_RING_BYTES")
    if raw:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"SHMCOMM_RPC_RING_BYTES must be an integer, got {raw!r}") from None
        if value < 4096:
            raise ValueError(f"SHMCOMM_RPC_RING_BYTES must be at least 4096, got {value}")
        return value
    return max(256 << 10, min((1 << 20) + (64 << 10), ((2 << 20) + (128 << 10)) // max(1, world_size)))


def _copies(bufs: list) -> list:
    """Private copies of out-of-band buffers for a call to this same process (value semantics)."""
    return [np.frombuffer(b, np.uint8).copy() for b in bufs]
