# The registry of collective kinds: one row per kind, the one place its code (descriptor word 0),
# its name (for errors and the mismatch text), the fields its descriptor carries (compared across
# ranks and shown on a mismatch: "d"type, "n"bytes, "r"oot, "o"p) and its route are written: the
# flat runner, how its queued calls batch, and the entry point through which compositions
# (add_route) may serve it. Dispatch (queue.pxi's _exec, _run_queued), the entry points
# (engine.pxi, via _route), _kind_cname and describe_call read these rows. The flat paths' size
# thresholds are the Communicator's (engine.pxi, "path choice: one place").
#
# Included before the engine (whose route cache is sized by K_COUNT); the runners the rows name
# are defined in the coll/*.pxi files, later (a row takes a runner's address, never calls it).
#
# A new collective kind: its code and row here, its arguments and runner in its family's coll/
# file, its Communicator entry point (engine.pxi), its GroupCore method and module function
# (group_core.pxi), their types (shmcomm/_core.pyi). docs/concepts.rst, "Adding to it".

cdef enum:
    K_BARRIER = 1
    K_ALL_REDUCE
    K_BROADCAST
    K_REDUCE
    K_ALL_GATHER
    K_GATHER
    K_SCATTER
    K_REDUCE_SCATTER
    K_ALL_TO_ALL
    K_ALL_TO_ALL_V
    K_ALLOC
    K_PYTHON          # a Python callable run in issue order (composite ops of the torch adapter)
    K_ALL_GATHER_V    # the uneven forms (coll/uneven.pxi)
    K_GATHER_V
    K_SCATTER_V
    K_REDUCE_SCATTER_V
    K_SCAN            # MPI's prefix reductions (coll/scan.pxi)
    K_EXSCAN
    K_COUNT           # one past the last kind

ctypedef int (*_runner_t)(Communicator, op_t *) except -1 nogil
ctypedef int (*_batcher_t)(Communicator, op_t *) noexcept nogil
ctypedef int (*_batch_runner_t)(Communicator, op_t **, int) except -1 nogil

cdef struct _kind_row_t:
    const char *name
    const char *fields
    _runner_t run           # NULL: not run by dispatch (K_ALLOC and K_PYTHON run where issued)
    # Batching: the batch class of a queued call (0: runs alone); calls of one batcher and class
    # queued one behind the other run together in one step, by run_batch. NULL: never batched.
    _batcher_t batch
    _batch_runner_t run_batch
    # Compositions (add_route): the entry point a level serves the kind through (its method of
    # that name, called with the Communicator's arguments; NULL: the kind is never composed),
    # and whether the size its rules read is the call's bytes times the group's size (the
    # gathers' and scatters' "in all") or the call's bytes.
    const char *entry
    bint whole

cdef _kind_row_t _KIND_ROWS[K_COUNT]


cdef void _kind(int kind, const char *name, const char *fields, _runner_t run,
                _batcher_t batch=NULL, _batch_runner_t run_batch=NULL, const char *entry=NULL,
                bint whole=False) noexcept:
    _KIND_ROWS[kind] = _kind_row_t(name, fields, run, batch, run_batch, entry, whole)


#     kind               name                 fields  flat runner           batcher, batch runner;
#                                                                           composed as, sized in all
_kind(K_BARRIER,         "barrier",           "",     _run_barrier)
_kind(K_ALL_REDUCE,      "all_reduce",        "dno",  _run_reduce,          _batch_class, _run_reduce_batch,
      "all_reduce", False)
_kind(K_REDUCE,          "reduce",            "dnro", _run_reduce,          _batch_class, _run_reduce_batch)
_kind(K_BROADCAST,       "broadcast",         "dnr",  _run_broadcast)
_kind(K_ALL_GATHER,      "all_gather",        "dn",   _run_gather,          NULL, NULL, "all_gather_into", True)
_kind(K_GATHER,          "gather",            "dnr",  _run_gather)
_kind(K_SCATTER,         "scatter",           "dnr",  _run_scatter)
_kind(K_REDUCE_SCATTER,  "reduce_scatter",    "dno",  _run_reduce_scatter,  NULL, NULL, "reduce_scatter_into",
      True)
_kind(K_ALL_TO_ALL,      "all_to_all",        "dn",   _run_all_to_all)
_kind(K_ALL_TO_ALL_V,    "all_to_all_single", "dn",   _run_all_to_all)
_kind(K_ALL_GATHER_V,    "all_gather_v",      "d",    _run_all_to_all)   # the uneven forms move pieces
_kind(K_GATHER_V,        "gather_v",          "dr",   _run_all_to_all)   # as all_to_all does
_kind(K_SCATTER_V,       "scatter_v",         "dr",   _run_all_to_all)   # (coll/uneven.pxi)
_kind(K_REDUCE_SCATTER_V, "reduce_scatter_v", "do",   _run_reduce_scatter_v)
_kind(K_SCAN,            "scan",              "dno",  _run_scan)
_kind(K_EXSCAN,          "exscan",            "dno",  _run_scan)
_kind(K_ALLOC,           "empty",             "n",    NULL)   # sc.empty / sc.zeros: a step of alloc_shared (heap.pxi)
_kind(K_PYTHON,          "operation",         "",     NULL)   # a Python callable run in issue order (_exec runs it)


