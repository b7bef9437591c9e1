"""Leaving RPC: the agent's side of ``rpc.shutdown``.

A graceful shutdown (``api.shutdown``) waits until this process has no call outstanding, then
calls the *leader* (the lowest live rank), whose barrier completes once every live worker
arrived; the leader then waits until the others closed their channels. ``stop`` ends the
threads, fails what is still pending and leaves the private group.
"""

from __future__ import annotations

import os
import threading
import time

from shmcomm import _core
from shmcomm.errors import CommTimeoutError, ShmcommError
from shmcomm.rpc.calls import _wake

__all__ = ["ShutdownMixin"]


class ShutdownMixin:
    """``Agent``'s shutdown barrier (on the leader) and ``stop`` (the state they use is set up
    in ``Agent.__init__``)."""

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
