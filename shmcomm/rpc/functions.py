"""Decorators for functions run through RPC.

``async_execution`` marks a function that returns a Future: the callee sends the reply when that
Future completes instead of when the function returns, so the function can wait for other RPCs
without holding a thread::

    from shmcomm import rpc

    @rpc.functions.async_execution
    def async_add_chained(to, x, y, z):
        return rpc.rpc_async(to, operator.add, args=(x, y)).then(lambda fut: fut.wait() + z)

    rpc.rpc_sync("worker1", async_add_chained, args=("worker2", 1, 1, 1))   # 3
"""

from __future__ import annotations

import functools
from typing import Any, Callable

__all__ = ["async_execution", "is_async_execution"]

_MARK = "_shmcomm_async_execution"


def async_execution(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` as returning a Future whose value is the RPC's reply (sent once it completes).

    The callee's thread is free while the Future is pending, so the function can wait for other
    RPCs. The returned Future may be a ``shmcomm.Future``, a ``torch.futures.Future`` or anything
    with ``add_done_callback`` and ``value``. With ``@staticmethod`` or ``@classmethod`` it must
    be the inner decorator; it also works on plain methods called through an instance or an
    RRef proxy. Called directly (not through RPC), the function returns its Future.

    Args:
        fn (Callable): a function that returns a Future.

    Returns:
        Callable: ``fn``, wrapped and marked (``functools.wraps`` keeps its name and docstring).

    Raises:
        TypeError: ``fn`` is not callable. Through RPC, the caller gets a ``TypeError`` when
            ``fn`` returns something that is not a Future.

    Example::

        class Adder:
            @staticmethod
            @rpc.functions.async_execution
            def static_add(to, x, y):
                return rpc.rpc_async(to, operator.add, args=(x, y))

        rpc.rpc_sync("worker1", Adder.static_add, args=("worker2", 1, 2))   # 3
    """
    if not callable(fn):
        raise TypeError(f"async_execution needs a callable, got {type(fn).__name__}")

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    setattr(wrapper, _MARK, True)
    # torch's marker too, so code that checks for it recognises these functions as well.
    wrapper._wrapped_async_rpc_function = fn  # type: ignore[attr-defined]
    return wrapper


def is_async_execution(fn: Any) -> bool:
    """Whether ``fn`` (a function, bound method, static or class method) is marked by
    ``async_execution`` (or torch's own decorator).

    Example::

        assert rpc.functions.is_async_execution(Adder.static_add)
    """
    try:
        return bool(getattr(fn, _MARK, False)) or hasattr(fn, "_wrapped_async_rpc_function")
    except Exception:  # noqa: BLE001 - objects with exotic __getattr__
        return False
