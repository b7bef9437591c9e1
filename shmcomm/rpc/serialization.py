"""Pickling for RPC messages: protocol 5 with out-of-band buffers, and remote exceptions.

``dumps(obj, dst)`` returns the pickle stream and the list of raw buffers that pickle left out of
it (numpy arrays natively, torch CPU tensors through a reducer registered here), so the transport
copies each large buffer once into shared memory and the receiver reads it straight into a new
array that the unpickled object then wraps::

    data, buffers = dumps((np.arange(1 << 20), "tag"), dst=1)
    obj = loads(data, buffers)

What pickle refuses (a lambda, a function defined inside another) is pickled again by the process
pickler of ``shmcomm.pickling``: by default cloudpickle, arrays still out of band; a pickler set
with ``sc.set_pickler`` writes bytes that the receiver's own pickler reads.

Exceptions raised by a callee travel as ``pack_exception(exc)`` and come back, through
``unpack_exception``, as an exception of the same type whose message holds the remote traceback
(or as ``RemoteError`` when that type cannot be rebuilt from a message).
"""

from __future__ import annotations

import copyreg
import importlib
import io
import pickle
import sys
import threading
import traceback
import types

import numpy as np

from shmcomm import pickling

__all__ = ["RemoteError", "dumps", "dumps_call", "dumps_value", "loads", "loads_call",
           "loads_value", "pack_exception", "unpack_exception", "current_dst", "first_in_message",
           "resolve_function"]

def current_dst():
    """Rank the message being pickled on this thread goes to (None outside ``dumps``).

    Example::

        if current_dst() == owner_rank: ...   # an RRef travelling home needs no new reference
    """
    return _state.t.dst


def first_in_message(obj) -> bool:
    """True the first time pickling the current message meets ``obj``; False when the message is
    pickled again by value after pickle refused it (see ``dumps``), so a side effect of a
    ``__reduce__`` (an RRef counting its copy) happens once per message. True outside ``dumps``.

    Example::

        if first_in_message(self): notify_owner()
    """
    st = _state.t
    seen = st.seen
    if seen is None:
        return True
    if id(obj) in seen:   # alive until the message is pickled: its id names it meanwhile
        return False
    if not seen:
        seen = st.seen = set()
    seen.add(id(obj))
    return True


# ---- arrays and tensors out of band -------------------------------------------------------------
# numpy's own reduction already goes out of band but costs ~10 us a call (Python-level helpers on
# both sides); these do the same in a few attribute reads. Anything unusual (object or structured
# dtypes, non-contiguous arrays, sparse or GPU tensors, subclasses) takes the stock path.
def _rebuild_array(buf, dtype: str, shape: tuple):
    return np.frombuffer(buf, dtype).reshape(shape)


def _reduce_array(a):
    if not a.flags.c_contiguous or not a.dtype.isbuiltin or a.dtype.hasobject:
        return a.__reduce_ex__(5)
    return (_rebuild_array, (pickle.PickleBuffer(a), a.dtype.str, a.shape))


def _rebuild_tensor(buf, dtype: str, shape: tuple, requires_grad: bool, view_as):
    import torch

    t = torch.from_numpy(np.frombuffer(buf, dtype).reshape(shape))  # wraps the received bytes
    if view_as is not None:
        t = t.view(getattr(torch, view_as))
    if requires_grad:
        t.requires_grad_(True)
    return t


def _reduce_tensor(t):
    view_as = None
    try:
        a = t.detach().numpy()   # CPU, strided, dtype numpy knows, no conj/neg bit
    except (TypeError, RuntimeError):
        try:
            name = str(t.dtype).rsplit(".", 1)[-1]
            if name not in ("bfloat16", "float16"):
                return t.__reduce_ex__(5)
            a = t.detach().view(_torch().int16).numpy()
            view_as = name
        except (TypeError, RuntimeError):
            return t.__reduce_ex__(5)  # torch's own path: in band, but right for anything
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return (_rebuild_tensor, (pickle.PickleBuffer(a), a.dtype.str, a.shape, t.requires_grad, view_as))


_torch_mod = None


def _torch():
    global _torch_mod
    if _torch_mod is None:
        import torch

        _torch_mod = torch
    return _torch_mod


def _dispatch_table(base=copyreg.dispatch_table) -> dict:
    """``base`` plus the reducers above (torch's only once torch is imported). A plain dict: the
    C pickler looks every object up in it, and a ChainMap would be a Python call each time."""
    table = dict(base)
    table[np.ndarray] = _reduce_array
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "Tensor"):
        table[torch.Tensor] = _reduce_tensor
    return table


