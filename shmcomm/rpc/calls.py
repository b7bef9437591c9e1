"""The calling side of the agent: one object per outstanding call, and sending requests.

``rpc_sync`` sends its request and waits (see ``replies``) on a lock of its own ``_Call``;
``rpc_async`` returns a ``_CallFuture`` at once. Sending never blocks an ``rpc_async`` caller: a
frame that does not fit its ring now is queued, in order, for that destination's sender thread.
A call to this same process runs on a pool thread, as a remote one would (see ``serving``).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from _thread import allocate_lock as _allocate_lock

from shmcomm import _core
from shmcomm.errors import CommTimeoutError, ShmcommError, future_error
from shmcomm.rpc.frames import KIND_ONEWAY, KIND_REQUEST, _copies
from shmcomm.rpc.serialization import dumps_call

__all__ = ["CallsMixin"]

log = logging.getLogger("shmcomm.rpc")


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


class CallsMixin:
    """``Agent``'s calls: ``call_sync``, ``call_async`` and the sender threads (the state they
    use is set up in ``Agent.__init__``)."""

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
