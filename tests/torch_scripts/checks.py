"""Value checks of every torch.distributed operation, shared by the launcher scripts and the pytest
tests. Each check runs on every rank of an initialized default group and raises AssertionError
with what differed; ``run_all`` runs them all and returns how many checks passed.
"""
from __future__ import annotations

import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.testing import assert_close

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
COMPLEX = [torch.complex64, torch.complex128]
ALL = FLOATS + INTS + COMPLEX + [torch.bool]
# torch 2.13 renamed these (the old names warn); either name reaches the same backend method.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
# torch has only a few kernels for these; they travel through the data-movement collectives.
UNSIGNED_WIDE = [torch.uint16, torch.uint32, torch.uint64]


def value(rank: int, dtype: torch.dtype, n: int = 5) -> torch.Tensor:
    """Rank ``rank``'s deterministic test tensor of ``n`` elements."""
    i = torch.arange(n, dtype=torch.float64)
    if dtype == torch.bool:
        return ((torch.arange(n) + rank) % 3 == 0)
    if dtype.is_complex:
        return torch.complex(i * 0.5 + rank + 1, i - rank).to(dtype)
    if dtype.is_floating_point:
        return (i * 0.5 + rank + 1).to(dtype)
    if dtype in UNSIGNED_WIDE:
        return (torch.arange(n, dtype=torch.int64) % 4 + rank + 1).to(dtype)
    return (i % 4 + rank + 1).to(torch.int64).to(dtype)


