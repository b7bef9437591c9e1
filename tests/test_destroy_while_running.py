"""``destroy_process_group`` on one thread of a rank while another thread of it is inside an
operation of that group: never a crash or a hang, the other thread gets a clear error, and
nothing stays in /dev/shm.

Rank 0's thread A loops one kind of operation (synchronous or async collectives, slots or single
copy, blocking receives); its thread B destroys the group at a random moment, often just as A
starts. Destroying waits for the operation A is in (bounded by the group's timeout), so the
segment stays mapped under it; A's next call fails as a call on a destroyed group. Rank 1 loops
the matching operation until rank 0's departure fails it. A destroy that met A's first async
operation while that operation was starting the group's progress thread raised ``RuntimeError:
cannot join thread before it is started`` and left the group half closed. The torch backend's
``dist.destroy_process_group`` goes the same way (it passed before too: its progress thread is
started long before)."""

import random
import threading
import time

import numpy as np
import pytest

import shmcomm as sc
from harness import run_ranks

# Single copy from 4 KiB: the tests cover slots and single copy with small arrays.
SMALL_PATHS = {"SHMCOMM_CMA_BYTES": 4096, "SHMCOMM_SLOT_BYTES": 8192}


def _one_op(kind, group, rank, n):
    """Run one operation of ``kind`` on ``group`` (None: the module's default group)."""
    x = np.ones(n, np.float32)
    if kind == "sync":
        sc.all_reduce(x, group=group)
    elif kind == "async":
        sc.all_reduce(x, group=group, async_op=True).wait()
    elif rank == 0:  # "recv": rank 0 receives, rank 1 sends
        sc.recv(x, src=1, group=group)
    else:
        sc.send(x, dst=0, group=group)


def _error_of_a_loop_destroyed_under_it(one_op, destroy, destroys, delay, round_):
    """Thread A runs ``one_op`` until it raises; if ``destroys``, this thread (B) calls
    ``destroy`` ``delay`` s after A started. Returns A's error; A must end within 20 s."""
    started, errors = threading.Event(), []

    def loop():
        started.set()
        try:
            while True:
                one_op()
        except BaseException as exc:  # noqa: BLE001 - checked by the caller
            errors.append(exc)

    a = threading.Thread(target=loop, daemon=True)
    a.start()
    if destroys:
        started.wait()
        time.sleep(delay)
        destroy()
    a.join(timeout=20)
    assert not a.is_alive(), f"round {round_}: thread A still inside an operation 20 s after the destroy"
    return errors[0]


def _destroyed_under_a_running_op(rank, size, kind, n, rounds, seed, default, job):
    """``rounds`` times: a group; rank 0's thread B destroys it while its thread A loops ``kind``
    operations on it. ``default``: the default group, by ``sc.destroy_process_group()`` (then
    made again under a fresh name), else a sub-group. Returns the errors A met, by round."""
    rng = random.Random(seed)
    seen = []
    for i in range(rounds):
        if default:
            if not sc.is_initialized():
                sc.init_process_group(rank=rank, world_size=size, name=f"{job}-{i}", timeout=30)
            group = None
        else:
            group = sc.new_group(list(range(size)))
        err = _error_of_a_loop_destroyed_under_it(
            lambda: _one_op(kind, group, rank, n), lambda: sc.destroy_process_group(group), rank == 0,
            rng.choice([0.0, rng.uniform(0, 0.002), rng.uniform(0, 0.02)]), i)
        if rank == 0:
            # ValueError where the call is refused before it is issued, ShmcommError once inside
            # (destroy's docstring); the default group's functions find no group at all
            assert isinstance(err, (sc.ShmcommError, ValueError)) and (
                "destroyed" in str(err) or (default and "not initialized" in str(err))), \
                f"round {i}: {type(err).__name__}: {err}"
        else:
            assert isinstance(err, sc.ShmcommError), f"round {i}: {type(err).__name__}: {err}"
            sc.destroy_process_group(group)
        seen.append(type(err).__name__)
        if not default:
            sc.barrier()
    return seen


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["sync", "async", "recv"])
@pytest.mark.parametrize("n", [16, 100_000], ids=["slots", "single-copy"])
def test_destroying_a_group_another_thread_runs_an_op_on(kind, n):
    import uuid

    job = f"test-dtr-{uuid.uuid4().hex[:8]}"
    run_ranks(_destroyed_under_a_running_op, 2, kind, n, 40, 7, False, job, env=SMALL_PATHS,
              job=job, timeout=100)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["sync", "async", "recv"])
def test_destroying_the_default_group_another_thread_runs_an_op_on(kind):
    import uuid

    from shmcomm import segments

    job = f"test-dtd-{uuid.uuid4().hex[:8]}"
    try:
        run_ranks(_destroyed_under_a_running_op, 2, kind, 16, 15, 11, True, job, env=SMALL_PATHS,
                  job=job, timeout=100)
    finally:
        left = [s.name for s in segments.list_segments() if f".{job}-" in s.name]
    assert not left, f"segments left in /dev/shm: {left}"


def _torch_destroyed_under_a_running_op(rank, size, store, rounds, seed):
    """``rounds`` torch groups (shmcomm backend); rank 0's thread B calls
    ``dist.destroy_process_group()`` while its thread A loops sync or async ``dist.all_reduce``."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rng = random.Random(seed)
    for i in range(rounds):
        dist.init_process_group("shmcomm", init_method=f"file://{store}-{i}", rank=rank,
                                world_size=size, timeout=timedelta(seconds=30))
        n, asynchronous = 16 if i % 4 < 2 else 100_000, i % 2

        def one_op():
            x = torch.ones(n)
            if asynchronous:
                dist.all_reduce(x, async_op=True).wait()
            else:
                dist.all_reduce(x)

        err = _error_of_a_loop_destroyed_under_it(one_op, dist.destroy_process_group, rank == 0,
                                                  rng.choice([0.0, rng.uniform(0, 0.02)]), i)
        if rank == 0:  # torch finds no group, or the group says it was destroyed
            assert "destroyed" in str(err) or "not been initialized" in str(err), \
                f"round {i}: {type(err).__name__}: {err}"
        else:
            assert "PeerFailureError" in f"{type(err).__name__}: {err}", f"round {i}: {type(err).__name__}: {err}"
            dist.destroy_process_group()
    return True


@pytest.mark.timeout(120)
def test_torch_destroy_process_group_while_another_thread_runs_all_reduce(tmp_path):
    pytest.importorskip("torch")
    from shmcomm import segments

    before = {s.name for s in segments.list_segments()}
    assert all(run_ranks(_torch_destroyed_under_a_running_op, 2, str(tmp_path / "store"), 8, 5,
                         init=False, env=SMALL_PATHS, timeout=100))
    left = [s.name for s in segments.list_segments() if s.name not in before and s.stale]
    assert not left, f"segments left in /dev/shm: {left}"
