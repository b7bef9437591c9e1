# One call of a collective: its kind, its validated arguments and pointer tables, and its state.
#
# Every call owns its arguments (as mpi4py's per-call message objects do): an async op keeps its
# _Call in its Work and in the group's in-flight list, so nothing a later call validates can reach
# an op that is still queued or running. A synchronous call fills the group's one inline _Call,
# which only the thread holding the engine touches. Below: the conversion of rank and size
# arguments every entry point shares.
from cpython.ref cimport PyObject, Py_DECREF, Py_INCREF
from libc.stdlib cimport calloc, free

# ---- the descriptor a rank publishes with a step (shm_cb_t.desc, 8 words) ---------------------
# Words 0-4 are compared across ranks (a mismatch raises on every rank); words 5-7 carry what the
# kind needs besides, each named here with the kinds that use it (never two meanings in one call).
cdef enum:
    D_KIND = 0, D_DTYPE = 1, D_NBYTES = 2, D_ROOT = 3, D_OP = 4  # D_KIND: the kind code (registry.pxi), its upper half the step tag
    D_BATCH = 5           # small and medium reductions: how many calls this rank runs in this
                          #   step (low 16 bits), the heap of a call that skipped the slots above
    D_HEAP = 5            # zero copy (large reductions): the sc.empty heap holding the array
    D_HEAP_OFF = 6        #   and the array's offset in it (small and medium ones too, skipping)
    D_FACTOR = 7          # PREMUL_SUM: this rank's factor (the bits of a double)
    D_INLINE = 6          # one-shot reductions: their first call's data when it fits
                          #   INLINE_BYTES, read with the step's tag (no slot line per peer)
    D_ALLOC_FAILED = 5    # K_ALLOC (sc.empty): rank 0 could not make the heap
    D_ALLOC_FREE = 6      #   and how many bytes /dev/shm had free
    D_ALLOC_NONCE = 7     #   the heap's nonce, rank 0's, which the others check


ctypedef struct op_t:
    int kind
    int dtype
    int itemsize
    int op
    double factor          # PREMUL_SUM: this rank's factor (published in descriptor word 7)
    int root               # rank, or -1 (all_reduce, all_gather)
    size_t count           # elements of the array (all_reduce/reduce/reduce_scatter: per rank)
    size_t nbytes
    char *ptr              # the array: in place (reduce, broadcast), input (gather), output (scatter, reduce_scatter)
    char **outs            # per-rank output pieces (n entries)
    char **ins             # per-rank input pieces (n entries)
    size_t *out_bytes      # all_to_all: bytes of each output piece
    size_t *in_bytes       # all_to_all: bytes of each input piece
    uint64_t heap          # sc.empty heap holding ptr (0: none), its offset there and its stride
    uint64_t heap_off
    size_t heap_stride
    const char *fill       # exscan's rank 0: one element of the op's identity (NULL: none)
    bint uniform           # all_to_all: equal pieces
    bint overlap           # all_to_all_single: output and input overlap (in place)
    uint32_t state         # SHM_OP_* bits (shm_engine.h): DONE once results are in place,
                           # FUTURE_WANTED once a Future was handed out
    PyObject *call         # the owning _Call (borrowed: the group's in-flight list holds it)


cdef enum:
    INLINE_RANKS = 8     # groups up to this size keep a call's pointer tables inside the _Call
    MAX_BATCH = 16       # small reductions run together in one step, at most
    BATCH_HEADER = 64    # a batched call's descriptor in the slot, before its data
    INLINE_BYTES = 8     # data this small rides in the descriptor's line (D_INLINE)


