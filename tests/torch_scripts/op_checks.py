"""Value checks of the ``torch.ops.shmcomm`` operators, shared by tests/test_torch_ops.py (forked
ranks) and the launcher runs (``ops_script.py`` under torchrun, shmrun and ranks started by hand).

Each check runs on every rank of an initialized default shmcomm group, compares every result with
the same reduction computed here from every rank's inputs (torch in float64/int64, independently
of shmcomm), checks that every rank holds the same bits, and raises AssertionError naming what
differed. ``run_all`` runs them all and returns how many results it compared.
"""
from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

from shmcomm.torch_ops import all_reduce_ as drop_in_all_reduce_
from shmcomm import _core
from shmcomm.torch_ops import kernels, native

FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
COMPLEX = [torch.complex64, torch.complex128]
DTYPES = FLOATS + INTS + COMPLEX + [torch.bool]
# 0, 1, odd, and larger than a slot (1 MiB): 300k float32 are 1.2 MB
SIZES = [0, 1, 1001, 300_000]


def ops_for(dtype: torch.dtype) -> list[str]:
    """The reduce ops the core has for ``dtype`` (the others raise TypeError: see check_refusals)."""
    if dtype == torch.bool:
        return ["max", "min", "band", "bor", "bxor"]
    if dtype.is_complex:
        return ["sum", "avg", "product"]
    if dtype.is_floating_point:
        return ["sum", "avg", "product", "max", "min"]
    return ["sum", "product", "max", "min", "band", "bor", "bxor"]


def value(rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input: small integers (exact in every dtype, products of 4 ranks too)."""
    gen = torch.Generator().manual_seed(7919 * salt + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=gen).bool()
    low = 0 if dtype == torch.uint8 else -3
    if dtype.is_complex:
        parts = torch.randint(low, 4, (2, n), generator=gen).double()
        return torch.complex(parts[0], parts[1]).to(dtype)
    return torch.randint(low, 4, (n,), generator=gen).to(dtype)


def expected(op: str, inputs: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The reduction of ``inputs`` computed in a wide type, then cast as the core casts it."""
    wide = torch.complex128 if dtype.is_complex else torch.float64 if dtype.is_floating_point else torch.int64
    xs = torch.stack([t.to(wide) for t in inputs])
    if op in ("sum", "avg"):
        r = xs.sum(0)
        if op == "avg":
            r = r / len(inputs)
    elif op == "product":
        r = xs.prod(0)
    elif op == "max":
        r = xs.max(0).values
    elif op == "min":
        r = xs.min(0).values
    else:
        r = xs[0]
        for x in xs[1:]:
            r = {"band": r & x, "bor": r | x, "bxor": r ^ x}[op]
    if dtype == torch.bool:
        return r != 0
    if not (dtype.is_floating_point or dtype.is_complex):
        return r.to(dtype)  # wraps as the core's integer arithmetic does (uint8 products)
    return r.to(dtype)


def _tolerance(dtype: torch.dtype, op: str) -> dict:
    """Exact, but for the division of "avg" (the core may multiply by 1/n: an ulp apart)."""
    if op != "avg":
        return {"rtol": 0, "atol": 0}
    if dtype in (torch.bfloat16, torch.float16):
        return {"rtol": 1e-2, "atol": 1e-2}
    return {"rtol": 1e-6, "atol": 1e-6}


def _same_everywhere(results: list[torch.Tensor], what: str, group=None) -> None:
    """Every rank of ``group`` holds the same bits in ``results``."""
    digest = hashlib.sha256(b"".join(r.contiguous().view(torch.uint8).numpy().tobytes() for r in results)).hexdigest()
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, digest, group=group)
    assert len(set(everyone)) == 1, f"{what}: ranks hold different bits: {everyone}"


def _close(actual: torch.Tensor, want: torch.Tensor, what: str, **tol) -> None:
    assert actual.dtype == want.dtype and actual.shape == want.shape, (what, actual.dtype, actual.shape, want.shape)
    torch.testing.assert_close(actual, want, equal_nan=True, msg=lambda m: f"{what}: {m}", **tol)


def check_all_reduce(group=None, ranks=None, calls=("op", "python", "drop_in")) -> int:
    """all_reduce_ over every dtype, op and size, through the op (native kernel where built),
    the Python kernel and the drop-in; ``ranks``: the group's members (default: every rank)."""
    ranks = ranks or list(range(dist.get_world_size()))
    me, name, compared, results = ranks.index(dist.get_rank()), (group.group_name if group else None), 0, []
    for salt, (dtype, n) in enumerate((d, n) for d in DTYPES for n in SIZES):
        for op in ops_for(dtype):
            call = calls[(salt + len(op)) % len(calls)]
            t = value(me, n, dtype, salt)
            if call == "op" and op == "sum" and name is None:  # DeepSpeed's call shape: the defaults
                out = torch.ops.shmcomm.all_reduce_(t)
            elif call == "op":
                out = torch.ops.shmcomm.all_reduce_(t, op, name)
            elif call == "python":
                out = kernels.all_reduce_(t, op, name)
            else:
                out = drop_in_all_reduce_(t, group, op)
            assert out is t, f"all_reduce_ ({call}) returned another tensor"
            want = expected(op, [value(q, n, dtype, salt) for q in range(len(ranks))], dtype)
            _close(t, want, f"all_reduce_({dtype}, {op}, n={n}, via {call})", **_tolerance(dtype, op))
            results.append(t)
            compared += 1
    _same_everywhere(results, "all_reduce_", group)
    return compared


