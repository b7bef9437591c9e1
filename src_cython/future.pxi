# Future, collect_all, wait_all: written by the Futures work.
#
# A compiled Future with the semantics of ``torch.futures.Future`` (see SPEC.md, "Futures").
#
# Concurrency model: every state transition runs with the GIL held and touches only C fields and
# object slots whose previous value is None, so no Python code (a finaliser run by a decref or by a
# GC pass triggered by an allocation) can run in the middle of it and let another thread in. Where
# an allocation is needed (a second callback), it is made first and the state is checked again
# afterwards. A thread that must block on an undone future allocates, once per future, a
# PyThread lock that stays acquired while the future is pending; completing the future releases it,
# and every waiter passes through it like a turnstile (acquire, release at once), with the GIL
# released, in slices of at most 100 ms so that Python signals (Ctrl-C) and the caller's timeout are
# checked between slices. A future that nobody blocks on never allocates a lock.
#
# Callbacks are kept as (fn, kind) pairs: the first in two slots of the object (no allocation for
# the common single callback), further ones in a flat list [fn, kind, fn, kind, ...]. The kind says
# what to do with fn: None = add_done_callback (errors are logged), a Future = then (fn's return
# value or error completes that child), _FUT_INTERNAL = fn is a _FutureCallback run at C level.

cimport cython

# Private prefixed names so that declarations elsewhere in the module cannot clash with these.
cdef extern from "pythread.h" nogil:
    ctypedef void *_fut_lock_t "PyThread_type_lock"
    _fut_lock_t _fut_lock_new "PyThread_allocate_lock"()
    void _fut_lock_free "PyThread_free_lock"(_fut_lock_t lock)
    int _fut_lock_acquire "PyThread_acquire_lock_timed"(_fut_lock_t lock, long long microseconds,
                                                       int intr_flag)
    void _fut_lock_release "PyThread_release_lock"(_fut_lock_t lock)
    int _FUT_LOCK_ACQUIRED "PY_LOCK_ACQUIRED"

cdef extern from "<time.h>" nogil:
    cdef struct _fut_timespec "timespec":
        long tv_sec
        long tv_nsec
    int _fut_clock_gettime "clock_gettime"(int clock_id, _fut_timespec *tp)
    int _FUT_CLOCK_MONOTONIC "CLOCK_MONOTONIC"

cdef extern from "Python.h":
    int _fut_check_signals "PyErr_CheckSignals"() except -1

from types import GenericAlias as _fut_GenericAlias

cdef enum:
    _FUT_PENDING = 0
    _FUT_RESULT = 1
    _FUT_ERROR = 2

# Longest time a blocked waiter stays without the GIL before it checks signals and its deadline.
cdef long long _FUT_SLICE_US = 100000

# Marks a callback slot whose fn is a _FutureCallback (run at C level, no Python call).
cdef object _FUT_INTERNAL = object()
cdef object _fut_logger = None
cdef object _fut_asyncio = None