cdef class _Call:
    """One call's arguments and state (internal)."""
    cdef op_t o
    cdef char *table_inline[2 * INLINE_RANKS]
    cdef size_t bytes_inline[2 * INLINE_RANKS]
    cdef object owners     # the arrays behind the pointers: alive until the op completes
    cdef object outputs    # what Work.result() returns: a list, or its one element (one_output)
    cdef bint one_output
    cdef object error      # the exception that failed the op
    cdef object fn         # K_PYTHON: fn(*args) runs in issue order
    cdef object args
    cdef object future     # shmcomm.Future handed out by Work.get_future()
    # A handed-out Future awaits settling: the _Call holds a reference to itself that is not an
    # attribute (Py_INCREF). A `self.pin = self` attribute was a cycle the cyclic GC could free
    # once the caller dropped the Work, while the engine still held the op (SIGSEGV).
    cdef bint pinned
    cdef int claim         # inline calls: how the engine is held (SHM_CLAIM_OWN / NESTED)
    cdef bint inline
    cdef object __weakref__

    def __cinit__(self):
        self.o.outs = NULL
        self.o.out_bytes = NULL

    def __dealloc__(self):
        if self.o.outs != self.table_inline:
            free(self.o.outs)
            free(self.o.out_bytes)

    cdef int _tables(self, int n) except -1:
        """Room for n output and n input pointers and sizes."""
        if n <= INLINE_RANKS:
            self.o.outs, self.o.out_bytes = self.table_inline, self.bytes_inline
        else:
            self.o.outs = <char **>calloc(2 * n, sizeof(char *))
            self.o.out_bytes = <size_t *>calloc(2 * n, sizeof(size_t))
            if self.o.outs == NULL or self.o.out_bytes == NULL:
                raise MemoryError()
        self.o.ins = self.o.outs + n
        self.o.in_bytes = self.o.out_bytes + n
        self.o.call = <PyObject *>self
        return 0

    cdef inline void reset(self) noexcept:
        """Clear the per-call fields (the inline _Call is reused by every synchronous call)."""
        self.o.kind = 0
        self.o.dtype = self.o.itemsize = self.o.op = self.o.root = 0
        self.o.factor = 1.0
        self.o.count = self.o.nbytes = 0
        self.o.ptr = NULL
        self.o.heap = self.o.heap_off = self.o.heap_stride = 0
        self.o.uniform = self.o.overlap = False
        self.o.state = SHM_OP_QUEUED

    cdef inline void pin(self) noexcept:
        """Keep this call alive until ``unpin``, whoever else lets go of it."""
        if not self.pinned:
            self.pinned = True
            Py_INCREF(self)

    cdef inline void unpin(self) noexcept:
        if self.pinned:
            self.pinned = False
            Py_DECREF(self)

    cdef list results(self):
        return [self.outputs] if self.one_output else self.outputs

    cdef inline bint done(self) noexcept nogil:
        return capi.shm_op_done(&self.o.state)


cdef extern from *:
    """
    /* The pending exception, normalised and with its traceback (a new reference), cleared. */
    static PyObject *__pyx_shm_fetch_exception(void) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (!type) Py_RETURN_NONE;
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb && value) PyException_SetTraceback(value, tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
        return value;
    }
    """
    object _fetch_exception "__pyx_shm_fetch_exception"()


# ---- ranks and sizes given as arguments ------------------------------------------------------
from operator import index as _index


cdef object _as_index(object value, str argname):
    """``value`` as a Python int; TypeError naming ``argname`` for bools and non-integers."""
    if type(value) is int:
        return value
    if not isinstance(value, bool):
        try:
            return _index(value)  # int subclasses, numpy integers
        except TypeError:
            pass
    raise TypeError(f"{argname} must be an int rank, got {type(value).__name__}")


cdef inline int _rank_arg(object value, str argname) except? -1:
    if type(value) is int:  # the common case first: this is on every call's path
        return value
    return _as_index(value, argname)


def rank_arg(value, str argname):
    """``value`` as an int rank; TypeError naming ``argname`` for bools and non-integers.

    Example::

        >>> rank_arg(3, "dst")
        3
    """
    return _as_index(value, argname)
