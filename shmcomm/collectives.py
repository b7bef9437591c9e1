"""Module-level collectives: each runs the method of the same name on ``group`` (default: the
default group). Each function's docstring is the one full text of its call; the ``ProcessGroup``
method of the same name gets a copy at import (``_share_docs`` below).

Example::

    import numpy as np, shmcomm as sc
    sc.init_process_group()
    x = np.ones(4, np.float32)
    sc.all_reduce(x)                                  # in place; x == world_size
    w = sc.broadcast(x, src=0, async_op=True); w.wait()
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Literal, Sequence, overload

import numpy as np

# The array collectives are compiled (shmcomm._core, src_cython/group_core.pxi): a Python
# wrapper here would cost more than an 8-byte collective itself.
from shmcomm._core import (  # noqa: F401
    all_gather, all_gather_into, all_gather_v, all_reduce, all_to_all, all_to_all_single, barrier,
    broadcast, gather, gather_v, recv, reduce, reduce_scatter, reduce_scatter_into,
    reduce_scatter_v, scatter, scatter_v, send,
)
from shmcomm.group import PROC_NULL, ProcessGroup, resolve
from shmcomm.ops import ReduceOp

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

    from shmcomm._types import Array, ReduceOpLike
    from shmcomm.work import Work

__all__ = ["all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather", "all_gather_into",
           "gather", "scatter", "reduce_scatter", "reduce_scatter_into", "all_to_all",
           "all_to_all_single", "all_gather_v", "gather_v", "scatter_v", "reduce_scatter_v",
           "barrier", "send", "recv", "isend", "irecv", "sendrecv", "PROC_NULL", "broadcast_object_list",
           "all_gather_object", "gather_object", "scatter_object_list", "empty", "zeros", "scan", "exscan"]


@overload
def all_reduce_coalesced(arrays: Sequence[Array], op: ReduceOpLike = ..., group: ProcessGroup | None = ...,
                         async_op: Literal[False] = ...) -> None: ...
@overload
def all_reduce_coalesced(arrays: Sequence[Array], op: ReduceOpLike = ..., group: ProcessGroup | None = ...,
                         *, async_op: Literal[True]) -> Work: ...
@overload
def all_reduce_coalesced(arrays: Sequence[Array], op: ReduceOpLike = ..., group: ProcessGroup | None = ...,
                         async_op: bool = ...) -> Work | None: ...
def all_reduce_coalesced(arrays: Sequence[Array], op: ReduceOpLike = ReduceOp.SUM,
                         group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """All-reduce each array of ``arrays`` in place, as one queued operation.

    Each array is reduced as ``all_reduce`` does (same dtypes, ops, fixed rank order and
    float32 accumulation of half types); the arrays may differ in size and dtype, but every
    rank passes the same list. An unknown ``op`` raises at the call; with ``async_op=True``,
    the other errors, those about the arrays included, are raised by the Work's ``wait()``.

    Args:
        arrays (Sequence[ndarray | Tensor | buffer]): writable C-contiguous arrays, inputs and
            outputs.
        op (ReduceOp | str | int): the reduction for every array, default ``ReduceOp.SUM``
            (see ``all_reduce``). Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once every array holds its result. With ``async_op=True``, a ``Work`` whose
        ``result()`` is the list of ``arrays``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``op`` does not apply to a
            dtype.
        ValueError: an array is not C-contiguous or not writable; ``op`` is unknown; the group was
            destroyed.
        CollectiveMismatchError: the ranks passed different arrays or ops, or called different
            collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        w_grad, b_grad = np.ones(1000, np.float32), np.ones(10)
        sc.all_reduce_coalesced([w_grad, b_grad], op="avg")
    """
    return resolve(group).all_reduce_coalesced(arrays, op, async_op)


def scan(array: Array, op: ReduceOpLike = ReduceOp.SUM, group: ProcessGroup | None = None,
         async_op: bool = False) -> Work | None:
    """MPI's inclusive prefix reduction, in place: rank r's ``array`` becomes ``op`` over the
    arrays of ranks 0..r (mpi4py's ``comm.Scan``).

    Every dtype and op of ``all_reduce``, with its rules (half types accumulate in float32; AVG
    divides by the number of ranks reduced, r + 1). Ranks reduce in rank order, so rank r's
    result has the bits ``all_reduce`` over ranks 0..r would give.

    Args:
        array (ndarray | Tensor | buffer): writable C-contiguous array; same shape and dtype on
            every rank.
        op (ReduceOp | str | int): the reduction, default ``ReduceOp.SUM``. Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group.
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None once ``array`` holds the result; with ``async_op=True``, a ``Work`` whose
        ``result()`` is ``[array]``.

    Raises:
        TypeError: not an array, an unsupported dtype, or ``op`` does not apply to the dtype.
        ValueError: not C-contiguous or not writable; ``op`` is unknown.
        CollectiveMismatchError: the ranks passed different sizes or dtypes, or called different
            collectives (raised on every rank).
        CommTimeoutError, PeerFailureError, AbortedError: as for ``all_reduce``.

    Example::

        x = np.full(3, sc.get_rank() + 1.0)
        sc.scan(x)                   # rank r: 1 + 2 + ... + (r + 1)
    """
    return resolve(group).scan(array, op, async_op)


def exscan(array: Array, op: ReduceOpLike = ReduceOp.SUM, group: ProcessGroup | None = None,
           async_op: bool = False) -> Work | None:
    """MPI's exclusive prefix reduction, in place: rank r's ``array`` becomes ``op`` over the
    arrays of ranks 0..r-1; rank 0's is left unchanged (mpi4py's ``comm.Exscan``, where it is
    undefined).

    Dtypes, ops (AVG divides by r) and the reduction order are those of ``scan``.

    Args:
        array (ndarray | Tensor | buffer): as for ``scan``.
        op (ReduceOp | str | int): as for ``scan``.
        group (ProcessGroup | None): the group; default None, the default group.
        async_op (bool): as for ``scan``.

    Returns:
        As ``scan``: None, or with ``async_op=True`` a ``Work`` whose ``result()`` is ``[array]``.

    Raises:
        TypeError, ValueError, CollectiveMismatchError, CommTimeoutError, PeerFailureError,
        AbortedError: as for ``scan``.

    Example::

        offsets = np.array([len(my_rows)])
        sc.exscan(offsets)           # rank r: rows held by ranks before it (rank 0: its own)
    """
    return resolve(group).exscan(array, op, async_op)


def isend(array: Array, dst: int, tag: int = 0, group: ProcessGroup | None = None) -> Work:
    """Start sending ``array`` to rank ``dst``; returns a ``Work`` at once.

    The non-blocking ``send``: the message is matched, ordered and checked as ``send``'s.
    ``array`` must not change until the Work completes (the Work keeps it alive).

    Args:
        array (ndarray | Tensor | buffer): numpy array, torch CPU tensor or C-contiguous
            buffer-protocol object (any dtype of ``all_reduce``; any size, 0 included).
        dst (int): the receiving rank, within the group (this rank too).
        tag (int): a 64-bit signed message tag the receive must match; default 0.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).

    Returns:
        Work: completes once the message is in shared memory or received; its ``result()`` is
        ``[array]``. Its ``wait()`` raises ``CommTimeoutError`` (not delivered within the
        group's timeout), ``PeerFailureError`` (``dst`` died), ``AbortedError`` or
        ``ShmcommError`` (the group was destroyed).

    Raises:
        TypeError: ``array`` is not an array or has an unsupported dtype; ``dst`` or ``tag`` is not
            an int.
        ValueError: ``dst`` is not a rank of the group; ``tag`` does not fit in 64 bits; ``array``
            is not C-contiguous.
        AbortedError: the group was aborted.
        ShmcommError: the group was destroyed.

    Example::

        if sc.get_rank() == 0:
            w = sc.isend(np.arange(4.0), dst=1, tag=3)
            w.wait()
    """
    return resolve(group).isend(array, dst, tag)


def irecv(array: Array, src: int | None = None, tag: int = 0, group: ProcessGroup | None = None) -> Work:
    """Start receiving a message into ``array``; returns a ``Work`` at once.

    The non-blocking ``recv``: a message from ``src`` (any rank when None) with this ``tag``
    and ``array``'s size and dtype.

    Args:
        array (ndarray | Tensor | buffer): writable C-contiguous numpy array, torch CPU tensor
            or buffer-protocol object that receives the message.
        src (int | None): the sending rank, within the group; None (the default): any rank.
        tag (int): the 64-bit signed tag to match; default 0.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).

    Returns:
        Work: completes once ``array`` holds the message; its ``result()`` is ``[array]`` and
        its ``source_rank()`` the sender's rank. Its ``wait()`` raises
        ``CollectiveMismatchError`` (the message has another size or dtype),
        ``CommTimeoutError`` (none arrived within the group's timeout), ``PeerFailureError``
        (``src`` died), ``AbortedError`` or ``ShmcommError`` (the group was destroyed).

    Raises:
        TypeError: ``array`` is not an array or has an unsupported dtype; ``src`` or ``tag`` is not
            an int.
        ValueError: ``src`` is negative or not a rank of the group; ``tag`` does not fit in 64 bits;
            ``array`` is not writable or not C-contiguous.
        AbortedError: the group was aborted.
        ShmcommError: the group was destroyed.

    Example::

        if sc.get_rank() == 1:
            buf = np.empty(4)
            w = sc.irecv(buf, tag=3)
            w.wait(); print("from", w.source_rank(), buf)
    """
    return resolve(group).irecv(array, src, tag)


def sendrecv(sendbuf: Array, dst: int, recvbuf: Array, src: int | None, sendtag: int = 0, recvtag: int = 0,
             group: ProcessGroup | None = None) -> int:
    """Send ``sendbuf`` to rank ``dst`` and receive a message from ``src`` into ``recvbuf``, both at
    once; returns the sender's rank (mpi4py's ``comm.Sendrecv``).

    The send and the receive are posted together and then both waited for, so a ring or a halo
    exchange, where every rank sends to one neighbour and receives from the other, cannot
    deadlock. ``PROC_NULL`` as ``dst`` or ``src`` skips that half, as at the edges of a
    non-periodic exchange. Messages are matched as ``send``'s and ``recv``'s (a ``send`` or
    ``isend`` elsewhere may be the other end).

    Args:
        sendbuf (ndarray | Tensor | buffer): the C-contiguous array to send (any dtype of
            ``all_reduce``; any size, 0 included).
        dst (int): the receiving rank, within the group, or ``PROC_NULL`` (send nothing).
        recvbuf (ndarray | Tensor | buffer): the writable C-contiguous array that receives the
            message; not ``sendbuf``, nor overlapping it.
        src (int | None): the sending rank, within the group; None: any rank; ``PROC_NULL``:
            receive nothing.
        sendtag (int): the send's 64-bit signed tag; default 0.
        recvtag (int): the tag the receive matches; default 0.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).

    Returns:
        int: the rank the message came from; ``PROC_NULL`` when ``src`` is ``PROC_NULL``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``dst``, ``src`` or a tag is
            not an int.
        ValueError: ``dst`` or ``src`` is not a rank of the group nor ``PROC_NULL``; a tag does
            not fit in 64 bits; an array is not C-contiguous, or ``recvbuf`` not writable;
            ``sendbuf`` is ``recvbuf``.
        CollectiveMismatchError: the message has another size or dtype than ``recvbuf``.
        CommTimeoutError: a half did not complete within the group's timeout.
        PeerFailureError: the partner died.
        AbortedError: the group was aborted.

    Example::

        r, n = sc.get_rank(), sc.get_world_size()       # a 1-D halo exchange, not periodic
        left = r - 1 if r > 0 else sc.PROC_NULL
        right = r + 1 if r < n - 1 else sc.PROC_NULL
        u = np.full(6, float(r))                        # u[0] and u[5] are ghost cells
        sc.sendrecv(u[1:2], left, u[5:], right)         # my first cell left, right's first in
        sc.sendrecv(u[4:5], right, u[:1], left)         # my last cell right, left's last in
    """
    return resolve(group).sendrecv(sendbuf, dst, recvbuf, src, sendtag, recvtag)


def broadcast_object_list(object_list: list[Any], src: int = 0, group: ProcessGroup | None = None) -> None:
    """Replace the items of ``object_list`` on every rank with those of rank ``src``, in place.

    The objects are pickled on ``src`` by the process pickler (``sc.set_pickler``), their size
    broadcast first, then the bytes; every rank unpickles them.

    Args:
        object_list (list): on ``src``, the picklable objects to send; elsewhere a list of the
            same length (its items are replaced).
        src (int): the sending rank, within the group; default 0. Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).

    Returns:
        None, once ``object_list`` holds ``src``'s objects.

    Raises:
        TypeError: ``object_list`` is not a list; ``src`` is not an int; an object cannot be pickled
            (the pickler's own error).
        ValueError: ``src`` is not a rank of the group; ``object_list`` is shorter or longer than on
            ``src``.
        CollectiveMismatchError: the ranks passed different ``src``, or called different collectives
            (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted.

    Example::

        objs = [{"lr": 0.1}, "config"] if sc.get_rank() == 0 else [None, None]
        sc.broadcast_object_list(objs, src=0)       # every rank: [{'lr': 0.1}, 'config']
    """
    return resolve(group).broadcast_object_list(object_list, src)


def all_gather_object(object_list: list[Any], obj: Any, group: ProcessGroup | None = None) -> None:
    """Fill ``object_list`` on every rank with every rank's ``obj``, in rank order.

    Objects are pickled by the process pickler (``sc.set_pickler``) and may differ in size.

    Args:
        object_list (list): a list of ``world_size`` items; item q is replaced by rank q's
            ``obj``.
        obj (Any): this rank's picklable object.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).

    Returns:
        None, once ``object_list`` is filled.

    Raises:
        TypeError: ``obj`` cannot be pickled (the pickler's own error).
        ValueError: ``object_list`` is not a list of ``world_size`` items.
        CollectiveMismatchError: the ranks called different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted.

    Example::

        out = [None] * sc.get_world_size()
        sc.all_gather_object(out, {"rank": sc.get_rank()})   # out[q] == {'rank': q}
    """
    return resolve(group).all_gather_object(object_list, obj)


def gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int = 0,
                  group: ProcessGroup | None = None) -> None:
    """Gather every rank's ``obj`` into ``object_gather_list`` on rank ``dst``, in rank order.

    Objects are pickled by the process pickler (``sc.set_pickler``) and may differ in size.

    Args:
        obj (Any): this rank's picklable object.
        object_gather_list (list | None): on ``dst``, a list of ``world_size`` items (item q
            is replaced by rank q's ``obj``); ignored elsewhere (pass None). Default None.
        dst (int): the gathering rank, within the group; default 0. Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).

    Returns:
        None, once the call is done on this rank.

    Raises:
        TypeError: ``dst`` is not an int; ``obj`` cannot be pickled (the pickler's own error).
        ValueError: ``dst`` is not a rank of the group; ``object_gather_list`` is not a list of
            ``world_size`` items on ``dst``.
        CollectiveMismatchError: the ranks passed different ``dst``, or called different collectives
            (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted.

    Example::

        out = [None] * sc.get_world_size() if sc.get_rank() == 0 else None
        sc.gather_object(sc.get_rank() * 10, out, dst=0)     # on rank 0: [0, 10, ...]
    """
    return resolve(group).gather_object(obj, object_gather_list, dst)


def scatter_object_list(scatter_object_output_list: list[Any], scatter_object_input_list: Sequence[Any] | None = None,
                        src: int = 0, group: ProcessGroup | None = None) -> None:
    """Hand rank q the object ``scatter_object_input_list[q]`` of rank ``src``.

    Rank q's object lands in ``scatter_object_output_list[0]``. Objects are pickled by the
    process pickler (``sc.set_pickler``) and may differ in size.

    Args:
        scatter_object_output_list (list): a list of at least one item; item 0 is replaced by
            this rank's object.
        scatter_object_input_list (Sequence | None): on ``src``, ``world_size`` picklable
            objects; ignored elsewhere (pass None). Default None.
        src (int): the scattering rank, within the group; default 0. Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).

    Returns:
        None, once ``scatter_object_output_list[0]`` holds this rank's object.

    Raises:
        TypeError: ``src`` is not an int; an object cannot be pickled (the pickler's own error).
        ValueError: ``src`` is not a rank of the group; ``scatter_object_output_list`` is not a
            non-empty list; ``scatter_object_input_list`` does not hold ``world_size`` items on
            ``src``.
        CollectiveMismatchError: the ranks passed different ``src``, or called different collectives
            (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted.

    Example::

        out = [None]
        objs = [f"task {q}" for q in range(sc.get_world_size())] if sc.get_rank() == 0 else None
        sc.scatter_object_list(out, objs, src=0)             # rank q: out == ['task q']
    """
    return resolve(group).scatter_object_list(scatter_object_output_list, scatter_object_input_list, src)


def empty(shape: int | Sequence[int], dtype: DTypeLike = float,
          group: ProcessGroup | None = None) -> np.ndarray[Any, np.dtype[Any]]:
    """A new uninitialised numpy array in the group's shared memory (collective).

    Every rank of the group calls it with the same shape and dtype; each gets its own array,
    and all of them live in one segment mapped by every rank, so collectives on them skip the
    copy into the staging area (zero copy). The memory goes away with the last array.

    Args:
        shape (int | Sequence[int]): the array's shape. Same on every rank.
        dtype (numpy dtype-like): the array's dtype; default ``float`` (float64). Same on
            every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).

    Returns:
        numpy.ndarray: C-contiguous, writable, of ``shape`` and ``dtype``.

    Raises:
        TypeError: ``dtype`` is not a numpy dtype.
        ValueError: ``shape`` has a negative dimension; the group was destroyed.
        CollectiveMismatchError: the ranks asked for different sizes, or called different
            collectives (raised on every rank).
        ShmcommError: rank 0 could not create the segment (``/dev/shm`` full).
        UntrustedFileError: the segment was replaced by a file that is not this job's.
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted.

    Example::

        x = sc.empty(1 << 20, np.float32)
        x[:] = sc.get_rank()
        sc.all_reduce(x)                            # zero copy
    """
    return resolve(group).empty(shape, dtype)


def zeros(shape: int | Sequence[int], dtype: DTypeLike = float,
          group: ProcessGroup | None = None) -> np.ndarray[Any, np.dtype[Any]]:
    """``empty``, filled with zeros: a new array in the group's shared memory (collective).

    Arguments and errors are those of :func:`empty`.

    Returns:
        numpy.ndarray: C-contiguous, writable, of ``shape`` and ``dtype``, all zeros.

    Example::

        buf = sc.zeros((4, 256), np.float64)
    """
    array = empty(shape, dtype, group)
    array.fill(0)
    return array


# ---- one text per call: the ProcessGroup methods get their module function's docstring --------
# every module function that is also a ProcessGroup method (``zeros`` is not)
_SHARED_DOCS = [name for name in __all__ if hasattr(ProcessGroup, name)]


def _method_doc(name: str, doc: str) -> str:
    """``doc`` of the module function ``name`` as the docstring of its ProcessGroup method:
    without the ``group`` argument's entry, and with the example calling the method on ``pg``.

    Example::

        ProcessGroup.barrier.__doc__ = _method_doc("barrier", barrier.__doc__)
    """
    lines, skipping = [], False
    for line in inspect.cleandoc(doc).splitlines():
        if skipping and line.startswith("        "):  # the entry's continuation lines
            continue
        skipping = line.startswith("    group (")
        if skipping:
            continue
        if line == "Example::":
            line = "Example (``pg``: the group)::"
        lines.append(line.replace(f"sc.{name}(", f"pg.{name}("))
    return "\n".join(lines)


def _share_docs() -> None:
    module = globals()
    for name in _SHARED_DOCS:
        # The compiled methods are GroupCore's (their __doc__ is writable, binding=True).
        getattr(ProcessGroup, name).__doc__ = _method_doc(name, module[name].__doc__)


_share_docs()
