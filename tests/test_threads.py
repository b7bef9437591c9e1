"""Large all_reduce split over each rank's own threads (shmcomm/hierarchy/threads.py). This machine
has two cores, so ``SHMCOMM_RANK_THREADS`` forces the threads and a low ``SHMCOMM_THREADS_BYTES``
sends small arrays through the level. Results are compared bit for bit with numpy reducing in
rank order (the flat paths' order): the same bits whatever the thread count, on every rank."""

from __future__ import annotations

import os

import numpy as np
import pytest

from harness import RankFailed, run_ranks
from level_checks import killed_mid_calls, mismatch
from reference import BFLOAT16, DTYPES, FACTORS, assert_same_bits, kernel_ops_for, make_input, \
    reduce_reference

# three threads a rank; every array of 64 bytes and more goes through them
FORCED = {"SHMCOMM_RANK_THREADS": "3", "SHMCOMM_THREADS_BYTES": "64"}


def _level():
    from shmcomm import world

    levels = world.default_group()._comm.levels
    assert len(levels) == 1 and type(levels[0]).__name__ == "ThreadsLevel", levels
    return levels[0]


def _every_dtype_and_op(rank, size, counts):
    from shmcomm import _core, world

    comm = world.default_group()._comm
    level = _level()
    checked = 0
    for dtype in DTYPES:
        for count in counts:
            inputs = [make_input(dtype, count, q) for q in range(size)]
            for op in kernel_ops_for(dtype):
                factor = FACTORS[rank % len(FACTORS)] if op == "PREMUL_SUM" else 1.0
                x = inputs[rank].copy()
                comm.all_reduce(x, _core.OP_NAMES.index(op), False, factor)
                assert_same_bits(x, reduce_reference(inputs, op), f"{dtype} {op} count={count}")
                checked += x.nbytes >= 64
    assert level.calls == checked, (level.calls, checked)
    assert len(level.lanes) == level.threads
    return level.threads, checked


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_dtype_and_op_gives_the_flat_paths_bits(world):
    """Counts that split unevenly, and one past a lane's 1 MiB slot (its pipelined path)."""
    counts = (5, 1001, 70_001) if world < 4 else (1001, 70_001)
    env = dict(FORCED, SHMCOMM_RANK_THREADS="2" if world == 4 else "3")
    got = run_ranks(_every_dtype_and_op, world, counts, env=env, timeout=230)
    assert len({g for g in got}) == 1 and got[0][0] == int(env["SHMCOMM_RANK_THREADS"]), got
    assert got[0][1] > 50


def _large_and_async(rank, size):
    import shmcomm as sc

    level = _level()
    # the default threshold (1 MiB): 300_001 float64 is 2.3 MiB, three pieces of 1 MiB and less
    x = make_input(np.dtype(np.float64), 300_001, rank)
    sc.all_reduce(x)
    inputs = [make_input(np.dtype(np.float64), 300_001, q) for q in range(size)]
    assert_same_bits(x, reduce_reference(inputs, "SUM"), "large")
    # async calls run in one piece (the caller computes meanwhile): issue order between them
    # and flat calls on the same memory, all queued at once
    xs = [np.full(200_000, float(rank + i)) for i in range(3)]
    works = []
    for y in xs:
        works.append(sc.all_reduce(y, async_op=True))      # split
        works.append(sc.all_reduce(y[:4], async_op=True))  # flat, on the split result
    for w in works:
        w.wait()
    for i, y in enumerate(xs):
        s = sum(r + i for r in range(size))
        assert (y[4:] == s).all() and (y[:4] == size * s).all(), (i, y[:6])
    # small arrays stay flat
    calls = level.calls
    sc.all_reduce(np.ones(1000))
    assert level.calls == calls
    # sc.empty ones split too, each lane's piece zero copy (the group lent the lanes its heaps,
    # this one made after the lanes); an odd count: pieces that end mid-line
    shared = sc.empty(300_001, np.float32)
    shared[...] = np.arange(300_001, dtype=np.float32) * (rank + 1)
    before = [lane.zero_copy_calls for lane in level.lanes]
    sc.all_reduce(shared)
    assert_same_bits(shared, np.arange(300_001, dtype=np.float32) * sum(range(1, size + 1)), "sc.empty")
    assert all(lane.zero_copy_calls > b for lane, b in zip(level.lanes, before)), \
        ([lane.zero_copy_calls for lane in level.lanes], before)
    # one rank's array private, the other's sc.empty: the lanes agree to go through the slots
    mixed = shared[:300_000] if rank == 0 else np.empty(300_000, np.float32)
    mixed[...] = rank + 1
    zero_copies = [lane.zero_copy_calls for lane in level.lanes]
    sc.all_reduce(mixed)
    assert (mixed == sum(range(1, size + 1))).all()
    assert [lane.zero_copy_calls for lane in level.lanes] == zero_copies
    return calls, level.calls


