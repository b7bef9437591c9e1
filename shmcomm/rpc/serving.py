"""Serving requests: the listener thread, its pool, and running each request.

One *listener* thread reads requests and runs each one itself: no hand-off to another thread,
which is what a small call costs most. When one request runs for more than a tick (a slow or
blocking function), the housekeeper (see ``housekeeping``) makes another pool thread the
listener, and the old one returns to the pool once its function returns. So a blocking function
holds one thread and delays other requests by at most a few milliseconds.

A function marked ``@rpc.functions.async_execution`` returns a Future; its reply is sent when
that Future completes, from the thread that completes it.
"""

from __future__ import annotations

import logging
import queue
import threading

from shmcomm.errors import ShmcommError
from shmcomm.rpc.calls import _name_of
from shmcomm.rpc.frames import KIND_ERR, KIND_OK, KIND_ONEWAY, _copies
from shmcomm.rpc.functions import is_async_execution
from shmcomm.rpc.serialization import dumps_value, loads_call, pack_exception

__all__ = ["ServingMixin"]

log = logging.getLogger("shmcomm.rpc")


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


class ServingMixin:
    """``Agent``'s serving side: the listener loop and the replies it sends (the state it uses
    is set up in ``Agent.__init__``)."""

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
