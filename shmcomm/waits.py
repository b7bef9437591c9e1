"""Waiting on many handles at once: ``collect_all``, ``wait_all`` and ``wait_any`` over Futures
and Works alike (MPI's ``Waitall``/``Waitany``, ``torch.futures``' ``collect_all``/``wait_all``).

A ``Work`` counts as its ``get_future()``: its value is ``work.result()`` (the arrays it wrote).
Waiting sleeps on the handles' completion, never spins::

    works = [sc.all_reduce(x, async_op=True) for x in arrays]
    sc.wait_all(works)                      # [[arrays[0]], [arrays[1]], ...]
    first = sc.wait_any([recv_a, recv_b])   # index of whichever finished first
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from typing import Any, Iterable, TypeVar, overload

from shmcomm._core import Future, Work
from shmcomm._core import collect_all as _collect_all
from shmcomm._core import wait_all as _wait_all
from shmcomm.errors import CommTimeoutError

_T = TypeVar("_T")

__all__ = ["collect_all", "wait_all", "wait_any"]


def _futures(items: Iterable[Any], func: str) -> list[Future[Any]]:
    """Each item as a Future: a Work (or a Work-like handle, as a group across nodes returns for
    point to point) counts as its ``get_future()``."""
    futures = []
    for i, item in enumerate(items):
        if not isinstance(item, Future) and callable(getattr(item, "get_future", None)):
            item = item.get_future()
        if not isinstance(item, Future):
            raise TypeError(f"{func}: item {i} is a {type(item).__name__}, not a shmcomm Future or Work")
        futures.append(item)
    return futures


# wait_any sleeps on one condition that every watched Future notifies when it completes. A Future
# gets that callback once, however often it is waited on (Futures cannot drop a callback, so one
# per call would pile up on a handle waited in a loop).
_completed = threading.Condition()
_watched: weakref.WeakSet = weakref.WeakSet()


def _notify(_future) -> None:
    with _completed:
        _completed.notify_all()


def _watch(future: Future) -> None:
    with _completed:
        if future in _watched:
            return
        _watched.add(future)
    future.add_done_callback(_notify)  # outside the lock: it runs at once if already done


@overload
def collect_all(futures: Iterable[Future[_T]]) -> Future[list[Future[_T]]]: ...
@overload
def collect_all(futures: Iterable[Future[Any] | Work]) -> Future[list[Future[Any]]]: ...
def collect_all(futures: Iterable[Future[Any] | Work]) -> Future[list[Future[Any]]]:
    """A Future that completes once every Future or Work in ``futures`` is done.

    As ``torch.futures.collect_all``. A Work counts as its ``get_future()``. It never blocks.

    Args:
        futures (Iterable[Future | Work]): the handles to wait for.

    Returns:
        Future[list[Future]]: completes once all are done, with the list of their Futures
        (in order; a Work's is its ``get_future()``). If any failed, its ``wait()`` raises the
        first failure in list order.

    Raises:
        TypeError: an item is neither a ``Future`` nor a ``Work``.

    Example::

        >>> a, b = sc.Future(), sc.Future()
        >>> both = sc.collect_all([a, b])
        >>> a.set_result(1); b.set_result(2)
        >>> [f.value() for f in both.wait()]
        [1, 2]
    """
    return _collect_all(_futures(futures, "collect_all"))


@overload
def wait_all(futures: Iterable[Future[_T]], timeout: float | None = None) -> list[_T]: ...
@overload
def wait_all(futures: Iterable[Future[Any] | Work], timeout: float | None = None) -> list[Any]: ...
def wait_all(futures: Iterable[Future[Any] | Work], timeout: float | None = None) -> list[Any]:
    """Wait for every Future or Work in ``futures`` and return their values, in order.

    Args:
        futures (Iterable[Future | Work]): the handles to wait for.
        timeout (float | None): seconds to wait at most; None (the default): no limit.

    Returns:
        list: each one's value (``Future.wait()``; a Work's is ``work.result()``, the arrays it
        wrote), in order.

    Raises:
        TypeError: an item is neither a ``Future`` nor a ``Work``.
        CommTimeoutError: they were not all done within ``timeout``.
        Exception: the error of the first failed one, in list order, once all are done.

    Example::

        >>> a, b = sc.Future(), sc.Future()
        >>> a.set_result(1); b.set_result(2)
        >>> sc.wait_all([a, b])
        [1, 2]
    """
    return _wait_all(_futures(futures, "wait_all"), timeout)


def wait_any(futures: Iterable[Future[Any] | Work], timeout: float | None = None) -> int:
    """Wait until at least one Future or Work in ``futures`` is done; return its index.

    As MPI's ``Waitany``. It does not raise the one's error: ``futures[i].wait()`` does.

    Args:
        futures (Iterable[Future | Work]): the handles to wait for, at least one.
        timeout (float | None): seconds to wait at most; None (the default) or ``inf``: no
            limit.

    Returns:
        int: the index of a done one (the lowest, when several are done).

    Raises:
        TypeError: an item is neither a ``Future`` nor a ``Work``.
        ValueError: ``futures`` is empty, or ``timeout`` is negative or nan.
        CommTimeoutError: none was done within ``timeout``.

    Example::

        >>> a, b = sc.Future(), sc.Future()
        >>> b.set_result("late but first")
        >>> sc.wait_any([a, b])
        1
    """
    items = _futures(futures, "wait_any")
    if not items:
        raise ValueError("wait_any needs at least one Future or Work")
    if timeout is not None and not timeout >= 0:  # nan too
        raise ValueError(f"timeout must be a non-negative number of seconds or None, got {timeout!r}")
    done = next((i for i, f in enumerate(items) if f.done()), None)
    if done is not None:  # without watching anything: a loop over a shrinking list stays cheap
        return done
    for f in items:
        _watch(f)
    deadline = None if timeout is None or timeout == math.inf else time.monotonic() + float(timeout)
    with _completed:  # a completion notifies under this lock: none is missed between check and wait
        while True:
            done = next((i for i, f in enumerate(items) if f.done()), None)
            if done is not None:
                return done
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise CommTimeoutError(f"wait_any: none of {len(items)} operations finished within "
                                       f"{timeout} s")
            # (a Condition refuses more than TIMEOUT_MAX, about 292 years: the loop waits again)
            _completed.wait(None if left is None else min(left, threading.TIMEOUT_MAX))
