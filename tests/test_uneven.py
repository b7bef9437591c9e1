"""Uneven counts: MPI's v forms (all_gather_v, gather_v, scatter_v, reduce_scatter_v) and torch's
list forms with pieces of different sizes, against numpy references at world sizes 1-4, on the
slot path, the pipelined path (pieces larger than a slot) and the single-copy path."""

import numpy as np
import pytest

import shmcomm as sc
from harness import RankFailed, run_ranks
from reference import DTYPES, assert_same_bits, make_input, ops_for, reduce_reference

PIPELINED = {"SHMCOMM_SLOT_BYTES": 8192, "SHMCOMM_SMALL_BYTES": 512}
SINGLE_COPY = {"SHMCOMM_CMA_BYTES": 1024, "SHMCOMM_SMALL_BYTES": 512}


def _counts(size, scale, salt=0):
    """Different counts per rank, a zero among them from 3 ranks up."""
    pattern = [3, 0, 11, 1, 6][salt % 5:] + [3, 0, 11, 1, 6][:salt % 5]
    return [pattern[q % 5] * scale + (q if scale > 1 else 0) for q in range(size)]


def _gapped(counts):
    """Displacements in reverse rank order with a 2-element gap before each piece."""
    displs, at = [0] * len(counts), 0
    for q in reversed(range(len(counts))):
        displs[q] = at + 2
        at += counts[q] + 2
    return displs, at


def _place(total, pieces, displs, fill):
    out = np.full(total, fill, dtype=pieces[0].dtype)
    for piece, d in zip(pieces, displs):
        out[d:d + piece.size] = piece
    return out


def _movement(rank, size, scale, dtypes):
    for dtype in dtypes:
        for salt in range(2):
            counts = _counts(size, scale, salt)
            what = f"{dtype.name} counts={counts}"
            ins = [make_input(dtype, counts[q], q, salt) for q in range(size)]
            packed = np.concatenate(ins) if size else ins[0]
            fill = make_input(dtype, 1, 99)[0]

            out = np.empty(sum(counts), dtype)
            sc.all_gather_v(out, ins[rank], counts)
            assert_same_bits(out, packed, "all_gather_v " + what)

            displs, total = _gapped(counts)
            out = np.full(total, fill, dtype)
            w = sc.all_gather_v(out, ins[rank], counts, displs, async_op=True)
            assert w.wait() and w.result()[0] is out
            assert_same_bits(out, _place(total, ins, displs, fill), "all_gather_v displs " + what)

            outs = [np.empty(c, dtype) for c in counts]  # torch's list form
            sc.all_gather(outs, ins[rank])
            for q in range(size):
                assert_same_bits(outs[q], ins[q], f"all_gather list[{q}] " + what)

            root = (salt + 1) % size
            out = np.full(total, fill, dtype) if rank == root else None
            sc.gather_v(ins[rank], out, counts if rank == root else None,
                        displs if rank == root else None, dst=root)
            if rank == root:
                assert_same_bits(out, _place(total, ins, displs, fill), "gather_v " + what)

            whole = make_input(dtype, total, 7, salt)
            mine = np.full(counts[rank], fill, dtype)
            sc.scatter_v(mine, whole if rank == root else None, counts, displs, src=root)
            assert_same_bits(mine, whole[displs[rank]:displs[rank] + counts[rank]], "scatter_v " + what)

            # all_to_all's list form with pieces of different sizes: rank r sends c(r, q) to q
            sends = [make_input(dtype, (rank + 2 * q + salt) % 5 * scale, rank * 10 + q) for q in range(size)]
            recvs = [np.empty((q + 2 * rank + salt) % 5 * scale, dtype) for q in range(size)]
            sc.all_to_all(recvs, sends)
            for q in range(size):
                expected = make_input(dtype, (q + 2 * rank + salt) % 5 * scale, q * 10 + rank)
                assert_same_bits(recvs[q], expected, f"all_to_all uneven from {q} " + what)
    return True


def _reductions(rank, size, scale, dtypes):
    for dtype in dtypes:
        counts = _counts(size, scale)
        ins = [make_input(dtype, sum(counts), q, 3) for q in range(size)]
        starts = np.cumsum([0] + counts)
        lo, hi = starts[rank], starts[rank + 1]
        for op in ops_for(dtype):
            what = f"{dtype.name} {op} counts={counts}"
            full = reduce_reference(ins, op)
            out = np.empty(counts[rank], dtype)
            sc.reduce_scatter_v(out, ins[rank], counts, op=getattr(sc.ReduceOp, op))
            assert_same_bits(out, full[lo:hi], "reduce_scatter_v " + what)
            out2 = np.empty(counts[rank], dtype)
            pieces = [ins[rank][starts[q]:starts[q + 1]] for q in range(size)]
            sc.reduce_scatter(out2, pieces, op=getattr(sc.ReduceOp, op), async_op=True).wait()
            assert_same_bits(out2, full[lo:hi], "reduce_scatter list " + what)
    return True


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_data_movement_matches_numpy(world):
    assert all(run_ranks(_movement, world, 1, DTYPES, timeout=170))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world,env", [(2, PIPELINED), (3, PIPELINED), (3, SINGLE_COPY)],
                         ids=["pipelined-2", "pipelined-3", "single-copy-3"])