@pytest.mark.timeout(120)
def test_large_async_and_flat_calls_keep_issue_order():
    env = {"SHMCOMM_RANK_THREADS": "3"}  # SHMCOMM_THREADS_BYTES's default: 1 MiB
    assert run_ranks(_large_and_async, 2, env=env, timeout=100) == [(1, 3)] * 2


def _one_waits_one_does_not(rank, size):
    import shmcomm as sc

    level = _level()
    x = make_input(np.dtype(np.float32), 400_001, rank)
    work = sc.all_reduce(x, async_op=rank == 1)
    if work is not None:
        work.wait()
    inputs = [make_input(np.dtype(np.float32), 400_001, q) for q in range(size)]
    assert_same_bits(x, reduce_reference(inputs, "SUM"), "sync on rank 0, async on rank 1")
    return level.calls


@pytest.mark.timeout(90)
def test_ranks_that_differ_in_async_agree_not_to_split():
    env = {"SHMCOMM_RANK_THREADS": "3", "SHMCOMM_TIMEOUT": "30"}
    assert run_ranks(_one_waits_one_does_not, 2, env=env, timeout=60) == [0, 0]


def _levels_attached(rank, size):
    from shmcomm import world

    return [type(level).__name__ for level in world.default_group()._comm.levels]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("env", [
    {},                                                      # a core a rank here: its share is 1
    {"SHMCOMM_RANK_THREADS": "1"},                           # off
    {"SHMCOMM_RANK_THREADS": "3", "SHMCOMM_THREADS_BYTES": "0"},  # off
], ids=["default", "one-thread", "zero-bytes"])
def test_no_threads_where_a_rank_owns_one_core_or_they_are_off(env):
    if not env and len(os.sched_getaffinity(0)) >= 4:
        pytest.skip("this machine gives each of 2 ranks several cores: the level applies")
    assert run_ranks(_levels_attached, 2, env=env, timeout=60) == [[]] * 2


def test_each_rank_takes_its_share_of_the_cores():
    from shmcomm.hierarchy.threads import default_threads

    def rows(*masks, asked=0):
        return np.array([[asked, 1 << 20, 1 << 30, m] + [0] * 15 for m in masks], np.int64)

    # bound inside disjoint halves of 16 cores, or unbound on all of them: 8 each
    assert default_threads(rows(0xFF, 0xFF00), 1, 16, 2) == 8
    assert default_threads(rows(0xFFFF, 0xFFFF), 0, 16, 2) == 8
    # two ranks of an 8-rank job on 16 cores: the job's other ranks run here too
    assert default_threads(rows(0xFFFF, 0xFFFF), 0, 16, 8) == 2
    # 64 cores: at most 8 by default; a setting above 0 is taken as it is
    assert default_threads(rows(2**40 - 1, (2**40 - 1) << 20), 0, 64, 2) == 8
    assert default_threads(rows(0x1, 0x2, asked=5), 0, 2, 2) == 5
    # a rank bound to one core, or four ranks sharing two: 1 (no lanes)
    assert default_threads(rows(0x1, 0xFE), 0, 8, 2) == 1
    assert default_threads(rows(0x3, 0x3, 0x3, 0x3), 2, 2, 4) == 1


