"""Error paths: every one raises a clear error on every rank, none hangs, none leaks a segment."""

import os
import re
import signal
import time
from datetime import timedelta

import numpy as np
import pytest

import shmcomm as sc
from harness import RankFailed, run_ranks, shmrun_leave_early


def _mismatches(rank, size):
    caught = []
    calls = [
        # (what rank 0 does, what the others do)
        (lambda: sc.all_reduce(np.ones(4, np.float32)), lambda: sc.all_reduce(np.ones(5, np.float32))),
        (lambda: sc.all_reduce(np.ones(4, np.float32)), lambda: sc.all_reduce(np.ones(4, np.float64))),
        (lambda: sc.all_reduce(np.ones(4)), lambda: sc.all_reduce(np.ones(4), op=sc.ReduceOp.MAX)),
        (lambda: sc.broadcast(np.ones(4), src=0), lambda: sc.broadcast(np.ones(4), src=1)),
        (lambda: sc.barrier(), lambda: sc.all_reduce(np.ones(1))),
        (lambda: sc.all_reduce(np.ones(100_000)), lambda: sc.all_reduce(np.ones(3))),  # pipelined vs one-shot
        # data inline in the descriptor's line (up to 8 bytes) on rank 0, in the slot on the others
        (lambda: sc.all_reduce(np.ones(2, np.float32)), lambda: sc.all_reduce(np.ones(3, np.float32))),
    ]
    for mine, theirs in calls:
        with pytest.raises(sc.CollectiveMismatchError) as info:
            (mine if rank == 0 else theirs)()
        caught.append(str(info.value))
    # the group is still usable and consistent afterwards
    x = np.full(3, rank, np.int64)
    sc.all_reduce(x)
    assert (x == sum(range(size))).all()
    return caught


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_mismatched_collectives_raise_on_every_rank(world):
    messages = run_ranks(_mismatches, world)
    assert "all_reduce(dtype=float32, nbytes=16" in messages[0][0]
    assert "barrier" in messages[1][4] and "all_reduce" in messages[1][4]
    assert all(isinstance(m, str) for ms in messages for m in ms)
    # each message names which collective of the group it was, counted by the rank itself: the
    # refused calls are consecutive calls, the same on every rank (none skipped one)
    import re

    counts = [[int(re.search(r"at collective (\d+) of this rank on this group", m).group(1)) for m in ms]
              for ms in messages]
    first = counts[0][0]
    assert counts == [list(range(first, first + len(counts[0])))] * world, counts


def _mismatch_frames(rank, size):
    import traceback

    frames = {}
    for how in ("inline", "queued"):
        x = np.ones(4 if rank == 0 else 5, np.float32)
        with pytest.raises(sc.CollectiveMismatchError) as info:
            if how == "inline":
                sc.all_reduce(x)
            else:
                sc.all_reduce(x, async_op=True).wait()
        frames[how] = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
    return frames


@pytest.mark.timeout(60)
def test_errors_from_the_engine_carry_no_engine_frames():
    """#46 item 6: a mismatch raised ~10 frames of compiled internals (dispatch, the algorithm's
    steps, the waits) above the message; now only the public call's own layers remain."""
    for frames in run_ranks(_mismatch_frames, 2):
        for how, files in frames.items():
            compiled = [f for f in files if f.startswith("src_cython/")]
            assert len(compiled) <= 4, (how, files)
            # none of the algorithm's steps (a mismatch met while the entry point itself waits
            # can add that one waits.pxi frame: still at most the 4 above)
            assert not any(f.startswith("src_cython/coll/") for f in compiled), (how, files)
            assert files[0].endswith("test_errors.py"), (how, files)


