"""The public RPC functions (re-exported by ``shmcomm.rpc``); one agent per process."""

from __future__ import annotations

import atexit
import threading
import time
from typing import Any, Callable, Iterable, TypeVar

from shmcomm._core import Future
from shmcomm.errors import InvalidStateError, PeerFailureError
from shmcomm.rpc.agent import Agent, WorkerInfo
from shmcomm.rpc.frames import KIND_REQUEST, _copies
from shmcomm.rpc.functions import async_execution
from shmcomm.rpc.rref import RRef, _owner_create, _run_into

__all__ = ["init_rpc", "shutdown", "rpc_sync", "rpc_async", "remote", "get_worker_info"]

DEFAULT_RPC_TIMEOUT = 60.0

_T = TypeVar("_T")

_agent: Agent | None = None
_lock = threading.Lock()
_atexit_registered = False


def _current() -> Agent:
    agent = _agent
    if agent is None:
        raise InvalidStateError("RPC is not initialized: call shmcomm.rpc.init_rpc() first")
    return agent


def init_rpc(name: str, rank: int | None = None, world_size: int | None = None, *,
             job: str | None = None, timeout: float | None = None,
             rpc_timeout: float = DEFAULT_RPC_TIMEOUT, num_worker_threads: int = 16,
             backend: Any = None, rpc_backend_options: Any = None) -> None:
    """Join the job's RPC group as worker ``name``; returns once every worker has joined.

    Every process of the job calls it once (and ``shutdown`` at the end). It needs no process
    group: RPC has its own shared-memory channels.

    Args:
        name (str): this worker's name, unique in the job (``to`` of the calls).
        rank (int | None): this worker's rank in ``[0, world_size)``; None (the default):
            ``RANK``.
        world_size (int | None): the number of workers; None (the default): ``WORLD_SIZE``.
        job (str | None): the job name, the same on every worker; None (the default):
            ``SHMCOMM_JOB``, else ``TORCHELASTIC_RUN_ID`` + ``MASTER_PORT``.
        timeout (float | None): seconds the start-up may take; None (the default):
            ``SHMCOMM_TIMEOUT``, else 300.
        rpc_timeout (float): the default timeout of each call in seconds, 0 for none;
            default 60.
        num_worker_threads (int): how many requests may block at once on this worker; default 16.
        backend (Any): accepted for torch compatibility, ignored.
        rpc_backend_options (Any): torch's options object; its ``rpc_timeout`` and
            ``num_worker_threads`` fields are used. Default None.

    Raises:
        ValueError: ``name`` is empty or not a string, or taken by another worker; a variable
            needed is not set (the message names it); ``rpc_timeout`` < 0,
            ``num_worker_threads`` < 1.
        TypeError: ``rank``, ``world_size`` or ``num_worker_threads`` is not an int.
        InvalidStateError: RPC is already initialized in this process.
        CommTimeoutError: not every worker joined within ``timeout``.

    Example::

        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=3, job="job-42")
        ...
        rpc.shutdown()
    """
    global _agent, _atexit_registered
    from shmcomm.world import job_arguments

    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    del backend
    if rpc_backend_options is not None:
        rpc_timeout = float(getattr(rpc_backend_options, "rpc_timeout", rpc_timeout))
        num_worker_threads = int(getattr(rpc_backend_options, "num_worker_threads", num_worker_threads))
    rank, world_size, job, timeout = job_arguments(rank, world_size, job, timeout, name_arg="job")
    if not rpc_timeout >= 0:
        raise ValueError(f"rpc_timeout must be >= 0 seconds (0: none), got {rpc_timeout}")
    if _int_arg(num_worker_threads, "num_worker_threads") < 1:
        raise ValueError(f"num_worker_threads must be >= 1, got {num_worker_threads}")
    with _lock:
        if _agent is not None:
            raise InvalidStateError("init_rpc was already called; call shutdown() first")
        agent = Agent(name, rank, world_size, job, float(timeout), float(rpc_timeout),
                      num_worker_threads)
        _agent = agent
        agent.start()   # only now: a request may already wait, and it needs _current()
        if not _atexit_registered:
            atexit.register(_stop_at_exit)
            _atexit_registered = True


def _int_arg(value, argname: str) -> int:
    import operator

    if isinstance(value, bool):
        raise TypeError(f"{argname} must be an int, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{argname} must be an int, got {type(value).__name__}") from None


def _stop_at_exit() -> None:
    global _agent
    agent, _agent = _agent, None
    if agent is not None:
        agent.stop()


