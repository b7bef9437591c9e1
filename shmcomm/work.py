"""Work handles for ``async_op=True`` and the per-group progress thread that runs them.

Operations on one group run in issue order: async ones on a background thread (as c10d's MPI
backend does with its work queue) so the caller computes while communication proceeds; a
synchronous call with nothing queued runs inline on the caller for the lowest latency.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

from shmcomm._core import Future
from shmcomm.errors import AbortedError, CommTimeoutError

__all__ = ["Work"]


class Work:
    """Handle of an asynchronous operation, as returned by any collective with ``async_op=True``.

    The Work keeps the operation's arrays alive until it completes::

        work = sc.all_reduce(x, async_op=True)
        compute_something_else()
        work.wait()            # raises the operation's error, if any
        assert work.is_success()
    """

    __slots__ = ("_fn", "_args", "_outputs", "_future", "_source", "_abort", "_drive", "__weakref__")

    def __init__(self, fn: Callable[..., Any] | None, args: tuple, outputs: list,
                 abort: Callable[[], None] | None = None, drive: Callable[..., None] | None = None):
        self._drive = drive  # makes progress on the waiting thread (point-to-point ops)
        self._fn = fn
        self._args = args
        self._outputs = outputs
        self._future = Future()
        self._source = -1
        self._abort = abort

    def _run(self) -> None:
        """Execute on the progress thread (or inline); completes the future either way."""
        try:
            value = self._fn(*self._args)
        except BaseException as exc:  # noqa: BLE001 - carried to the waiter
            self._fail(exc)
        else:
            if isinstance(value, int) and not isinstance(value, bool):
                self._source = value
            self._args = ()
            self._future.set_result(self._outputs)

    def _fail(self, exc: BaseException) -> None:
        self._args = ()
        if not self._future.done():
            self._future.set_exception(exc)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; return True or raise the op's error (CommTimeoutError past ``timeout``).

        Example::

            work.wait(timeout=5.0)
        """
        try:
            if self._drive is not None and not self._future.done():
                self._drive(self._future, -1.0 if timeout is None else timeout)
            self._future.wait(timeout)
        except CommTimeoutError:
            if self._future.done():
                raise
            raise CommTimeoutError(f"Work not completed within {timeout} s") from None
        return True

    def is_completed(self) -> bool:
        """True once the operation finished, successfully or not.

        Example::

            while not work.is_completed():
                do_other_work()
        """
        return self._future.done()

    def is_success(self) -> bool:
        """True if the operation finished without error.

        Example::

            work.wait(); assert work.is_success()
        """
        return self._future.done() and self.exception() is None

    def exception(self) -> BaseException | None:
        """The operation's error, or None (also None while still running).

        Example::

            if work.is_completed() and work.exception():
                log(work.exception())
        """
        if not self._future.done():
            return None
        try:
            self._future.value()
        except BaseException as exc:  # noqa: BLE001
            return exc
        return None

    def result(self) -> list:
        """The arrays the operation wrote (e.g. ``[array]`` for all_reduce), after ``wait``.

        Example::

            out, = sc.all_reduce(x, async_op=True).result()
        """
        self.wait()
        return list(self._outputs)

    def get_future(self):
        """A ``shmcomm.Future`` completed with ``result()`` (or the op's error).

        Example::

            fut = work.get_future().then(lambda f: f.value()[0].sum())
        """
        return self._future

    def source_rank(self) -> int:
        """Sender's rank for a completed ``irecv``; -1 otherwise.

        Example::

            w = sc.irecv(buf); w.wait(); print("from", w.source_rank())
        """
        return self._source

    def abort(self) -> None:
        """Abort the whole group: pending and later ops on it raise AbortedError on every rank.

        Example::

            work.abort()
        """
        if self._abort is not None:
            self._abort()
        self._fail(AbortedError("the operation was aborted"))

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "pending"
        return f"<shmcomm.Work {state}>"


class OpQueue:
    """Runs one group's operations in issue order on a lazily started daemon thread."""

    def __init__(self, name: str, comm):
        self._name = name
        # The communicator is told when its ops run in the background (its waits sleep sooner)
        # and keeps the submitted/completed counters, which its compiled fast path compares.
        # Each counter has one writer (the issuing thread, the worker), so no lock is needed.
        self._comm = comm
        self._queue: queue.Queue[Work | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def idle(self) -> bool:
        """True when nothing is queued or running, so a synchronous op may run inline."""
        return self._comm.submitted == self._comm.completed

    def submit(self, work: Work) -> Work:
        self._comm.submitted += 1
        self._queue.put(work)
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"shmcomm-{self._name}", daemon=True)
            self._thread.start()
        return work

    def _loop(self) -> None:
        while True:
            work = self._queue.get()
            try:
                if work is None:
                    return
                self._comm.background = True
                try:
                    work._run()
                finally:
                    self._comm.background = False
            finally:
                if work is not None:
                    self._comm.completed += 1
                self._queue.task_done()

    def fail_pending(self, exc: BaseException) -> None:
        """Fail every queued (not yet started) op with ``exc``."""
        while True:
            try:
                work = self._queue.get_nowait()
            except queue.Empty:
                return
            if work is not None:
                work._fail(exc)
                self._comm.completed += 1
            self._queue.task_done()

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            if self._thread is not threading.current_thread():
                self._thread.join(timeout=5.0)
        self._thread = None
