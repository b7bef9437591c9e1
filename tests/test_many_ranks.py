"""Groups of 8 and 16 ranks (more than this machine's cores: slow, so sizes stay small).

At these sizes the paths are chosen by the rank count too: the one-shot limit is a budget of bytes
read per rank, and collectives leave single copy to groups of up to 4 ranks. Every dtype and op
is checked against numpy, and every rank must hold the same bits.
"""

import numpy as np
import pytest

import shmcomm as sc
from harness import run_ranks
from reference import DTYPES, assert_same_bits, digest, make_input, ops_for, reduce_reference

# 7 elements go one-shot; 300 (600-2400 bytes, above the forced 512-byte limit) go by
# reduce-scatter + all-gather; 3000 of 8-byte types fill more than the 8 KiB slot (pipelined).
SMALL_PATHS = {"SHMCOMM_SMALL_BYTES": 512, "SHMCOMM_SLOT_BYTES": 8192}


def _all_reduce_every_dtype_and_op(rank, size, counts):
    results = []
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for count in counts:
                inputs = [make_input(dtype, count, r) for r in range(size)]
                x = inputs[rank].copy()
                sc.all_reduce(x, op=sc.ReduceOp[op])
                assert_same_bits(x, reduce_reference(inputs, op), f"all_reduce {dtype.name} {op} {count}")
                results.append(x)
    return digest(results)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [8, 16])
def test_all_reduce_at_8_and_16_ranks_every_path_dtype_and_op(world):
    digests = run_ranks(_all_reduce_every_dtype_and_op, world, [0, 1, 7, 300], timeout=280,
                        env=SMALL_PATHS)
    assert len(set(digests)) == 1, "ranks hold different bits"


@pytest.mark.timeout(120)
def test_all_reduce_at_16_ranks_in_two_steps_down_to_one_element():
    """With no one-shot at all, a reduction of 1 or 7 elements over 16 ranks goes reduce-scatter +
    all-gather with most ranks' slices empty (the default one-shot limit at 16 ranks on 16 cores
    is 256 B: 300 floats take this path there)."""
    digests = run_ranks(_all_reduce_every_dtype_and_op, 16, [1, 7], timeout=110,
                        env={"SHMCOMM_SMALL_BYTES": 0})
    assert len(set(digests)) == 1, "ranks hold different bits"


@pytest.mark.timeout(300)
def test_all_reduce_at_8_ranks_pipelined_and_single_copy_off():
    """Single copy is asked for from 1 KiB, but a group of 8 ranks reduces through the slots."""
    env = {**SMALL_PATHS, "SHMCOMM_CMA_BYTES": 1024}
    digests = run_ranks(_all_reduce_every_dtype_and_op, 8, [3000], timeout=280, env=env)
    assert len(set(digests)) == 1, "ranks hold different bits"


def _movement_and_p2p(rank, size, count):
    """all_gather, broadcast and a ring of send/recv at sizes that ask for single copy."""
    mine = np.arange(count, dtype=np.float64) + 1000 * rank
    outs = [np.empty(count) for _ in range(size)]
    sc.all_gather(outs, mine)
    assert all(np.array_equal(outs[q], np.arange(count) + 1000 * q) for q in range(size))
    b = mine.copy()
    sc.broadcast(b, src=size - 1)
    assert np.array_equal(b, np.arange(count) + 1000 * (size - 1))
    got = np.empty(count)
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    works = [sc.isend(mine, dst=nxt), sc.irecv(got, src=prv)]
    for w in works:
        w.wait()
    assert np.array_equal(got, np.arange(count) + 1000 * prv)
    return True


@pytest.mark.timeout(180)
def test_data_movement_and_p2p_at_8_ranks_with_single_copy_asked():
    assert all(run_ranks(_movement_and_p2p, 8, 5000, timeout=170, env={"SHMCOMM_CMA_BYTES": 1024}))
