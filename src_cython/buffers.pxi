# Buffer handling in one place: turn a user's array (numpy array, torch CPU tensor, any
# C-contiguous buffer-protocol object) into a pointer, a size and a dtype code, and keep an owner
# object alive while the pointer is in use.
cimport numpy as cnp

cnp.import_array()

ctypedef struct buf_t:
    char *ptr
    size_t nbytes
    size_t count
    int dtype
    int itemsize

# dtype code by numpy dtype; filled lazily since dtype objects hash quickly.
cdef dict _dtype_codes = {}

DTYPE_NAMES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
               "float16", "bfloat16", "float32", "float64", "longdouble", "complex64",
               "complex128", "clongdouble")


cdef int _dtype_code_slow(object dt) except -2:
    cdef str kind = dt.kind
    cdef int size = dt.itemsize
    if kind == "b":
        return SHM_BOOL
    if kind == "i":
        return {1: SHM_INT8, 2: SHM_INT16, 4: SHM_INT32, 8: SHM_INT64}.get(size, -1)
    if kind == "u":
        return {1: SHM_UINT8, 2: SHM_UINT16, 4: SHM_UINT32, 8: SHM_UINT64}.get(size, -1)
    if kind == "f":
        if size > 8 and dt == np.dtype(np.longdouble):
            return SHM_LONGDOUBLE
        return {2: SHM_FLOAT16, 4: SHM_FLOAT32, 8: SHM_FLOAT64}.get(size, -1)
    if kind == "c":
        if size > 16 and dt == np.dtype(np.clongdouble):
            return SHM_CLONGDOUBLE
        return {8: SHM_COMPLEX64, 16: SHM_COMPLEX128}.get(size, -1)
    if dt.name == "bfloat16" and size == 2:  # ml_dtypes
        return SHM_BFLOAT16
    return -1


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
            info = (code if code >= 0 else dtype_code(view.dtype), probe.element_size())
        except TypeError:
            info = (-1, 0)
        _torch_dtype_info[dt] = info
    if info[0] < 0:
        raise TypeError(f"{argname} has unsupported dtype {dt}")
    return info


cdef object _torch_buf(object t, buf_t *out, str argname):
    """Fill ``out`` straight from a CPU tensor's storage; the tensor is the owner."""
    cdef tuple info = _torch_dtype(t.dtype, argname)
    if not t.is_cpu:
        raise ValueError(f"{argname} must be a CPU tensor, got a tensor on {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{argname} must be contiguous (call .contiguous() first)")
    out.dtype = info[0]
    out.itemsize = info[1]
    out.count = t.numel()
    out.nbytes = out.count * out.itemsize
    out.ptr = <char *><size_t>t.data_ptr()
    return t


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