def check_data_movement(group=None, ranks=None) -> int:
    """all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single (even and uneven),
    broadcast_ and the copying all_reduce/broadcast, for every dtype."""
    ranks = ranks or list(range(dist.get_world_size()))
    n, me, name, compared = len(ranks), ranks.index(dist.get_rank()), (group.group_name if group else None), 0
    results = []
    for salt, dtype in enumerate(DTYPES):
        # all_gather_into_tensor: 2-D, stacked along dim 0 in rank order
        mine = value(me, 6, dtype, salt).reshape(2, 3)
        got = torch.ops.shmcomm.all_gather_into_tensor(mine, n, name)
        _close(got, torch.cat([value(q, 6, dtype, salt).reshape(2, 3) for q in range(n)]), f"all_gather {dtype}")
        # reduce_scatter_tensor: rank r gets block r of the sum (max for bool)
        op = "max" if dtype == torch.bool else "sum"
        full = value(me, 4 * n, dtype, salt + 100)
        got2 = torch.ops.shmcomm.reduce_scatter_tensor(full, op, n, name)
        want = expected(op, [value(q, 4 * n, dtype, salt + 100) for q in range(n)], dtype)[4 * me:4 * me + 4]
        _close(got2, want, f"reduce_scatter {dtype}")
        # all_to_all_single, uneven: rank r sends q+1 rows to rank q
        rows_in = [q + 1 for q in range(n)]
        rows_out = [me + 1] * n
        src = torch.cat([value(me * 100 + q, (q + 1) * 2, dtype, salt).reshape(q + 1, 2) for q in range(n)])
        got3 = torch.ops.shmcomm.all_to_all_single(src, rows_out, rows_in, name)
        want3 = torch.cat([value(q * 100 + me, (me + 1) * 2, dtype, salt).reshape(me + 1, 2) for q in range(n)])
        _close(got3, want3, f"all_to_all_single uneven {dtype}")
        # broadcast_ from the last group rank; the copying forms leave their input alone
        b = value(me, 7, dtype, salt)
        assert torch.ops.shmcomm.broadcast_(b, n - 1, name) is b
        _close(b, value(n - 1, 7, dtype, salt), f"broadcast_ {dtype}")
        before = value(me, 5, dtype, salt)
        copy = torch.ops.shmcomm.broadcast(before, 0, name)
        _close(before, value(me, 5, dtype, salt), f"broadcast left its input {dtype}")
        _close(copy, value(0, 5, dtype, salt), f"broadcast {dtype}")
        results += [got, b, copy]  # the others differ by rank by design
        compared += 5
    x = value(me, 9, torch.float32)
    total = torch.ops.shmcomm.all_reduce(x, "sum", name)
    _close(x, value(me, 9, torch.float32), "all_reduce left its input")
    _close(total, expected("sum", [value(q, 9, torch.float32) for q in range(n)], torch.float32), "all_reduce")
    _same_everywhere(results, "all_gather and broadcast", group)
    return compared + 1


def check_non_contiguous(group=None, ranks=None) -> int:
    """A transposed (non-contiguous) tensor goes through a copy and is reduced in place."""
    ranks = ranks or list(range(dist.get_world_size()))
    me, name = ranks.index(dist.get_rank()), (group.group_name if group else None)
    t = value(me, 12, torch.float32).reshape(3, 4).t()
    torch.ops.shmcomm.all_reduce_(t, "sum", name)
    want = expected("sum", [value(q, 12, torch.float32).reshape(3, 4).t() for q in range(len(ranks))], torch.float32)
    _close(t, want, "non-contiguous all_reduce_")
    return 1


def run_all() -> int:
    """Every check on the default group; at 3+ ranks, again on a sub-group of the first and last."""
    size = dist.get_world_size()
    # every tensor below is read by the native tensor reader where the native library loaded
    assert _core.tensor_reader_in_use() == native.load(), (native.why_not(), _core.tensor_reader_in_use())
    compared = check_all_reduce() + check_data_movement() + check_non_contiguous()
    if size >= 3:
        members = [0, size - 1]
        sub = dist.new_group(members, backend="shmcomm")
        if dist.get_rank() in members:
            compared += check_all_reduce(sub, members, calls=("op", "drop_in"))
            compared += check_data_movement(sub, members)
    return compared