def test_pieces_cover_the_array_on_cache_line_bounds():
    from shmcomm.hierarchy.threads import pieces

    for count in (0, 1, 15, 16, 17, 1000, 70_001):
        for itemsize in (1, 2, 4, 8, 16):
            for threads in (1, 2, 3, 8):
                got = pieces(count, itemsize, threads, 64)
                assert got[0][0] == 0 and got[-1][1] == count and len(got) <= threads
                assert all(a == b for (_, a), (b, _) in zip(got, got[1:])), got
                assert all(a * itemsize % 64 == 0 for a, _ in got), got
    assert len(pieces(1 << 20, 1, 8, 1 << 18)) == 4  # none under the smallest piece


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["size", "op"])
def test_a_mismatch_is_named_at_once(kind):
    env = dict(FORCED, SHMCOMM_TIMEOUT="30")
    for got in run_ranks(mismatch, 2, kind, env=env, timeout=60):
        assert got is not None and got[0] < 10 and "all_reduce" in got[1], got


@pytest.mark.timeout(90)
def test_a_rank_killed_mid_call_is_a_peer_failure_at_once():
    env = dict(FORCED, SHMCOMM_TIMEOUT="60")
    try:
        results = run_ranks(killed_mid_calls, 3, env=env, timeout=60, expect_dead=(2,))
    except RankFailed as e:
        raise AssertionError(str(e)) from None
    for got in results[:2]:
        # whichever lane a survivor waited in, the error names the dead process by its rank
        assert got is not None and got[0] < 15, results
        assert got[2:4] == (2, got[4]), got


def _torch(rank, size, store):
    import torch
    import torch.distributed as dist

    import shmcomm.torch_ops  # noqa: F401 - registers torch.ops.shmcomm

    torch.set_num_threads(1)
    dist.init_process_group("shmcomm", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        level = dist.group.WORLD._get_backend(torch.device("cpu"))._comm.levels[0]
        for dtype, np_dtype in ((torch.float32, np.dtype(np.float32)), (torch.bfloat16, BFLOAT16)):
            for op, name in ((dist.ReduceOp.SUM, "SUM"), (dist.ReduceOp.AVG, "AVG")):
                x = make_input(np_dtype, 10_001, rank)
                t = torch.from_numpy(x.astype(np.float32)).to(dtype)
                dist.all_reduce(t, op=op)
                got = t.float().numpy().astype(np_dtype)
                inputs = [make_input(np_dtype, 10_001, r) for r in range(size)]
                assert_same_bits(got, reduce_reference(inputs, name), f"{dtype} {name}")
        # the op tensor-parallel decoding calls
        t = torch.from_numpy(make_input(np.dtype(np.float32), 10_001, rank))
        torch.ops.shmcomm.all_reduce_(t, "sum", dist.group.WORLD.group_name)
        inputs = [make_input(np.dtype(np.float32), 10_001, r) for r in range(size)]
        assert_same_bits(t.numpy(), reduce_reference(inputs, "SUM"), "torch.ops.shmcomm.all_reduce_")
        return level.calls
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_torch_tensors_and_the_inference_op_split_too(tmp_path):
    pytest.importorskip("torch")
    if BFLOAT16 is None:
        pytest.skip("ml_dtypes is not installed")
    got = run_ranks(_torch, 2, str(tmp_path / "store"), init=False, env=FORCED, timeout=100)
    assert got == [5] * 2


def _lanes_made_when_needed(rank, size):
    import shmcomm as sc

    level = _level()
    made = [len(level.lanes)]
    sc.all_reduce(np.ones(300_000), async_op=True).wait()  # async: one piece, one lane
    made.append(len(level.lanes))
    x = np.ones(300_000)
    sc.all_reduce(x)  # synchronous: every lane
    made.append(len(level.lanes))
    assert (x == size).all()
    return made


@pytest.mark.timeout(90)
def test_lanes_are_made_by_the_first_call_that_needs_them():
    """A group that never makes a large call costs no segments and no threads."""
    assert run_ranks(_lanes_made_when_needed, 2, env={"SHMCOMM_RANK_THREADS": "3"}, timeout=60) \
        == [[0, 1, 3]] * 2


def _lend_to_a_group_in_another_order(rank, size):
    from shmcomm import _core, world

    comm = world.default_group()._comm
    reversed_ranks = comm.derive("reversed", [1, 0])
    try:
        _core.lend_heaps(comm, reversed_ranks)
    except ValueError as exc:
        return str(exc)
    finally:
        reversed_ranks.close()
    return "lent"


@pytest.mark.timeout(60)
def test_heaps_are_lent_only_to_a_group_over_the_same_ranks():
    said = run_ranks(_lend_to_a_group_in_another_order, 2, timeout=40)
    assert all("is not over the same ranks" in s for s in said), said
