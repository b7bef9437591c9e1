"""scan and exscan (MPI's prefix reductions) against numpy, every dtype and op, world sizes 1-4."""

from __future__ import annotations

import numpy as np
import pytest

import shmcomm as sc
from harness import run_ranks
from reference import DTYPES, assert_same_bits, make_input, ops_for, reduce_reference


def _prefixes(rank, size):
    checked = 0
    for dtype in DTYPES:
        for count in (0, 1, 7, 40_003):
            inputs = [make_input(dtype, count, r, salt=3) for r in range(size)]
            for op in ops_for(dtype):
                x = inputs[rank].copy()
                sc.scan(x, op=op)
                assert_same_bits(x, reduce_reference(inputs[:rank + 1], op), f"scan {dtype} {op} {count}")
                y = inputs[rank].copy()
                work = sc.exscan(y, op=op, async_op=True)
                work.wait()
                want = reduce_reference(inputs[:rank], op) if rank else _identity(inputs[0], op)
                assert_same_bits(y, want, f"exscan {dtype} {op} {count}")
                checked += 2
    z = np.arange(6, dtype=np.int64).reshape(2, 3) + rank  # any shape
    sc.scan(z, op=sc.ReduceOp.MAX)
    assert (z == np.arange(6).reshape(2, 3) + rank).all()
    with pytest.raises(TypeError):
        sc.scan(np.ones(3, np.float32), op="band")  # refused on every rank, before any step
    sc.barrier()
    return checked


def _identity(x: np.ndarray, op: str) -> np.ndarray:
    """What exscan gives rank 0: ``op``'s identity in ``x``'s dtype (``x`` itself for AVG, which
    has none), written out here by hand."""
    if op == "AVG":
        return x
    if op in ("SUM", "BOR", "BXOR"):
        return np.zeros_like(x)
    if op == "PRODUCT":
        return np.ones_like(x)
    if x.dtype.kind == "b":
        return np.full_like(x, op != "MAX")
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        return np.full_like(x, {"MIN": info.max, "MAX": info.min, "BAND": info.max if x.dtype.kind == "u" else -1}[op])
    return np.full_like(x, np.inf if op == "MIN" else -np.inf)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_scan_and_exscan_every_dtype_and_op(world):
    assert len(set(run_ranks(_prefixes, world, timeout=220))) == 1


def _torch_and_subgroups(rank, size):
    import torch

    t = torch.full((5,), float(rank + 1), dtype=torch.bfloat16)
    sc.scan(t)
    assert t.tolist() == [float((rank + 1) * (rank + 2) // 2)] * 5, t
    sub = sc.new_group([2, 0])  # ranks of the sub-group: 0 -> rank 0, 1 -> rank 2
    if sub is not None:
        x = np.array([float(rank + 10)])
        sc.exscan(x, group=sub)
        assert x[0] == (0.0 if sub.rank == 0 else 10.0), (rank, sub.rank, x)  # rank 1 gets rank 0's
    return True


@pytest.mark.timeout(60)
def test_scan_on_torch_tensors_and_sub_groups():
    pytest.importorskip("torch")
    assert all(run_ranks(_torch_and_subgroups, 3))


def _past_the_slots_and_mismatched(rank, size):
    """Arrays of many slot-sized chunks (SHMCOMM_SLOT_BYTES=4096: ~20 and ~3 chunks), then scan
    against exscan (refused on every rank, naming both calls; the group stays usable)."""
    from shmcomm.errors import CollectiveMismatchError

    for dtype, count, op in ((np.dtype(np.float64), 10_001, "SUM"), (np.dtype(np.int8), 9_000, "MAX"),
                             (np.dtype(np.float32), 3_333, "AVG")):
        inputs = [make_input(dtype, count, r, salt=5) for r in range(size)]
        x = inputs[rank].copy()
        sc.scan(x, op=op)
        assert_same_bits(x, reduce_reference(inputs[:rank + 1], op), f"scan {dtype} {op} {count}")
        y = inputs[rank].copy()
        sc.exscan(y, op=op)
        want = reduce_reference(inputs[:rank], op) if rank else _identity(inputs[0], op)
        assert_same_bits(y, want, f"exscan {dtype} {op} {count}")
    if size > 1:
        z = np.ones(4)
        with pytest.raises(CollectiveMismatchError, match=r"(?s)rank 0: scan\(dtype=float64.*rank 1: exscan\(dtype=float64"):
            (sc.scan if rank == 0 else sc.exscan)(z)
    w = np.full(3, 1.0 + rank)
    sc.scan(w)
    assert (w == (rank + 1) * (rank + 2) / 2).all()
    return True


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [1, 3])
def test_scan_past_the_slots_and_scan_against_exscan(world):
    assert all(run_ranks(_past_the_slots_and_mismatched, world, env={"SHMCOMM_SLOT_BYTES": "4096"},
                         timeout=100))
