"""Remote references: a value that lives on one worker (its owner), usable from every worker.

``rpc.remote(to, func)`` runs ``func`` on ``to`` and returns an ``RRef`` at once; the value stays
on the owner. ``to_here()`` copies it to the caller; the ``rpc_sync()``, ``rpc_async()`` and
``remote()`` proxies call its methods where it lives::

    rref = rpc.remote("worker1", Counter, args=(10,))
    rref.rpc_sync().add(5)         # runs Counter.add on worker1 -> 15
    rref.to_here().value           # a copy here -> 15

Lifetime. The owner keeps the value alive while any worker holds an RRef to it. It counts user
references: ``remote`` counts its creator's; pickling an RRef to another worker adds one before
the message leaves (a synchronous note to the owner, so a later drop by anyone can never overtake
it); a user RRef that is garbage collected queues a drop, sent by the agent's housekeeping thread
(``__del__`` only appends to a deque: it never blocks, takes a lock or sends; the agent's side is
``ReferencesMixin``, at the end of this file). When the count
reaches zero the owner forgets the value. An RRef travelling back to its owner is the owner's
object again and counts nothing.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Callable, Iterator

from shmcomm import _core
from shmcomm.errors import ShmcommError, future_error
from shmcomm.rpc.frames import KIND_ONEWAY
from shmcomm.rpc.functions import async_execution, is_async_execution

if TYPE_CHECKING:
    from shmcomm.rpc.agent import WorkerInfo

__all__ = ["RRef"]


def _agent():
    from shmcomm.rpc import api

    return api._current()


class RRef:
    """A reference to a value owned by one worker, as ``torch.distributed.rpc.RRef``.

    ``rpc.remote`` returns RRefs to values made on another worker; ``RRef(value)`` wraps a
    local value (this worker owns it) so it can be passed to others. An RRef travels in RPC
    arguments and results; the owner keeps the value while any worker holds an RRef to it.

    Args:
        value (Any): the value this worker owns.
        type_hint (Any): accepted for torch compatibility, ignored. Default None.

    Raises:
        InvalidStateError: RPC is not initialized.

    Example::

        rref = rpc.RRef([1, 2, 3])                       # owned here
        rpc.rpc_sync("worker1", len_of, args=(rref,))    # worker1 calls rref.to_here()
        rref.is_owner(), rref.owner_name()               # (True, 'worker0')
    """

    __slots__ = ("_agent", "_owner", "_id", "_value", "_created", "_counted", "__weakref__")
    _value: Any  # the value's Future on the owner, None on other workers

    def __init__(self, value: Any, type_hint: Any = None) -> None:  # noqa: ARG002 - torch signature
        agent = _agent()
        self._agent = agent
        self._owner = agent.rank
        self._id = agent.new_rref_id()
        self._value = _done(value)
        self._created = self._value
        self._counted = False
        agent.owners_weak[self._id] = self

    # ---- construction inside the package ------------------------------------------------------
    @classmethod
    def _owned(cls, agent, rid: tuple, value_future) -> RRef:
        self = cls.__new__(cls)
        self._agent, self._owner, self._id = agent, agent.rank, rid
        self._value = value_future
        self._created = value_future
        self._counted = False
        agent.owners_weak[rid] = self
        return self

    @classmethod
    def _user(cls, agent, owner: int, rid: tuple, counted: bool, created) -> RRef:
        self = cls.__new__(cls)
        self._agent, self._owner, self._id = agent, owner, rid
        self._value = None
        self._created = created
        self._counted = counted
        return self

    # ---- identity -----------------------------------------------------------------------------
    def owner(self) -> WorkerInfo:
        """The owner's ``WorkerInfo`` (name and rank).

        Returns:
            WorkerInfo: the worker that holds the value.

        Example::

            rref.owner()          # WorkerInfo(name='worker1', id=1)
        """
        return self._agent.infos[self._owner]

    def owner_name(self) -> str:
        """The owner's worker name.

        Returns:
            str: the name the owner passed to ``init_rpc``.

        Example::

            assert rref.owner_name() == "worker1"
        """
        return self._agent.infos[self._owner].name

    def is_owner(self) -> bool:
        """Whether this worker holds the value.

        Returns:
            bool: True on the owner.

        Example::

            if rref.is_owner(): v = rref.local_value()
        """
        return self._owner == self._agent.rank

    def confirmed_by_owner(self) -> bool:
        """Whether the owner has made the value (or failed to); never blocks.

        Returns:
            bool: True once the owner answered ``rpc.remote``; always True on the owner of an
            ``RRef(value)``.

        Example::

            rref = rpc.remote("worker1", make); ...; rref.confirmed_by_owner()
        """
        return self._created.done()

    # ---- the value ----------------------------------------------------------------------------
    def local_value(self) -> Any:
        """The value itself, on the owner; waits until it is made.

        Returns:
            Any: the value (not a copy).

        Raises:
            RuntimeError: this worker is not the owner (use ``to_here``).
            Exception: the error that making the value raised.

        Example::

            rref = rpc.RRef({"a": 1}); rref.local_value()["a"]    # 1
        """
        if not self.is_owner():
            raise RuntimeError(f"local_value: this RRef is owned by {self.owner_name()}, not by "
                               f"{self._agent.name}; use to_here()")
        return self._value.wait()

    def to_here(self, timeout: float | None = None) -> Any:
        """A copy of the value on this worker (the value itself on the owner).

        Args:
            timeout (float | None): seconds to wait; None (the default): ``init_rpc``'s
                ``rpc_timeout``; 0: no limit (on the owner, None and 0 wait without a limit).

        Returns:
            Any: the value.

        Raises:
            Exception: the error that making the value raised.
            CommTimeoutError: the value did not arrive within ``timeout``.
            PeerFailureError: the owner died.

        Example::

            rpc.remote("worker1", torch.ones, args=(2,)).to_here()    # tensor([1., 1.])
        """
        if self.is_owner():
            return self._value.wait(None if timeout is None or timeout <= 0 else timeout)
        agent = self._agent
        return agent.call_sync(self._owner, _owner_fetch, (self._id,), None, timeout)

    # ---- proxies ------------------------------------------------------------------------------
    def rpc_sync(self, timeout: float | None = None) -> Any:
        """A proxy whose methods run on the owner through ``rpc_sync``.

        ``rref.rpc_sync().m(*args)`` calls ``m`` of the value on the owner and returns its
        result.

        Args:
            timeout (float | None): each call's timeout in seconds; None (the default):
                ``init_rpc``'s ``rpc_timeout``.

        Returns:
            A proxy: any attribute is a function that makes the call.

        Example::

            rref.rpc_sync().append(4)     # value.append(4) on the owner
        """
        return _Proxy(self, "sync", timeout)

    def rpc_async(self, timeout: float | None = None) -> Any:
        """A proxy whose methods run on the owner through ``rpc_async``.

        ``rref.rpc_async().m(*args)`` calls ``m`` of the value on the owner and returns a
        ``Future`` of its result at once.

        Args:
            timeout (float | None): each call's timeout in seconds; None (the default):
                ``init_rpc``'s ``rpc_timeout``.

        Returns:
            A proxy: any attribute is a function that makes the call.

        Example::

            fut = rref.rpc_async().size(); fut.wait()
        """
        return _Proxy(self, "async", timeout)

    def remote(self, timeout: float | None = None) -> Any:
        """A proxy whose methods run on the owner through ``remote``.

        ``rref.remote().m(*args)`` calls ``m`` of the value on the owner and returns at once an
        ``RRef`` to its result, owned by the same worker.

        Args:
            timeout (float | None): each call's timeout in seconds; None (the default):
                ``init_rpc``'s ``rpc_timeout``.

        Returns:
            A proxy: any attribute is a function that makes the call.

        Example::

            n = rref.remote().__len__().to_here()
        """
        return _Proxy(self, "remote", timeout)

    # ---- travelling ---------------------------------------------------------------------------
    def __reduce__(self):
        from shmcomm.rpc.serialization import current_dst, first_in_message

        agent = _agent()
        if agent is not self._agent:
            raise RuntimeError("this RRef belongs to an RPC session that was shut down")
        dst = current_dst()
        # first_in_message: a message pickled twice (by value after pickle refused a lambda in
        # it) still carries one copy of this RRef, so it is counted once
        if self._owner == agent.rank:
            counted = dst != agent.rank
            if counted and first_in_message(self):
                _owner_incref(agent, self)
        else:
            counted = dst != self._owner
            if counted and first_in_message(self):
                # before the message leaves: the owner must count the copy before anyone can
                # drop it (a drop travels on another ring and could otherwise arrive first)
                agent.call_sync(self._owner, _owner_addref, (self._id,), None, None)
        return (_rebuild, (self._owner, self._id, counted))

    def __del__(self):
        try:
            if self._counted:
                agent = self._agent
                if not agent._stopping:
                    agent.delrefs.append((self._owner, self._id))
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __repr__(self) -> str:
        kind = "OwnerRRef" if self.is_owner() else "UserRRef"
        return f"{kind}(owner={self.owner_name()}, id={self._id})"


class _Proxy:
    """Attribute access yields a function that calls that method of the RRef's value remotely."""

    __slots__ = ("_rref", "_mode", "_timeout")

    def __init__(self, rref: RRef, mode: str, timeout):
        self._rref, self._mode, self._timeout = rref, mode, timeout

    def __getattr__(self, name: str):
        from shmcomm.rpc import api

        rref, mode, timeout = self._rref, self._mode, self._timeout
        call = {"sync": api.rpc_sync, "async": api.rpc_async, "remote": api.remote}[mode]

        def method(*args, **kwargs):
            return call(rref._owner, _owner_call, args=(rref, name, args, kwargs), timeout=timeout)

        method.__name__ = name
        return method

    def __repr__(self) -> str:
        return f"<{self._mode} proxy of {self._rref!r}>"


