"""Reading replies: the *reply role*, and failing calls that will get none.

Whoever holds the reply role (a lock) reads the reply rings: a thread blocked in ``rpc_sync``
takes it itself and so wakes up on its own reply with no hand-off; while ``rpc_async`` calls are
outstanding and no synchronous caller reads, the reply thread does it and completes their
Futures. A call whose peer died or whose deadline passed fails, once its peer's last replies
have been read (see ``housekeeping`` for the periodic sweep).
"""

from __future__ import annotations

import logging
import time

from shmcomm.errors import CommTimeoutError, PeerFailureError
from shmcomm.rpc.calls import _Call, _name_of, _wake
from shmcomm.rpc.frames import KIND_ERR
from shmcomm.rpc.serialization import loads_value, unpack_exception

__all__ = ["RepliesMixin", "SLICE"]

log = logging.getLogger("shmcomm.rpc")

SLICE = 0.02          # longest a waiting caller goes without checking its deadline and peer


class RepliesMixin:
    """``Agent``'s reply side: waiting for replies, completing and failing calls, the reply
    thread (the state it uses is set up in ``Agent.__init__``)."""

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