def _same(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    if actual.dtype in UNSIGNED_WIDE:  # few kernels exist for these: compare the bits
        actual, expected = actual.view(torch.int16 if actual.itemsize == 2 else
                                       torch.int32 if actual.itemsize == 4 else torch.int64), \
            expected.view(torch.int16 if expected.itemsize == 2 else
                          torch.int32 if expected.itemsize == 4 else torch.int64)
    if actual.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        actual, expected = actual.view(torch.uint8), expected.view(torch.uint8)
    try:
        assert_close(actual, expected, rtol=None, atol=None, equal_nan=True)
    except AssertionError as exc:
        raise AssertionError(f"{what}: {exc}") from None


def _reduce_expected(tensors: list[torch.Tensor], op) -> torch.Tensor:
    dtype = tensors[0].dtype
    if dtype == torch.bool:
        stack = torch.stack(tensors)
        if op in (dist.ReduceOp.SUM, dist.ReduceOp.BOR, dist.ReduceOp.MAX):
            return stack.any(0)
        if op in (dist.ReduceOp.PRODUCT, dist.ReduceOp.BAND, dist.ReduceOp.MIN):
            return stack.all(0)
        return (stack.sum(0) % 2).bool()
    wide = torch.complex128 if dtype.is_complex else torch.float64 if dtype.is_floating_point else torch.int64
    stack = torch.stack([t.to(wide) for t in tensors])
    if op == dist.ReduceOp.SUM:
        out = stack.sum(0)
    elif op == dist.ReduceOp.AVG and not (dtype.is_floating_point or dtype.is_complex):
        out = torch.div(stack.sum(0), len(tensors), rounding_mode="trunc")  # as NCCL: truncated
    elif op == dist.ReduceOp.AVG:
        out = stack.sum(0) / len(tensors)
    elif op == dist.ReduceOp.PRODUCT:
        out = stack.prod(0)
    elif op == dist.ReduceOp.MIN:
        out = stack.min(0).values
    elif op == dist.ReduceOp.MAX:
        out = stack.max(0).values
    else:
        out = stack[0].clone()
        for t in stack[1:]:
            out = {dist.ReduceOp.BAND: torch.bitwise_and, dist.ReduceOp.BOR: torch.bitwise_or,
                   dist.ReduceOp.BXOR: torch.bitwise_xor}[op](out, t)
    if not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool:
        bits = torch.iinfo(dtype).bits
        out = out & ((1 << bits) - 1) if bits < 64 else out
        return out.to(torch.uint8 if dtype == torch.uint8 else torch.int64).to(dtype) if bits == 8 \
            else out.to(dtype)
    return out.to(dtype)


def ops_for(dtype: torch.dtype) -> list:
    """The ReduceOps torch allows for ``dtype`` (AVG on all but bool, truncated on integers)."""
    if dtype == torch.bool:
        return [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.BAND,
                dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
    if dtype.is_complex:
        return [dist.ReduceOp.SUM, dist.ReduceOp.AVG]
    if dtype.is_floating_point:
        return [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN,
                dist.ReduceOp.MAX]
    return [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN,
            dist.ReduceOp.MAX, dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]


class Counter:
    """Counts passed checks."""

    def __init__(self):
        self.n = 0

    def same(self, actual, expected, what):
        _same(actual, expected, what)
        self.n += 1


# ---- reductions ---------------------------------------------------------------------------------
def check_all_reduce(rank, size, c: Counter, group=None, ranks=None):
    """all_reduce with every op and dtype, async, non-contiguous, 0-d and empty tensors."""
    ranks = ranks or list(range(size))
    for dtype in ALL:
        for op in ops_for(dtype):
            t = value(rank, dtype)
            dist.all_reduce(t, op=op, group=group)
            c.same(t, _reduce_expected([value(r, dtype) for r in ranks], op), f"all_reduce {dtype} {op}")
    base = torch.arange(12.0).reshape(3, 4) + rank
    view = base[:, ::2]                                    # non-contiguous
    assert not view.is_contiguous()
    dist.all_reduce(view, group=group)
    expected = sum(torch.arange(12.0).reshape(3, 4)[:, ::2] + r for r in ranks)
    c.same(view, expected, "all_reduce non-contiguous")
    c.same(base[:, 1::2], torch.arange(12.0).reshape(3, 4)[:, 1::2] + rank, "untouched columns")
    scalar = torch.tensor(float(rank + 1))
    dist.all_reduce(scalar, op=dist.ReduceOp.MAX, group=group)
    c.same(scalar, torch.tensor(float(max(ranks) + 1)), "all_reduce 0-d")
    empty = torch.empty(0)
    dist.all_reduce(empty, group=group)
    c.same(empty, torch.empty(0), "all_reduce empty")
    big = torch.full((300_000,), float(rank + 1))        # larger than one slot: pipelined
    work = dist.all_reduce(big, group=group, async_op=True)
    total = work.get_future().then(lambda f: f.value()[0].sum().item()).wait()
    work.wait()
    assert work.is_completed() and work.is_success()
    c.same(big, torch.full((300_000,), float(sum(r + 1 for r in ranks))), "async all_reduce")
    assert total == 300_000 * sum(r + 1 for r in ranks), total


def check_coalesced(rank, size, c: Counter):
    """all_reduce_coalesced and the coalescing manager (all_reduce, all_gather_into_tensor)."""
    a, b = torch.full((3,), rank, dtype=torch.int32), torch.full((2, 2), rank, dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_reduce_coalesced([a, b])
    c.same(a, torch.full((3,), sum(range(size)), dtype=torch.int32), "all_reduce_coalesced a")
    c.same(b, torch.full((2, 2), sum(range(size)), dtype=torch.int32), "all_reduce_coalesced b")
    x, y = torch.ones(4) * rank, torch.ones(5) * rank
    with dist._coalescing_manager():
        dist.all_reduce(x)
        dist.all_reduce(y)
    c.same(x, torch.ones(4) * sum(range(size)), "coalescing manager all_reduce")
    outs = [torch.empty(size * 2), torch.empty(size * 3)]
    with dist._coalescing_manager():
        all_gather_single(outs[0], torch.full((2,), float(rank)))
        all_gather_single(outs[1], torch.full((3,), float(rank)))
    c.same(outs[1], torch.arange(size, dtype=torch.float32).repeat_interleave(3), "coalesced all_gather")
    gathered = [[torch.empty(2), torch.empty(3)] for _ in range(size)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_gather_coalesced(gathered, [torch.full((2,), float(rank)), torch.full((3,), float(rank))])
    for q in range(size):
        c.same(gathered[q][1], torch.full((3,), float(q)), "all_gather_coalesced")


def check_premul_sum(rank, size, c: Counter):
    """PREMUL_SUM (FSDP2's gradient divide factor) with a number and a 0-d tensor factor, every
    floating dtype, on all_reduce, reduce, reduce_scatter(_tensor), the coalesced forms and a
    functional reduce_scatter; AVG through the same paths."""
    for dtype in [torch.float32, torch.float64, torch.float16, torch.bfloat16]:
        for factor in (0.25, torch.tensor(3.0, dtype=torch.float64)):
            f = float(factor)
            op = lambda: dist._make_nccl_premul_sum(factor)  # noqa: E731 - a fresh op per call
            expected = sum(value(r, torch.float64) * f for r in range(size)).to(dtype)
            t = value(rank, dtype)
            dist.all_reduce(t, op=op())
            c.same(t, expected, f"premul all_reduce {dtype} {f}")
            t = value(rank, dtype)
            dist.reduce(t, dst=size - 1, op=op())
            c.same(t, expected if rank == size - 1 else value(rank, dtype), f"premul reduce {dtype}")
            ins = [value(rank * 10 + q, dtype, 3) for q in range(size)]
            want = sum(value(r * 10 + rank, torch.float64, 3) * f for r in range(size)).to(dtype)
            out = torch.empty(3, dtype=dtype)
            dist.reduce_scatter(out, ins, op=op())
            c.same(out, want, f"premul reduce_scatter {dtype}")
            out = torch.empty(3, dtype=dtype)
            reduce_scatter_single(out, torch.cat(ins), op=op())
            c.same(out, want, f"premul reduce_scatter_tensor {dtype}")
            a, b = value(rank, dtype), value(rank, dtype, 7)
            with dist._coalescing_manager():
                dist.all_reduce(a, op=op())
                dist.all_reduce(b, op=op())
            c.same(b, sum(value(r, torch.float64, 7) * f for r in range(size)).to(dtype),
                   f"premul coalesced all_reduce {dtype}")
            outs = [torch.empty(3, dtype=dtype), torch.empty(3, dtype=dtype)]
            with dist._coalescing_manager():
                reduce_scatter_single(outs[0], torch.cat(ins), op=op())
                reduce_scatter_single(outs[1], torch.cat(ins) * 2, op=op())
            c.same(outs[1], want * 2, f"premul coalesced reduce_scatter_tensor {dtype}")
    x = torch.arange(size * 4, dtype=torch.float32) + rank
    got = funcol.wait_tensor(funcol.reduce_scatter_tensor(x, "avg", 0, dist.group.WORLD))
    c.same(got, (torch.arange(size * 4.0) + sum(range(size)) / size)[rank * 4:rank * 4 + 4],
           "functional reduce_scatter avg")


def check_reduce(rank, size, c: Counter, group=None, ranks=None):
    """reduce to every destination, several dtypes and ops; other ranks' tensors unchanged."""
    ranks = ranks or list(range(size))
    for dst_index, dst in enumerate(ranks):
        for dtype in [torch.float32, torch.bfloat16, torch.int64, torch.complex64, torch.bool]:
            op = dist.ReduceOp.MAX if dtype == torch.bool else dist.ReduceOp.SUM
            t = value(rank, dtype)
            dist.reduce(t, dst=dst, op=op, group=group)
            if rank == dst:
                c.same(t, _reduce_expected([value(r, dtype) for r in ranks], op), f"reduce {dtype}")


def check_reduce_scatter(rank, size, c: Counter):
    """reduce_scatter (lists) and reduce_scatter_tensor (flat and 2-D), several dtypes and ops."""
    for dtype in [torch.float32, torch.float16, torch.int32, torch.complex128]:
        for op in [dist.ReduceOp.SUM, dist.ReduceOp.AVG if dtype.is_floating_point or dtype.is_complex
                   else dist.ReduceOp.MAX]:
            ins = [value(rank * 10 + q, dtype, 3) for q in range(size)]
            out = torch.empty(3, dtype=dtype)
            dist.reduce_scatter(out, ins, op=op)
            c.same(out, _reduce_expected([value(r * 10 + rank, dtype, 3) for r in range(size)], op),
                   f"reduce_scatter {dtype} {op}")
            flat = torch.cat(ins)
            out2 = torch.empty(3, dtype=dtype)
            reduce_scatter_single(out2, flat, op=op)
            c.same(out2, out, f"reduce_scatter_tensor {dtype} {op}")
    if dist.get_backend() == "shmcomm":  # gloo refuses pieces of different sizes
        # rank q's piece holds q + 1 elements; bfloat16 sums in float32
        for dtype in [torch.float32, torch.bfloat16, torch.int64]:
            ins = [value(rank * 10 + q, dtype, q + 1) for q in range(size)]
            out = torch.empty(rank + 1, dtype=dtype)
            dist.reduce_scatter(out, ins)
            c.same(out, _reduce_expected([value(r * 10 + rank, dtype, rank + 1) for r in range(size)],
                                         dist.ReduceOp.SUM), f"uneven reduce_scatter {dtype}")
    grid = torch.arange(size * 6, dtype=torch.float64).reshape(size * 2, 3) + rank
    out = torch.empty(2, 3, dtype=torch.float64)
    reduce_scatter_single(out, grid)
    expected = sum(torch.arange(size * 6, dtype=torch.float64).reshape(size * 2, 3) + r for r in range(size))
    c.same(out, expected[2 * rank:2 * rank + 2], "reduce_scatter_tensor 2-D")


def check_large(rank, size, c: Counter):
    """Sizes past 4 MiB (where a group across nodes shards over every rail instead of crossing
    through one rank per node), odd counts: all_reduce in float32 and bfloat16,
    reduce_scatter_tensor and all_gather_into_tensor. Values are small integers, exact in both."""
    count = (4 << 20) // 4 + 3
    pattern = torch.arange(count) % 7
    for dtype in [torch.float32, torch.bfloat16]:
        for op in [dist.ReduceOp.SUM, dist.ReduceOp.MAX]:
            t = (pattern + rank).to(dtype)
            dist.all_reduce(t, op=op)
            parts = [(pattern + r).to(dtype) for r in range(size)]
            c.same(t, _reduce_expected(parts, op), f"large all_reduce {dtype} {op}")
    piece = count // size + 1
    whole = (torch.arange(piece * size) % 5 + rank).to(torch.float32)
    out = torch.empty(piece)
    reduce_scatter_single(out, whole)
    expected = sum((torch.arange(piece * size) % 5 + r).to(torch.float32) for r in range(size))
    c.same(out, expected[rank * piece:(rank + 1) * piece], "large reduce_scatter_tensor")
    gathered = torch.empty(piece * size)
    all_gather_single(gathered, out)
    c.same(gathered, expected, "large all_gather_into_tensor")


# ---- data movement -----------------------------------------------------------------------------
def check_broadcast(rank, size, c: Counter, group=None, ranks=None):
    """broadcast from every root, every dtype (float8 included), non-contiguous."""
    ranks = ranks or list(range(size))
    dtypes = ALL + UNSIGNED_WIDE + [torch.float8_e4m3fn]
    for src in ranks:
        for dtype in dtypes:
            if dtype == torch.float8_e4m3fn:
                t = value(rank, torch.float32).to(dtype)
                expected = value(src, torch.float32).to(dtype)
            else:
                t, expected = value(rank, dtype), value(src, dtype)
            dist.broadcast(t, src=src, group=group)
            c.same(t, expected, f"broadcast {dtype} from {src}")
        m = (torch.arange(20.0).reshape(4, 5) * (rank + 1)).t()        # non-contiguous
        dist.broadcast(m, src=src, group=group)
        c.same(m, (torch.arange(20.0).reshape(4, 5) * (src + 1)).t(), "broadcast non-contiguous")


def check_all_gather(rank, size, c: Counter, group=None, ranks=None):
    """all_gather (even and uneven), all_gather_into_tensor (flat, 2-D, non-contiguous input)."""
    ranks = ranks or list(range(size))
    n = len(ranks)
    me = ranks.index(rank)
    for dtype in ALL + UNSIGNED_WIDE:
        outs = [torch.empty(5, dtype=dtype) for _ in range(n)]
        dist.all_gather(outs, value(rank, dtype), group=group)
        for q, r in enumerate(ranks):
            c.same(outs[q], value(r, dtype), f"all_gather {dtype}")
    uneven = [torch.empty(q + 1, 2) for q in range(n)]
    dist.all_gather(uneven, torch.full((me + 1, 2), float(rank)), group=group)
    for q, r in enumerate(ranks):
        c.same(uneven[q], torch.full((q + 1, 2), float(r)), "uneven all_gather")
    for dtype in [torch.float32, torch.bfloat16, torch.int16, torch.complex64, torch.bool]:
        flat = torch.empty(n * 5, dtype=dtype)
        all_gather_single(flat, value(rank, dtype), group=group)
        c.same(flat, torch.cat([value(r, dtype) for r in ranks]), f"all_gather_into_tensor {dtype}")
    stacked = torch.empty(n, 2, 3)
    src = (torch.arange(6.0).reshape(3, 2) + rank).t()                   # non-contiguous input
    all_gather_single(stacked, src, group=group)
    for q, r in enumerate(ranks):
        c.same(stacked[q], (torch.arange(6.0).reshape(3, 2) + r).t(), "all_gather_into_tensor 2-D")


def check_gather_scatter(rank, size, c: Counter):
    """gather and scatter through every root, a few dtypes."""
    for root in range(size):
        for dtype in [torch.float64, torch.int8, torch.bfloat16, torch.bool, torch.complex64]:
            outs = [torch.empty(5, dtype=dtype) for _ in range(size)] if rank == root else None
            dist.gather(value(rank, dtype), outs, dst=root)
            if rank == root:
                for q in range(size):
                    c.same(outs[q], value(q, dtype), f"gather {dtype}")
            ins = [value(root * 10 + q, dtype) for q in range(size)] if rank == root else None
            out = torch.empty(5, dtype=dtype)
            dist.scatter(out, ins, src=root)
            c.same(out, value(root * 10 + rank, dtype), f"scatter {dtype}")


def check_all_to_all(rank, size, c: Counter):
    """all_to_all (even and uneven lists) and all_to_all_single (even, splits, 2-D)."""
    for dtype in [torch.float32, torch.int64, torch.float16, torch.complex128]:
        ins = [value(rank * 10 + q, dtype, 4) for q in range(size)]
        outs = [torch.empty(4, dtype=dtype) for _ in range(size)]
        dist.all_to_all(outs, ins)
        for q in range(size):
            c.same(outs[q], value(q * 10 + rank, dtype, 4), f"all_to_all {dtype}")
    # rank r sends r + q + 1 elements to rank q
    ins = [torch.full((rank + q + 1,), float(rank * 10 + q)) for q in range(size)]
    outs = [torch.empty(q + rank + 1) for q in range(size)]
    dist.all_to_all(outs, ins)
    for q in range(size):
        c.same(outs[q], torch.full((q + rank + 1,), float(q * 10 + rank)), "uneven all_to_all")
    inp = torch.arange(size * 2, dtype=torch.float32) + 100 * rank
    out = torch.empty(size * 2)
    dist.all_to_all_single(out, inp)
    expected = torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) + 100 * q
                          for q in range(size)])
    c.same(out, expected, "all_to_all_single even")
    in_splits = [rank + q + 1 for q in range(size)]
    out_splits = [q + rank + 1 for q in range(size)]
    rows = torch.cat([torch.full((s, 3), rank * 10 + q, dtype=torch.int32) for q, s in enumerate(in_splits)])
    out = torch.empty(sum(out_splits), 3, dtype=torch.int32)
    dist.all_to_all_single(out, rows, out_splits, in_splits)
    expected = torch.cat([torch.full((s, 3), q * 10 + rank, dtype=torch.int32)
                          for q, s in enumerate(out_splits)])
    c.same(out, expected, "all_to_all_single splits 2-D")


def check_barrier(rank, size, c: Counter):
    """barrier, sync and async; a barrier holds every rank until the last one arrives."""
    dist.barrier()
    dist.barrier(async_op=True).wait()
    if rank == 0:
        time.sleep(0.3)
    start = time.monotonic()
    dist.barrier()
    waited = time.monotonic() - start
    assert rank == 0 or waited >= 0.25, f"rank {rank} left the barrier after {waited:.3f} s, " \
        "before rank 0 arrived"
    c.n += 1


# ---- point to point ----------------------------------------------------------------------------
def check_p2p(rank, size, c: Counter):
    """send/recv, isend/irecv, recv from any source, batch_isend_irecv ring, non-contiguous."""
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    for dtype in [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64]:
        if rank == 0:
            dist.send(value(0, dtype), dst=1, tag=7)
        elif rank == 1:
            buf = torch.empty(5, dtype=dtype)
            assert dist.recv(buf, src=0, tag=7) == 0
            c.same(buf, value(0, dtype), f"send/recv {dtype}")
    send = dist.isend(torch.full((4,), float(rank)), dst=nxt)
    buf = torch.empty(4)
    recv = dist.irecv(buf, src=prv)
    send.wait()
    recv.wait()
    c.same(buf, torch.full((4,), float(prv)), "isend/irecv")
    if rank == 0:
        got = set()
        for _ in range(size - 1):
            anyone = torch.empty(2)
            sender = dist.recv(anyone, tag=3)
            c.same(anyone, torch.full((2,), float(sender)), "recv anysource")
            got.add(sender)
        assert got == set(range(1, size)), got
    else:
        dist.send(torch.full((2,), float(rank)), dst=0, tag=3)
    out = torch.empty(3, 2)
    ops = [dist.P2POp(dist.isend, torch.full((3, 2), float(rank)), nxt),
           dist.P2POp(dist.irecv, out, prv)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    c.same(out, torch.full((3, 2), float(prv)), "batch_isend_irecv")
    strided = torch.zeros(4, 4)
    target = strided[:, 1]                                            # non-contiguous
    reqs = [dist.isend(torch.arange(8.0)[::2] + rank, dst=nxt), dist.irecv(target, src=prv)]
    for w in reqs:
        w.wait()
    c.same(strided[:, 1], torch.arange(8.0)[::2] + prv, "non-contiguous recv")
    dist.barrier()


def check_objects(rank, size, c: Counter):
    """Object collectives through torch's own helpers."""
    objs = [{"rank": rank, "tag": "x" * (rank + 1)}, rank] if rank == 0 else [None, None]
    dist.broadcast_object_list(objs, src=0)
    assert objs == [{"rank": 0, "tag": "x"}, 0], objs
    gathered = [None] * size
    dist.all_gather_object(gathered, {"r": rank, "pad": "y" * rank * 5})
    assert gathered == [{"r": q, "pad": "y" * q * 5} for q in range(size)], gathered
    out = [None] * size if rank == size - 1 else None
    dist.gather_object(("g", rank), out, dst=size - 1)
    if rank == size - 1:
        assert out == [("g", q) for q in range(size)], out
    received = [None]
    dist.scatter_object_list(received, [f"item{q}" for q in range(size)] if rank == 0 else None, src=0)
    assert received == [f"item{rank}"], received
    c.n += 4


def check_groups(rank, size, c: Counter):
    """new_group: sub-group collectives with group ranks mapped, names and backend."""
    world = dist.group.WORLD
    assert world.name() == dist.get_backend(), world.name()
    assert world.group_desc == "default_pg", world.group_desc
    assert isinstance(world.group_name, str) and world.group_name
    members = [0, size - 1] if size > 2 else [1]
    sub = dist.new_group(members)
    if rank in members:
        assert dist.get_world_size(sub) == len(members)
        assert dist.get_backend(sub) == dist.get_backend()
        assert sub.group_name != world.group_name
        check_all_reduce(rank, size, Counter(), group=sub, ranks=members)
        check_broadcast(rank, size, c, group=sub, ranks=members)
        check_reduce(rank, size, c, group=sub, ranks=members)
        check_all_gather(rank, size, c, group=sub, ranks=members)
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=sub)
        c.same(t, torch.tensor([float(sum(members))]), "sub-group all_reduce")
    whole = dist.new_group()
    t = torch.ones(3)
    dist.all_reduce(t, group=whole)
    c.same(t, torch.full((3,), float(size)), "new_group() all_reduce")
    dist.destroy_process_group(whole)
    dist.barrier()


def check_lazy_views(rank, size, c: Counter):
    """Negative views (lazy: no plain memory of their own) in and out of operations."""
    neg = torch._neg_view(torch.arange(4.0) + rank)
    assert neg.is_neg()
    dist.all_reduce(neg)
    c.same(neg.resolve_neg(), -sum(torch.arange(4.0) + r for r in range(size)), "all_reduce neg view")
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    buf = torch._neg_view(torch.zeros(3))
    works = [dist.isend(torch._neg_view(torch.ones(3) * rank), dst=nxt), dist.irecv(buf, src=prv)]
    for w in works:
        w.wait()
    c.same(buf.resolve_neg(), -torch.ones(3) * prv, "isend/irecv neg views")
    # (torch itself refuses lazy conjugate views: it views complex tensors as real first)

CHECKS = [check_all_reduce, check_coalesced, check_premul_sum, check_reduce, check_reduce_scatter,
          check_large, check_broadcast, check_all_gather, check_gather_scatter, check_all_to_all,
          check_barrier, check_p2p, check_objects, check_groups, check_lazy_views]


def run_all(rank: int, size: int, checks=None) -> int:
    """Run ``checks`` (default: all) on this rank; return the number of checks that passed."""
    c = Counter()
    for check in checks or CHECKS:
        try:
            check(rank, size, c)
        except AssertionError as exc:
            raise AssertionError(f"{check.__name__} on rank {rank}: {exc}") from None
    return c.n


# ---- DistributedDataParallel --------------------------------------------------------------------
def make_model(seed: int = 0) -> torch.nn.Module:
    """A small MLP with a BatchNorm (DDP broadcasts its buffers every step), same on every rank."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def train_ddp(rank: int, group=None, steps: int = 6, comm_hook=None,
              bucket_cap_mb: float = 0.002) -> list[torch.Tensor]:
    """Train ``make_model()`` under DDP on ``group`` with per-rank data; return the parameters
    and buffers afterwards. ``comm_hook``: a ``(state, hook)`` pair for ``register_comm_hook``."""
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=bucket_cap_mb)
    if comm_hook is not None:
        ddp.register_comm_hook(*comm_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randn(8, 4, generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()] + [b.clone() for b in model.buffers()]
