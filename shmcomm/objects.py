"""Collectives on picklable Python objects, built on the byte collectives of a group.

Objects are pickled by the process pickler (``sc.set_pickler``; by default pickle, and
cloudpickle for lambdas and local functions), their sizes exchanged first, then the bytes::

    out = [None] * sc.get_world_size()
    sc.all_gather_object(out, {"rank": sc.get_rank(), "f": lambda x: x + 1})
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from shmcomm import pickling

__all__ = ["broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list"]


def _dumps(obj) -> np.ndarray:
    return np.frombuffer(pickling.dumps(obj), dtype=np.uint8)


def _loads(buf: np.ndarray):
    return pickling.loads(buf.tobytes())


def broadcast_object_list(group: Any, object_list: list[Any], src: int = 0) -> None:
    """Replace ``object_list``'s items on every rank with those of rank ``src``."""
    if not isinstance(object_list, list):
        raise TypeError(f"object_list must be a list, got {type(object_list).__name__}")
    size = np.zeros(1, np.int64)
    payload = _dumps(object_list) if group.rank == src else None
    if payload is not None:
        size[0] = payload.size
    group.broadcast(size, src)
    if payload is None:
        payload = np.empty(int(size[0]), np.uint8)
    group.broadcast(payload, src)
    if group.rank != src:
        received = _loads(payload)
        if len(received) != len(object_list):
            raise ValueError(f"object_list has {len(object_list)} items here but {len(received)} on src")
        object_list[:] = received


def _gather_payloads(group: Any, obj: Any, dst: int | None) -> list[Any] | None:
    """Every rank's pickled ``obj`` on every rank (dst None) or on ``dst`` only."""
    mine = _dumps(obj)
    sizes = np.zeros(group.size, np.int64)
    group.all_gather_into(sizes, np.array([mine.size], np.int64))
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: mine.size] = mine
    whole: np.ndarray | None
    if dst is None:
        whole = np.empty(group.size * padded.size, np.uint8)
        group.all_gather_into(whole, padded)
    else:
        whole = np.empty(group.size * padded.size, np.uint8) if group.rank == dst else None
        parts = np.split(whole, group.size) if whole is not None else None
        group.gather(padded, parts, dst)
        if whole is None:
            return None
    return [_loads(whole[q * padded.size: q * padded.size + sizes[q]]) for q in range(group.size)]


def _check_out_list(object_list, size: int, argname: str) -> None:
    if not isinstance(object_list, list) or len(object_list) != size:
        raise ValueError(f"{argname} must be a list of world_size={size} items")


def all_gather_object(group: Any, object_list: list[Any], obj: Any) -> None:
    """Fill ``object_list`` (world_size long) with every rank's ``obj``."""
    _check_out_list(object_list, group.size, "object_list")
    object_list[:] = cast("list[Any]", _gather_payloads(group, obj, None))  # a list for dst None


def gather_object(group: Any, obj: Any, object_gather_list: list[Any] | None = None, dst: int = 0) -> None:
    """Fill ``object_gather_list`` on ``dst`` with every rank's ``obj``."""
    if group.rank == dst:
        _check_out_list(object_gather_list, group.size, "object_gather_list")
    result = _gather_payloads(group, obj, dst)
    if group.rank == dst:
        cast("list[Any]", object_gather_list)[:] = cast("list[Any]", result)  # both lists on dst


def scatter_object_list(group: Any, output_list: list[Any], input_list: Any, src: int = 0) -> None:
    """Set ``output_list[0]`` on rank q to ``input_list[q]`` of rank ``src``."""
    if not isinstance(output_list, list) or len(output_list) < 1:
        raise ValueError("scatter_object_output_list must be a list with at least one item")
    if group.rank == src:
        _check_out_list(list(input_list) if input_list is not None else None, group.size,
                        "scatter_object_input_list")
    # Everyone needs the largest size to size the scatter pieces; one broadcast carries all.
    payloads = [_dumps(o) for o in input_list] if group.rank == src else None
    sizes = np.array([p.size for p in payloads] if payloads else [0] * group.size, np.int64)
    group.broadcast(sizes, src)
    width = int(sizes.max())
    pieces = None
    if payloads is not None:
        pieces = [np.zeros(width, np.uint8) for _ in payloads]
        for piece, p in zip(pieces, payloads):
            piece[: p.size] = p
    mine = np.empty(width, np.uint8)
    group.scatter(mine, pieces, src)
    output_list[0] = _loads(mine[: sizes[group.rank]])
