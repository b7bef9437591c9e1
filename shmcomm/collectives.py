"""Module-level collectives: each runs the method of the same name on ``group`` (default: the
default group). This module holds the one full text of every collective call, the compiled ones'
included: each function's docstring is that text, and the ``ProcessGroup`` method of the same name
gets a copy at import (``_share_docs`` below).

Example::

    import numpy as np, shmcomm as sc
    sc.init_process_group()
    x = np.ones(4, np.float32)
    sc.all_reduce(x)                                  # in place; x == world_size
    w = sc.broadcast(x, src=0, async_op=True); w.wait()
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence, TypeVar, overload

import numpy as np

import shmcomm._core as _core
from shmcomm.group import PROC_NULL, EngineGroup, ProcessGroup
from shmcomm.world import resolve
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


# ---- the compiled collectives: their text ----------------------------------------------------
# The array collectives, send and recv are compiled (shmcomm._core, src_cython/group_core.pxi): a
# Python wrapper here would cost more than an 8-byte collective itself. Their text is here, as the
# docstring of a ``def`` that ``@_compiled`` gives to the compiled function and then drops: the
# module's name is bound to the compiled function itself.
#
# Shared wording: "array" is a numpy array, a torch CPU tensor or a C-contiguous buffer-protocol
# object; every numpy bool, integer, float and complex dtype works, and bfloat16.

_Compiled = TypeVar("_Compiled", bound=Callable[..., Any])


def _compiled(function: _Compiled) -> Callable[[Callable[..., Any]], _Compiled]:
    """Decorator: the decorated ``def`` is the text of the compiled ``function``, not code. Its
    docstring becomes ``function``'s and the name is bound to ``function``; its parameters must be
    ``function``'s, in order (TypeError at import otherwise), so that the text's signature cannot
    drift from the code's.

    Example::

        @_compiled(_core.barrier)
        def barrier(group=None, async_op=False):
            '''Wait until every rank of the group has reached the barrier. ...'''
    """
    def give_text(text: Any) -> _Compiled:
        if _parameters(text) != _parameters(function):
            raise TypeError(f"the text of {text.__name__} has parameters {_parameters(text)}, "
                            f"the compiled function {_parameters(function)}")
        function.__doc__ = text.__doc__
        return function
    return give_text


def _parameters(function: Any) -> tuple[str, ...]:
    code = function.__code__  # compiled functions have one too (binding=True)
    return tuple(code.co_varnames[:code.co_argcount])


@_compiled(_core.all_reduce)
def all_reduce(array, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``array`` element-wise over every rank of the group, in place.

    Every rank passes an array of the same size and dtype and gets the reduction of all of
    them. Ranks reduce in one fixed order (rank 0, 1, ...), so the result is bit-identical on
    every rank, whatever the SIMD level. float16 and bfloat16 accumulate in float32.
    ``BAND``/``BOR``/``BXOR`` take integer and bool arrays only; complex has no ``MIN``/``MAX``;
    bool has no ``AVG``; integer ``AVG`` truncates toward zero.

    Args:
        array (ndarray | Tensor | buffer): numpy array, torch CPU tensor or C-contiguous
            buffer-protocol object, writable; input and output. Same size and dtype on every
            rank; any size, 0 included. Dtypes: every numpy bool, integer, float (float16
            included) and complex type, and bfloat16 (torch, or ``ml_dtypes``).
        op (ReduceOp | str | int): the reduction, default ``ReduceOp.SUM``; also its name
            (``"max"``), its code, or torch's ``ReduceOp``. Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``array`` holds the result. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[array]``.

    Raises:
        TypeError: ``array`` is not an array or has an unsupported dtype; ``op`` does not apply to
            the dtype.
        ValueError: ``array`` is not C-contiguous or not writable; ``op`` is unknown; the group was
            destroyed.
        CollectiveMismatchError: the ranks passed different sizes, dtypes or ops, or called
            different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        x = np.full(3, sc.get_rank() + 1.0)
        sc.all_reduce(x)                            # 2 ranks: x == [3., 3., 3.]
        sc.all_reduce(x, op=sc.ReduceOp.MAX)
        work = sc.all_reduce(x, op="avg", async_op=True)
        out, = work.result()                        # waits; out is x
    """


