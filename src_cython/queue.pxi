# The queue and the progress thread: running one op, running queued ops in issue order on
# whichever thread gets there first (a waiter, a later synchronous call, the background thread),
# and turning a validated call into a run or a queued Work (_open, _go, _abandon). Free functions
# of Communicator (engine.pxi holds its fields).

# ---- running one op -----------------------------------------------------------------------
cdef int _exec(Communicator self, op_t *o) except -1 nogil:
    """Run ``o`` on this thread, which holds the engine."""
    cdef int k = o.kind
    if k == K_PYTHON:
        with gil:
            call = <_Call>o.call
            call.fn(*call.args)
        return 0
    if not 0 < k < K_COUNT or _KIND_ROWS[k].run == NULL:
        with gil:
            raise SystemError(f"unknown operation kind {k}")
    _begin(self, _KIND_ROWS[k].name)
    return _KIND_ROWS[k].run(self, o)


cdef object _trimmed(object error, op_t *o):
    """``error`` as the engine raised it, less the engine's own frames (the dispatch, the
    algorithm's steps, the waits): the user's line and the message say what happened. Errors of
    Python operations (K_PYTHON: callbacks, compositions) keep theirs, which are the user's."""
    if o.kind != K_PYTHON and isinstance(error, ShmcommError):
        return error.with_traceback(None)
    return error


cdef int _exec_entry(Communicator c, op_t *o) except -1 nogil:
    return _exec(c, o)


cdef int _exec_batch_entry(Communicator c, op_t **ops, int k) except -1 nogil:
    """Run k calls of one kind and batch class together (the kind's row's run_batch); returns
    how many are done."""
    _begin(c, _kind_cname(ops[0].kind))
    cdef int done = _KIND_ROWS[ops[0].kind].run_batch(c, ops, k)
    if done > 1:
        c.calls_begun += done - 1  # _begin counted the batch's first call
    return done


cdef inline size_t _batch_bytes(op_t *o, int j) noexcept nogil:
    """Slot bytes call j of a batch takes: its data rounded to a cache line, after a descriptor
    for j > 0 (the first call's descriptor is the control block's, and its data starts the slot,
    so a batch of one touches the same lines as a plain one-shot)."""
    return (BATCH_HEADER if j else 0) + _align_up(o.nbytes, 64)


cdef bint _touches_batch(op_t **batch, int k, op_t *o) noexcept nogil:
    """Whether ``o``'s array overlaps the array of a call already in the batch: such a call runs
    after that one, not beside it, so that it reads that call's result (issue order). Batched,
    three async all_reduces of one array at 2 ranks left 2 or 4 in it instead of 8."""
    cdef int j
    for j in range(k):
        if _spans_overlap(o.ptr, o.nbytes, batch[j].ptr, batch[j].nbytes):
            return True
    return False


cdef void _run_queued(Communicator self, op_t *o, bint background) noexcept nogil:
    """Run the queued op ``o`` (claimed from the engine) and, when it is a small reduction,
    the small reductions queued right behind it in the same step; complete what ran and
    release the engine. Touches Python only for an error or a Future that was handed out."""
    cdef op_t *batch[MAX_BATCH]
    cdef op_t *nxt
    cdef size_t room = self.slot_bytes
    cdef _batcher_t batcher = _batcher(o)  # the kind's row's; calls batch with its own class
    cdef int j, k = 1, rc, settle = 0, kind = batcher(self, o) if batcher != NULL else 0
    batch[0] = o
    if kind:
        room -= _batch_bytes(o, 0)
        while k < MAX_BATCH:
            nxt = <op_t *>capi.shm_engine_peek(&self.engine, k)
            if nxt == NULL or _batcher(nxt) != batcher or batcher(self, nxt) != kind \
                    or _batch_bytes(nxt, k) > room or _touches_batch(batch, k, nxt):
                break
            room -= _batch_bytes(nxt, k)
            batch[k] = nxt
            k += 1
    self.background = background
    if k == 1:
        rc = (<_exec_unchecked_t>_exec_entry)(self, o)
    else:
        rc = (<_exec_batch_unchecked_t>_exec_batch_entry)(self, batch, k)
    self.background = False
    if background:
        self.background_calls += 1
    if rc < 0:
        with gil:
            error = (<_Call>o.call).error = _trimmed(_fetch_exception(), o)
            interrupted = isinstance(error, KeyboardInterrupt)
        if self.published:
            _withdraw(self, interrupted)
        rc = 1  # the head failed; what it failed with decides the rest
    elif k == 1:
        rc = 1
    elif rc > 1:
        self.fused_calls += rc
    self.published = False
    # Ops j >= rc stay queued. Once DONE is visible a waiter may free an op, so whether its
    # Future is ours to settle is learnt in the same RMW (a wanted one is pinned, see calls.pxi).
    for j in range(rc):
        if capi.shm_op_mark(&batch[j].state, SHM_OP_DONE) & SHM_OP_FUTURE_WANTED:
            batch[settle] = batch[j]
            settle += 1
    capi.shm_engine_release(&self.engine, SHM_CLAIM_OWN, rc)
    for j in range(settle):
        _settle_future(batch[j])