def get_worker_info(name: str | None = None) -> WorkerInfo:
    """The ``WorkerInfo`` (name and rank) of worker ``name``, or of this worker.

    Args:
        name (str | None): a worker's name; None (the default): this worker.

    Returns:
        WorkerInfo: ``WorkerInfo(name, id)``, ``id`` being the worker's rank.

    Raises:
        ValueError: no worker has this name.
        InvalidStateError: RPC is not initialized.

    Example::

        me = rpc.get_worker_info()                 # WorkerInfo(name='worker0', id=0)
        rpc.get_worker_info("worker1").id          # 1
    """
    agent = _current()
    if name is None:
        return agent.infos[agent.rank]
    info = agent.by_name.get(name)
    if info is None:
        raise ValueError(f"unknown worker name {name!r}; workers are {[i.name for i in agent.infos]}")
    return info


def _check_call(func, args, kwargs, timeout):
    if not callable(func):
        raise TypeError(f"func must be callable, got {type(func).__name__}")
    if type(args) is not tuple:
        try:
            args = tuple(args)
        except TypeError:
            raise TypeError(f"args must be a tuple or another iterable, got {type(args).__name__}") from None
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict or None, got {type(kwargs).__name__}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or timeout != timeout):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    return args, kwargs or None


def rpc_sync(to: str | int | WorkerInfo, func: Callable[..., _T], args: Iterable[Any] = (),
             kwargs: dict[str, Any] | None = None, timeout: float | None = None) -> _T:
    """Run ``func(*args, **kwargs)`` on worker ``to`` and return its result.

    Arrays and tensors in the arguments and the result travel through shared memory; other
    objects are pickled (functions by name; lambdas and local functions by value).

    Args:
        to (str | int | WorkerInfo): the worker: its name, its rank or its ``WorkerInfo``
            (this worker too).
        func (Callable): the function to run there.
        args (Iterable): its positional arguments; default ``()``.
        kwargs (dict | None): its keyword arguments; default None.
        timeout (float | None): seconds to wait for the result; None (the default):
            ``init_rpc``'s ``rpc_timeout``; 0: no limit.

    Returns:
        What ``func`` returned (for an ``@async_execution`` function, its Future's value).

    Raises:
        Exception: what ``func`` raised, with the same type, its message followed by the remote
            traceback (``RemoteError`` where the type cannot be rebuilt here).
        TypeError: ``func`` is not callable, ``args`` not iterable, ``kwargs`` not a dict,
            ``timeout`` not a number; ``to`` is not a name, rank or WorkerInfo.
        ValueError: ``to`` names no worker of the group.
        CommTimeoutError: no result within ``timeout`` (also a ``TimeoutError``).
        PeerFailureError: worker ``to`` died.
        InvalidStateError: RPC is not initialized.
        ShmcommError: RPC is shut down.

    Example::

        rpc.rpc_sync("worker1", operator.add, args=(2, 3))          # 5
        rpc.rpc_sync(1, np.add, args=(np.ones(4), 1), timeout=5.0)  # array([2., 2., 2., 2.])
    """
    agent = _current()
    args, kwargs = _check_call(func, args, kwargs, timeout)
    return agent.call_sync(agent.resolve(to), func, args, kwargs, timeout)


def rpc_async(to: str | int | WorkerInfo, func: Callable[..., _T], args: Iterable[Any] = (),
              kwargs: dict[str, Any] | None = None, timeout: float | None = None) -> Future[_T]:
    """Start ``func(*args, **kwargs)`` on worker ``to``; returns a ``Future`` of its result at once.

    The arguments are those of ``rpc_sync``.

    Args:
        to (str | int | WorkerInfo): the worker: its name, its rank or its ``WorkerInfo``.
        func (Callable): the function to run there.
        args (Iterable): its positional arguments; default ``()``.
        kwargs (dict | None): its keyword arguments; default None.
        timeout (float | None): seconds until the Future fails with ``CommTimeoutError``; None
            (the default): ``init_rpc``'s ``rpc_timeout``; 0: no limit.

    Returns:
        Future: completes with what ``func`` returned, or with the error ``rpc_sync`` would
        raise (``func``'s, ``CommTimeoutError``, ``PeerFailureError``).

    Raises:
        TypeError: ``func`` is not callable, ``args`` not iterable, ``kwargs`` not a dict,
            ``timeout`` not a number; ``to`` is not a name, rank or WorkerInfo.
        ValueError: ``to`` names no worker of the group.
        InvalidStateError: RPC is not initialized.
        ShmcommError: RPC is shut down.

    Example::

        futs = [rpc.rpc_async("worker1", operator.mul, args=(i, i)) for i in range(4)]
        sc.wait_all(futs)                                          # [0, 1, 4, 9]
        rpc.rpc_async("worker1", sum, args=([1, 2],)).then(lambda f: f.value() + 1).wait()  # 4
    """
    agent = _current()
    args, kwargs = _check_call(func, args, kwargs, timeout)
    return agent.call_async(agent.resolve(to), func, args, kwargs, timeout, KIND_REQUEST)