def _bad_arguments(rank, size):
    with pytest.raises(ValueError, match="dst"):
        sc.reduce(np.ones(3), dst=size)
    with pytest.raises(ValueError, match="src"):
        sc.broadcast(np.ones(3), src=-1)
    with pytest.raises(TypeError, match="AVG"):
        sc.all_reduce(np.ones(3, bool), op=sc.ReduceOp.AVG)
    with pytest.raises(TypeError, match="BXOR"):
        sc.all_reduce(np.ones(3, np.float32), op=sc.ReduceOp.BXOR)
    with pytest.raises(TypeError, match="MIN"):
        sc.all_reduce(np.ones(3, np.complex64), op=sc.ReduceOp.MIN)
    with pytest.raises(ValueError, match="op"):
        sc.all_reduce(np.ones(3), op="median")
    # mpi4py's Allreduce(sendbuf, recvbuf) habit: the in-place rule named, no array printed
    big = np.arange(100_000, dtype=np.float32)
    for call in (lambda: sc.all_reduce(big, np.empty_like(big)),
                 lambda: sc.reduce(big, 0, np.empty_like(big))):
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value).startswith("op must be one of ['SUM', ") and \
            "got an array (float32, shape (100000,)): shmcomm's reductions work in place" in str(info.value) \
            and "recvbuf[...] = sendbuf" in str(info.value) and len(str(info.value)) < 500, str(info.value)
    with pytest.raises(ValueError, match="output_list"):
        sc.all_gather([np.ones(3)] * (size + 1), np.ones(3))
    with pytest.raises(ValueError, match="output"):
        sc.all_gather_into(np.ones(size * 3 + 1), np.ones(3))
    with pytest.raises(ValueError, match="C-contiguous"):
        sc.all_reduce(np.ones((4, 4))[:, 1])
    with pytest.raises(TypeError, match="unsupported dtype"):
        sc.all_reduce(np.array(["a", "b"]))
    with pytest.raises(ValueError, match="input_split_sizes"):
        sc.all_to_all_single(np.ones(4), np.ones(4), [2] * size, [1] * size)
    with pytest.raises(TypeError, match="group"):
        sc.all_reduce(np.ones(2), group="world")
    with pytest.raises(ValueError, match="gather_list"):
        sc.gather(np.ones(2), None, dst=rank)
    # nobody was left waiting: a real collective still lines up
    x = np.ones(2)
    sc.all_reduce(x)
    return float(x[0])


@pytest.mark.timeout(60)
def test_bad_arguments_raise_before_anyone_waits():
    assert run_ranks(_bad_arguments, 2) == [2.0, 2.0]


def _timeout(rank, size):
    if rank == 1:
        time.sleep(1.5)  # never joins the collective
        return "slept"
    t0 = time.monotonic()
    with pytest.raises(sc.CommTimeoutError, match="timed out") as info:
        sc.all_reduce(np.ones(4))
    assert isinstance(info.value, TimeoutError)
    elapsed = time.monotonic() - t0
    with pytest.raises(sc.ShmcommError, match="unusable"):
        sc.barrier()
    return elapsed


@pytest.mark.timeout(60)
def test_timeout_raises_comm_timeout_error():
    elapsed, _ = run_ranks(_timeout, 2, env={"SHMCOMM_TIMEOUT": 0.5})
    assert 0.4 < elapsed < 3.0


def _killed_mid_run(rank, size, victim):
    x = np.ones(1 << 16)
    for _ in range(20):
        sc.all_reduce(x)
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(sc.PeerFailureError) as info:
        for _ in range(1000):
            sc.all_reduce(x)
    assert info.value.rank == victim and info.value.pid > 0
    assert f"rank {victim}" in str(info.value)
    took = time.monotonic() - t0
    # Every later call says the same, whatever call or thread met the death first: a survivor of
    # a random kill once got a plain ShmcommError ("unusable after an earlier failure") from a
    # send, and its `except PeerFailureError` missed it.
    for later in (lambda: sc.all_reduce(x), sc.barrier, lambda: sc.broadcast(x, src=0)):
        with pytest.raises(sc.PeerFailureError) as again:
            later()
        assert again.value.rank == victim, again.value
    return took


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world,victim", [(2, 1), (3, 0), (4, 2)])
def test_sigkilled_peer_raises_peer_failure_within_2s(world, victim):
    times = run_ranks(_killed_mid_run, world, victim, expect_dead={victim})
    assert all(t < 2.0 for r, t in enumerate(times) if r != victim), times


def _peer_left(rank, size):
    if rank == 1:
        return "left"  # the harness destroys the group: this rank departs
    time.sleep(0.3)
    with pytest.raises(sc.PeerFailureError, match="rank 1"):
        sc.barrier()
    return "ok"


@pytest.mark.timeout(60)
def test_departed_peer_raises_instead_of_hanging():
    assert run_ranks(_peer_left, 2) == ["ok", "left"]


def _abort(rank, size):
    if rank == 0:
        work = sc.all_reduce(np.ones(4), async_op=True)  # rank 1 has not joined yet
        time.sleep(0.2)
        work.abort()
        with pytest.raises(sc.AbortedError):
            work.wait(timeout=5)
    else:
        time.sleep(1.0)
    with pytest.raises(sc.AbortedError):
        sc.barrier()  # rank 1 sees the abort; later ops on rank 0 do too
    return "aborted"