cdef inline _batcher_t _batcher(op_t *o) noexcept nogil:
    """The batcher of the queued call ``o``'s kind (NULL: it runs alone)."""
    return _KIND_ROWS[o.kind].batch if 0 < o.kind < K_COUNT else NULL


cdef const char *_kind_cname(int kind) noexcept nogil:
    """The op's name as a C string, for error messages (static storage: no GIL needed)."""
    if 0 < kind < K_COUNT:
        return _KIND_ROWS[kind].name
    return b"operation"


cdef str describe_call(const uint64_t *d):
    """One rank's descriptor as text: ``all_reduce(dtype=float32, nbytes=16, op=SUM)``."""
    cdef uint64_t kind = capi.shm_desc_kind(d[D_KIND])  # (its upper half is the step tag)
    if not 0 < kind < K_COUNT:
        return f"kind {kind}(dtype={d[D_DTYPE]}, nbytes={d[D_NBYTES]}, root={d[D_ROOT]}, op={d[D_OP]})"
    name, fields = _KIND_ROWS[kind].name.decode(), _KIND_ROWS[kind].fields.decode()
    args = []
    if "d" in fields:
        args.append(f"dtype={DTYPE_NAMES[d[D_DTYPE]] if d[D_DTYPE] < len(DTYPE_NAMES) else d[D_DTYPE]}")
    if "n" in fields:
        args.append(f"nbytes={d[D_NBYTES]}")
    if "r" in fields:
        args.append(f"root={d[D_ROOT]}")
    if "o" in fields:
        args.append(f"op={OP_NAMES[d[D_OP]] if d[D_OP] < len(OP_NAMES) else d[D_OP]}")
    return f"{name}({', '.join(args)})"


# ---- routes: which composition, if any, serves a call --------------------------------------
# A route is (level, min_bytes, min_ranks, bfloat16, shared): the level serves the kind's calls
# of min_bytes and more, in a group of min_ranks and more, bfloat16 ones only if it takes them,
# and sc.empty ones only if it keeps them where they lie (``shared``: the threads level, whose
# lanes run zero copy on their pieces); other levels stage copies, which lose to the flat zero
# copy. The first route whose rules hold serves the call; none: the flat runner.

cdef inline object _route(Communicator c, op_t *o):
    """The level that serves the validated call ``o`` instead of the flat runner, or None. A
    group without routes pays one test."""
    if c.routes is None:
        return None
    return _first_route(c, o)


cdef object _first_route(Communicator c, op_t *o):
    cdef size_t total = o.nbytes * (<size_t>c.size if _KIND_ROWS[o.kind].whole else 1)
    if total < c.route_floor[o.kind]:
        return None
    for level, min_bytes, min_ranks, bf16, shared in c.routes[o.kind]:
        if total >= <size_t>min_bytes and c.size >= min_ranks and (o.dtype != SHM_BFLOAT16 or bf16) \
                and (o.heap == 0 or shared):
            return level
    return None


def add_route(Communicator comm, str entry, level, size_t min_bytes, int min_ranks=2, bint bfloat16=True,
              bint shared=False):
    """Let ``level`` serve ``comm``'s calls of the collective entry point ``entry`` of arrays of
    ``min_bytes`` and more (in all, for the gathers and scatters: the output's bytes),
    when the group has ``min_ranks`` ranks or more, of bfloat16 ones only if ``bfloat16``, and of
    ``sc.empty`` ones only if ``shared`` (the level keeps them where they lie).
    Routes are tried in the order added; the first whose rules hold serves the call, by calling
    ``level``'s method named ``entry`` with the Communicator's arguments. ``level`` is aborted
    and closed with ``comm`` (its ``abort(reason, cause)`` and ``close()``). Every rank must add
    the same routes. ``shmcomm.hierarchy`` adds them from each level's ``routes``.

    Example::

        add_route(comm, "all_reduce", numa_level, 1 << 20)   # 1 MiB and more: inside NUMA nodes first
    """
    if comm.closed:
        raise ValueError("add_route on a closed group")
    kinds = [k for k in range(1, K_COUNT) if _KIND_ROWS[k].entry != NULL
             and _KIND_ROWS[k].entry.decode() == entry]
    if not kinds:
        composable = sorted(_KIND_ROWS[k].entry.decode() for k in range(1, K_COUNT) if _KIND_ROWS[k].entry != NULL)
        raise ValueError(f"no composition can serve {entry!r}: the composable entry points are {composable}")
    if not callable(getattr(level, entry, None)) or not callable(getattr(level, "abort", None)) \
            or not callable(getattr(level, "close", None)):
        raise TypeError(f"a level serving {entry!r} needs the methods {entry}, abort and close "
                        f"(shmcomm.hierarchy.level.Level); {type(level).__name__} lacks some")
    if comm.routes is None:
        comm.routes = [[] for _ in range(K_COUNT)]
    comm.routes[kinds[0]].append((level, min_bytes, max(min_ranks, 1), bfloat16, shared))
    comm.route_floor[kinds[0]] = min(comm.route_floor[kinds[0]], min_bytes)
    if not any(level is known for known in comm.levels):
        comm.levels.append(level)


# The rows as Python sees them (tools and tests): kind code -> (name, descriptor fields).
KINDS = {k: (_KIND_ROWS[k].name.decode(), _KIND_ROWS[k].fields.decode()) for k in range(1, K_COUNT)}
KIND_NAMES = {k: row[0] for k, row in KINDS.items()}