def remote(to: str | int | WorkerInfo, func: Callable[..., Any], args: Iterable[Any] = (),
           kwargs: dict[str, Any] | None = None, timeout: float | None = None) -> RRef:
    """Run ``func(*args, **kwargs)`` on worker ``to``; returns at once an ``RRef`` to the result.

    The result stays on ``to`` (its owner) while any worker holds an RRef to it.

    Args:
        to (str | int | WorkerInfo): the owner: a worker's name, rank or ``WorkerInfo``.
        func (Callable): the function that makes the value there.
        args (Iterable): its positional arguments; default ``()``.
        kwargs (dict | None): its keyword arguments; default None.
        timeout (float | None): seconds the creation may take; None (the default):
            ``init_rpc``'s ``rpc_timeout``; 0: no limit.

    Returns:
        RRef: a reference to the value; ``func``'s error is raised by ``to_here()`` and the
        proxies.

    Raises:
        TypeError: ``func`` is not callable, ``args`` not iterable, ``kwargs`` not a dict,
            ``timeout`` not a number; ``to`` is not a name, rank or WorkerInfo.
        ValueError: ``to`` names no worker of the group.
        InvalidStateError: RPC is not initialized.
        ShmcommError: RPC is shut down.

    Example::

        rref = rpc.remote("worker1", torch.ones, args=(2,))
        rref.to_here()                       # tensor([1., 1.])
        rref.rpc_sync().sum()                # tensor(2.) computed on worker1
    """
    agent = _current()
    args, kwargs = _check_call(func, args, kwargs, timeout)
    dst = agent.resolve(to)
    rid = agent.new_rref_id()
    if dst == agent.rank:
        from shmcomm.rpc.serialization import dumps, loads

        data, bufs = dumps((func, args, kwargs), dst)   # value semantics, as for a remote owner
        func, args, kwargs = loads(data, _copies(bufs))
        value: Future[Any] = Future()
        obj = RRef._owned(agent, rid, value)
        agent._pool.submit(_run_into, value, func, args, kwargs)
        return obj
    created = agent.call_async(dst, _owner_create, (rid, func, args, kwargs), None, timeout)
    return RRef._user(agent, dst, rid, True, created)


@async_execution
def _shutdown_arrive(rank: int):
    return _current().barrier_arrive(rank)


def shutdown(graceful: bool = True, timeout: float | None = None) -> None:
    """Leave RPC: this process's agent stops and ``init_rpc`` may be called again.

    With ``graceful`` (the default), first wait until every worker has called ``shutdown`` with
    no call outstanding, so no worker leaves while others still need it; a dead worker is
    excused. Without it, leave at once: pending calls fail.

    Args:
        graceful (bool): wait for every worker first; default True.
        timeout (float | None): seconds that wait may take; None (the default): as long as the
            workers live.

    Raises:
        InvalidStateError: RPC is not initialized.
        CommTimeoutError: ``graceful`` and the workers did not all arrive within ``timeout``.

    Example::

        rpc.shutdown()                      # every worker, at the end
        rpc.shutdown(graceful=False)        # leave now: pending calls fail
    """
    global _agent
    with _lock:
        agent = _current()
    try:
        if graceful:
            deadline = time.monotonic() + timeout if timeout else 0.0
            agent.wait_outstanding(deadline)
            agent.flush_delrefs()
            while True:
                leader = agent.leader()   # the lowest live rank
                left = max(0.001, deadline - time.monotonic()) if deadline else 0
                try:
                    agent.call_sync(leader, _shutdown_arrive, (agent.rank,), None, left)
                    break
                except PeerFailureError as exc:
                    if exc.rank != leader:
                        raise
                    # the leader died: everyone moves on to the next one
            if leader == agent.rank:
                agent.wait_others_left(deadline or time.monotonic() + 30.0)
    finally:
        agent.stop()   # before forgetting it: requests still being served may need _current()
        with _lock:
            if _agent is agent:
                _agent = None
