# The registry of collective kinds: one row per kind, the one place its name (for errors and the
# mismatch text), the fields its descriptor carries (compared across ranks and shown on a
# mismatch: "d"type, "n"bytes, "r"oot, "o"p) and its runner are written. The kind codes are the
# enum in calls.pxi (descriptor word 0); dispatch (queue.pxi's _exec), _kind_cname and
# describe_call read these rows. Path thresholds are the Communicator's (engine.pxi, "path
# choice: one place"). Included last: the runners are defined in the coll/*.pxi files.

ctypedef int (*_runner_t)(Communicator, op_t *) except -1 nogil

cdef struct _kind_row_t:
    const char *name
    const char *fields
    _runner_t run           # NULL: not run by dispatch (K_ALLOC and K_PYTHON run where issued)

cdef _kind_row_t _KIND_ROWS[K_COUNT]


cdef void _kind(int kind, const char *name, const char *fields, _runner_t run) noexcept:
    _KIND_ROWS[kind].name = name
    _KIND_ROWS[kind].fields = fields
    _KIND_ROWS[kind].run = run


_kind(K_BARRIER, "barrier", "", _run_barrier)
_kind(K_ALL_REDUCE, "all_reduce", "dno", _run_reduce)
_kind(K_REDUCE, "reduce", "dnro", _run_reduce)
_kind(K_BROADCAST, "broadcast", "dnr", _run_broadcast)
_kind(K_ALL_GATHER, "all_gather", "dn", _run_gather)
_kind(K_GATHER, "gather", "dnr", _run_gather)
_kind(K_SCATTER, "scatter", "dnr", _run_scatter)
_kind(K_REDUCE_SCATTER, "reduce_scatter", "dno", _run_reduce_scatter)
_kind(K_ALL_TO_ALL, "all_to_all", "dn", _run_all_to_all)
_kind(K_ALL_TO_ALL_V, "all_to_all_single", "dn", _run_all_to_all)
_kind(K_ALL_GATHER_V, "all_gather_v", "d", _run_all_to_all)   # the uneven forms move pieces as
_kind(K_GATHER_V, "gather_v", "dr", _run_all_to_all)          # all_to_all does (coll/uneven.pxi)
_kind(K_SCATTER_V, "scatter_v", "dr", _run_all_to_all)
_kind(K_REDUCE_SCATTER_V, "reduce_scatter_v", "do", _run_reduce_scatter_v)
_kind(K_ALLOC, "empty", "n", NULL)        # sc.empty / sc.zeros: a step of alloc_shared (heap.pxi)
_kind(K_PYTHON, "operation", "", NULL)    # a Python callable run in issue order (_exec runs it)

# The rows as Python sees them (tools and tests): kind code -> (name, descriptor fields).
KINDS = {k: (_KIND_ROWS[k].name.decode(), _KIND_ROWS[k].fields.decode()) for k in range(1, K_COUNT)}
KIND_NAMES = {k: row[0] for k, row in KINDS.items()}
