# Buffer handling in one place: turn a user's array (numpy array, torch CPU tensor, any
# C-contiguous buffer-protocol object) into a pointer, a size and a dtype code, and keep an owner
# object alive while the pointer is in use.
cimport numpy as cnp
from cpython.object cimport PyObject

cnp.import_array()

ctypedef struct buf_t:
    char *ptr
    size_t nbytes
    size_t count
    int dtype
    int itemsize

# dtype code by numpy dtype; filled lazily since dtype objects hash quickly.
cdef dict _dtype_codes = {}


cdef object _dtype_key(object dt):
    """How the table finds a numpy dtype: (kind, itemsize) for numpy's own numbers (so int64 and
    longlong, both 8-byte signed integers, are one entry), the name for extension types
    (ml_dtypes' bfloat16)."""
    return (dt.kind, dt.itemsize) if dt.kind in "biufc" else dt.name


cdef dict _table_codes():
    """Code by dtype key, for every dtype of the table (shm_dtypes.h) whose C size numpy agrees with."""
    codes = {}
    for code, name in enumerate(DTYPE_NAMES):
        try:
            dt = np.dtype(name)
        except TypeError:  # bfloat16: numpy has none of its own
            codes.setdefault(name, code)
            continue
        if dt.itemsize == shm_dtype_itemsizes[code]:
            codes.setdefault(_dtype_key(dt), code)
    return codes


cdef dict _codes_by_key = None  # built at first use: DTYPE_NAMES comes from kernels.pxi


cdef int _dtype_code_slow(object dt) except -2:
    global _codes_by_key
    if _codes_by_key is None:
        _codes_by_key = _table_codes()
    return _codes_by_key.get(_dtype_key(dt), -1)


cdef inline int dtype_code(object dt) except -2:
    code = _dtype_codes.get(dt)
    if code is None:
        code = _dtype_code_slow(dt)
        _dtype_codes[dt] = code
    return code


cdef object _torch_to_numpy(object t, str argname):
    """A numpy view sharing a CPU tensor's memory; bfloat16 comes back as an int16 view."""
    if t.device.type != "cpu":
        raise ValueError(f"{argname} must be a CPU tensor, got a tensor on {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{argname} must be contiguous (call .contiguous() first)")
    t = t.detach()
    if str(t.dtype) == "torch.bfloat16":
        return t.view(_torch().int16).numpy(), SHM_BFLOAT16
    try:
        return t.numpy(), -1
    except TypeError as exc:
        raise TypeError(f"{argname} has unsupported dtype {t.dtype}: {exc}") from None


cdef object _torch_mod = None


cdef object _torch():
    global _torch_mod
    if _torch_mod is None:
        import torch
        _torch_mod = torch
    return _torch_mod


cdef object _Tensor = None  # torch.Tensor, once torch is imported (by the user: never here)


cdef inline bint _is_torch_tensor(object obj):
    global _Tensor
    if _Tensor is None:
        torch = sys.modules.get("torch")
        if torch is None or not hasattr(torch, "Tensor"):
            return False
        _Tensor = torch.Tensor
    return isinstance(obj, _Tensor)


# (dtype code, itemsize) by torch dtype: reading a tensor's pointer and sizes directly costs
# ~0.3 us, going through tensor.numpy() cost 2-3 us per call.
cdef dict _torch_dtype_info = {}


cdef tuple _torch_dtype(object dt, str argname):
    info = _torch_dtype_info.get(dt)
    if info is None:
        probe = _torch().empty(0, dtype=dt)
        try:
            view, code = _torch_to_numpy(probe, argname)
            info = (code if code >= 0 else dtype_code(view.dtype), probe.element_size(),
                    probe.is_complex())
        except TypeError:
            info = (-1, 0, False)
        _torch_dtype_info[dt] = info
    if info[0] < 0:
        raise TypeError(f"{argname} has unsupported dtype {dt}")
    return info


cdef int _not_as_it_is(object t, tuple info) except -1:
    """0 when the memory of tensor ``t`` (of a dtype the core knows: ``info``) holds its values
    as the collectives read them; else why not: 1 not on the CPU, 2 not contiguous, 3 a lazy
    view (z.conj(), z.conj().imag), whose memory holds the values before the conjugation or
    negation that reading it applies. The one home of these checks."""
    if not t.is_cpu:
        return 1
    if not t.is_contiguous():
        return 2
    if t.is_neg() or (info[2] and t.is_conj()):
        return 3
    return 0


# The tensor reader of shmcomm/torch_ops/tensors.cpp (native.py hands it over once the library
# is loaded; NULL until then): a plain tensor's pointer, count and dtype in one C call, where the
# reads below go through Python six times (~0.36 us a collective). It declines (0) any tensor the
# core does not take as it is; those take the Python reads, which name what is wrong.
ctypedef struct tensor_view_t:
    void *data
    int64_t numel
    int dtype
ctypedef int (*tensor_reader_t)(PyObject *, tensor_view_t *) noexcept
cdef tensor_reader_t _tensor_reader = NULL


def use_tensor_reader(size_t address) -> None:
    """Read tensors with the C function at ``address`` (``shmcomm_read_tensor`` of the native
    library, shmcomm/torch_ops/native.py), or through Python again (0). Internal: an address
    that is not such a function crashes the process at the next tensor.

    Example::

        use_tensor_reader(0)   # back to the Python reads
    """
    global _tensor_reader
    _tensor_reader = <tensor_reader_t><void *>address


def tensor_reader_in_use() -> bool:
    """True once the native tensor reader serves (see ``use_tensor_reader``).

    Example::

        tensor_reader_in_use()   # True in a rank with a shmcomm torch group, where it built
    """
    return _tensor_reader != NULL


