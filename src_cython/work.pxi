# Work: the handle of an async operation.
#
# A collective's Work is its call's _Call (a subclass: one object per async op): completion is a
# C flag the runner stores, and `wait` drives the group's queue on the calling thread up to this
# op (no hand-off, no sleep when the op is next in line). The Future is made only if asked for
# (get_future). A point-to-point Work holds a Future that the p2p engine completes, and a `drive`
# function that moves bytes on the waiting thread.


@cython.final
cdef class Work(_Call):
    """Handle of an asynchronous operation, as returned by any call with ``async_op=True``.

    Also by ``isend``/``irecv``. Operations of one group run in issue order; a Work keeps its
    operation's arrays alive until it completes, so dropping it without ``wait()`` is fine (the
    operation still runs). ``wait`` may be called from any thread, and more than once. Never
    made by hand.

    Example::

        work = sc.all_reduce(x, async_op=True)
        compute_something_else()
        work.wait()            # raises the operation's error, if any
        assert work.is_success()
    """
    cdef Communicator _comm          # collectives: the group's engine; None for p2p
    cdef public object _future       # p2p: completed by the p2p engine; collective: made lazily
    cdef public object _outputs
    cdef public int _source
    cdef object _abort_fn
    cdef object _drive

    def __init__(self, fn=None, args=(), outputs=(), abort=None, drive=None):
        # Point-to-point Works: the p2p engine completes `_future` (fn and args are unused).
        self._future = Future()
        self._outputs = list(outputs)
        self._source = -1
        self._abort_fn = abort
        self._drive = drive

    @staticmethod
    cdef Work _new(Communicator comm):
        cdef Work w = Work.__new__(Work)
        w._tables(comm.size)
        w._comm, w._source = comm, -1
        return w

    cdef inline bint _done(self):
        if self._comm is not None:
            return self.done()
        return self._future.done()

    def wait(self, timeout=None):
        """Block until the operation completes; return True or raise its error.

        Waiting drives the group's queue on this thread (no hand-off when the operation is next
        in line).

        Args:
            timeout (float | None): seconds to wait at most; None (the default) or ``inf``: until
                done (each collective is bounded by the group's timeout anyway). On the group's
                progress thread (in a Future's callback) the queue runs here whatever the
                timeout: no other thread would run it.

        Returns:
            bool: True, once the operation completed successfully.

        Raises:
            CommTimeoutError: not completed within ``timeout`` (the operation stays pending and
                may be waited for again), or the operation's own timeout.
            CollectiveMismatchError: the operation's ranks disagreed (see the call).
            PeerFailureError: a rank of the group died or left it.
            AbortedError: the group was aborted.
            ShmcommError: the group was destroyed, or is unusable after an earlier failure.
            ValueError: ``timeout`` is negative or nan.

        Example::

            work.wait(timeout=5.0)
        """
        cdef double limit = _fut_timeout_arg(timeout)  # None and inf: -1, no limit
        cdef int rc = 0
        cdef bint runs
        if self._comm is None:
            return self._wait_future(limit)
        if not self.done():
            # No limit: run the queue here. On the group's progress thread (in a callback) too,
            # limit or not: nothing else would run it (a limited wait there timed out always).
            runs = limit < 0 or _on_progress_thread(self._comm)
            with nogil:
                rc = _drive(self._comm, &self.o, runs, limit)
            if rc == -2:
                raise CommTimeoutError(f"Work not completed within {timeout} s")
            _prune(self._comm)
        if self.error is not None:
            raise self.error
        return True

    cdef _wait_future(self, double limit):
        try:
            if self._drive is not None and not self._future.done():
                self._drive(self._future, limit)
            self._future.wait(None if limit < 0 else limit)
        except CommTimeoutError:
            if self._future.done():
                raise
            raise CommTimeoutError(f"Work not completed within {limit} s") from None
        return True

    def is_completed(self):
        """Whether the operation has finished, successfully or not; never blocks.

        Returns:
            bool: True once it finished.

        Example::

            while not work.is_completed():
                do_other_work()
        """
        return self._done()

    def is_success(self):
        """Whether the operation has finished without error; never blocks.

        Returns:
            bool: True once it finished successfully; False while it runs or if it failed.

        Example::

            work.wait(); assert work.is_success()
        """
        return self._done() and self.exception() is None

    def exception(self):
        """The operation's error, if it failed; never blocks.

        Returns:
            BaseException | None: the error; None if it succeeded or is still running.

        Example::

            if work.is_completed() and work.exception():
                log(work.exception())
        """
        if not self._done():
            return None
        if self._comm is not None:
            return self.error
        try:
            self._future.value()
        except BaseException as exc:  # noqa: BLE001
            return exc
        return None

    def result(self):
        """Wait for the operation (as ``wait()``) and return the arrays it wrote.

        Returns:
            list: the output arrays, the ones passed to the call (not copies): ``[array]`` for
            ``all_reduce``, ``broadcast``, ``isend``/``irecv`` ...; the arrays of ``output_list``
            for ``all_gather``/``all_to_all``; ``[]`` for ``barrier``. Each call's docstring says.

        Raises:
            Exception: the operation's error, as ``wait()`` raises it.

        Example::

            out, = sc.all_reduce(x, async_op=True).result()
        """
        self.wait()
        return list(self.results() if self._comm is not None else self._outputs)

    def get_future(self):
        """A ``Future`` completed with ``result()``, or with the operation's error.

        Its callbacks run on the thread that completes the operation (the group's progress
        thread, or a waiter). Every call returns the same Future. Asking for it starts the
        operation now on the progress thread (for callbacks nobody waits for); waiting on it, or
        on a future ``then`` chains to it, without a timeout runs the group's queue up to the
        operation on the waiting thread, as ``wait`` does; asked for on the progress thread
        itself, inside a callback, it runs the operation there first.

        Returns:
            Future[list]: completes when the operation does.

        Example::

            fut = work.get_future().then(lambda f: f.value()[0].sum())
        """
        cdef Future fut
        if self._comm is None:
            return self._future
        if self.future is not None:
            return self.future
        fut = Future()
        fut._driver = self  # its wait runs the queue here, as Work.wait does
        self.future = fut
        self.pin()  # alive until settled, even if the caller drops this Work (calls.pxi)
        if capi.shm_op_mark(&self.o.state, SHM_OP_FUTURE_WANTED) & SHM_OP_DONE:
            with nogil:  # completed before the want was seen: settle it here
                _settle_future(&self.o)
        elif _on_progress_thread(self._comm):
            # A callback of this group's ops asking for it may wait on it where the wait runs
            # nothing: with a timeout, or on a torch future fed by it (C++ waits, as PowerSGD's
            # DDP hook does). It would block the one thread that runs the op: run it now.
            with nogil:
                _drive(self._comm, &self.o, True, 0.0)
        else:
            # For callbacks nobody waits for (a waiter runs the queue itself, Future._drive):
            # the progress thread starts the op now, not after its rest (up to 1 ms).
            capi.shm_engine_start_issued(&self._comm.engine)
        return self.future

    def source_rank(self):
        """The sender's rank of a completed ``irecv``.

        Returns:
            int: the sender's rank within the group; -1 for other operations and while the
            receive is pending.

        Example::

            w = sc.irecv(buf); w.wait(); print("from", w.source_rank())
        """
        return self._source

    def abort(self):
        """Abort the whole group: pending and later operations on it raise ``AbortedError``.

        On every rank, not only this operation: the group can only be destroyed then (as
        ``ProcessGroup.abort()``). A point-to-point Work that is still pending fails with
        ``AbortedError`` at once.

        Example::

            work.abort()
        """
        if self._comm is not None:
            self._comm.abort()
        else:
            if self._abort_fn is not None:
                self._abort_fn()
            if not self._future.done():
                self._future.set_exception(AbortedError("the operation was aborted"))

    def __repr__(self):
        return f"<shmcomm.Work {'done' if self._done() else 'pending'}>"
