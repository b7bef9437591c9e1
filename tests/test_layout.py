"""Where a call's data goes in the slots (src_cython/layout.pxi): calls that fill part of a slot
move along it from one use to the next, at the same place on every rank.

The rule is checked directly (``_core.slot_shift``), then by collectives whose consecutive calls
land at changing places of the slot, mixed in size and kind so that a call often takes lines an
earlier call of another size used, each result compared with numpy's.
"""

import numpy as np
import pytest

import shmcomm as sc
from harness import run_ranks
from shmcomm import _core
from reference import make_input, reduce_reference

SLOT = 1 << 20


@pytest.mark.parametrize("used", [4096, 4097, 8192, 65536, 100_000, 262_144, SLOT // 2])
def test_a_call_moves_along_the_whole_slot_a_page_multiple_at_a_time(used):
    page = 4096
    step_of = -(-used // page) * page  # rounded up to a page
    places = [_core.slot_shift(SLOT, step, used) for step in range(0, 4 * SLOT // step_of, 2)]
    assert all(p % step_of == 0 and p + used <= SLOT for p in places)
    assert sorted(set(places)) == list(range(0, SLOT // step_of * step_of, step_of))
    assert places[1] == (step_of if SLOT // step_of > 1 else 0)  # the next use moves on
    # the two steps of a slot pair (s, s + 1) are the two slots' same use: the same place
    assert all(_core.slot_shift(SLOT, s, used) == _core.slot_shift(SLOT, s + 1, used) for s in range(0, 64, 2))


@pytest.mark.parametrize("used", [0, 1, 64, 4095, SLOT // 2 + 1, SLOT, 5 * SLOT])
def test_small_calls_and_calls_over_half_a_slot_stay_at_its_start(used):
    assert {_core.slot_shift(SLOT, step, used) for step in range(64)} == {0}


SIZES = (1_024, 5_000, 16_384, 30_001, 65_536)  # elements: 4 KiB to 256 KiB of float32


def _moving_calls(rank, size):
    """Every slot collective, calls of changing sizes in turn, each checked against numpy."""
    checked = 0
    for i in range(40):
        count = SIZES[i % len(SIZES)] + (i % 3)
        dtype = (np.float32, np.int32, np.float64)[i % 3]
        inputs = [make_input(np.dtype(dtype), count, r, salt=i) for r in range(size)]
        kind = i % 6
        if kind == 0:
            x = inputs[rank].copy()
            sc.all_reduce(x)
            np.testing.assert_array_equal(x, reduce_reference(inputs, "SUM"), err_msg=f"all_reduce {i}")
        elif kind == 1:
            x = inputs[rank].copy()
            sc.broadcast(x, src=i % size)
            np.testing.assert_array_equal(x, inputs[i % size], err_msg=f"broadcast {i}")
        elif kind == 2:
            out = np.empty(count * size, dtype)
            sc.all_gather_into(out, inputs[rank])
            np.testing.assert_array_equal(out, np.concatenate(inputs), err_msg=f"all_gather {i}")
        elif kind == 3:
            whole = [make_input(np.dtype(dtype), count * size, r, salt=i) for r in range(size)]
            out = np.empty(count, dtype)
            sc.reduce_scatter_into(out, whole[rank])
            want = reduce_reference(whole, "SUM")[rank * count:(rank + 1) * count]
            np.testing.assert_array_equal(out, want, err_msg=f"reduce_scatter {i}")
        elif kind == 4:
            whole = [make_input(np.dtype(dtype), count * size, r, salt=i) for r in range(size)]
            out = np.empty(count * size, dtype)
            sc.all_to_all_single(out, whole[rank])
            want = np.concatenate([w[rank * count:(rank + 1) * count] for w in whole])
            np.testing.assert_array_equal(out, want, err_msg=f"all_to_all {i}")
        else:
            x = inputs[rank].copy()
            sc.scan(x)
            np.testing.assert_array_equal(x, reduce_reference(inputs[:rank + 1], "SUM"), err_msg=f"scan {i}")
        checked += 1
    return checked


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_collectives_whose_calls_move_along_the_slots_give_numpys_values(world):
    assert run_ranks(_moving_calls, world, timeout=110) == [40] * world