# ---- helpers ------------------------------------------------------------------------------------
def _done(value: Any) -> _core.Future[Any]:
    fut: _core.Future[Any] = _core.Future()
    fut.set_result(value)
    return fut


def _chain(source, target) -> None:
    """Complete ``target`` with ``source``'s outcome (``source``: any Future-like object)."""
    def copy(f):
        try:
            value = f.value()
        except BaseException as exc:  # noqa: BLE001
            target.set_exception(future_error(exc))
        else:
            target.set_result(value)

    source.add_done_callback(copy)


def _run_into(target, func, args, kwargs) -> None:
    """Run ``func`` and complete ``target`` with what it returns (or with its Future's value)."""
    try:
        result = func(*args, **kwargs) if kwargs else func(*args)
        if is_async_execution(func):
            _chain(result, target)
            return
    except BaseException as exc:  # noqa: BLE001
        target.set_exception(future_error(exc))
        return
    target.set_result(result)


def _lookup(agent, rid: tuple) -> RRef:
    with agent.owners_lock:
        entry = agent.owners.get(rid)
    obj = entry[0] if entry is not None else agent.owners_weak.get(rid)
    if obj is None:
        raise RuntimeError(f"RRef {rid} no longer exists on its owner {agent.name} "
                           f"(every reference to it was dropped)")
    return obj