@_compiled(_core.broadcast)
def broadcast(array, src, group=None, async_op=False):
    """Copy ``array`` of rank ``src`` into ``array`` of every other rank.

    Args:
        array (ndarray | Tensor | buffer): numpy array, torch CPU tensor or C-contiguous
            buffer-protocol object of the same size and dtype on every rank (any dtype of
            ``all_reduce``). Read on ``src``; written, so writable, on the others.
        src (int): the rank that sends, within the group. Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``array`` holds ``src``'s data. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[array]``.

    Raises:
        TypeError: ``array`` is not an array or has an unsupported dtype; ``src`` is not an int.
        ValueError: ``src`` is not a rank of the group; ``array`` is not C-contiguous, or not
            writable on a receiving rank; the group was destroyed.
        CollectiveMismatchError: the ranks passed different sizes, dtypes or ``src``, or called
            different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        w = np.arange(4.0) if sc.get_rank() == 0 else np.empty(4)
        sc.broadcast(w, src=0)                      # every rank: w == [0., 1., 2., 3.]
    """


@_compiled(_core.reduce)
def reduce(array, dst, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``array`` element-wise over every rank into ``array`` of rank ``dst``.

    As ``all_reduce`` (same dtypes, ops, fixed order and float32 accumulation of half types),
    but only ``dst`` gets the result; the other ranks' arrays are unchanged.

    Args:
        array (ndarray | Tensor | buffer): numpy array, torch CPU tensor or C-contiguous
            buffer-protocol object, writable (on every rank); same size and dtype on every rank.
            The input everywhere, the output on ``dst``.
        dst (int): the rank that gets the result, within the group. Same on every rank.
        op (ReduceOp | str | int): the reduction, default ``ReduceOp.SUM`` (see ``all_reduce``).
            Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once the call is done on this rank. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[array]``.

    Raises:
        TypeError: ``array`` is not an array or has an unsupported dtype; ``op`` does not apply to
            the dtype; ``dst`` is not an int.
        ValueError: ``dst`` is not a rank of the group; ``array`` is not C-contiguous or not
            writable; ``op`` is unknown; the group was destroyed.
        CollectiveMismatchError: the ranks passed different sizes, dtypes, ops or ``dst``, or called
            different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        x = np.full(3, sc.get_rank() + 1.0)
        sc.reduce(x, dst=0)                         # 2 ranks: x == [3., 3., 3.] on rank 0 only
    """


@_compiled(_core.all_gather)
def all_gather(output_list, array, group=None, async_op=False):
    """Gather every rank's ``array`` into ``output_list`` on every rank.

    ``output_list[q]`` receives rank q's ``array``. Pieces may differ in size between ranks
    (as in torch): ``output_list[q]`` is then sized like rank q's array, on every rank.

    Args:
        output_list (list[ndarray | Tensor | buffer]): ``world_size`` writable C-contiguous
            arrays of ``array``'s dtype.
        array (ndarray | Tensor | buffer): this rank's piece: numpy array, torch CPU tensor or
            C-contiguous buffer-protocol object (any dtype of ``all_reduce``).
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output_list`` is filled. With ``async_op=True``, a ``Work``: its ``wait()``
        raises the communication errors below, its ``result()`` is the arrays of
        ``output_list`` (a list).

    Raises:
        TypeError: an array is not one or has an unsupported dtype.
        ValueError: ``output_list`` does not hold ``world_size`` arrays, or one differs in dtype, is
            not writable, is not C-contiguous or is not sized like its rank's piece; the group was
            destroyed.
        CollectiveMismatchError: the ranks disagree on the sizes or dtype, or called different
            collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        x = np.full(2, sc.get_rank(), np.int32)
        outs = [np.empty(2, np.int32) for _ in range(sc.get_world_size())]
        sc.all_gather(outs, x)                      # outs[q] == [q, q]
    """


@_compiled(_core.all_gather_into)
def all_gather_into(output, array, group=None, async_op=False):
    """Gather every rank's ``array`` into one array, rank-major, on every rank.

    ``output`` holds ``world_size * array.size`` elements; rank q's ``array`` lands at
    element ``q * array.size`` (NCCL's all_gather, torch's ``all_gather_into_tensor``).

    Args:
        output (ndarray | Tensor | buffer): writable C-contiguous array of ``world_size *
            array.size`` elements of ``array``'s dtype.
        array (ndarray | Tensor | buffer): this rank's piece: numpy array, torch CPU tensor or
            C-contiguous buffer-protocol object (any dtype of ``all_reduce``), the same size on
            every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output`` is filled. With ``async_op=True``, a ``Work``: its ``wait()``
        raises the communication errors below, its ``result()`` is ``[output]``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype.
        ValueError: ``output`` has the wrong size or dtype, or is not writable or not C-contiguous;
            the group was destroyed.
        CollectiveMismatchError: the ranks passed different sizes or dtypes, or called different
            collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        x = np.full(2, sc.get_rank(), np.int32)
        out = np.empty(2 * sc.get_world_size(), np.int32)
        sc.all_gather_into(out, x)                  # 2 ranks: out == [0, 0, 1, 1]
    """


@_compiled(_core.gather)
def gather(array, gather_list=None, dst=0, group=None, async_op=False):
    """Gather every rank's ``array`` into ``gather_list`` on rank ``dst``.

    ``gather_list[q]`` on ``dst`` receives rank q's ``array``. Every piece has the same size
    (the other ranks cannot know the root's sizes): for pieces of different sizes use
    ``gather_v``.

    Args:
        array (ndarray | Tensor | buffer): this rank's piece: numpy array, torch CPU tensor or
            C-contiguous buffer-protocol object (any dtype of ``all_reduce``), the same size and
            dtype on every rank.
        gather_list (list[ndarray | Tensor | buffer] | None): on ``dst``, ``world_size``
            writable C-contiguous arrays sized like ``array``; None (the default) on the others.
        dst (int): the rank that gathers, within the group; default 0. Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once the call is done on this rank. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is the arrays of
        ``gather_list`` on ``dst`` and ``[]`` on the others.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``dst`` is not an int.
        ValueError: ``dst`` is not a rank of the group; ``gather_list`` is missing on ``dst`` or
            given elsewhere, does not hold ``world_size`` arrays, or holds one of another size or
            dtype, not writable or not C-contiguous; the group was destroyed.
        CollectiveMismatchError: the ranks passed different sizes, dtypes or ``dst``, or called
            different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        x = np.full(2, sc.get_rank(), np.int32)
        outs = [np.empty(2, np.int32) for _ in range(sc.get_world_size())] if sc.get_rank() == 0 else None
        sc.gather(x, outs, dst=0)                   # on rank 0: outs[q] == [q, q]
    """


@_compiled(_core.scatter)
def scatter(array, scatter_list=None, src=0, group=None, async_op=False):
    """Hand rank q the piece ``scatter_list[q]`` of rank ``src``, into its ``array``.

    Every piece has the same size (the other ranks cannot know the root's sizes): for pieces
    of different sizes use ``scatter_v``.

    Args:
        array (ndarray | Tensor | buffer): writable C-contiguous array that receives this
            rank's piece: numpy array, torch CPU tensor or buffer-protocol object (any dtype of
            ``all_reduce``), the same size and dtype on every rank.
        scatter_list (list[ndarray | Tensor | buffer] | None): on ``src``, ``world_size``
            C-contiguous arrays sized like ``array``; None (the default) on the others.
        src (int): the rank that scatters, within the group; default 0. Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``array`` holds this rank's piece. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[array]``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``src`` is not an int.
        ValueError: ``src`` is not a rank of the group; ``scatter_list`` is missing on ``src`` or
            given elsewhere, does not hold ``world_size`` arrays, or holds one of another size or
            dtype; ``array`` is not writable or not C-contiguous; the group was destroyed.
        CollectiveMismatchError: the ranks passed different sizes, dtypes or ``src``, or called
            different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        n = sc.get_world_size()
        parts = [np.full(2, q, np.int32) for q in range(n)] if sc.get_rank() == 0 else None
        mine = np.empty(2, np.int32)
        sc.scatter(mine, parts, src=0)              # rank q: mine == [q, q]
    """


@_compiled(_core.reduce_scatter)
def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``input_list[r]`` over every rank into ``output`` of rank r.

    Dtypes, ops, the fixed rank order (bit-identical results) and float32 accumulation of
    half types are those of ``all_reduce``. Pieces may differ in size between ranks (as in
    torch): ``input_list[q]`` is then sized like rank q's ``output``, on every rank.

    Args:
        output (ndarray | Tensor | buffer): writable C-contiguous array that receives this
            rank's reduced piece.
        input_list (list[ndarray | Tensor | buffer]): ``world_size`` C-contiguous arrays of
            ``output``'s dtype; ``input_list[q]`` is this rank's contribution to rank q.
        op (ReduceOp | str | int): the reduction, default ``ReduceOp.SUM`` (see ``all_reduce``).
            Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output`` holds the result. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[output]``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``op`` does not apply to the
            dtype.
        ValueError: ``input_list`` does not hold ``world_size`` arrays, or one differs in dtype or
            has the wrong size; ``output`` is not writable or not C-contiguous; ``op`` is unknown;
            the group was destroyed.
        CollectiveMismatchError: the ranks disagree on sizes, dtype or op, or called different
            collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        n = sc.get_world_size()
        out = np.empty(2)
        sc.reduce_scatter(out, [np.full(2, q + 1.0) for q in range(n)])   # rank q: out == n * (q + 1)
    """


@_compiled(_core.reduce_scatter_into)
def reduce_scatter_into(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    """``reduce_scatter`` with one input array of ``world_size * output.size`` elements.

    Piece r of ``input`` (elements ``r * output.size`` on, rank-major) is this rank's
    contribution to rank r (NCCL's reduce_scatter, torch's ``reduce_scatter_tensor``). Dtypes,
    ops, the fixed rank order and float32 accumulation of half types are those of ``all_reduce``.

    Args:
        output (ndarray | Tensor | buffer): writable C-contiguous array that receives this
            rank's reduced piece; the same size on every rank.
        input (ndarray | Tensor | buffer): C-contiguous array of ``world_size * output.size``
            elements of ``output``'s dtype.
        op (ReduceOp | str | int): the reduction, default ``ReduceOp.SUM`` (see ``all_reduce``).
            Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output`` holds the result. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[output]``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``op`` does not apply to the
            dtype.
        ValueError: ``input`` has the wrong size or dtype; ``output`` is not writable or not
            C-contiguous; ``op`` is unknown; the group was destroyed.
        CollectiveMismatchError: the ranks passed different sizes, dtypes or ops, or called
            different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        n = sc.get_world_size()
        out = np.empty(2)
        sc.reduce_scatter_into(out, np.ones(2 * n))  # out == [n, n]
    """


@_compiled(_core.all_to_all)
def all_to_all(output_list, input_list, group=None, async_op=False):
    """Send ``input_list[q]`` to rank q; ``output_list[q]`` receives rank q's piece for this rank.

    Pieces may differ in size (as in torch): ``output_list[q]`` on rank r is then sized like
    ``input_list[r]`` of rank q.

    Args:
        output_list (list[ndarray | Tensor | buffer]): ``world_size`` writable C-contiguous
            arrays of the inputs' dtype.
        input_list (list[ndarray | Tensor | buffer]): ``world_size`` C-contiguous arrays of one
            dtype (any dtype of ``all_reduce``).
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output_list`` is filled. With ``async_op=True``, a ``Work``: its ``wait()``
        raises the communication errors below, its ``result()`` is the arrays of
        ``output_list`` (a list).

    Raises:
        TypeError: an array is not one or has an unsupported dtype.
        ValueError: a list does not hold ``world_size`` arrays, or holds one of another dtype, not
            C-contiguous, or (outputs) not writable; the group was destroyed.
        CollectiveMismatchError: the ranks' sizes do not match pairwise, or they called different
            collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        r, n = sc.get_rank(), sc.get_world_size()
        ins = [np.full(2, 10.0 * r + q) for q in range(n)]
        outs = [np.empty(2) for _ in range(n)]
        sc.all_to_all(outs, ins)                    # outs[q] == [10 * q + r, 10 * q + r]
    """


@_compiled(_core.all_to_all_single)
def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False):
    """``all_to_all`` on one input and one output array, cut into consecutive pieces.

    Piece q of ``input`` goes to rank q; piece q of ``output`` receives rank q's piece for this
    rank. Without split sizes every piece is ``1/world_size`` of the array; with them,
    ``input_split_sizes[q]`` and ``output_split_sizes[q]`` count the rows of piece q along the
    first axis (elements, for a 1-D array), as in torch.

    Args:
        output (ndarray | Tensor | buffer): writable C-contiguous array of ``input``'s dtype.
        input (ndarray | Tensor | buffer): C-contiguous array (any dtype of ``all_reduce``).
        output_split_sizes (Sequence[int] | None): ``world_size`` row counts (first axis)
            summing to ``output``'s length; None (the default): equal pieces.
        input_split_sizes (Sequence[int] | None): ``world_size`` row counts (first axis)
            summing to ``input``'s length; None (the default): equal pieces.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output`` is filled. With ``async_op=True``, a ``Work``: its ``wait()``
        raises the communication errors below, its ``result()`` is ``[output]``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; a split size is not an int.
        ValueError: the dtypes differ; split sizes are not ``world_size`` non-negative counts
            summing to the array's size, or are None where the size does not divide evenly;
            ``output`` is not writable or not C-contiguous; the group was destroyed.
        CollectiveMismatchError: the ranks' split sizes do not match pairwise, or they called
            different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        n = sc.get_world_size()
        inp = np.arange(2.0 * n) + 100 * sc.get_rank()
        out = np.empty(2 * n)
        sc.all_to_all_single(out, inp)              # equal pieces of 2 elements
        sc.all_to_all_single(out, inp, [2] * n, [2] * n)   # the same, with explicit sizes
    """


@_compiled(_core.all_gather_v)
def all_gather_v(output, array, counts, displs=None, group=None, async_op=False):
    """Gather pieces of different sizes into one array on every rank (MPI's Allgatherv).

    Rank q's ``array`` (``counts[q]`` elements) lands in every rank's ``output`` at element
    ``displs[q]`` (default: packed in rank order). Every rank passes the same ``counts`` and
    ``displs``; elements of ``output`` outside the pieces are left as they are.

    Args:
        output (ndarray | Tensor | buffer): writable C-contiguous array of ``array``'s dtype,
            large enough for every piece.
        array (ndarray | Tensor | buffer): this rank's piece of ``counts[rank]`` elements
            (any dtype of ``all_reduce``).
        counts (Sequence[int]): ``world_size`` element counts, one per rank.
        displs (Sequence[int] | None): ``world_size`` element offsets into ``output``; pieces
            must not overlap. None (the default): packed in rank order.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output`` is filled. With ``async_op=True``, a ``Work``: its ``wait()``
        raises the communication errors below, its ``result()`` is ``[output]``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``counts`` or ``displs`` is not
            a sequence of ints.
        ValueError: the dtypes differ; ``counts``/``displs`` are not ``world_size`` non-negative
            values, a piece ends past ``output`` or overlaps another, or ``array`` does not hold
            ``counts[rank]`` elements; ``output`` is not writable or not C-contiguous; the group was
            destroyed.
        CollectiveMismatchError: the ranks' counts disagree, or they called different collectives
            (raised on every rank, naming both ranks).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        r, n = sc.get_rank(), sc.get_world_size()
        counts = [q + 1 for q in range(n)]
        out = np.empty(sum(counts), np.float32)
        sc.all_gather_v(out, np.full(r + 1, r, np.float32), counts)   # 2 ranks: [0., 1., 1.]
    """


@_compiled(_core.gather_v)
def gather_v(array, output=None, counts=None, displs=None, dst=0, group=None, async_op=False):
    """Gather pieces of different sizes into one array on rank ``dst`` (MPI's Gatherv).

    Rank q's ``array`` (``counts[q]`` elements) lands in ``output`` of ``dst`` at element
    ``displs[q]`` (default: packed in rank order). ``output``, ``counts`` and ``displs`` matter
    on ``dst`` only: the other ranks need not know the sizes.

    Args:
        array (ndarray | Tensor | buffer): this rank's piece (any dtype of ``all_reduce``).
        output (ndarray | Tensor | buffer | None): on ``dst``, a writable C-contiguous array of
            ``array``'s dtype, large enough for every piece; None (the default) on the others.
        counts (Sequence[int] | None): on ``dst``, ``world_size`` element counts; ignored
            elsewhere. Default None.
        displs (Sequence[int] | None): on ``dst``, ``world_size`` element offsets into
            ``output`` (pieces must not overlap); None (the default): packed in rank order.
        dst (int): the rank that gathers, within the group; default 0. Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once the call is done on this rank. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[output]``
        (``[None]`` on ranks other than ``dst``).

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``counts``, ``displs`` or
            ``dst`` is not made of ints.
        ValueError: ``dst`` is not a rank of the group; ``output`` is missing on ``dst`` or given
            elsewhere, of another dtype, not writable or not C-contiguous; ``counts`` is missing on
            ``dst``; a piece ends past ``output`` or overlaps another, or ``array`` does not hold
            ``counts[dst]`` elements on ``dst``; the group was destroyed.
        CollectiveMismatchError: a rank's ``array`` does not hold its ``counts`` entry, the ranks
            passed different ``dst``, or called different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        r, n = sc.get_rank(), sc.get_world_size()
        counts = [q + 1 for q in range(n)]
        out = np.empty(sum(counts)) if r == 0 else None
        sc.gather_v(np.full(r + 1, float(r)), out, counts, dst=0)   # 2 ranks, rank 0: [0., 1., 1.]
    """


@_compiled(_core.scatter_v)
def scatter_v(output, input=None, counts=None, displs=None, src=0, group=None, async_op=False):
    """Scatter pieces of different sizes from one array on rank ``src`` (MPI's Scatterv).

    Rank q's ``output`` receives ``counts[q]`` elements of ``input`` of ``src``, from element
    ``displs[q]`` (default: packed in rank order). ``input``, ``counts`` and ``displs`` matter
    on ``src`` only: the other ranks need not know the sizes.

    Args:
        output (ndarray | Tensor | buffer): writable C-contiguous array that receives this
            rank's piece (any dtype of ``all_reduce``).
        input (ndarray | Tensor | buffer | None): on ``src``, a C-contiguous array of
            ``output``'s dtype holding every piece; None (the default) on the others.
        counts (Sequence[int] | None): on ``src``, ``world_size`` element counts; ignored
            elsewhere. Default None.
        displs (Sequence[int] | None): on ``src``, ``world_size`` element offsets into
            ``input`` (pieces may overlap); None (the default): packed in rank order.
        src (int): the rank that scatters, within the group; default 0. Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output`` holds this rank's piece. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[output]``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``counts``, ``displs`` or
            ``src`` is not made of ints.
        ValueError: ``src`` is not a rank of the group; ``input`` is missing on ``src`` or given
            elsewhere, or of another dtype; ``counts`` is missing on ``src``; a piece ends past
            ``input``, or ``output`` does not hold ``counts[src]`` elements on ``src``; ``output``
            is not writable or not C-contiguous; the group was destroyed.
        CollectiveMismatchError: a rank's ``output`` does not hold its ``counts`` entry, the ranks
            passed different ``src``, or called different collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        r, n = sc.get_rank(), sc.get_world_size()
        counts = [q + 1 for q in range(n)]
        whole = np.arange(float(sum(counts))) if r == 0 else None
        mine = np.empty(r + 1)
        sc.scatter_v(mine, whole, counts, src=0)    # 2 ranks: [0.] and [1., 2.]
    """


@_compiled(_core.reduce_scatter_v)
def reduce_scatter_v(output, input, counts, op=ReduceOp.SUM, group=None, async_op=False):
    """``reduce_scatter`` with pieces of different sizes (MPI's Reduce_scatter).

    ``input`` holds ``sum(counts)`` elements on every rank, packed in rank order; rank r's
    ``output`` (``counts[r]`` elements) gets the reduction over ranks of their piece r. Dtypes,
    ops, the fixed rank order (bit-identical results) and float32 accumulation of half types
    are those of ``all_reduce``.

    Args:
        output (ndarray | Tensor | buffer): writable C-contiguous array of ``counts[rank]``
            elements that receives this rank's reduced piece.
        input (ndarray | Tensor | buffer): C-contiguous array of ``output``'s dtype holding
            ``sum(counts)`` elements.
        counts (Sequence[int]): ``world_size`` element counts, the same on every rank.
        op (ReduceOp | str | int): the reduction, default ``ReduceOp.SUM`` (see ``all_reduce``).
            Same on every rank.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once ``output`` holds the result. With ``async_op=True``, a ``Work``: its
        ``wait()`` raises the communication errors below, its ``result()`` is ``[output]``.

    Raises:
        TypeError: an array is not one or has an unsupported dtype; ``op`` does not apply to the
            dtype; ``counts`` is not a sequence of ints.
        ValueError: the dtypes differ; ``counts`` is not ``world_size`` non-negative counts,
            ``input`` is too small, or ``output`` does not hold ``counts[rank]`` elements;
            ``output`` is not writable or not C-contiguous; ``op`` is unknown; the group was
            destroyed.
        CollectiveMismatchError: the ranks' counts, dtypes or ops disagree, or they called different
            collectives (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        r, n = sc.get_rank(), sc.get_world_size()
        counts = [q + 1 for q in range(n)]
        out = np.empty(counts[r])
        sc.reduce_scatter_v(out, np.ones(sum(counts)), counts)   # out == [n, ...]
    """


@_compiled(_core.barrier)
def barrier(group=None, async_op=False):
    """Wait until every rank of the group has reached the barrier.

    Runs in issue order with the group's other operations: it completes after every
    collective this rank issued before it.

    Args:
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).
        async_op (bool): if True, queue the call and return a ``Work`` at once; default False.

    Returns:
        None, once every rank arrived. With ``async_op=True``, a ``Work``: its ``wait()``
        raises the communication errors below, its ``result()`` is ``[]``.

    Raises:
        ValueError: the group was destroyed.
        CollectiveMismatchError: another rank called a different collective (raised on every rank).
        CommTimeoutError: not every rank arrived within the group's timeout.
        PeerFailureError: a rank of the group died or left it.
        AbortedError: the group was aborted (``Work.abort()`` on any rank).

    Example::

        sc.barrier()
        work = sc.barrier(async_op=True); work.wait()
    """


@_compiled(_core.send)
def send(array, dst, tag=0, group=None):
    """Send ``array`` to rank ``dst``; blocks until the bytes are in shared memory or received.

    Messages between one sender and one receiver arrive in the order sent (MPI's
    non-overtaking rule); the receiver's ``recv`` must name this ``tag`` (or ``src=None``) and
    pass an array of the same size and dtype. ``isend`` is the non-blocking form.

    Args:
        array (ndarray | Tensor | buffer): numpy array, torch CPU tensor or C-contiguous
            buffer-protocol object (any dtype of ``all_reduce``; any size, 0 included).
        dst (int): the receiving rank, within the group (this rank too).
        tag (int): a 64-bit signed message tag the receive must match; default 0.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).

    Returns:
        None.

    Raises:
        TypeError: ``array`` is not an array or has an unsupported dtype; ``dst`` or ``tag`` is not
            an int.
        ValueError: ``dst`` is not a rank of the group; ``tag`` does not fit in 64 bits; ``array``
            is not C-contiguous.
        CommTimeoutError: the message was not delivered within the group's timeout.
        PeerFailureError: ``dst`` died or left the group.
        AbortedError: the group was aborted.
        ShmcommError: the group was destroyed.

    Example::

        if sc.get_rank() == 0:
            sc.send(np.arange(4.0), dst=1, tag=7)
    """


@_compiled(_core.recv)
def recv(array, src=None, tag=0, group=None):
    """Receive a message into ``array``; returns the sender's rank.

    Blocks until a message from ``src`` (any rank when None) with this ``tag`` arrived; it
    must have ``array``'s size and dtype. ``irecv`` is the non-blocking form.

    Args:
        array (ndarray | Tensor | buffer): writable C-contiguous numpy array, torch CPU tensor
            or buffer-protocol object that receives the message.
        src (int | None): the sending rank, within the group; None (the default): any rank.
        tag (int): the 64-bit signed tag to match; default 0.
        group (ProcessGroup | None): the group; default None, the default group
            (``ValueError`` if shmcomm is not initialized; ``TypeError`` if not a
            ProcessGroup).

    Returns:
        int: the rank that sent the message (within the group).

    Raises:
        TypeError: ``array`` is not an array or has an unsupported dtype; ``src`` or ``tag`` is not
            an int.
        ValueError: ``src`` is negative or not a rank of the group; ``tag`` does not fit in 64 bits;
            ``array`` is not writable or not C-contiguous.
        CollectiveMismatchError: the matching message has another size or dtype.
        CommTimeoutError: no matching message arrived within the group's timeout.
        PeerFailureError: ``src`` died or left the group.
        AbortedError: the group was aborted.
        ShmcommError: the group was destroyed.

    Example::

        if sc.get_rank() == 1:
            buf = np.empty(4)
            sender = sc.recv(buf, src=None, tag=7)  # 0; buf == [0., 1., 2., 3.]
    """


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


@_compiled(_core.scan)
def scan(array, op=ReduceOp.SUM, group=None, async_op=False):
    """MPI's inclusive prefix reduction, in place: rank r's ``array`` becomes ``op`` over the
    arrays of ranks 0..r (mpi4py's ``comm.Scan``).

    Every dtype and op of ``all_reduce`` but torch's premul_sum, with its rules (half types accumulate
    in float32; AVG divides by the number of ranks reduced, r + 1). Ranks reduce in rank order,
    so rank r's result has the bits ``all_reduce`` over ranks 0..r would give. One step per
    chunk of the group's slots: every rank but the last copies its array into its slot, then
    rank r reduces those of ranks 0..r-1 and its own.

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


@_compiled(_core.exscan)
def exscan(array, op=ReduceOp.SUM, group=None, async_op=False):
    """MPI's exclusive prefix reduction, in place: rank r's ``array`` becomes ``op`` over the
    arrays of ranks 0..r-1; rank 0's becomes the op's identity (0 for SUM, BOR and BXOR, 1 for
    PRODUCT, the dtype's largest value for MIN and smallest for MAX, inf and -inf for floating
    point, every bit set for BAND), so that ``offsets`` below are right on every rank. AVG has no
    identity: rank 0 keeps its array. (mpi4py's ``comm.Exscan`` leaves rank 0's undefined.)

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
        sc.exscan(offsets)           # rank r: rows held by ranks before it (rank 0: 0)
    """


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
        text = _method_doc(name, module[name].__doc__)
        # The compiled methods are GroupCore's (their __doc__ is writable, binding=True);
        # EngineGroup's are their twins for groups across nodes.
        for group_class in (ProcessGroup, EngineGroup):
            getattr(group_class, name).__doc__ = text


_share_docs()
