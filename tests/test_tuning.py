"""The choices a group tunes as it runs (src_cython/tuning.pxi), per size class, by rank 0: the
stores that write the shared slots (streaming or normal; a mask in the segment's header that
every rank reads), and whether large reductions of private arrays go by single copy or through
the slots (rank 0's mask, told to the others in the step that publishes the arrays' addresses).

Results must not depend on either choice (same bits every way, every path), and the choices
must move exactly as the schedule says: timed calls from SHMCOMM_TUNE_BYTES up, a probing
window that flips a class after 26 calls of it, nothing timed or flipped for smaller calls or
with the setting at 0, nothing after a fixed mask.
"""

import numpy as np
import pytest

import shmcomm as sc
from harness import run_ranks
from reference import assert_same_bits, make_input, reduce_reference

ALL = 0xFFFF
WINDOW_OPENS = 32 - 6  # STORE_PERIOD_MIN - STORE_WINDOW timed calls


def _comm(group=None):
    from shmcomm.world import default_group

    return (group or default_group())._comm


def _same_results_either_way(rank, size, counts, dtypes, ways=((ALL, None), (0, None))):
    """all_reduce, reduce, broadcast and all_gather with each (stores, paths) mask pair fixed in
    turn (None: left as it is), against references computed independently (float64/int64 in
    reference.py)."""
    comm = _comm()
    for stores, paths in ways:
        comm._fix_tuning(stores=stores, paths=paths)  # every rank fixes the same masks
        sc.barrier()
        mask = f"stores {stores} paths {paths}"
        for dtype in dtypes:
            for count in counts:
                inputs = [make_input(np.dtype(dtype), count, r) for r in range(size)]
                what = f"{mask} {np.dtype(dtype).name} count={count}"
                for op in ("SUM", "MAX", "PRODUCT"):
                    x = inputs[rank].copy()
                    sc.all_reduce(x, op=sc.ReduceOp[op])
                    assert_same_bits(x, reduce_reference(inputs, op), f"all_reduce {op} {what}")
                    y = inputs[rank].copy()
                    sc.reduce(y, dst=size - 1, op=sc.ReduceOp[op])
                    if rank == size - 1:
                        assert_same_bits(y, reduce_reference(inputs, op), f"reduce {op} {what}")
                z = inputs[rank].copy()  # the slot copies of broadcast and all_gather too
                sc.broadcast(z, src=1)
                assert_same_bits(z, inputs[1], "broadcast " + what)
                out = np.empty(count * size, inputs[rank].dtype)
                sc.all_gather_into(out, inputs[rank])
                assert_same_bits(out, np.concatenate(inputs), "all_gather_into " + what)
        sc.barrier()  # before any rank fixes the next masks
        if stores is not None:
            assert comm.slot_stores == stores, "a fixed stores mask moved"
        if paths is not None:
            assert comm.reduce_paths == (paths if rank == 0 else 0), "a fixed paths mask moved"
        sc.barrier()
    return True


# One shot (<= 16 KiB at 2 ranks), two steps (medium, up to the 1 MiB slot), and odd sizes that
# leave a tail short of a cache line in every streamed copy.
COUNTS = [1, 1023, 1024, 4097, 16384, 40001, 200_000]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_streamed_and_normal_slot_stores_give_the_same_results(world):
    assert all(run_ranks(_same_results_either_way, world, COUNTS, ["float32", "int64", "float64"],
                         timeout=230, env={"SHMCOMM_CMA_BYTES": 1 << 30}))


@pytest.mark.timeout(120)
def test_streamed_slot_stores_through_the_pipeline():
    """Arrays larger than a slot (the pipelined path, single copy off), uneven chunks."""
    env = {"SHMCOMM_CMA_BYTES": 0, "SHMCOMM_SLOT_BYTES": 65536}
    assert all(run_ranks(_same_results_either_way, 3, [70_001, 300_000], ["float32", "float64"],
                         timeout=110, env=env))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3])
def test_single_copy_and_the_slots_give_the_same_results_for_large_reductions(world):
    """From the single-copy size (default 256 KiB) rank 0 may send reductions through the slots
    (with either stores) or keep them on single copy: every way alike, uneven slices."""
    ways = [(0, 0), (0, ALL), (ALL, ALL), (ALL, 0)]
    assert all(run_ranks(_same_results_either_way, world, [70_001, 300_001], ["float32", "float64"],
                         ways, timeout=230))


