"""Uneven-count collectives composed from one all-to-all with split sizes, for groups whose
engine has no native form of them (a group across nodes: ``compose.HierarchicalComm``).

One node's groups run these natively (``src_cython/coll/uneven.pxi``); this module gives the
same results from ``exchange(out, inp, out_splits, in_splits)``, an all_to_all_single on flat
numpy arrays (counts in elements). Argument checks are the native ones (``check_counts``).

Example::

    from shmcomm.hierarchy import uneven
    uneven.all_gather_list(comm.all_to_all_single_flat, outs, a, comm.rank, comm.size)
"""

from __future__ import annotations

import numpy as np

from shmcomm._core import PREMUL_SUM, check_counts, reduce_kernel


def _own(what: str, got: int, mine: int) -> None:
    if got != mine:
        raise ValueError(f"{what} has {got} elements but this rank's array has {mine}")


def _pieces(whole: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    return np.split(whole, np.cumsum(sizes)[:-1]) if sizes else []


def all_gather_list(exchange, outs: list, a: np.ndarray, rank: int, size: int) -> None:
    """``outs[q]`` = rank q's ``a`` (pieces of any size; ``outs[rank]`` sized like ``a``)."""
    if len(outs) != size:
        raise ValueError(f"output_list must hold world_size={size} arrays, got {len(outs)}")
    _own(f"output_list[{rank}]", outs[rank].size, a.size)
    splits = [o.size for o in outs]
    whole = np.empty(sum(splits), a.dtype)
    exchange(whole, np.concatenate([a] * size), splits, [a.size] * size)
    for o, part in zip(outs, _pieces(whole, splits)):
        o[...] = part


def all_gather_v(exchange, out: np.ndarray, a: np.ndarray, counts, displs, rank: int, size: int) -> None:
    """MPI's Allgatherv on flat ``out``: rank q's ``a`` at element ``displs[q]``."""
    cs, ds = check_counts(counts, displs, out.size, size, "output", True)
    _own(f"counts[{rank}]", cs[rank], a.size)
    all_gather_list(exchange, [out[d:d + c] for c, d in zip(cs, ds)], a, rank, size)


def gather_v(exchange, a: np.ndarray, out, counts, displs, root: int, rank: int, size: int) -> None:
    """MPI's Gatherv: on ``root``, rank q's ``a`` at element ``displs[q]`` of ``out``."""
    sends = [0] * size
    sends[root] = a.size
    if rank != root:
        exchange(np.empty(0, a.dtype), a, [0] * size, sends)
        return
    cs, ds = check_counts(counts, displs, out.size, size, "output", True)
    _own(f"counts[{root}]", cs[root], a.size)
    whole = np.empty(sum(cs), a.dtype)
    exchange(whole, a, cs, sends)
    for c, d, part in zip(cs, ds, _pieces(whole, cs)):
        out[d:d + c] = part


def scatter_v(exchange, out: np.ndarray, inp, counts, displs, root: int, rank: int, size: int) -> None:
    """MPI's Scatterv: rank q's ``out`` = ``counts[q]`` elements of root's ``inp`` from ``displs[q]``."""
    recvs = [0] * size
    recvs[root] = out.size
    if rank != root:
        exchange(out, np.empty(0, out.dtype), recvs, [0] * size)
        return
    cs, ds = check_counts(counts, displs, inp.size, size, "input", False)
    _own(f"counts[{root}]", cs[root], out.size)
    packed = np.concatenate([inp[d:d + c] for c, d in zip(cs, ds)])
    exchange(out, packed, recvs, cs)


def reduce_scatter_list(exchange, out: np.ndarray, ins: list, op: int, factor: float, rank: int,
                        size: int) -> None:
    """``out`` on rank r = reduction, in rank order, of every rank's ``ins[r]`` (any sizes).

    PREMUL_SUM: each rank scales its own pieces first (factors are per rank), then they are summed.
    """
    if len(ins) != size:
        raise ValueError(f"input_list must hold world_size={size} arrays, got {len(ins)}")
    _own(f"input_list[{rank}]", ins[rank].size, out.size)
    sends = list(ins)
    if op == PREMUL_SUM:
        sends = [np.empty_like(a) for a in ins]
        for scaled, a in zip(sends, ins):
            reduce_kernel(scaled, [a], PREMUL_SUM, factors=[factor])
        op = 0
    m = out.size
    gathered = np.empty(size * m, out.dtype)
    exchange(gathered, np.concatenate(sends), [m] * size, [a.size for a in sends])
    reduce_kernel(out, [gathered[q * m:(q + 1) * m] for q in range(size)], op)


def reduce_scatter_v(exchange, out: np.ndarray, inp: np.ndarray, counts, op: int, factor: float,
                     rank: int, size: int) -> None:
    """MPI's Reduce_scatter: ``inp`` holds ``sum(counts)`` elements; rank r gets piece r reduced."""
    cs, ds = check_counts(counts, None, inp.size, size, "input", False)
    _own(f"counts[{rank}]", cs[rank], out.size)
    reduce_scatter_list(exchange, out, [inp[d:d + c] for c, d in zip(cs, ds)], op, factor, rank, size)
