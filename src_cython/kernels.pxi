# The reduction kernels as the Python side sees them: the dtype and op tables (generated from
# shm_dtypes.h), the SIMD level in use (chosen once, here, at import), and a direct call of one
# level's kernel on local arrays for the tests and the kernel micro-benchmark.
from libc.stdlib cimport free, malloc

DTYPE_NAMES = tuple(shm_dtype_names[i].decode() for i in range(SHM_NDTYPES))
OP_NAMES = tuple(shm_op_names[i].decode() for i in range(SHM_NOPS))
SIMD_LEVELS = tuple(shm_simd_names[i].decode() for i in range(SHM_SIMD_NLEVELS))

# PREMUL_SUM needs a factor per call: the torch backend passes it (Communicator.all_reduce's
# ``factor``); the public ReduceOp, whose members need nothing else, leaves it out.
# PROD: an alias of PRODUCT, as MPI (MPI.PROD) and numpy (np.prod) spell it; iterating ReduceOp
# still gives each op once.
ReduceOp = enum.IntEnum("ReduceOp", [(name, code) for code, name in enumerate(OP_NAMES)
                                     if code != SHM_PREMUL_SUM] + [("PROD", OP_NAMES.index("PRODUCT"))],
                        module="shmcomm.ops", qualname="ReduceOp")
PREMUL_SUM = SHM_PREMUL_SUM
ReduceOp.__doc__ = """Element-wise reductions: SUM, PRODUCT (alias PROD), MIN, MAX, AVG, BAND, BOR, BXOR.

    Values are the kernels' op codes (generated from their table). ``AVG`` on integers divides
    the wrapped sum and truncates toward zero (as NCCL); bool has no ``AVG``.
    ``BAND``/``BOR``/``BXOR`` need integer or bool; complex numbers have no ``MIN``/``MAX``.
    Half types accumulate in float32::

        sc.all_reduce(grads, op=sc.ReduceOp.AVG)
    """

_OP_CODES = {member: int(member) for member in ReduceOp}


def op_code(op) -> int:
    """Code of ``op`` (a ReduceOp, its name in any case, "prod" for PRODUCT, or torch's
    ReduceOp); ValueError names bad input.

    Example::

        >>> op_code("max"), op_code(ReduceOp.SUM), op_code("prod")
        (3, 0, 1)
    """
    code = _OP_CODES.get(op) if op.__class__ is ReduceOp else None
    if code is not None:
        return code
    if isinstance(op, str):
        try:
            return int(ReduceOp[op.upper()])
        except KeyError:
            pass
    elif isinstance(op, int) and not isinstance(op, bool) and 0 <= op < len(ReduceOp):
        return op
    else:  # torch.distributed.ReduceOp and its RedOpType members carry a name
        name = getattr(op, "name", None) or str(op).rpartition(".")[2]
        if name.upper() in ReduceOp.__members__:
            return int(ReduceOp[name.upper()])
    names = [m.name for m in ReduceOp]
    if hasattr(op, "shape") and hasattr(op, "dtype"):  # mpi4py's habit: (sendbuf, recvbuf)
        raise ValueError(
            f"op must be one of {names}, got an array ({op.dtype}, shape {tuple(op.shape)}): "
            "shmcomm's reductions work in place on one array, as torch.distributed's do: "
            "all_reduce(array, op=...) leaves the result in array. For MPI's "
            "Allreduce(sendbuf, recvbuf), copy first (recvbuf[...] = sendbuf), then "
            "all_reduce(recvbuf)")
    raise ValueError(f"op must be one of {names}, got {op!r}")


def simd_levels():
    """The SIMD levels this build has and this CPU runs, baseline first.

    Example::

        >>> simd_levels()[0]
        'baseline'
    """
    return [SIMD_LEVELS[i] for i in range(SHM_SIMD_NLEVELS) if shm_simd_runs(i)]


def simd_level():
    """The level whose kernels every reduction uses (the best one, or ``SHMCOMM_SIMD``'s).

    Example::

        >>> simd_level() in simd_levels()
        True
    """
    return SIMD_LEVELS[shm_simd_level]