# ---- the engine ---------------------------------------------------------------------------
cdef int _drive(Communicator self, op_t *target, bint runs, double timeout) except -1 nogil:
    """Wait until ``target`` is done (target NULL: until this thread holds the engine inline;
    returns the claim), with Python signals checked every slice.
    ``runs``: this thread runs the queued ops itself, between them waiting (spinning adaptively,
    then sleeping), for as long as it takes (``timeout`` unused). Otherwise it only waits, at
    most ``timeout`` seconds, leaving the ops to the progress thread (an op once started cannot
    be left half done), and returns -2 when the time ran out."""
    cdef void *head
    cdef uint32_t seen
    cdef int claim, got, rc = 0
    cdef uint64_t deadline = 0
    if target != NULL and capi.shm_engine_held_here(&self.engine) and not capi.shm_op_done(&target.state):
        # This thread runs an op of the group (a ProcessGroup.run callable, a callback) and
        # waits for one queued behind it: that one can only start after this one ends.
        with gil:
            raise ShmcommError(
                f"an operation running on group {self.job}.{self.part} (ProcessGroup.run, a torch "
                f"composite or a callback) waits for an async operation issued on the same group "
                f"after it, which can only start once the running one has ended: issue it with "
                f"async_op=False inside the operation, or wait for it outside")
    if not runs:
        deadline = capi.shm_deadline_after(timeout)
        capi.shm_engine_kick(&self.engine)
    else:
        if target != NULL:  # the common case: the op is next in line; run it at once
            head = capi.shm_engine_claim(&self.engine)
            if head != NULL:
                _run_queued(self, <op_t *>head, False)
            if capi.shm_op_done(&target.state):
                return 0
        capi.shm_fetch_add(&self.engine.drivers, 1)
    try:
        while True:
            if target != NULL:
                if capi.shm_op_done(&target.state):
                    break
            else:
                claim = capi.shm_engine_claim_inline(&self.engine)
                if claim != SHM_CLAIM_NONE:
                    rc = claim
                    break
            seen = capi.shm_load_acquire(&self.engine.done)
            if runs:
                head = capi.shm_engine_claim(&self.engine)
                if head != NULL:
                    _run_queued(self, <op_t *>head, False)
                    continue
            # Another thread runs an op: spin only briefly, then sleep. A large op would
            # otherwise share this core with a spinning waiter (on two cores, a waiter
            # spinning beside the progress thread doubled a 32 MiB all_reduce).
            got = capi.shm_wait_geq(&self.engine.done, seen + 1, &self.engine.done_waiters,
                                    min(self.spin_ns, SPIN_FLOOR_NS) if runs else 0, self.yields,
                                    SLICE_NS if runs else 1000 * 1000)
            if not got:
                with gil:
                    PyErr_CheckSignals()
            if deadline and capi.shm_now_ns() > deadline:
                rc = -2
                break
    finally:
        if runs:
            capi.shm_fetch_sub(&self.engine.drivers, 1)
        if capi.shm_engine_pending(&self.engine):
            capi.shm_engine_kick(&self.engine)  # what is left is the progress thread's (if it sleeps)
    return rc