cdef inline double _fut_now() noexcept nogil:
    cdef _fut_timespec ts
    _fut_clock_gettime(_FUT_CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + 1e-9 * <double>ts.tv_nsec


cdef double _fut_timeout_arg(object timeout) except? -2.0:
    """Converts a ``timeout`` argument to seconds; -1.0 means wait forever."""
    cdef double t
    if timeout is None:
        return -1.0
    try:
        t = timeout
    except TypeError:
        raise TypeError(f"timeout must be a number of seconds or None, not "
                        f"{type(timeout).__name__}") from None
    if t != t or t < 0.0:
        raise ValueError(f"timeout must be a non-negative number of seconds or None, "
                         f"got {timeout!r}")
    if t == float("inf"):
        return -1.0
    return t


cdef void _fut_log_callback_error(object fn, object exc) noexcept:
    # add_done_callback contract: an error in a callback is logged, never raised. Logging must not
    # fail the completion either, hence the broad except.
    global _fut_logger
    try:
        if _fut_logger is None:
            import logging
            _fut_logger = logging.getLogger("shmcomm.future")
        _fut_logger.error("Got the following error when running the callback %r: %s: %s",
                          fn, type(exc).__name__, exc,
                          exc_info=(type(exc), exc, exc.__traceback__))
    except BaseException:
        pass


cdef class _FutureCallback:
    """Base of callbacks that run at C level when a Future completes (no Python call).

    Other parts of the compiled core subclass it, override ``_on_done`` and register an instance
    with ``fut._add_callback(cb, _FUT_INTERNAL)``. An error raised by ``_on_done`` is logged.
    """

    cdef int _on_done(self, Future fut) except -1:
        raise NotImplementedError("_FutureCallback._on_done")


@cython.freelist(32)
@cython.auto_pickle(False)
cdef class Future:
    """A placeholder for a value that becomes available later, as ``torch.futures.Future``.

    It is completed exactly once, with ``set_result`` or ``set_exception``; ``wait`` blocks until
    then (releasing the GIL), ``then`` and ``add_done_callback`` attach callbacks that run, in the
    order added, when it completes (at once if it already has), and ``await fut`` works inside
    asyncio. Safe to use from several threads. Generic for type checkers: ``Future[int]``.

    Args:
        devices (list | None): for torch compatibility; shmcomm futures hold host values only,
            so it must be None or empty (else ``ValueError``). Keyword only.

    Example::

        >>> import shmcomm as sc
        >>> fut = sc.Future()
        >>> doubled = fut.then(lambda f: f.value() * 2)
        >>> fut.set_result(21)
        >>> doubled.wait()
        42
    """

    cdef object _result        # the value, or the exception when _state == _FUT_ERROR
    cdef int _state
    cdef object _cb_fn         # first callback (None: no callback)
    cdef object _cb_kind
    cdef list _more            # further callbacks as [fn, kind, fn, kind, ...]
    cdef _fut_lock_t _lock     # held while pending; allocated only when a thread must block
    cdef object _driver        # a Work whose op completes this future: waiting runs it (see _drive)
    cdef object __weakref__

    __class_getitem__ = classmethod(_fut_GenericAlias)

    def __init__(self, *, devices=None):
        # No __cinit__: the C-level constructors (then, _completed_future) skip argument parsing.
        # ``devices`` exists for torch compatibility; shmcomm values live in host memory.
        if devices:
            raise ValueError(f"devices: shmcomm futures hold host (CPU) values only; devices must "
                             f"be None or empty, got {devices!r}")

    def __dealloc__(self):
        if self._lock != NULL:
            _fut_lock_free(self._lock)
            self._lock = NULL

    # ---- C-level fast paths for the rest of the compiled core -----------------------------------

    cdef inline bint _is_done(self) noexcept:
        return self._state != _FUT_PENDING

    cdef int _set_result_fast(self, object value) except -1:
        """set_result without Python dispatch; raises InvalidStateError when already completed."""
        return self._complete(value, _FUT_RESULT)

    cdef int _set_exception_fast(self, object exc) except -1:
        """set_exception without Python dispatch or argument checks (exc must be an exception)."""
        return self._complete(exc, _FUT_ERROR)

    cdef object _wait_fast(self, double timeout):
        """wait() without Python dispatch; ``timeout`` in seconds, negative = forever."""
        if self._state == _FUT_PENDING and timeout < 0:
            self._drive()
        if self._state == _FUT_PENDING:
            self._block(timeout)
        if self._state == _FUT_RESULT:
            return self._result
        raise self._result

    cdef int _drive(self) except -1:
        """A future of a group's operation (``Work.get_future`` and what ``then`` chains to it)
        is waited for the way ``Work.wait`` waits: this thread runs the group's queue up to the
        operation, instead of sleeping until the progress thread has (a thread hand-off: 40 us
        against 1 us for an all_reduce of 2 floats at 2 ranks). Its callbacks then run here. A
        failed operation fails the future too, which ``wait`` raises; an error that left it
        pending (this thread runs an op of the group that the awaited one queues behind) is
        raised from here instead of waiting for ever."""
        driver = self._driver
        if driver is None:
            return 0
        try:
            driver.wait()
        except Exception:
            if self._state == _FUT_PENDING:
                raise
        return 0

    cdef int _complete(self, object value, int state) except -1:
        cdef object fn, kind, more, fatal, err
        cdef Py_ssize_t i, n
        if self._state != _FUT_PENDING:
            raise InvalidStateError("Attempting to mark a completed Future as complete again; a "
                                    "Future can only be completed once")
        self._result = value
        self._state = state
        self._driver = None  # done: the Work it drove may go
        if self._lock != NULL:
            _fut_lock_release(self._lock)
        if self._cb_fn is None:
            return 0
        # From here on no other thread touches the callback slots: they see the state as done
        # and run their callbacks themselves.
        fn = self._cb_fn
        kind = self._cb_kind
        more = self._more
        self._cb_fn = None
        self._cb_kind = None
        self._more = None
        fatal = self._run_callback(fn, kind)
        if more is not None:
            n = len(<list>more)
            for i in range(0, n, 2):
                err = self._run_callback((<list>more)[i], (<list>more)[i + 1])
                if fatal is None:
                    fatal = err
        if fatal is not None:
            # A KeyboardInterrupt or SystemExit from a callback: raised only once every callback
            # has run, so the future stays consistent.
            raise fatal
        return 0

    cdef object _run_callback(self, object fn, object kind):
        """Runs one callback; returns a non-Exception BaseException to re-raise, else None."""
        cdef object err = None
        cdef object ret = None
        if kind is None:
            try:
                fn(self)
            except BaseException as e:
                err = e
            if err is not None:
                if isinstance(err, Exception):
                    _fut_log_callback_error(fn, err)
                    return None
                return err
            return None
        if kind is _FUT_INTERNAL:
            try:
                (<_FutureCallback>fn)._on_done(self)
            except BaseException as e:
                err = e
            if err is not None:
                if isinstance(err, Exception):
                    _fut_log_callback_error(fn, err)
                    return None
                return err
            return None
        # then(): the callback's return value or error completes the child future.
        try:
            ret = fn(self)
        except BaseException as e:
            err = e
        child = <Future>kind
        if child._state != _FUT_PENDING:
            # The user completed the child by hand; nothing left to deliver it to.
            if err is not None:
                _fut_log_callback_error(fn, err)
            return None if err is None or isinstance(err, Exception) else err
        if err is None:
            return child._complete_from_callback(ret, _FUT_RESULT)
        fatal = child._complete_from_callback(err, _FUT_ERROR)
        if fatal is None and not isinstance(err, Exception):
            fatal = err
        return fatal

    cdef object _complete_from_callback(self, object value, int state):
        # _complete, but a KeyboardInterrupt/SystemExit from the child's callbacks is handed back to
        # the caller's callback loop instead of cutting it short.
        try:
            self._complete(value, state)
        except BaseException as e:
            return e
        return None

    cdef int _add_callback(self, object fn, object kind) except -1:
        """Runs fn when this future completes (now, in this thread, if it already has)."""
        cdef object fatal
        cdef list lst = None
        if self._state == _FUT_PENDING:
            if self._cb_fn is None:
                self._cb_fn = fn
                self._cb_kind = kind
                return 0
            # Allocating may run a GC pass and let another thread complete us: allocate first,
            # then check the state again.
            if self._more is None:
                lst = [fn, kind]
            if self._state == _FUT_PENDING:
                if self._more is None:
                    if lst is None:
                        lst = [fn, kind]
                    self._more = lst
                else:
                    (<list>self._more).append(fn)   # appends never run Python code
                    (<list>self._more).append(kind)
                return 0
        fatal = self._run_callback(fn, kind)
        if fatal is not None:
            raise fatal
        return 0

    cdef int _block(self, double timeout) except -1:
        """Blocks without the GIL until done; ``timeout`` in seconds, negative = forever."""
        cdef _fut_lock_t lock
        cdef int status
        cdef double deadline = 0.0
        cdef double remaining
        cdef long long slice_us
        if self._state != _FUT_PENDING:
            return 0
        if timeout == 0.0:
            raise CommTimeoutError("Future.wait() timed out after 0 seconds")
        if timeout > 0.0:
            deadline = _fut_now() + timeout
        lock = self._lock
        if lock == NULL:
            lock = _fut_lock_new()
            if lock == NULL:
                raise MemoryError("cannot allocate the lock of a Future")
            _fut_lock_acquire(lock, 0, 0)   # a fresh lock: never blocks
            self._lock = lock
        while True:
            slice_us = _FUT_SLICE_US
            if timeout > 0.0:
                remaining = deadline - _fut_now()
                if remaining <= 0.0:
                    raise CommTimeoutError(f"Future.wait() timed out after {timeout:g} seconds")
                if remaining * 1e6 < <double>slice_us:
                    slice_us = <long long>(remaining * 1e6) + 1
            with nogil:
                status = _fut_lock_acquire(lock, slice_us, 1)
                if status == _FUT_LOCK_ACQUIRED:
                    _fut_lock_release(lock)   # let the next waiter through
            if self._state != _FUT_PENDING:
                return 0
            _fut_check_signals()

    # ---- Python API -----------------------------------------------------------------------------

    def done(self):
        """Whether the future holds a result or an exception; never blocks.

        Returns:
            bool: True once it is completed.

        Example::

            >>> fut = sc.Future()
            >>> fut.done()
            False
            >>> fut.set_result(1)
            >>> fut.done()
            True
        """
        return self._state != _FUT_PENDING

    def set_result(self, result):
        """Complete the future with ``result`` and run its callbacks, in the order they were added.

        Args:
            result (Any): the value; ``wait()`` and ``value()`` return it.

        Raises:
            InvalidStateError: the future is already completed.

        Example::

            >>> fut = sc.Future()
            >>> fut.set_result(5)
            >>> fut.wait()
            5
        """
        self._complete(result, _FUT_RESULT)

    def set_exception(self, result):
        """Complete the future with the exception ``result`` and run its callbacks.

        Args:
            result (Exception): the error; ``wait()`` and ``value()`` raise it.

        Raises:
            TypeError: ``result`` is not an ``Exception`` instance.
            InvalidStateError: the future is already completed.

        Example::

            >>> fut = sc.Future()
            >>> fut.set_exception(ValueError("bad input"))
            >>> fut.wait()
            Traceback (most recent call last):
            ...
            ValueError: bad input
        """
        if not isinstance(result, Exception):
            raise TypeError(f"set_exception(result): result must be an Exception instance, not "
                            f"{type(result).__name__}")
        self._complete(result, _FUT_ERROR)

    def wait(self, timeout=None):
        """Block until the future is done and return its value, or raise its exception.

        The GIL is released while blocked; Ctrl-C interrupts the wait.

        Args:
            timeout (float | None): seconds to wait at most; None (the default): no limit.

        Returns:
            Any: the value given to ``set_result``.

        Raises:
            Exception: the exception given to ``set_exception``.
            CommTimeoutError: not done within ``timeout`` (the future is unchanged).
            TypeError: ``timeout`` is not a number.
            ValueError: ``timeout`` is negative or NaN.

        Example::

            >>> fut = sc.Future()
            >>> threading.Timer(0.1, fut.set_result, args=(7,)).start()
            >>> fut.wait(timeout=5.0)
            7
        """
        if self._state == _FUT_PENDING:
            return self._wait_fast(_fut_timeout_arg(timeout))
        return self._wait_fast(-1.0)  # done: its value or its error at once (timeout unread)

    def value(self):
        """The value of a completed future, or its exception raised; never blocks.

        Meant for callbacks and for after ``wait``.

        Returns:
            Any: the value given to ``set_result``.

        Raises:
            Exception: the exception given to ``set_exception``.
            InvalidStateError: the future is not done yet.

        Example::

            >>> fut = sc.Future()
            >>> fut.add_done_callback(lambda f: print("got", f.value()))
            >>> fut.set_result(3)
            got 3
        """
        if self._state == _FUT_RESULT:
            return self._result
        if self._state == _FUT_PENDING:
            raise InvalidStateError("Future.value() called on a Future that is not done; "
                                    "wait() for it first")
        raise self._result

    def then(self, callback):
        """Chain ``callback``: a new future completes with its return value or error.

        ``callback`` runs when this future completes (at once, in this thread, if it already has),
        after the callbacks added before it, on the thread that completes it.

        Args:
            callback (Callable[[Future], Any]): called with this future.

        Returns:
            Future: completes with ``callback(self)``'s return value (a Future it returns is not
            unwrapped), or with the exception it raised.

        Raises:
            TypeError: ``callback`` is not callable.

        Example::

            >>> fut = sc.Future()
            >>> chained = fut.then(lambda f: f.value() + 1).then(lambda f: f.value() * 10)
            >>> fut.set_result(1)
            >>> chained.wait()
            20
        """
        if not callable(callback):
            raise TypeError(f"then(callback): callback must be callable, not "
                            f"{type(callback).__name__}")
        cdef Future child = Future.__new__(Future)
        child._driver = self._driver  # waiting on the child runs the op that completes this one
        self._add_callback(callback, child)
        return child

    def add_done_callback(self, callback):
        """Run ``callback(self)`` when this future completes (at once if it already has).

        Callbacks run in the order added, on the thread that completes the future. The return
        value is ignored; an exception raised by ``callback`` is logged (logger
        ``shmcomm.future``) and not propagated.

        Args:
            callback (Callable[[Future], object]): called with this future.

        Raises:
            TypeError: ``callback`` is not callable.

        Example::

            >>> fut = sc.Future()
            >>> fut.add_done_callback(lambda f: print("done:", f.value()))
            >>> fut.set_result("ok")
            done: ok
        """
        if not callable(callback):
            raise TypeError(f"add_done_callback(callback): callback must be callable, not "
                            f"{type(callback).__name__}")
        self._add_callback(callback, None)

    def __await__(self):
        """Wait for the future inside asyncio without blocking the event loop: ``await fut``.

        Returns ``value()``, or raises the future's exception.

        Example::

            >>> async def main(fut):
            ...     return await fut
            >>> fut = sc.Future(); fut.set_result(4)
            >>> asyncio.run(main(fut))
            4
        """
        if self._state == _FUT_PENDING:
            waiter = _fut_asyncio_waiter(self)
            yield from waiter
        return self.value()

    def __repr__(self):
        if self._state == _FUT_PENDING:
            return f"<{type(self).__name__} pending>"
        if self._state == _FUT_RESULT:
            return f"<{type(self).__name__} done, result of type {type(self._result).__name__}>"
        return f"<{type(self).__name__} failed: {self._result!r}>"


cdef Future _completed_future(object value):
    """A new Future already completed with ``value`` (the C-level fast path)."""
    cdef Future fut = Future.__new__(Future)
    fut._result = value
    fut._state = _FUT_RESULT
    return fut


cdef Future _failed_future(object exc):
    """A new Future already completed with the exception ``exc``."""
    cdef Future fut = Future.__new__(Future)
    fut._result = exc
    fut._state = _FUT_ERROR
    return fut


# ---- asyncio bridge -----------------------------------------------------------------------------

def _fut_wake_waiter(waiter):
    if not waiter.done():
        waiter.set_result(None)


@cython.final
cdef class _FutureAsyncBridge(_FutureCallback):
    cdef object loop
    cdef object waiter

    cdef int _on_done(self, Future fut) except -1:
        if _fut_asyncio._get_running_loop() is self.loop:
            _fut_wake_waiter(self.waiter)
            return 0
        try:
            self.loop.call_soon_threadsafe(_fut_wake_waiter, self.waiter)
        except RuntimeError:
            pass   # the loop was closed: nobody is awaiting any more
        return 0


cdef object _fut_asyncio_waiter(Future fut):
    """An asyncio future of the running loop that completes (with None) when ``fut`` does."""
    global _fut_asyncio
    if _fut_asyncio is None:
        import asyncio
        _fut_asyncio = asyncio
    cdef _FutureAsyncBridge bridge = _FutureAsyncBridge.__new__(_FutureAsyncBridge)
    bridge.loop = _fut_asyncio.get_running_loop()
    bridge.waiter = bridge.loop.create_future()
    fut._add_callback(bridge, _FUT_INTERNAL)
    return bridge.waiter


# ---- collect_all / wait_all ---------------------------------------------------------------------

cdef Future _fut_gathered(list futures):
    """The collect_all result for done ``futures``: the list, or the first error in list order."""
    cdef Future f
    for f in futures:
        if f._state == _FUT_ERROR:
            return _failed_future(f._result)
    return _completed_future(futures)


@cython.final
cdef class _FutureGather(_FutureCallback):
    cdef Py_ssize_t remaining
    cdef list futures
    cdef Future out

    cdef int _on_done(self, Future fut) except -1:
        cdef Future f
        self.remaining -= 1
        if self.remaining == 0:
            for f in self.futures:
                if f._state == _FUT_ERROR:
                    return self.out._complete(f._result, _FUT_ERROR)
            return self.out._complete(self.futures, _FUT_RESULT)
        return 0


cdef list _fut_as_list(object futures, str func):
    cdef list futs = list(futures)
    cdef Py_ssize_t i
    for i in range(len(futs)):
        if not isinstance(futs[i], Future):
            raise TypeError(f"{func}(futures): futures[{i}] is a {type(futs[i]).__name__}, "
                            f"not a shmcomm Future")
    return futs


cdef Future _fut_collect(list futs):
    cdef Future f
    cdef _FutureGather gather
    for f in futs:
        if f._state == _FUT_PENDING:
            break
    else:
        return _fut_gathered(futs)
    gather = _FutureGather.__new__(_FutureGather)
    gather.futures = futs
    gather.out = Future.__new__(Future)
    gather.remaining = 1   # held until every input is registered
    for f in futs:
        if f._state == _FUT_PENDING:
            gather.remaining += 1
            f._add_callback(gather, _FUT_INTERNAL)   # runs at once if f completed meanwhile
    gather._on_done(None)
    return gather.out


def collect_all(futures):
    """A future that completes once every future in ``futures`` is done (Futures only).

    As ``torch.futures.collect_all``; ``shmcomm.collect_all`` also takes Works.

    Args:
        futures (Iterable[Future]): the futures.

    Returns:
        Future[list[Future]]: completes with the list of the input futures (in order); if any
        failed, waiting on it raises the error of the first failed one, in list order, once all
        are done.

    Raises:
        TypeError: an item is not a ``Future``.

    Example::

        >>> a, b = sc.Future(), sc.Future()
        >>> both = sc.collect_all([a, b])
        >>> a.set_result(1); b.set_result(2)
        >>> [f.value() for f in both.wait()]
        [1, 2]
    """
    return _fut_collect(_fut_as_list(futures, "collect_all"))


def wait_all(futures, timeout=None):
    """Wait for every future in ``futures`` and return their values (Futures only).

    ``shmcomm.wait_all`` also takes Works.

    Args:
        futures (Iterable[Future]): the futures.
        timeout (float | None): seconds to wait at most; None (the default): no limit.

    Returns:
        list: their values, in order.

    Raises:
        TypeError: an item is not a ``Future``.
        CommTimeoutError: they were not all done within ``timeout``.
        Exception: the error of the first failed future, in list order, once all are done.

    Example::

        >>> a, b = sc.Future(), sc.Future()
        >>> a.set_result(1); b.set_result(2)
        >>> sc.wait_all([a, b])
        [1, 2]
    """
    cdef list futs = _fut_as_list(futures, "wait_all")
    cdef Future f
    cdef double limit = _fut_timeout_arg(timeout)
    if limit < 0:
        for f in futs:
            if f._state == _FUT_PENDING:
                f._drive()
    _fut_collect(futs)._wait_fast(limit)
    return [f._result for f in futs]
