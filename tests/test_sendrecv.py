"""``sc.sendrecv``: mpi4py's ``Sendrecv`` (a send and a receive posted together) with
``PROC_NULL`` for a missing partner, checked against numpy at 2, 3 and 4 ranks."""

from __future__ import annotations

import time

import numpy as np
import pytest

import shmcomm as sc
from harness import run_ranks
from shmcomm.world import default_group

# 0 elements, one slot's worth, and more than a slot (a message that waits for its receive)
COUNTS = [0, 16, 1 << 20]


def _ring(rank, size):
    """Every rank sends right and receives from the left at once, in every size: a blocking send
    first would deadlock the large one."""
    right, left = (rank + 1) % size, (rank - 1) % size
    for count in COUNTS:
        out = np.arange(count, dtype=np.float64) + 1000.0 * rank
        got = np.full(count, -1.0)
        assert sc.sendrecv(out, right, got, left, sendtag=count, recvtag=count) == left
        np.testing.assert_array_equal(got, np.arange(count, dtype=np.float64) + 1000.0 * left)
    # as a method, from any source, to and from this rank itself
    pg = default_group()
    got = np.zeros(3, np.int32)
    assert pg.sendrecv(np.full(3, rank, np.int32), right, got, None) == left
    np.testing.assert_array_equal(got, np.full(3, left, np.int32))
    assert sc.sendrecv(np.full(2, 7.0), rank, got64 := np.zeros(2), rank) == rank
    np.testing.assert_array_equal(got64, [7.0, 7.0])
    return True


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_exchange_of_every_size(world):
    assert all(run_ranks(_ring, world, timeout=100))


def _halo(rank, size):
    """The docstring's 1-D halo exchange, not periodic: the edge ranks have PROC_NULL on one
    side, whose ghost cell stays as it was."""
    left = rank - 1 if rank > 0 else sc.PROC_NULL
    right = rank + 1 if rank < size - 1 else sc.PROC_NULL
    u = np.full(6, float(rank))
    u[1], u[4] = 10.0 * rank + 1, 10.0 * rank + 4
    from_right = sc.sendrecv(u[1:2], left, u[5:], right)
    from_left = sc.sendrecv(u[4:5], right, u[:1], left)
    return from_left, from_right, u.tolist()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_halo_exchange_with_proc_null_at_the_edges(world):
    for rank, (from_left, from_right, u) in enumerate(run_ranks(_halo, world, timeout=100)):
        expected = [float(rank), 10.0 * rank + 1, float(rank), float(rank), 10.0 * rank + 4, float(rank)]
        if rank > 0:
            expected[0] = 10.0 * (rank - 1) + 4
        if rank < world - 1:
            expected[5] = 10.0 * (rank + 1) + 1
        assert u == expected, (rank, u)
        assert from_left == (rank - 1 if rank > 0 else sc.PROC_NULL)
        assert from_right == (rank + 1 if rank < world - 1 else sc.PROC_NULL)


def _errors(rank, size):
    other = 1 - rank
    a = np.ones(4)
    with pytest.raises(ValueError, match="different arrays"):
        sc.sendrecv(a, other, a, other)
    with pytest.raises(ValueError, match="dst"):
        sc.sendrecv(a, 5, np.zeros(4), other)
    assert sc.sendrecv(a, sc.PROC_NULL, a, sc.PROC_NULL) == sc.PROC_NULL  # nothing to do
    # a message larger than the receive: it raises on both ranks, at once, and the sends end
    t0 = time.monotonic()
    with pytest.raises(sc.CollectiveMismatchError):
        sc.sendrecv(np.ones(8), other, np.zeros(4), other)
    assert time.monotonic() - t0 < 10
    got = np.zeros(2)  # the pair still works
    assert sc.sendrecv(np.full(2, float(rank)), other, got, other) == other and got[0] == other
    return True


@pytest.mark.timeout(60)
def test_bad_arguments_and_a_size_mismatch():
    assert all(run_ranks(_errors, 2, timeout=50))
