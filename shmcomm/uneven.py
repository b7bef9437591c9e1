"""Uneven-count collectives composed from one all-to-all with split sizes, for groups whose
engine has no native form of them (a group across nodes: ``hierarchy.HierarchicalComm``).

One node's groups run these natively (``src_cython/coll_uneven.pxi``); this module gives the
same results from ``exchange(out, inp, out_splits, in_splits)``, an all_to_all_single on flat
torch tensors (counts in elements). Argument checks are the native ones (``check_counts``).

Example::

    from shmcomm import uneven
    uneven.all_gather_list(comm.all_to_all_single_flat, outs, t, comm.rank, comm.size)
"""

from __future__ import annotations

from shmcomm._core import PREMUL_SUM, check_counts, reduce_kernel


def _flat(t):
    return t.reshape(-1)


def _own(what: str, got: int, mine: int) -> None:
    if got != mine:
        raise ValueError(f"{what} has {got} elements but this rank's array has {mine}")


def all_gather_list(exchange, outs: list, t, rank: int, size: int) -> None:
    """``outs[q]`` = rank q's ``t`` (pieces of any size; ``outs[rank]`` sized like ``t``)."""
    import torch

    if len(outs) != size:
        raise ValueError(f"output_list must hold world_size={size} arrays, got {len(outs)}")
    _own(f"output_list[{rank}]", outs[rank].numel(), t.numel())
    splits = [o.numel() for o in outs]
    whole = torch.empty(sum(splits), dtype=t.dtype)
    exchange(whole, _flat(t).repeat(size), splits, [t.numel()] * size)
    for o, part in zip(outs, torch.split(whole, splits)):
        _flat(o).copy_(part)


def all_gather_v(exchange, out, t, counts, displs, rank: int, size: int) -> None:
    """MPI's Allgatherv on flat ``out``: rank q's ``t`` at element ``displs[q]``."""
    cs, ds = check_counts(counts, displs, out.numel(), size, "output", True)
    _own(f"counts[{rank}]", cs[rank], t.numel())
    flat = _flat(out)
    all_gather_list(exchange, [flat[d:d + c] for c, d in zip(cs, ds)], t, rank, size)


def gather_v(exchange, t, out, counts, displs, root: int, rank: int, size: int) -> None:
    """MPI's Gatherv: on ``root``, rank q's ``t`` at element ``displs[q]`` of ``out``."""
    import torch

    sends = [0] * size
    sends[root] = t.numel()
    if rank != root:
        exchange(t.new_empty(0), _flat(t), [0] * size, sends)
        return
    cs, ds = check_counts(counts, displs, out.numel(), size, "output", True)
    _own(f"counts[{root}]", cs[root], t.numel())
    whole = torch.empty(sum(cs), dtype=t.dtype)
    exchange(whole, _flat(t), cs, sends)
    flat = _flat(out)
    for c, d, part in zip(cs, ds, torch.split(whole, cs)):
        flat[d:d + c].copy_(part)


def scatter_v(exchange, out, inp, counts, displs, root: int, rank: int, size: int) -> None:
    """MPI's Scatterv: rank q's ``out`` = ``counts[q]`` elements of root's ``inp`` from ``displs[q]``."""
    import torch

    recvs = [0] * size
    recvs[root] = out.numel()
    if rank != root:
        exchange(_flat(out), out.new_empty(0), recvs, [0] * size)
        return
    cs, ds = check_counts(counts, displs, inp.numel(), size, "input", False)
    _own(f"counts[{root}]", cs[root], out.numel())
    flat = _flat(inp)
    packed = torch.cat([flat[d:d + c] for c, d in zip(cs, ds)]) if size else flat
    exchange(_flat(out), packed, recvs, cs)


def reduce_scatter_list(exchange, out, ins: list, op: int, factor: float, rank: int, size: int) -> None:
    """``out`` on rank r = reduction, in rank order, of every rank's ``ins[r]`` (any sizes).

    PREMUL_SUM: each rank scales its own pieces first (factors are per rank), then they are summed.
    """
    import torch

    if len(ins) != size:
        raise ValueError(f"input_list must hold world_size={size} arrays, got {len(ins)}")
    _own(f"input_list[{rank}]", ins[rank].numel(), out.numel())
    sends = [_flat(a) for a in ins]
    if op == PREMUL_SUM:
        sends, op = [a * factor for a in sends], 0
    m = out.numel()
    gathered = torch.empty(size * m, dtype=out.dtype)
    exchange(gathered, torch.cat(sends), [m] * size, [a.numel() for a in sends])
    reduce_kernel(_flat(out), [gathered[q * m:(q + 1) * m] for q in range(size)], op)


def reduce_scatter_v(exchange, out, inp, counts, op: int, factor: float, rank: int, size: int) -> None:
    """MPI's Reduce_scatter: ``inp`` holds ``sum(counts)`` elements; rank r gets piece r reduced."""
    cs, ds = check_counts(counts, None, inp.numel(), size, "input", False)
    _own(f"counts[{rank}]", cs[rank], out.numel())
    flat = _flat(inp)
    reduce_scatter_list(exchange, out, [flat[d:d + c] for c, d in zip(cs, ds)], op, factor, rank, size)
