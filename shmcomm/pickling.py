"""The process-wide pickler of the object collectives and RPC, as mpi4py's ``MPI.pickle``.

By default an object is pickled by reference where pickle can do it, so an instance of a class
of the script is an instance of that same class on every rank, and by value with cloudpickle
where pickle refuses: lambdas, functions and classes defined inside functions, and functions
that their module lacks by name (a notebook's, in the ranks of ``sc.spawn``). Loading is
``pickle.loads``. Another pickler (dill, a restricted unpickler, a counting wrapper) is set on
every process::

    import dill
    sc.set_pickler(dill.dumps, dill.loads)
    out = [None] * sc.get_world_size()
    sc.all_gather_object(out, lambda x: x + sc.get_rank())
    sc.set_pickler()                          # the default again
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, NamedTuple

__all__ = ["Pickler", "set_pickler", "get_pickler", "default_dumps", "dumps", "loads",
           "uses_default_dumps", "cloudpickle_module", "cloudpickle_for", "REFUSED"]

DEFAULT_PROTOCOL = 5  # out-of-band buffers; every supported Python has it

# What pickle raises for what cloudpickle can pickle by value: PicklingError for a lambda or a
# function that its module lacks, AttributeError for a local object, TypeError for modules, code
# objects and cells. Unpicklable things (locks, sockets) fail again with cloudpickle's error.
REFUSED = (pickle.PicklingError, AttributeError, TypeError)


class Pickler(NamedTuple):
    """The pickling functions in use: ``dumps(obj[, protocol]) -> bytes`` and
    ``loads(bytes) -> obj``. ``protocol`` is passed to ``dumps`` as its second argument, or not
    at all when it is None. ``get_pickler`` returns one; ``set_pickler(*p)`` restores it::

        saved = sc.get_pickler()   # Pickler(dumps=default_dumps, loads=pickle.loads, protocol=5)
        sc.set_pickler(*saved)
    """

    dumps: Callable[..., Any]
    loads: Callable[[bytes], Any]
    protocol: int | None


_cloudpickle: Any = None  # the module once imported; False when it is not installed


def cloudpickle_module() -> Any:
    """The cloudpickle module, imported on first use, or None when it is not installed.

    Example::

        cp = cloudpickle_module()
        data = cp.dumps(lambda: 1) if cp is not None else None
    """
    global _cloudpickle
    if _cloudpickle is None:
        try:
            import cloudpickle
        except ImportError:
            cloudpickle = False
        _cloudpickle = cloudpickle
    return _cloudpickle or None


def cloudpickle_for(refused: BaseException) -> Any:
    """The cloudpickle module, to pickle by value what pickle ``refused``; without cloudpickle,
    raises ``refused`` itself with a note saying to install it.

    Example::

        try:
            data = pickle.dumps(obj)
        except REFUSED as exc:
            data = cloudpickle_for(exc).dumps(obj)
    """
    cloudpickle = cloudpickle_module()
    if cloudpickle is None:
        if hasattr(refused, "add_note"):   # Python 3.11+
            refused.add_note("shmcomm: install cloudpickle to pickle it by value")
        raise refused
    return cloudpickle


def default_dumps(obj: Any, protocol: int = DEFAULT_PROTOCOL) -> bytes:
    """``pickle.dumps``, or ``cloudpickle.dumps`` for what pickle refuses (see the module text).

    Example::

        pickle.loads(default_dumps(lambda x: 2 * x))(3)    # 6
    """
    try:
        return pickle.dumps(obj, protocol)
    except REFUSED as exc:
        refused = exc
    return cloudpickle_for(refused).dumps(obj, protocol)


_DEFAULT = Pickler(default_dumps, pickle.loads, DEFAULT_PROTOCOL)
_current = _DEFAULT


def _check_callable(value: Any, name: str, default: Callable[..., Any]) -> Callable[..., Any]:
    if value is None:
        return default
    if not callable(value):
        raise TypeError(f"{name} must be a callable or None, got {type(value).__name__}")
    return value


def set_pickler(dumps: Callable[..., Any] | None = None,
                loads: Callable[[bytes], Any] | None = None,
                protocol: int | None = None) -> Pickler:
    """Set how this process pickles the objects of object collectives and RPC.

    As mpi4py's ``MPI.pickle.__init__(dumps, loads, protocol)``: every process of the job must set
    the same one (the bytes one writes, another reads). RPC keeps its own faster pickling for the
    calls pickle handles (names of functions, arrays and tensors out of band) and uses this
    pickler for the rest.

    Args:
        dumps (Callable | None): ``dumps(obj[, protocol]) -> bytes``; None (the default):
            :func:`default_dumps` (pickle, and cloudpickle for what pickle refuses).
        loads (Callable | None): ``loads(bytes) -> obj``; None (the default): ``pickle.loads``.
        protocol (int | None): passed to ``dumps`` as its second argument (negative: the
            highest); None (the default): 5 for the default dumps and ``pickle.dumps``, none
            for any other dumps.

    Returns:
        Pickler: the pickler it replaces; ``set_pickler(*previous)`` restores it.

    Raises:
        TypeError: ``dumps`` or ``loads`` is not callable; ``protocol`` is not an int.
        ValueError: ``protocol`` is above ``pickle.HIGHEST_PROTOCOL``.

    Example::

        import dill
        sc.set_pickler(dill.dumps, dill.loads)       # on every rank
        sc.broadcast_object_list(objs, src=0)
        previous = sc.set_pickler()                  # back to the default
        sc.set_pickler(*previous)                    # and back to dill
    """
    global _current
    dumps = _check_callable(dumps, "dumps", default_dumps)
    loads = _check_callable(loads, "loads", pickle.loads)
    if protocol is None:
        protocol = DEFAULT_PROTOCOL if dumps is default_dumps or dumps is pickle.dumps else None
    elif isinstance(protocol, bool) or not isinstance(protocol, int):
        raise TypeError(f"protocol must be an int or None, got {type(protocol).__name__}")
    elif protocol > pickle.HIGHEST_PROTOCOL:
        raise ValueError(f"protocol must be at most pickle.HIGHEST_PROTOCOL="
                         f"{pickle.HIGHEST_PROTOCOL} (negative: the highest), got {protocol}")
    previous, _current = _current, Pickler(dumps, loads, protocol)
    return previous


def get_pickler() -> Pickler:
    """The pickler this process uses for object collectives and RPC (see :func:`set_pickler`).

    Returns:
        Pickler: a named tuple ``(dumps, loads, protocol)``.

    Example::

        sc.get_pickler().protocol            # 5
        sc.get_pickler().loads is pickle.loads
    """
    return _current


def uses_default_dumps() -> bool:
    """Whether the default dumps is in use (then RPC may pickle by value with cloudpickle itself).

    Example::

        if uses_default_dumps(): ...
    """
    return _current.dumps is default_dumps


def dumps(obj: Any) -> bytes | bytearray | memoryview:
    """``obj`` pickled by the process pickler; ``TypeError`` if its dumps returns no bytes.

    Example::

        data = dumps({"rank": 0})
    """
    p = _current
    data = p.dumps(obj) if p.protocol is None else p.dumps(obj, p.protocol)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"the pickler's dumps {getattr(p.dumps, '__qualname__', p.dumps)!r} "
                        f"returned {type(data).__name__}, not bytes")
    return data


def loads(data: bytes) -> Any:
    """The object of ``data``, made by ``dumps`` (here or on another process).

    Example::

        loads(dumps([1, 2]))        # [1, 2]
    """
    return _current.loads(data)