cdef int _hold_idle(Communicator self) except -1:
    """Hold the engine inline once every queued op has run (this thread runs them, waiting for
    one another thread runs); returns the claim to release. ShmcommError on a thread that runs
    one of the group's own operations: it would wait for itself."""
    cdef int claim = capi.shm_engine_claim_inline(&self.engine)
    if claim == SHM_CLAIM_NESTED:
        capi.shm_engine_release(&self.engine, claim, 0)
        raise ShmcommError(_NESTED_CLOSE)
    if claim == SHM_CLAIM_NONE:
        with nogil:
            claim = _drive(self, NULL, True, 0.0)
    return claim



cdef _Call _open(Communicator self, bint async_op):
    """The _Call to fill for a new call: a fresh one for an async op; for a synchronous one the
    inline _Call, once this thread holds the engine (after everything issued before it ran)."""
    cdef _Call call
    cdef int claim
    if self.closed:
        raise ValueError(f"process group {self.job}.{self.part} was destroyed")
    _check_process(self)
    if async_op:
        return Work._new(self)  # the Work is the call's own argument object
    claim = capi.shm_engine_claim_inline(&self.engine)
    if claim == SHM_CLAIM_NONE:
        with nogil:
            claim = _drive(self, NULL, True, 0.0)
    call = self.inline_call
    if claim == SHM_CLAIM_NESTED:
        # A queued Python op calls a collective: a _Call of its own (the inline one may be
        # the caller's, mid-call).
        call = _Call.__new__(_Call)
        call._tables(self.size)
        call.inline = True
    # The inline _Call is reused by every synchronous call: clear what the last one left
    # (a list form's prep does not set the shared-array fields its runner reads).
    call.reset()
    call.claim = claim
    return call



cdef _abandon(Communicator self, _Call call):
    """A call whose arguments were refused: let go of the engine if it held it."""
    if call.inline:
        capi.shm_engine_release(&self.engine, call.claim, 0)
        call.owners = None



cdef object _go(Communicator self, _Call call, object owners, object outputs, bint one_output=False):
    """Run a filled call: inline now (returns None), or queued (returns its Work). The Work's
    results are ``outputs``, a list, or ``[outputs]`` with ``one_output`` (made only if asked)."""
    cdef int rc
    cdef op_t *o = &call.o
    if call.inline:
        with nogil:
            rc = (<_exec_unchecked_t>_exec_entry)(self, o)
            if rc >= 0:
                self.published = False
                capi.shm_engine_release(&self.engine, call.claim, 0)
        if rc < 0:
            # taken before the withdrawal, which may run Python (a message) that would lose it
            error = _trimmed(_fetch_exception(), o)
            interrupted = isinstance(error, KeyboardInterrupt)
            with nogil:
                if self.published:
                    _withdraw(self, interrupted)
                self.published = False
                capi.shm_engine_release(&self.engine, call.claim, 0)
            raise error
        return None
    call.owners = owners
    call.outputs = outputs
    call.one_output = one_output
    if len(self.inflight) - self.inflight_head > 8:  # (Work.wait prunes too)
        _prune(self)
    while capi.shm_engine_push(&self.engine, o) != 0:  # the queue is full: make room
        oldest = <_Call>self.inflight[self.inflight_head]
        with nogil:
            _drive(self, &oldest.o, True, 0.0)
        _prune(self)
    self.inflight.append(call)
    if self.thread is None:
        _start_thread(self)
    if self.closed:
        # destroyed while this call was being made: nothing would run it (no progress thread);
        # run it here, where it fails as a call on a destroyed group (_begin)
        with nogil:
            _drive(self, o, True, 0.0)
    if o.nbytes >= EAGER_BYTES and o.kind != K_PYTHON:
        capi.shm_engine_start_issued(&self.engine)  # worth a wake-up: start it now
    return call