@pytest.mark.timeout(120)
def test_a_rank_that_leaves_early_is_named_by_its_peers_and_by_shmrun():
    """Rank 1 returns (exit code 0) while ranks 0 and 2 wait for it in an all_reduce: they name
    it, and shmrun's summary names it as the cause. Before, the summary blamed a rank that had
    only failed because rank 1 had left ("rank 2 (pid ...) failed with exit code 1")."""
    rc, out, pid = shmrun_leave_early(3, 1)
    assert rc == 1, out[-3000:]
    for rank in (0, 2):
        assert f"rank {rank} raised PeerFailureError: all_reduce: rank 1 (pid {pid}) died or left " \
               "the group" in out, out[-3000:]


@pytest.mark.timeout(60)
def test_abort_fails_pending_and_later_ops_on_every_rank():
    assert run_ranks(_abort, 2) == ["aborted", "aborted"]


def _abort_for_a_death(rank, size):
    """Rank 0 aborts as a composition does when it met a death elsewhere, naming that process
    (here rank 2's, alive: only the plumbing is under test)."""
    import os

    from shmcomm.world import default_group

    pids = [None] * size
    sc.all_gather_object(pids, os.getpid())
    if rank == 0:
        default_group()._comm.abort("rank 2 died", sc.PeerFailureError("died", 7, pids[2]))
    with pytest.raises(sc.PeerFailureError, match="aborted by rank 0: rank 2 died") as err:
        for _ in range(1000):  # until the abort is seen (rank 0 at once)
            sc.barrier()
            time.sleep(0.01)
    with pytest.raises(sc.PeerFailureError):
        sc.send(np.ones(2), (rank + 1) % size)  # point to point too
    return err.value.rank, err.value.pid == pids[2]


@pytest.mark.timeout(60)
def test_an_abort_for_a_death_reaches_every_rank_as_peer_failure():
    """The death is renumbered as each rank's group numbers it (here one group: rank 2)."""
    assert run_ranks(_abort_for_a_death, 3) == [(2, True)] * 3


@pytest.mark.timeout(60)
def test_rendezvous_timeout_names_missing_ranks():
    def lonely(rank, size):
        with pytest.raises(sc.CommTimeoutError, match=r"rank\(s\) \[1\]"):
            sc.init_process_group(rank=0, world_size=2, name=f"lonely-{os.getpid()}", timeout=0.5)
        return True

    assert run_ranks(lonely, 1, init=False) == [True]


def _late_ranks(rank, size):
    # ranks 0 and 1 run two barriers; rank 2 runs one, then stays away: the second barrier
    # times out (the group's timeout is 0.5 s) naming rank 2 and the step it reached; rank 1
    # arrived, so rank 0's message does not name it
    sc.barrier()
    if rank == 2:
        time.sleep(2.0)
        return "away"
    with pytest.raises(sc.CommTimeoutError) as info:
        sc.barrier()
    return str(info.value)


@pytest.mark.timeout(60)
def test_collective_timeout_names_late_ranks_and_their_steps():
    message = run_ranks(_late_ranks, 3, env={"SHMCOMM_TIMEOUT": "0.5"})[0]
    assert "barrier timed out after 0.5 s on rank 0 waiting for its peers at step" in message, message
    assert "not arrived: rank 2 at step" in message, message
    assert "rank 1 at" not in message, message