def test_data_movement_large(world, env):
    dtypes = [np.dtype(np.float32), np.dtype(np.int8), np.dtype(np.complex128)]
    assert all(run_ranks(_movement, world, 997, dtypes, timeout=170, env=env))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_reductions_match_numpy(world):
    assert all(run_ranks(_reductions, world, 1, DTYPES, timeout=230))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world,env", [(3, PIPELINED), (2, SINGLE_COPY)], ids=["pipelined-3", "single-copy-2"])
def test_reductions_large(world, env):
    dtypes = [np.dtype(np.float16), np.dtype(np.int32), np.dtype(np.float64)]
    assert all(run_ranks(_reductions, world, 997, dtypes, timeout=170, env=env))


def _in_place(rank, size):
    """MPI_IN_PLACE's use: each rank's input is its own piece of the output."""
    counts = _counts(size, 3)
    starts = np.cumsum([0] + counts)
    out = np.zeros(sum(counts), np.float64)
    out[starts[rank]:starts[rank + 1]] = rank + 1
    sc.all_gather_v(out, out[starts[rank]:starts[rank + 1]], counts)
    expected = np.concatenate([np.full(c, q + 1.0) for q, c in enumerate(counts)])
    np.testing.assert_array_equal(out, expected)
    whole = np.arange(sum(counts), dtype=np.float64) * (rank + 1)
    sc.reduce_scatter_v(whole[starts[rank]:starts[rank + 1]], whole, counts)
    tri = size * (size + 1) / 2
    np.testing.assert_array_equal(whole[starts[rank]:starts[rank + 1]],
                                  np.arange(starts[rank], starts[rank + 1]) * tri)
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_in_place(world):
    assert all(run_ranks(_in_place, world))


def _torch_tensors(rank, size):
    import torch

    counts = [q + 1 for q in range(size)]
    x = torch.full((rank + 1,), float(rank), dtype=torch.bfloat16)
    out = torch.empty(sum(counts), dtype=torch.bfloat16)
    sc.all_gather_v(out, x, counts)
    expected = torch.cat([torch.full((c,), float(q), dtype=torch.bfloat16) for q, c in enumerate(counts)])
    assert torch.equal(out, expected)
    mine = torch.empty(rank + 1, dtype=torch.bfloat16)
    sc.reduce_scatter_v(mine, torch.ones(sum(counts), dtype=torch.bfloat16), counts)
    assert torch.equal(mine, torch.full((rank + 1,), float(size), dtype=torch.bfloat16))
    return True


@pytest.mark.timeout(60)
def test_torch_tensors():
    pytest.importorskip("torch")
    assert all(run_ranks(_torch_tensors, 3))


# ---- errors --------------------------------------------------------------------------------
def _disagreeing_counts(rank, size):
    counts = [1, 2] if rank == 0 else [1, 3]
    x = np.zeros(counts[rank], np.float32)
    out = np.empty(sum(counts), np.float32)
    with pytest.raises(sc.CollectiveMismatchError) as err:
        sc.all_gather_v(out, x, counts)
    with pytest.raises(sc.CollectiveMismatchError) as err2:  # rank 1 sends rank 0 three, not one
        mine = [1, 2] if rank == 0 else [3, 2]
        sc.reduce_scatter_v(np.empty(mine[rank], np.float32), np.zeros(sum(mine), np.float32), mine)
    sc.barrier()  # the group goes on
    return str(err.value), str(err2.value)


@pytest.mark.timeout(60)
def test_counts_that_disagree_fail_on_every_rank():
    texts = run_ranks(_disagreeing_counts, 2)
    for gather_text, reduce_text in texts:
        assert "all_gather_v: rank 1 sends 3 float32 elements to rank 0, which expects 2" in gather_text
        assert "reduce_scatter_v: rank 1 sends 3 float32 elements to rank 0, which expects 1" in reduce_text