cdef _prune(Communicator self):
    """Forget queued calls that completed (their arrays may go)."""
    cdef Py_ssize_t n = len(self.inflight)
    while self.inflight_head < n and (<_Call>self.inflight[self.inflight_head]).done():
        self.inflight[self.inflight_head] = None
        self.inflight_head += 1
    if self.inflight_head == n:
        del self.inflight[:]
        self.inflight_head = 0
    elif self.inflight_head > 64:
        del self.inflight[:self.inflight_head]
        self.inflight_head = 0



cdef _start_thread(Communicator self):
    with self.thread_lock:
        if self.thread is None and not self.closed:
            self.thread = threading.Thread(target=self._progress_loop, daemon=True,
                                           name=f"shmcomm-{self.job}.{self.part}")
            self.thread.start()



cdef void _progress(Communicator self) noexcept nogil:
    # The thread takes only ops issued before its last rest began: a fresh op belongs to the
    # thread that issued it, which usually waits for it at once or issues more first. While
    # callers run every op themselves, the rest doubles (up to doze_max: fewer wake-ups
    # competing for the cores); the first op the thread has to run itself sets it back.
    cdef void *head
    cdef uint64_t before = 0, seen, last_seen = 0, doze = self.doze_ns, doze_max = 20 * self.doze_ns
    cdef uint64_t active = capi.shm_now_ns()
    while not capi.shm_load_acquire(&self.engine.stop):
        seen = capi.shm_engine_issued(&self.engine)
        if seen != last_seen:
            last_seen, active = seen, capi.shm_now_ns()
        if capi.shm_load_acquire(&self.engine.drivers) == 0:
            head = capi.shm_engine_claim_ticket_below(
                &self.engine, max(before, capi.shm_engine_eager_until(&self.engine)))
            if head != NULL:
                _run_queued(self, <op_t *>head, True)
                doze = self.doze_ns
                continue
        before = capi.shm_engine_issued(&self.engine)
        capi.shm_engine_rest(&self.engine, before, capi.shm_now_ns() - active > IDLE_NS, doze, SLICE_NS)
        # Ops came in during the rest: they are ours after the next rest unless their issuer
        # runs them meanwhile; that rest keeps its length. (Shortening it whenever an op was
        # pending woke the thread every 50 us in an issue-then-wait loop, torch's functional
        # collectives: 35 -> 27 us a call at 2 ranks on 2 cores.) Nothing pending: rest longer.
        if not capi.shm_engine_pending(&self.engine):
            doze = min(2 * doze, doze_max)



cdef inline bint _on_progress_thread(Communicator self):
    """Whether the caller is this group's progress thread (running a Future's callbacks)."""
    thread = self.thread
    return thread is not None and (<object>thread).ident == threading.get_ident()



cdef _stop_thread(Communicator self):
    with self.thread_lock:  # not half started: Thread.start() lets other threads run before it returns
        thread = self.thread
    if thread is None:
        return
    capi.shm_store_seq_cst(&self.engine.stop, 1)
    capi.shm_fetch_add(&self.engine.kick, 1)
    capi.shm_futex_wake_all(&self.engine.kick)
    if thread is not threading.current_thread():
        thread.join()
    self.thread = None


cdef void _settle_future(op_t *o) noexcept nogil:
    """Complete the Future handed out for ``o``, with the GIL; called once, by the side whose
    shm_op_mark saw the other's bit (the completer or Work.get_future).
    Callbacks run here; an error escaping one (SystemExit included) is logged, never allowed to
    end the thread that runs the group's ops."""
    with gil:
        call = <_Call>o.call  # a reference: unpinning below cannot free it under us
        try:
            if call.error is not None:
                call.future.set_exception(call.error)
            else:
                call.future.set_result(call.results())
        except BaseException as exc:  # noqa: BLE001 - see the docstring
            _fut_log_callback_error(call.future, exc)
        finally:
            call.unpin()