def _empty_too_large(rank, size):
    st = os.statvfs("/dev/shm")
    too_many = st.f_bavail * st.f_frsize // 8 + 1  # float64s per rank: more than /dev/shm holds
    with pytest.raises(sc.ShmcommError) as info:
        sc.empty(too_many)
    a = sc.empty(4)  # nothing was made, and the group goes on
    a[:] = rank
    x = np.ones(1)
    sc.all_reduce(x)
    assert x[0] == size
    return str(info.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_gets_the_cause_of_a_failed_shared_allocation(world):
    messages = run_ranks(_empty_too_large, world)
    # sizes in MiB, the factor explained (per rank x ranks), the hint for shared arrays
    assert re.match(rf"cannot reserve [\d.]+ MiB in /dev/shm for sc.empty: [\d.]+ MiB x {world} ranks "
                    r"\(one segment holds every rank's array\): No space left on device \([\d.]+ MiB free "
                    r"of [\d.]+ MiB\); enlarge /dev/shm: docker run --shm-size=1g", messages[0]), messages
    for text in messages[1:]:
        assert re.match(rf"empty: rank 0 could not create the shared array's segment of [\d.]+ MiB "
                        rf"\([\d.]+ MiB x {world} ranks\) in /dev/shm \([\d.]+ MiB free then; see rank "
                        r"0's error\); enlarge /dev/shm: docker run --shm-size=1g", text), text


def _empty_against_another_collective(rank, size):
    caught = []
    for theirs in (lambda: sc.all_reduce(np.ones(4, np.float32)), sc.barrier):
        with pytest.raises(sc.CollectiveMismatchError) as info:
            sc.empty(4, np.float32) if rank == 0 else theirs()
        caught.append(str(info.value))
    a = sc.empty(4, np.float32)  # every rank names the same heap: the group goes on
    a[:] = rank
    sc.all_reduce(a)
    assert (a == sum(range(size))).all(), a
    return caught


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_empty_against_another_collective_is_a_mismatch_and_the_next_empty_works(world):
    """Before, rank 0 counted the heap of its sc.empty that met another collective, its peers
    did not: the next sc.empty aborted the group with "... is not the one rank 0 created" on
    the others (UntrustedFileError) and AbortedError on rank 0."""
    messages = run_ranks(_empty_against_another_collective, world)
    for ms in messages:
        assert "rank 0: empty(nbytes=16)" in ms[0] and "all_reduce(dtype=float32, nbytes=16" in ms[0], ms
        assert "rank 0: empty(nbytes=16)" in ms[1] and "barrier()" in ms[1], ms


@pytest.mark.timeout(60)
def test_job_name_in_use_and_world_size_mismatch():
    def clash(rank, size):
        if rank == 0:
            sc.init_process_group(rank=0, world_size=1, name="clash-job-" + str(os.getppid()))
            return "first"
        time.sleep(0.5)
        return "second"

    assert run_ranks(clash, 2, init=False) == ["first", "second"]

    def sizes(rank, size):
        with pytest.raises(sc.ShmcommError, match="world_size"):
            sc.init_process_group(rank=rank, world_size=2 + rank, name=f"sizes-{os.getppid()}", timeout=3)
        return True

    with pytest.raises(RankFailed):  # rank 0 waits for a rank 1 that refuses to join
        run_ranks(sizes, 2, init=False, timeout=10)


def test_environment_errors_name_the_variable(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "SHMCOMM_JOB", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="RANK"):
        sc.init_process_group()
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        sc.init_process_group()
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="SHMCOMM_JOB"):
        sc.init_process_group()
    with pytest.raises(ValueError, match="not initialized"):
        sc.all_reduce(np.ones(1))
    with pytest.raises(ValueError, match="rank"):
        sc.init_process_group(rank=3, world_size=2, name="x")


def _async_bad_arguments(rank, size):
    with pytest.raises(ValueError, match="dst"):
        sc.reduce(np.ones(3), dst=size, async_op=True)
    with pytest.raises(TypeError, match="AVG"):
        sc.all_reduce(np.ones(3, bool), op=sc.ReduceOp.AVG, async_op=True)
    x = np.ones(2)
    sc.all_reduce(x, async_op=True).wait()
    return float(x[0])


@pytest.mark.timeout(60)
def test_async_bad_arguments_raise_at_the_call():
    assert run_ranks(_async_bad_arguments, 2) == [2.0, 2.0]


def _interrupted(rank, size):
    if rank == 1:
        time.sleep(3.0)
        return "late"
    import threading

    # Python's own Ctrl-C, whatever this run inherited: a suite started in the background by a
    # non-interactive shell ignores SIGINT, and Python then installs no KeyboardInterrupt at all.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        sc.barrier()  # blocked on rank 1: Ctrl-C still gets through
    return time.monotonic() - t0


@pytest.mark.timeout(60)
def test_ctrl_c_interrupts_a_blocked_wait():
    elapsed, _ = run_ranks(_interrupted, 2)
    assert elapsed < 1.5


def _destroy_inside_own_operation(rank, size):
    """A group destroyed from inside one of its own operations refuses, and stays whole."""
    from shmcomm.world import default_group

    pg = default_group()
    with pytest.raises(sc.ShmcommError, match="cannot be destroyed from inside one of its own"):
        pg._comm.submit(pg.destroy, (), [], False)
    # through the module: refused before the registry forgets the group
    with pytest.raises(sc.ShmcommError, match="cannot be destroyed from inside one of its own"):
        pg._comm.submit(sc.destroy_process_group, (), [], False)
    assert sc.is_initialized() and default_group() is pg
    x = np.ones(3)
    sc.all_reduce(x)  # still a working group on every rank
    assert (x == size).all()
    return True