cdef int _simd_code(object name, str what) except -1:
    if name not in SIMD_LEVELS:
        raise ValueError(f"{what} must be auto or one of {', '.join(SIMD_LEVELS)}; got {name!r}")
    cdef int code = SIMD_LEVELS.index(name)
    if not shm_simd_runs(code):
        raise ValueError(f"{what}={name}: this CPU or this build cannot run it; levels here: "
                         f"{', '.join(simd_levels())}")
    return code


def choose_simd_level():
    """Apply SHMCOMM_SIMD (auto, baseline, avx2, avx512, neon), else take the best level.

    Runs at import and again whenever a group is created, where every SHMCOMM_* setting is read
    (group_settings). A value that is unknown or cannot run here leaves the best level in use and
    raises ValueError; the import ignores it (``import torch`` loads shmcomm's entry point), group
    creation does not. Switching levels while another group reduces is harmless: every level gives
    the same bits.

    Example::

        >>> choose_simd_level()   # SHMCOMM_SIMD unset: the best level
        >>> simd_level() == simd_levels()[-1]
        True
    """
    global shm_simd_level
    raw = os.environ.get("SHMCOMM_SIMD", "").strip().lower()
    shm_simd_level = shm_simd_best()
    if raw not in ("", "auto"):
        shm_simd_level = _simd_code(raw, "SHMCOMM_SIMD")


try:
    choose_simd_level()
except ValueError:
    pass  # raised again when a group is created


cdef int check_reduce_op(int dtype, int op) except -1:
    """TypeError/ValueError unless the kernels have ``op`` for ``dtype`` (every reducing call)."""
    if not 0 <= op < SHM_NOPS:
        raise ValueError(f"op must be a ReduceOp, got {op}")
    if not shm_reduce_supported(dtype, op):
        if op == SHM_PREMUL_SUM:
            raise TypeError(f"op PREMUL_SUM needs a floating-point dtype, got {DTYPE_NAMES[dtype]}")
        raise TypeError(f"op {OP_NAMES[op]} is not supported for dtype {DTYPE_NAMES[dtype]}")
    return 0


def reduce_kernel(out, inputs, op=0, level=None, factors=None):
    """``out[i] = op(inputs[0][i], ..., inputs[-1][i])`` by one level's kernel, in this process.

    No communication: this is the kernel every collective reduction runs, called directly, for
    the tests (every level must give the same bits) and ``bench/bench_kernels.py``. ``op`` is an
    op code (``int(sc.ReduceOp.SUM)``, or ``PREMUL_SUM`` with one factor per input in
    ``factors``); ``level`` a name from :func:`simd_levels`, default the one in use. ``out`` may
    be one of the inputs.

    Example::

        >>> import numpy as np
        >>> a, b, out = np.ones(5, np.float16), np.full(5, 2, np.float16), np.empty(5, np.float16)
        >>> reduce_kernel(out, [a, b], 0, "baseline"); out.tolist()
        [3.0, 3.0, 3.0, 3.0, 3.0]
    """
    cdef buf_t b_out, b_in
    cdef int code = shm_simd_level if level is None else _simd_code(level, "level")
    cdef int n = len(inputs), k, opc = op
    if n < 1:
        raise ValueError("inputs must hold at least one array")
    keep = [as_buf(out, &b_out, True, "out")]
    check_reduce_op(b_out.dtype, opc)
    if opc == SHM_PREMUL_SUM and (factors is None or len(factors) != n):
        raise ValueError(f"PREMUL_SUM needs one factor per input ({n}), got {factors!r}")
    cdef const void **srcs = <const void **>malloc(n * sizeof(void *))
    cdef double *scale = <double *>malloc(n * sizeof(double))
    if srcs == NULL or scale == NULL:
        free(srcs); free(scale)
        raise MemoryError()
    try:
        for k in range(n):
            keep.append(as_buf(inputs[k], &b_in, False, f"inputs[{k}]"))
            if b_in.dtype != b_out.dtype or b_in.count != b_out.count:
                raise ValueError(f"inputs[{k}] has {b_in.count} {DTYPE_NAMES[b_in.dtype]} elements; out "
                                 f"has {b_out.count} {DTYPE_NAMES[b_out.dtype]}")
            srcs[k] = b_in.ptr
            scale[k] = factors[k] if opc == SHM_PREMUL_SUM else 1.0
        with nogil:
            shm_reduce_at(code, b_out.ptr, srcs, scale, n, b_out.count, b_out.dtype, opc)
    finally:
        free(srcs); free(scale)
    return None