def _owner_incref(agent, obj: RRef) -> None:
    with agent.owners_lock:
        entry = agent.owners.get(obj._id)
        if entry is None:
            agent.owners[obj._id] = [obj, 1]
        else:
            entry[1] += 1


def _rebuild(owner: int, rid: tuple, counted: bool) -> RRef:
    agent = _agent()
    if owner == agent.rank:
        obj = _lookup(agent, rid)
        if counted:
            _owner_decref([rid])   # the copy came home: the owner's object is used instead
        return obj
    return RRef._user(agent, owner, rid, counted, _done(None))


# ---- run on the owner (pickled by reference in requests) ----------------------------------------
@async_execution
def _owner_create(rid: tuple, func, args, kwargs):
    """Make the value of a new RRef from ``remote``; the creator holds the first reference."""
    agent = _agent()
    value: _core.Future[Any] = _core.Future()
    obj = RRef._owned(agent, rid, value)
    with agent.owners_lock:
        agent.owners[rid] = [obj, 1]
    _run_into(value, func, args, kwargs)
    return value.then(_confirm)


def _confirm(fut) -> None:
    fut.value()   # the creator learns of a failure; the value itself stays here


@async_execution
def _owner_fetch(rid: tuple):
    return _lookup(_agent(), rid)._value


def _owner_addref(rid: tuple) -> None:
    agent = _agent()
    with agent.owners_lock:
        entry = agent.owners.get(rid)
        if entry is not None:
            entry[1] += 1
            return
    _owner_incref(agent, _lookup(agent, rid))


def _owner_decref(rids: list) -> None:
    agent = _agent()
    dropped = []
    with agent.owners_lock:
        for rid in rids:
            entry = agent.owners.get(rid)
            if entry is None:
                continue
            entry[1] -= 1
            if entry[1] <= 0:
                dropped.append(agent.owners.pop(rid))
    del dropped  # the values die here, outside the lock (their __del__ may do anything)


@async_execution
def _owner_call(rref: RRef, name: str, args: tuple, kwargs: dict):
    """Call method ``name`` of the value of ``rref`` (an owner RRef here) once it exists."""
    out: _core.Future[Any] = _core.Future()

    def run(f):
        try:
            method = getattr(f.value(), name)
        except BaseException as exc:  # noqa: BLE001 - no such value or attribute
            out.set_exception(future_error(exc))
            return
        _run_into(out, method, args, kwargs)

    rref._value.add_done_callback(run)
    return out


# ---- the agent's side (mixed into Agent) --------------------------------------------------------
class ReferencesMixin:
    """``Agent``'s reference bookkeeping: ids of new RRefs, and sending the drops that
    ``RRef.__del__`` queues (from the housekeeping thread and ``shutdown``). The owner-side
    tables (``owners``, ``owners_weak``, ``owners_lock``) are read by the functions above."""

    rank: int
    delrefs: collections.deque
    _rref_ids: Iterator[int]
    call_async: Callable[..., Any]

    def new_rref_id(self) -> tuple:
        return (self.rank, next(self._rref_ids))

    def flush_delrefs(self) -> None:
        """Send queued reference drops to their owners (one one-way note per owner)."""
        by_owner: dict[int, list] = {}
        while self.delrefs:
            try:
                owner, rid = self.delrefs.popleft()
            except IndexError:
                break
            by_owner.setdefault(owner, []).append(rid)
        for owner, rids in by_owner.items():
            if owner == self.rank:
                _owner_decref(rids)
                continue
            try:
                self.call_async(owner, _owner_decref, (rids,), None, None, kind=KIND_ONEWAY)
            except ShmcommError:
                pass  # the owner is gone: nothing to free