def _bad_arguments(rank, size):
    x = np.zeros(2, np.float32)
    cases = [
        (lambda: sc.all_gather_v(np.empty(4, np.float32), x, [2]), ValueError, "counts must be 2"),
        (lambda: sc.all_gather_v(np.empty(4, np.float32), x, [2, -1]), ValueError, "non-negative"),
        (lambda: sc.all_gather_v(np.empty(3, np.float32), x, [2, 2]), ValueError, "ends past"),
        # mpi4py's order (the send buffer first): the error names shmcomm's order
        (lambda: sc.all_gather_v(x, np.empty(4, np.float32), [2, 2]), ValueError,
         "output: piece 1 (counts[1]=2 from element 2) ends past the array's 2 elements; counts cut "
         "the array that holds every rank's piece, and shmcomm's arguments come in its own order: "
         "all_gather_v(output, array, counts), gather_v(array, output, counts, dst=)"),
        # a displacement near 2**63 must not wrap the bounds check (it once pointed before the array)
        (lambda: sc.all_gather_v(np.empty(4, np.float32), x, [2, 2], [0, 2**63 - 2]), ValueError,
         "ends past"),
        (lambda: sc.reduce_scatter_v(x, np.zeros(4, np.float32), [2, 2**63 - 3]), ValueError,
         "ends past"),
        (lambda: sc.all_gather_v(np.empty(4, np.float32), x, [1, 3]), ValueError,
         f"counts[{rank}] has {[1, 3][rank]} float32 elements but this rank's array has 2"),
        (lambda: sc.all_gather_v(np.empty(4, np.float32), x, [2, 2], [0, 1]), ValueError, "overlap"),
        (lambda: sc.all_gather_v(np.empty(4, np.float64), x, [2, 2]), ValueError, "output is float64"),
        (lambda: sc.all_gather_v(np.empty(4, np.float32), x, 2), TypeError, "sequence of 2 ints"),
        (lambda: sc.all_gather_v(np.empty(4, np.float32), x, [2.0, 2]), TypeError,
         "counts[0] must be an int element count, got float"),
        (lambda: sc.gather_v(x, None, dst=0) if rank == 0 else sc.gather_v(x, x, dst=0),
         ValueError, "output is required on the dst" if rank == 0 else "must be None on ranks other"),
        (lambda: sc.scatter_v(x, None, src=5), ValueError, "src must be a rank in [0, 2)"),
        (lambda: sc.reduce_scatter_v((w := np.zeros(4, np.float32))[1:3], w, [2, 2]), ValueError,
         "output overlaps the input piece for rank"),
        (lambda: sc.reduce_scatter_v(x, np.zeros(4, np.float32), [2, 2], op=sc.ReduceOp.BAND),
         TypeError, "op BAND is not supported for dtype float32"),
    ]
    for call, kind, text in cases:
        with pytest.raises(kind) as err:
            call()
        assert text in str(err.value), (text, str(err.value))
    sc.barrier()  # no call above left a step behind: the group still works
    out = np.empty(4, np.float32)
    sc.all_gather_v(out, np.full(2, rank, np.float32), [2, 2])
    assert out.tolist() == [0, 0, 1, 1]
    return True


@pytest.mark.timeout(60)
def test_bad_arguments_are_refused_with_their_names():
    assert all(run_ranks(_bad_arguments, 2))


def _uneven_gather_list(rank, size):
    x = np.zeros(rank + 1, np.float32)
    if rank == 0:
        with pytest.raises(ValueError, match=r"gather_list\[1\] has 2 float32 elements; expected 1 "
                                             r"\(for pieces of different sizes use shmcomm.gather_v\)"):
            sc.gather(x, [np.empty(1, np.float32), np.empty(2, np.float32)], dst=0)
    else:
        with pytest.raises(sc.ShmcommError):  # the root never came: a timeout, or its exit
            sc.gather(x, dst=0)
    return True


@pytest.mark.timeout(60)
def test_uneven_gather_list_points_at_gather_v():
    assert all(run_ranks(_uneven_gather_list, 2, env={"SHMCOMM_TIMEOUT": 2}))


def test_one_rank_mpi4py_style_pieces():
    """Without processes: world size 1 of a fresh group, every form and the empty case."""
    def body(rank, size):
        x = np.arange(5, dtype=np.int64)
        out = np.empty(5, np.int64)
        sc.all_gather_v(out, x, [5])
        sc.gather_v(x, out2 := np.empty(5, np.int64), [5])
        sc.scatter_v(out3 := np.empty(5, np.int64), x, [5])
        sc.reduce_scatter_v(out4 := np.empty(5, np.int64), x, [5])
        sc.all_gather_v(np.empty(0, np.int64), np.empty(0, np.int64), [0])
        return [a.tolist() for a in (out, out2, out3, out4)]
    assert run_ranks(body, 1) == [[list(range(5))] * 4]