class _Thread:
    """One thread's pickling state. A plain object reached through one thread-local read: each
    attribute of a threading.local costs a dictionary lookup of the thread, on every message."""

    __slots__ = ("dst", "seen", "ctx")

    def __init__(self) -> None:
        self.dst = None
        self.seen = None    # ids first_in_message met in the message being pickled; None: none is
        self.ctx = None     # (file, pickler, buffers, stamp, in_use) reused by this thread


class _State(threading.local):
    def __init__(self) -> None:
        self.t = _Thread()


_state = _State()


def _stamp():
    return (len(copyreg.dispatch_table), "torch" in sys.modules)


def _new_ctx():
    buffers: list = []
    f = io.BytesIO()
    p = pickle.Pickler(f, 5, buffer_callback=buffers.append)
    p.dispatch_table = _dispatch_table()
    return [f, p, buffers, _stamp(), False]


def dumps(obj, dst=None) -> tuple[bytes, list]:
    """Pickle ``obj`` for rank ``dst``; returns ``(stream, raw out-of-band buffers)``.

    This thread's stdlib pickler, reused: by reference, buffers out of band; what it refuses
    goes by value (``_dumps_by_value``). Example::

        data, bufs = dumps({"x": np.ones(4)}, dst=0)   # len(bufs) == 1
    """
    st = _state.t
    prev_dst, prev_seen = st.dst, st.seen
    st.dst = dst
    st.seen = ()   # in a message, nothing met yet: first_in_message makes the set if needed
    try:
        ctx = st.ctx
        if ctx is None or ctx[4] or ctx[3] != _stamp():
            if ctx is None or not ctx[4]:
                ctx = st.ctx = _new_ctx()
            else:  # pickling inside pickling (an RRef's __reduce__ sends a note): a fresh one
                ctx = _new_ctx()
        f, p, buffers = ctx[0], ctx[1], ctx[2]
        ctx[4] = True
        try:
            f.seek(0)
            f.truncate()
            p.dump(obj)
            return f.getvalue(), [b.raw() for b in buffers] if buffers else []
        except pickling.REFUSED as exc:
            refused = exc
        finally:
            p.clear_memo()   # the memo holds every object pickled: keep nothing alive
            buffers.clear()
            ctx[4] = False
        return _dumps_by_value(obj, refused)
    finally:
        st.dst = prev_dst
        st.seen = prev_seen


def _dumps_by_value(obj, refused: BaseException) -> tuple[bytes, list]:
    """``dumps`` of what pickle ``refused``: cloudpickle with the same out-of-band buffers when the
    default pickler is in use, else the process pickler's bytes inside a stdlib stream (which
    the receiver's ``loads`` turns back into the object with its own pickler)."""
    if not pickling.uses_default_dumps():
        return pickle.dumps(_Pickled(pickling.dumps(obj)), 5), []
    cloudpickle = pickling.cloudpickle_for(refused)
    buffers: list = []
    f = io.BytesIO()
    # a fresh one each time: a cloudpickle Pickler keeps per-message state (globals it met)
    p = cloudpickle.Pickler(f, 5, buffer_callback=buffers.append)
    p.dispatch_table = _dispatch_table(cloudpickle.Pickler.dispatch_table)
    p.dump(obj)
    return f.getvalue(), [b.raw() for b in buffers]


class _Pickled:
    """Bytes of the process pickler travelling in a stdlib pickle stream; unpickled, the object.

    Example::

        pickle.loads(pickle.dumps(_Pickled(pickling.dumps(obj))))   # obj, by pickling.loads
    """

    __slots__ = ("data",)

    def __init__(self, data) -> None:
        self.data = data

    def __reduce__(self):
        return (pickling.loads, (bytes(self.data),))


_SIMPLE = frozenset({int, float, str, bytes, bool, complex, type(None)})
_BY_NAME = frozenset({types.FunctionType, types.BuiltinFunctionType})


# Functions travel as (module, qualname), looked up once per side and cached: pickle would look
# them up (import + getattr chain) on every call, both ways.
_fn_keys: dict = {}
_fn_by_key: dict = {}