def _masks_after(rank, size, nbytes, calls):
    """The header's mask after ``calls`` all_reduces of ``nbytes``, as every rank reads it."""
    a = np.empty(nbytes // 4, np.float32)
    for _ in range(calls):
        a[...] = rank + 1
        sc.all_reduce(a)
    np.testing.assert_array_equal(a, np.full_like(a, size * (size + 1) // 2))
    sc.barrier()  # rank 0 flips after its last call: every rank reads after that
    comm = _comm()
    if nbytes < 256 << 10:
        return comm.slot_stores
    return comm.slot_stores, comm.reduce_paths, comm.single_copy_reductions


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_the_probing_window_flips_the_class_for_every_rank(world):
    """After 26 timed calls of 64 KiB (size class 4: 64-128 KiB) rank 0 opens that class's
    window: its bit flipped, and only its, seen by every rank."""
    masks = run_ranks(_masks_after, world, 64 << 10, WINDOW_OPENS, timeout=50,
                      env={"SHMCOMM_CMA_BYTES": 1 << 30})
    assert masks == [1 << 4] * world
    masks = run_ranks(_masks_after, world, 64 << 10, WINDOW_OPENS - 1, timeout=50,
                      env={"SHMCOMM_CMA_BYTES": 1 << 30})
    assert masks == [0] * world


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_the_paths_window_sends_large_reductions_through_the_slots_on_every_rank(world):
    """1 MiB (class 8) reductions go by single copy; after 26 of them rank 0 flips the class to
    the slots for a window, and tells the others through the address step: the calls of the
    window (checked, every one) take the slots on every rank, or they would not line up."""
    got = run_ranks(_masks_after, world, 1 << 20, WINDOW_OPENS + 3, timeout=50)
    assert got == [(0, 1 << 8, WINDOW_OPENS)] + [(0, 0, WINDOW_OPENS)] * (world - 1)
    got = run_ranks(_masks_after, world, 1 << 20, WINDOW_OPENS - 1, timeout=50)
    assert got == [(0, 0, WINDOW_OPENS - 1)] * world


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nbytes, env", [(2048, {}), (64 << 10, {"SHMCOMM_TUNE_BYTES": 0}),
                                         (16 << 10, {"SHMCOMM_TUNE_BYTES": 32 << 10})])
def test_calls_below_the_threshold_or_with_it_off_are_never_timed(nbytes, env):
    masks = run_ranks(_masks_after, 2, nbytes, WINDOW_OPENS, timeout=50,
                      env={"SHMCOMM_CMA_BYTES": 1 << 30, **env})
    assert masks == [0, 0]


def _fixed_mask_stays(rank, size):
    comm = _comm()
    comm._fix_tuning(stores=0x10)  # 64 KiB calls stream, the rest do not
    sc.barrier()
    a = np.ones(16 << 10, np.float32)
    for _ in range(WINDOW_OPENS + 20):
        sc.all_reduce(a)
        a[...] = 1
    sc.barrier()
    return comm.slot_stores


@pytest.mark.timeout(60)
def test_a_fixed_mask_is_never_probed():
    assert run_ranks(_fixed_mask_stays, 2, timeout=50, env={"SHMCOMM_CMA_BYTES": 1 << 30}) == [0x10, 0x10]


def test_a_window_flips_only_if_faster_than_the_calls_before_it_and_the_average():
    """A window keeps its flip only when clearly faster (TUNE_GAIN, 0.85) than both the calls
    just before it and the class's running average: a few slow calls before the window (a
    preempted rank) once flipped 64 KiB to streaming stores, 1.7x slower here, and page faults
    of a class's first calls inflate the average."""
    keeps = sc._core._tuner_keeps_flip
    assert keeps(10_000, 20_000, 20_000)          # the way in use is slower by both measures
    assert not keeps(10_000, 20_000, 10_500)      # only the calls before the window were slow
    assert not keeps(10_000, 10_500, 20_000)      # only the average (first calls' page faults)
    assert not keeps(9_000, 10_000, 10_000)       # faster, but by less than TUNE_GAIN
    assert keeps(8_000, 0, 10_000)                # no calls before it timed: the average decides
