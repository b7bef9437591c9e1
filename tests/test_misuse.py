"""Calls that can never work get a clear error at once, never a hang or silent wrong data."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import shmcomm as sc
from harness import run_ranks


# ---- a child forked from a rank ---------------------------------------------------------------
def _forked_child_calls(rank, size):
    """A child made with os.fork() that calls its parent's group used to run as the parent's
    rank: the peer got the child's data, silently. Every kind of call is refused in the child,
    and the parent's group is untouched."""
    if rank == 0:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what each call did, then leave without cleanup
            os.close(read_end)
            outcomes = []
            for name, call in (("all_reduce", lambda: sc.all_reduce(np.full(4, 100.0))),
                               ("barrier", lambda: sc.barrier(async_op=True)),
                               ("isend", lambda: sc.isend(np.ones(4), dst=1)),
                               ("empty", lambda: sc.empty(4))):
                try:
                    call()
                    outcomes.append(f"{name}: ran")
                except sc.ShmcommError as exc:
                    outcomes.append(f"{name}: {'forked' if 'forked' in str(exc) else exc}")
                except BaseException as exc:  # noqa: BLE001 - reported to the parent
                    outcomes.append(f"{name}: {type(exc).__name__}: {exc}")
            os.write(write_end, "\n".join(outcomes).encode())
            os._exit(0)
        os.close(write_end)
        os.waitpid(pid, 0)
        with os.fdopen(read_end) as f:
            outcomes = f.read().splitlines()
        assert outcomes == [f"{n}: forked" for n in ("all_reduce", "barrier", "isend", "empty")], outcomes
    x = np.full(4, float(rank + 1))
    sc.all_reduce(x)
    assert (x == size * (size + 1) / 2).all(), x
    return True


@pytest.mark.timeout(60)
def test_a_forked_child_cannot_use_its_parents_group():
    assert all(run_ranks(_forked_child_calls, 2))


# ---- an operation that waits for one queued behind it ------------------------------------------
def _run_waits_for_its_own_group(rank, size):
    """A callable run by ProcessGroup.run that issues an async op on the same group and waits for
    it used to hang forever (the op is queued behind the running one): a clear error instead,
    and the group stays usable."""
    from shmcomm.world import default_group

    pg = default_group()
    x = np.ones(8)

    def inner():
        pg.all_reduce(x, async_op=True).wait()

    started = time.monotonic()
    try:
        pg.run(inner, (), [], False)
    except sc.ShmcommError as exc:
        assert "async_op=False" in str(exc), exc
    else:
        raise AssertionError("waiting inside run for an op queued behind it did not raise")
    assert time.monotonic() - started < 5
    y = np.ones(8)
    sc.all_reduce(y)  # the op issued inside ran after the failed one, on every rank
    assert (y == size).all() and (x == size).all(), (x, y)
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_an_operation_waiting_for_one_queued_behind_it_raises(world):
    assert all(run_ranks(_run_waits_for_its_own_group, world))
