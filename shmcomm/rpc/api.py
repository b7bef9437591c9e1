"""The public RPC functions (re-exported by ``shmcomm.rpc``); one agent per process."""

from __future__ import annotations

import atexit
import threading
import time

from shmcomm.errors import InvalidStateError, PeerFailureError
from shmcomm.rpc.agent import KIND_REQUEST, Agent, WorkerInfo
from shmcomm.rpc.functions import async_execution
from shmcomm.rpc.rref import RRef, _owner_create, _run_into

__all__ = ["init_rpc", "shutdown", "rpc_sync", "rpc_async", "remote", "get_worker_info"]

DEFAULT_RPC_TIMEOUT = 60.0

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
             backend=None, rpc_backend_options=None) -> None:
    """Join the RPC group as worker ``name``; returns once every worker has joined.

    ``rank``, ``world_size`` and the job name default to RANK, WORLD_SIZE and SHMCOMM_JOB, as for
    ``init_process_group``. ``timeout`` bounds the start-up (default SHMCOMM_TIMEOUT or 300 s),
    ``rpc_timeout`` is the default per-call timeout, ``num_worker_threads`` the most requests that
    may block at once. ``backend`` is accepted for torch compatibility; from
    ``rpc_backend_options`` the fields ``rpc_timeout`` and ``num_worker_threads`` are used::

        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=3, job="job-42")
        ...
        rpc.shutdown()
    """
    global _agent, _atexit_registered
    from shmcomm.group import job_arguments

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
    """The WorkerInfo of worker ``name`` (this worker when None).

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


def rpc_sync(to, func, args=(), kwargs=None, timeout=None):
    """Run ``func(*args, **kwargs)`` on worker ``to`` and return its result.

    ``to`` is a worker name, a rank or a WorkerInfo (this worker too). ``timeout`` in seconds:
    None uses init_rpc's ``rpc_timeout``, 0 waits forever; past it ``CommTimeoutError`` (a
    ``TimeoutError``) is raised. The callee's exception is raised here with the same type and its
    traceback in the message; a dead callee raises ``PeerFailureError``::

        rpc.rpc_sync("worker1", operator.add, args=(2, 3))          # 5
        rpc.rpc_sync(1, np.add, args=(np.ones(4), 1), timeout=5.0)  # array([2., 2., 2., 2.])
    """
    agent = _current()
    args, kwargs = _check_call(func, args, kwargs, timeout)
    return agent.call_sync(agent.resolve(to), func, args, kwargs, timeout)


def rpc_async(to, func, args=(), kwargs=None, timeout=None):
    """Start ``func(*args, **kwargs)`` on worker ``to``; returns a ``shmcomm.Future`` of its result.

    Errors (the callee's, a timeout, a dead callee) complete the Future exceptionally::

        futs = [rpc.rpc_async("worker1", operator.mul, args=(i, i)) for i in range(4)]
        sc.wait_all(futs)                                          # [0, 1, 4, 9]
        rpc.rpc_async("worker1", sum, args=([1, 2],)).then(lambda f: f.value() + 1).wait()  # 4
    """
    agent = _current()
    args, kwargs = _check_call(func, args, kwargs, timeout)
    return agent.call_async(agent.resolve(to), func, args, kwargs, timeout, KIND_REQUEST)


def remote(to, func, args=(), kwargs=None, timeout=None) -> RRef:
    """Run ``func(*args, **kwargs)`` on worker ``to`` and return an RRef to the result, at once.

    The result stays on ``to`` (the owner) while any worker holds an RRef to it; errors of
    ``func`` are raised by ``to_here()``::

        rref = rpc.remote("worker1", torch.ones, args=(2,))
        rref.to_here()                       # tensor([1., 1.])
        rref.rpc_sync().sum()                # tensor(2.) computed on worker1
    """
    agent = _current()
    args, kwargs = _check_call(func, args, kwargs, timeout)
    dst = agent.resolve(to)
    rid = agent.new_rref_id()
    if dst == agent.rank:
        from shmcomm import _core
        from shmcomm.rpc.serialization import dumps, loads

        data, bufs = dumps((func, args, kwargs), dst)   # value semantics, as for a remote owner
        func, args, kwargs = loads(data, _copies(bufs))
        value = _core.Future()
        obj = RRef._owned(agent, rid, value)
        agent._pool.submit(_run_into, value, func, args, kwargs)
        return obj
    created = agent.call_async(dst, _owner_create, (rid, func, args, kwargs), None, timeout)
    return RRef._user(agent, dst, rid, True, created)


def _copies(bufs):
    from shmcomm.rpc.agent import _copies as copies

    return copies(bufs)


@async_execution
def _shutdown_arrive(rank: int):
    return _current().barrier_arrive(rank)


def shutdown(graceful: bool = True, timeout: float | None = None) -> None:
    """Leave RPC. With ``graceful`` (the default) first wait until every worker has called
    ``shutdown`` with no call outstanding, so no worker leaves while others still need it; a dead
    worker is excused. ``timeout`` bounds that wait (None: as long as the workers live)::

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
