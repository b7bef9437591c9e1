"""The agent's housekeeping thread and the periodic checks it shares with the reply readers.

Every tick it replaces a listener that has run one request for a whole tick (see ``serving``),
sends queued reference drops (see ``rref``), fails calls whose peer is gone or whose deadline
passed (the *sweep*, also run by whoever reads replies), and completes the shutdown barrier on
the leader once every live worker arrived (see ``shutdown``).
"""

from __future__ import annotations

import logging
import time

__all__ = ["HousekeepingMixin", "TICK_BUSY", "TICK_IDLE"]

log = logging.getLogger("shmcomm.rpc")

TICK_BUSY = 0.002     # housekeeping period while requests run: a blocked listener is replaced
TICK_IDLE = 0.02      # ... otherwise (timeouts, dead peers, reference notes)


class HousekeepingMixin:
    """``Agent``'s housekeeping thread and sweep (the state they use is set up in
    ``Agent.__init__``)."""

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