def _function_key(func):
    """``(module, qualname)`` of a module-level function, or None (then pickle decides)."""
    key = _fn_keys.get(func)
    if key is None:
        module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", None)
        if not module or not qualname or "<" in qualname:
            return None
        obj = _resolve(module, qualname)
        if obj is not func:
            return None
        key = _fn_keys[func] = (module, qualname)
    return key


def resolve_function(func):
    """The callable a request names: ``func`` itself, or the function of a ``(module, qualname)``.

    Example::

        resolve_function(("operator", "add"))(1, 2)     # 3
    """
    if type(func) is not tuple:
        return func
    fn = _fn_by_key.get(func)
    if fn is None:
        module, qualname = func
        fn = importlib.import_module(module)
        for part in qualname.split("."):
            fn = getattr(fn, part)
        _fn_by_key[func] = fn
    return fn


FLAT = 1   # frame flag: the payload is the short form below, arrays and tensors as raw buffers


def _flat(a):
    """``(meta, raw bytes)`` of an exact ndarray or plain CPU tensor that travels as its bytes,
    else None (then the general pickling decides)."""
    t = type(a)
    if t is np.ndarray:
        if a.flags.c_contiguous and a.dtype.isbuiltin and not a.dtype.hasobject:
            return (a.dtype.str, a.shape, False), pickle.PickleBuffer(a).raw()
        return None
    torch = _torch_mod or (_torch() if "torch" in sys.modules else None)
    if torch is not None and t is torch.Tensor and not a.requires_grad:
        try:
            n = a.numpy()   # refuses GPU, sparse, conjugate views and dtypes numpy lacks
        except (TypeError, RuntimeError):
            return None
        if n.flags.c_contiguous:
            return (n.dtype.str, n.shape, True), pickle.PickleBuffer(n).raw()
    return None


def _unflat(meta, buf):
    dtype, shape, tensor = meta
    a = (buf.view(dtype) if type(buf) is np.ndarray else np.frombuffer(buf, dtype)).reshape(shape)
    return _torch().from_numpy(a) if tensor else a


def dumps_call(func, args: tuple, kwargs, dst=None) -> tuple[bytes, list, int]:
    """Pickle a request ``(func, args, kwargs)`` for rank ``dst``: ``(stream, buffers, flags)``.

    A module-level function travels as its name. When every argument is a scalar, a string, an
    ndarray or a plain CPU tensor and there are no kwargs (the common case), the stream is only
    names, numbers and shapes (``flags == FLAT``), and the arrays go out of band as raw bytes;
    anything else takes the general path. ``loads_call`` is the inverse::

        data, bufs, flags = dumps_call(operator.add, (1, 2), None, dst=1)
        func, args, kwargs = loads_call(data, bufs, flags)
    """
    if type(func) in _BY_NAME:
        key = _function_key(func)
        if key is not None:
            func = key
            if kwargs is None:
                metas = bufs = None
                for i, a in enumerate(args):
                    if type(a) in _SIMPLE:
                        continue
                    flat = _flat(a)
                    if flat is None:
                        break
                    if metas is None:
                        metas, bufs, args = [], [], list(args)
                    metas.append((i, flat[0]))
                    bufs.append(flat[1])
                    args[i] = None
                else:
                    if metas is None:
                        return pickle.dumps((key, args, None), 5), [], 0
                    return pickle.dumps((key, tuple(args), None, tuple(metas)), 5), bufs, FLAT
    data, bufs = dumps((func, args, kwargs), dst)
    return data, bufs, 0


def loads_call(data: bytes, buffers: list, flags: int):
    """``(func, args, kwargs)`` of a request made by ``dumps_call`` (func resolved).

    Example::

        func, args, kwargs = loads_call(data, bufs, flags)
    """
    if flags & FLAT:
        key, args, kwargs, metas = pickle.loads(data)
        args = list(args)
        for (i, meta), buf in zip(metas, buffers):
            args[i] = _unflat(meta, buf)
        return resolve_function(key), args, kwargs
    func, args, kwargs = loads(data, buffers)
    return resolve_function(func), args, kwargs


def dumps_value(value, dst=None) -> tuple[bytes, list, int]:
    """Pickle a reply value for rank ``dst``: ``(stream, buffers, flags)``, with short forms for
    scalars, strings, ndarrays and plain CPU tensors. ``loads_value`` is the inverse::

        data, bufs, flags = dumps_value(np.ones(3), dst=0)
    """
    if type(value) in _SIMPLE:
        return pickle.dumps(value, 5), [], 0
    flat = _flat(value)
    if flat is not None:
        return pickle.dumps(flat[0], 5), [flat[1]], FLAT
    data, bufs = dumps(value, dst)
    return data, bufs, 0