@pytest.mark.timeout(60)
def test_destroy_inside_own_operation_leaves_the_group_whole():
    assert all(run_ranks(_destroy_inside_own_operation, 2))


# ---- "never time out" (issue 47): inf, and spans whose nanoseconds overflow, mean no limit -----
def _never_times_out(rank, size, timeout):
    """Every wait outlasts many 50 ms wait slices: rank 1 sleeps 0.3 s before each of its parts."""
    sc.init_process_group(rank=rank, world_size=size, name=f"never-{os.getppid()}", timeout=timeout)

    def late():
        if rank == 1:
            time.sleep(0.3)

    late()
    sc.barrier()  # the group's own deadline
    x = np.ones(4)
    late()
    work = sc.all_reduce(x, async_op=True)
    assert work.wait(timeout=float("inf")) and x[0] == size  # Work.wait's limit
    y = np.zeros(4)
    late()
    if rank == 1:
        sc.send(np.arange(4.0), dst=0)
    else:
        assert sc.recv(y, src=1) == 1 and y.tolist() == [0.0, 1.0, 2.0, 3.0]  # point to point
    late()
    work = sc.all_reduce(x, async_op=True)
    assert sc.wait_any([work], timeout=float("inf")) == 0
    work.get_future().wait(timeout=float("inf"))
    return x[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timeout", [float("inf"), 1e12, timedelta.max.total_seconds()],
                         ids=["inf", "1e12", "timedelta.max"])
def test_no_timeout_waits_past_a_wait_slice(timeout):
    """`now + <uint64_t>(timeout * 1e9)` overflowed for these: the first wait longer than one
    slice raised `CommTimeoutError: barrier timed out after inf s`."""
    assert run_ranks(_never_times_out, 2, timeout, init=False, timeout=30) == [4.0, 4.0]


def _bad_wait_timeouts(rank, size):
    work = sc.all_reduce(np.ones(2), async_op=True)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="timeout must be a non-negative number of seconds"):
            work.wait(timeout=bad)  # -1 waited without a limit
        with pytest.raises(ValueError, match="timeout must be a non-negative number of seconds"):
            sc.wait_any([work], timeout=bad)
    return work.wait()


@pytest.mark.timeout(60)
def test_negative_or_nan_wait_timeouts_are_refused_naming_the_argument():
    assert run_ranks(_bad_wait_timeouts, 1) == [True]


@pytest.mark.timeout(120)
def test_torch_backend_takes_timedelta_max_as_no_timeout(tmp_path):
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    import shmcomm.torch  # noqa: F401 - registers the backend

    path = str(tmp_path / "store")

    def body(rank, size):
        torch.set_num_threads(1)
        # a store of its own: torch's FileStore takes timedelta.max as a negative timeout
        dist.init_process_group("shmcomm", store=dist.FileStore(path, size), rank=rank,
                                world_size=size, timeout=timedelta.max)
        try:
            # torch hands its backend timedelta.max wrapped to a negative span: the default
            # (30 min) was used
            assert dist.group.WORLD._get_backend(torch.device("cpu"))._comm.timeout == float("inf")
            if rank == 1:
                time.sleep(0.3)
            t = torch.ones(3)
            dist.all_reduce(t)
            dist.barrier()
            return t.tolist()
        finally:
            dist.destroy_process_group()

    assert run_ranks(body, 2, init=False, timeout=100) == [[2.0] * 3] * 2


@pytest.mark.timeout(120)
def test_no_timeout_across_simulated_nodes():
    """Between nodes the timeout reaches torch's store and gloo as a timedelta: inf raised
    OverflowError there, and a span past 24.8 days wraps torch's poll (it spun warning "likely a
    timeout")."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    code = ("import time, numpy as np, shmcomm as sc; sc.init_process_group(); "
            "time.sleep(0.3 * sc.get_rank()); x = np.ones(2); sc.all_reduce(x); sc.barrier(); "
            "print('sum', x[0]); sc.destroy_process_group()")
    env = {**os.environ, "SHMCOMM_SIMULATE_NODES": "2", "SHMCOMM_TIMEOUT": "inf"}
    done = subprocess.run([sys.executable, "-m", "shmcomm.launch", "-n", "2", sys.executable, "-c", code],
                          env=env, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("sum 2.0") == 2, done.stdout
    assert "likely a timeout" not in done.stderr, done.stderr[-3000:]