def native_tensor_view(t):
    """``(address, count, dtype name)`` of tensor ``t`` as the native reader gives them to the
    core; None where it declines ``t`` (the Python reads serve it) or no reader is in use.

    Example::

        native_tensor_view(torch.ones(3))   # (140..., 3, "float32") once the reader serves
    """
    cdef buf_t b
    if not _read_tensor(t, &b):
        return None
    return <size_t>b.ptr, b.count, DTYPE_NAMES[b.dtype]


cdef inline bint _read_tensor(object t, buf_t *out):
    """Fill ``out`` from the native reader; False where there is none or it declines ``t``."""
    cdef tensor_view_t view
    if _tensor_reader == NULL or not _tensor_reader(<PyObject *>t, &view) \
            or not 0 <= view.dtype < SHM_NDTYPES:  # (a code the core lacks: the Python reads)
        return False
    out.ptr = <char *>view.data
    out.dtype = view.dtype
    out.itemsize = shm_dtype_itemsizes[view.dtype]
    out.count = <size_t>view.numel
    out.nbytes = out.count * out.itemsize
    return True


cdef object _torch_buf(object t, buf_t *out, str argname):
    """Fill ``out`` straight from a CPU tensor's storage; the tensor is the owner."""
    cdef tuple info
    if _read_tensor(t, out):
        return t
    if type(t) is not _Tensor and type(t).__torch_dispatch__ is not _Tensor.__torch_dispatch__:
        # a wrapper subclass (DTensor, a functional collective's AsyncCollectiveTensor): its
        # data_ptr() is not its data (it was 0: the collective wrote through a null pointer)
        raise TypeError(f"{argname} is a {type(t).__name__}, a tensor subclass whose data lives "
                        f"elsewhere; pass a plain tensor (DTensor: .to_local(); a functional "
                        f"collective's result: wait for it, e.g. torch.distributed._functional_"
                        f"collectives.wait_tensor)")
    info = _torch_dtype(t.dtype, argname)
    try:
        why = _not_as_it_is(t, info)
        out.ptr = <char *><size_t>t.data_ptr()
    except RuntimeError:  # sparse, mkldnn, ...: no strided memory (checked here for free)
        raise ValueError(f"{argname} must be a dense (strided) tensor, got layout {t.layout}") from None
    if why == 1:
        raise ValueError(f"{argname} must be a CPU tensor, got a tensor on {t.device}")
    if why == 2:
        raise ValueError(f"{argname} must be contiguous (call .contiguous() first)")
    if why == 3:
        raise ValueError(f"{argname} is a lazily conjugated or negated view; call "
                         f".resolve_conj().resolve_neg() first")
    out.dtype = info[0]
    out.itemsize = info[1]
    out.count = t.numel()
    out.nbytes = out.count * out.itemsize
    return t


def tensor_is_direct(t) -> bool:
    """True when the collectives take tensor ``t`` by its memory as it is: a plain
    ``torch.Tensor`` (not a subclass) on the CPU, contiguous, of a dtype the core reduces, and
    not a lazily conjugated or negated view. Any other tensor needs a copy (or is refused).
    The torch backend asks this before every call (the checks are ``_torch_buf``'s).

    Example::

        tensor_is_direct(torch.ones(4))        # True
        tensor_is_direct(torch.ones(4, 4).T)   # False: not contiguous
    """
    cdef tuple info
    cdef buf_t unused
    if not _is_torch_tensor(t) or type(t) is not _Tensor:
        return False
    if _read_tensor(t, &unused):
        return True
    info = _torch_dtype_info.get(t.dtype)
    if info is None:  # first sight of this dtype: classify it (a refused dtype is not direct)
        try:
            info = _torch_dtype(t.dtype, "tensor")
        except TypeError:
            return False
    try:
        return info[0] >= 0 and _not_as_it_is(t, info) == 0
    except RuntimeError:  # sparse: no strided memory (mkldnn is refused when it is taken)
        return False


cdef object as_buf(object obj, buf_t *out, bint writable, str argname):
    """Fill ``out`` for ``obj`` and return the object that must stay alive while ``out`` is used."""
    cdef cnp.ndarray arr
    cdef int forced = -1
    if isinstance(obj, cnp.ndarray):
        arr = <cnp.ndarray>obj
    elif _is_torch_tensor(obj):
        return _torch_buf(obj, out, argname)
    else:
        try:
            view = memoryview(obj)
        except TypeError:
            raise TypeError(f"{argname} must be a numpy array, a torch CPU tensor or a buffer-protocol "
                            f"object, got {type(obj).__name__}") from None
        arr = np.asarray(view)
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise ValueError(f"{argname} must be C-contiguous (use np.ascontiguousarray)")
    if writable and not cnp.PyArray_ISWRITEABLE(arr):
        raise ValueError(f"{argname} must be writable")
    out.dtype = forced if forced >= 0 else dtype_code(<object>cnp.PyArray_DESCR(arr))
    if out.dtype < 0:
        raise TypeError(f"{argname} has unsupported dtype {arr.dtype}")
    out.ptr = <char *>cnp.PyArray_DATA(arr)
    out.itemsize = <int>cnp.PyArray_ITEMSIZE(arr)
    out.count = <size_t>cnp.PyArray_SIZE(arr)
    out.nbytes = out.count * out.itemsize
    return arr


def as_numpy(obj, str argname="array", bint writable=False):
    """Return ``(ndarray view, dtype name)`` of ``obj`` exactly as collectives see it."""
    cdef buf_t b
    arr = as_buf(obj, &b, writable, argname)
    if _is_torch_tensor(arr):
        arr = _torch_to_numpy(arr, argname)[0]
    return arr, DTYPE_NAMES[b.dtype]