def loads_value(data: bytes, buffers: list, flags: int):
    """The value of a reply made by ``dumps_value``.

    Example::

        value = loads_value(data, bufs, flags)
    """
    if flags & FLAT:
        return _unflat(pickle.loads(data), buffers[0])
    return loads(data, buffers)


def loads(data: bytes, buffers: list):
    """Inverse of ``dumps``: ``buffers`` are the received arrays, wrapped without a copy.

    Example::

        obj = loads(data, bufs)
    """
    return pickle.loads(data, buffers=buffers) if buffers else pickle.loads(data)


# ---- exceptions ---------------------------------------------------------------------------------
class RemoteError(RuntimeError):
    """An exception raised by a remote function whose type could not be rebuilt on the caller.

    Raised by ``rpc_sync``, a Future's ``wait()`` and ``RRef.to_here()`` in place of the callee's
    exception. Its message is the remote message followed by the remote traceback;
    ``exc_type`` names the remote type (``module.QualName``), ``remote_traceback`` holds the
    traceback text, ``original`` is the unpickled exception when that worked (else None).

    Example::

        try:
            rpc.rpc_sync("worker1", fails)
        except rpc.RemoteError as e:
            print(e.exc_type, e.remote_traceback)
    """

    def __init__(self, message: str, exc_type: str = "", remote_traceback: str = "", original=None):
        super().__init__(message)
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback
        self.original = original

    def __reduce__(self):
        return (type(self), (self.args[0] if self.args else "", self.exc_type, self.remote_traceback, None))


def pack_exception(exc: BaseException, worker: str) -> tuple:
    """What travels back for a callee's exception: type name, text, traceback, pickled state.

    Example::

        info = pack_exception(ValueError("bad"), "worker1")
    """
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        # args and attributes, not the exception itself: rebuilding through __new__ works for
        # types whose __init__ takes other arguments than their args (which plain pickle breaks)
        state = pickle.dumps((exc.args, dict(getattr(exc, "__dict__", {}))), 5)
    except Exception:  # noqa: BLE001 - an unpicklable attribute: the type and text still travel
        state = None
    cls = type(exc)
    return (cls.__module__, cls.__qualname__, _safe_str(exc), tb, state, worker)


def _safe_str(exc) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001
        return f"<unprintable {type(exc).__name__}>"


def _resolve(module: str, qualname: str):
    """The object named ``module.qualname``, or None if it cannot be imported."""
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:  # noqa: BLE001
        return None
    return obj


def _find_type(module: str, qualname: str):
    obj = _resolve(module, qualname)
    return obj if isinstance(obj, type) and issubclass(obj, BaseException) else None


def _make(cls, args: tuple, attrs: dict):
    exc = cls.__new__(cls, *args)
    exc.args = args
    for key, value in attrs.items():
        try:
            setattr(exc, key, value)
        except Exception:  # noqa: BLE001 - read-only attribute
            pass
    return exc


def unpack_exception(info: tuple) -> BaseException:
    """The exception to raise on the caller: same type, message with the remote traceback.

    Example::

        raise unpack_exception(info)
    """
    module, qualname, text, tb, state, worker = info
    args, attrs = (), {}
    if state is not None:
        try:
            args, attrs = pickle.loads(state)
        except Exception:  # noqa: BLE001 - an attribute of a type missing here
            args, attrs = (text,), {}
    cls = _find_type(module, qualname)
    type_name = qualname if module == "builtins" else f"{module}.{qualname}"
    message = f"{text}\n\nOn {worker}, remote traceback:\n{tb.rstrip()}"
    original = None
    if cls is not None:
        try:
            original = _make(cls, tuple(args), attrs)
        except Exception:  # noqa: BLE001
            original = None
        try:
            rebuilt = _make(cls, (message,), attrs)
            if _message_kept(rebuilt, tb):
                return rebuilt
        except Exception:  # noqa: BLE001 - a __new__ that wants other arguments
            pass
    return RemoteError(f"{type_name}: {message}", type_name, tb, original)


def _message_kept(exc, tb: str) -> bool:
    """False for a type whose __init__ drops or rewrites its message (then RemoteError is better)."""
    try:
        return "remote traceback:" in str(exc)
    except Exception:  # noqa: BLE001
        return False
