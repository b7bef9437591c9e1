"""The registry's routes (src_cython/registry.pxi): which composition, if any, serves a call.

A toy level (``Doubling``: an all_reduce that all-gathers on a sub-group of its own and sums
with numpy, then doubles the result, so a routed call is told apart by its value) is added
with ``shmcomm.hierarchy.add_routes``, as the NUMA level is; the rules (size in all, ranks,
sc.empty arrays, bfloat16) and the contract's refusals are checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from harness import run_ranks


class Doubling:
    """A level serving all_reduce (sum only) from ``min_bytes``: 2 x the sum, by all-gather on a
    group derived for it, in issue order on the group's engine."""

    min_ranks = 2
    bfloat16 = False

    def __init__(self, comm, min_bytes: int):
        self._comm = comm
        self._sub = comm.derive("doubling", range(comm.size))
        self.routes = (("all_reduce", min_bytes),)
        self.calls = 0
        self.closed = False

    def all_reduce(self, array, op, async_op, factor):
        return self._comm.submit(self._run, (array,), [array], async_op)

    def _run(self, array):
        pieces = [np.empty_like(array) for _ in range(self._comm.size)]
        self._sub.all_gather(pieces, array)
        array[...] = 2 * np.sum(pieces, axis=0, dtype=array.dtype)
        self.calls += 1

    def abort(self, reason, cause=None):
        self._sub.abort(reason, cause)

    def close(self):
        self.closed = True
        self._sub.close()


def _routed(rank, size):
    import shmcomm as sc
    from shmcomm import world
    from shmcomm.hierarchy import add_routes

    comm = world.default_group()._comm
    level = add_routes(comm, Doubling(comm, 400))
    assert comm.levels == [level]
    got = {}
    for count in (0, 1, 99, 100, 1000):           # 400 bytes of float32 = 100 elements
        x = np.arange(count, dtype=np.float32) + rank
        sc.all_reduce(x)
        expected = sum(np.arange(count, dtype=np.float32) + r for r in range(size))
        routed = count * 4 >= 400
        np.testing.assert_array_equal(x, expected * (2 if routed else 1), err_msg=str(count))
        got[count] = routed
    calls_before_shared = level.calls
    shared = sc.empty(1000, np.float32)           # sc.empty arrays keep the flat zero-copy path
    shared[:] = rank
    sc.all_reduce(shared)
    assert (shared == sum(range(size))).all() and level.calls == calls_before_shared
    y = np.ones(4096, np.float32)
    work = sc.all_reduce(y, async_op=True)        # queued in issue order, then waited
    work.wait()
    assert (y == 2 * size).all()
    assert level.calls == calls_before_shared + 1
    # the other entry points are not routed: all_gather_into of any size stays flat
    out = np.empty(1000 * size, np.float32)
    sc.all_gather_into(out, np.full(1000, rank, np.float32))
    assert (out.reshape(size, 1000) == np.arange(size)[:, None]).all()
    return level.calls


@pytest.mark.timeout(90)
@pytest.mark.parametrize("size", [2, 3])
def test_a_level_serves_the_calls_its_route_takes(size):
    assert run_ranks(_routed, size, timeout=80) == [3] * size   # 100 and 1000 elements, and 4096


def _too_few_ranks(rank, size):
    import shmcomm as sc
    from shmcomm import world
    from shmcomm.hierarchy import add_routes

    comm = world.default_group()._comm
    level = Doubling(comm, 0)
    level.min_ranks = 3
    add_routes(comm, level)
    x = np.ones(1000, np.float32)
    sc.all_reduce(x)
    return float(x[0]), level.calls


@pytest.mark.timeout(60)
def test_a_route_needs_its_rank_count():
    assert run_ranks(_too_few_ranks, 2, timeout=50) == [(2.0, 0)] * 2


def _closed_with_the_group(rank, size):
    import shmcomm as sc
    from shmcomm import world
    from shmcomm.hierarchy import add_routes

    comm = world.default_group()._comm
    level = add_routes(comm, Doubling(comm, 0))
    sc.destroy_process_group()
    return level.closed


@pytest.mark.timeout(60)
def test_levels_close_with_their_group():
    assert run_ranks(_closed_with_the_group, 2, timeout=50) == [True, True]


def _refusals(rank, size):
    from shmcomm import _core, world

    comm = world.default_group()._comm
    messages = []
    with pytest.raises(ValueError) as info:
        _core.add_route(comm, "broadcast", object(), 0)
    messages.append(str(info.value))

    class Partial:
        def all_reduce(self, *args):
            pass

    with pytest.raises(TypeError) as info:
        _core.add_route(comm, "all_reduce", Partial(), 0)
    messages.append(str(info.value))
    return messages


@pytest.mark.timeout(60)
def test_routes_refuse_what_cannot_compose():
    [(kind, level)] = run_ranks(_refusals, 1, timeout=50)
    assert "no composition can serve 'broadcast'" in kind
    assert "['all_gather_into', 'all_reduce', 'reduce_scatter_into']" in kind
    assert "needs the methods all_reduce, abort and close" in level and "Partial" in level
