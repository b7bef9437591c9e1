"""Process groups: environment init, sub-groups with group-local ranks, teardown, API hygiene."""

import os
import re

import numpy as np
import pytest

import shmcomm as sc
from harness import run_ranks


def _subgroups(rank, size):
    evens = sc.new_group(ranks=[0, 2])
    odds = sc.new_group(ranks=[3, 1])  # sorted: rank 1 is group rank 0
    everyone = sc.new_group()
    assert (evens is None) == (rank % 2 == 1)
    assert (odds is None) == (rank % 2 == 0)
    mine = evens or odds
    assert sc.get_world_size(mine) == 2 and sc.get_rank(mine) == rank // 2
    x = np.array([rank], np.int64)
    sc.all_reduce(x, group=mine)
    assert x[0] == (2 if rank % 2 == 0 else 4)
    b = np.array([rank], np.int64)
    sc.broadcast(b, src=1, group=mine)  # src is a rank within the group
    assert b[0] == (2 if rank % 2 == 0 else 3)
    y = np.ones(1)
    sc.all_reduce(y, group=everyone)
    assert y[0] == size
    sc.destroy_process_group(mine)
    with pytest.raises(ValueError, match="destroyed"):
        mine.barrier()
    sc.barrier()  # the default group still works
    return True


@pytest.mark.timeout(60)
def test_new_group_uses_group_local_ranks():
    assert all(run_ranks(_subgroups, 4))


def _split(rank, size):
    # colors: even ranks 0, odd ranks 1, the last rank none; keys reverse the order
    color = None if rank == size - 1 and size > 2 else rank % 2
    g = sc.split(color, key=-rank)
    if color is None:
        assert g is None
    else:
        members = sorted((r for r in range(size) if r % 2 == color and not (r == size - 1 and size > 2)),
                         reverse=True)  # key = -rank: the highest rank first
        assert sc.get_world_size(g) == len(members) and sc.get_rank(g) == members.index(rank)
        assert g.ranks == members, g.ranks
        x = np.array([float(rank)])
        sc.all_reduce(x, group=g)
        assert x[0] == float(sum(members)), x
        b = np.array([float(rank)])
        sc.broadcast(b, src=0, group=g)  # group rank 0 is the highest member rank
        assert b[0] == float(members[0])
    mine, every = sc.new_subgroups(group_size=1 if size % 2 else 2)
    width = 1 if size % 2 else 2
    assert len(every) == size // width and every[rank // width] is mine
    assert all(g is None for i, g in enumerate(every) if i != rank // width)
    y = np.ones(2)
    sc.all_reduce(y, group=mine)
    assert (y == width).all(), y
    with pytest.raises(ValueError, match=f"the group's {size} ranks do not divide into groups of {size + 1}"):
        sc.new_subgroups(group_size=size + 1)
    with pytest.raises(ValueError, match="group_size must be an integer >= 1, got 0"):
        sc.new_subgroups(group_size=0)
    with pytest.raises(ValueError, match="color must be an integer >= 0 or None"):
        sc.split(-1)
    sc.barrier()
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_split_by_color_and_new_subgroups(world):
    assert all(run_ranks(_split, world))


def _split_of_a_split(rank, size):
    """#46: Comm.Split on any group: a split of a split, by the method and by group=."""
    row = sc.split(rank // 2, key=rank)                 # rows [0, 1], [2, 3]
    row_members = [r for r in range(size) if r // 2 == rank // 2]
    # the row again, its order reversed (key = -rank in the row), through the method
    back = row.split(0, key=-row.rank)
    assert back.ranks == row_members[::-1] and back.rank == row_members[::-1].index(rank), back.ranks
    x = np.array([float(rank + 1)])
    sc.all_reduce(x, group=back)
    assert x[0] == float(sum(r + 1 for r in row_members)), x
    # the row's first rank joins nothing; the others form a group of their own
    alone = sc.split(None if row.rank == 0 else 0, group=row)
    if row.rank == 0:
        assert alone is None
    else:
        assert alone.ranks == row_members[1:] and alone.size == len(row_members) - 1, alone.ranks
        y = np.array([7.0])
        sc.broadcast(y, src=0, group=alone)
        assert y[0] == 7.0
    with pytest.raises(ValueError, match="color must be an integer >= 0 or None"):
        row.split(-2)
    sc.barrier()
    return back.ranks


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [3, 4])
def test_split_of_a_split(world):
    got = run_ranks(_split_of_a_split, world)
    assert got[0] == [1, 0] and got[-1] == ([3, 2] if world == 4 else [2]), got


def _from_environment(rank, size, job):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), SHMCOMM_JOB=job)
    pg = sc.init_process_group()
    assert sc.is_initialized() and pg.rank == rank and pg.size == size
    with pytest.raises(ValueError, match="already"):
        sc.init_process_group()
    x = np.ones(3)
    pg.all_reduce(x)  # methods without group=
    sc.destroy_process_group()
    assert not sc.is_initialized()
    # torchrun's variables name the job when SHMCOMM_JOB is absent
    del os.environ["SHMCOMM_JOB"]
    os.environ.update(TORCHELASTIC_RUN_ID=job, MASTER_PORT="29500")
    pg = sc.init_process_group()
    pg.barrier()
    return float(x[0])


@pytest.mark.timeout(60)
def test_init_from_environment_and_reinit():
    job = f"envjob-{os.getpid()}"
    assert run_ranks(_from_environment, 3, job, init=False) == [3.0] * 3


def _world_of_one(rank, size):
    x = np.arange(5.0)
    sc.all_reduce(x, op=sc.ReduceOp.AVG)
    outs = [np.empty(5)]
    sc.all_gather(outs, x)
    sc.barrier()
    assert np.array_equal(outs[0], np.arange(5.0))
    return True


@pytest.mark.timeout(30)
def test_world_size_one():
    assert run_ranks(_world_of_one, 1) == [True]


@pytest.mark.timeout(30)
def test_multinode_launch_without_torch_fails_at_once():
    """Under a launch on several nodes (LOCAL_WORLD_SIZE != WORLD_SIZE) the numpy API needs
    torch's gloo between nodes: without it, a clear error at once, never a timeout."""
    import subprocess
    import sys
    import time

    code = ("import sys; sys.modules['torch'] = None\n"
            "import shmcomm as sc\n"
            "try:\n    sc.init_process_group()\n"
            "except sc.ShmcommError as exc:\n    print('refused:', exc)\n")
    env = dict(os.environ, RANK="0", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2", SHMCOMM_JOB="nodes-test",
               MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=25)
    assert "refused:" in out.stdout and "shmcomm[torch]" in out.stdout, out.stdout + out.stderr
    assert "LOCAL_WORLD_SIZE=2" in out.stdout
    assert time.monotonic() - start < 10


@pytest.mark.timeout(30)
def test_every_engine_provides_the_engine_calls_with_compatible_signatures():
    """One list of the collective calls every engine provides (``shmcomm.group.ENGINE_CALLS``,
    those of ``GroupCore``): the compiled Communicator (one node) and the hierarchy's
    HierarchicalComm (several) both have each, with the same parameters in the same order and
    the same defaults; and the group faces that drive them (the compiled GroupCore, the Python
    EngineGroup) take the same arguments."""
    import inspect

    from shmcomm import _core
    from shmcomm.group import ENGINE_CALLS, EngineGroup
    from shmcomm.hierarchy.compose import HierarchicalComm

    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert len(ENGINE_CALLS) == 18 and {"all_reduce", "barrier", "scan", "exscan"} <= set(ENGINE_CALLS)
    assert "send" not in ENGINE_CALLS and "recv" not in ENGINE_CALLS
    for name in ENGINE_CALLS:
        assert params(getattr(HierarchicalComm, name)) == params(getattr(_core.Communicator, name)), name
        # ReduceOp.SUM and 0 are one default (an IntEnum): equal, as the comparison needs
        assert params(getattr(EngineGroup, name)) == params(getattr(_core.GroupCore, name)), name
    for name in ("send", "recv", "isend", "irecv"):
        assert params(getattr(EngineGroup, name)) == params(getattr(sc.ProcessGroup, name)), name


@pytest.mark.timeout(30)
def test_an_engine_group_hands_its_engine_what_a_communicator_gets():
    """EngineGroup's collectives (made from GroupCore's by parameter name) convert what users
    pass as GroupCore converts it for its Communicator: op names to codes, ranks checked, lists
    made lists, row split sizes made element counts, async_op a bool; anything else as given."""
    from shmcomm.group import EngineGroup
    from shmcomm.ops import ReduceOp

    calls = []

    class Recorder:
        def __getattr__(self, name):
            return lambda *args: calls.append((name, args))

    group = EngineGroup.__new__(EngineGroup)
    group._engine = Recorder()
    x, out = np.zeros(4), np.zeros((4, 3))
    group.reduce(x, 1, "max")
    group.all_reduce(x, async_op=1)
    group.gather(x)
    group.scatter(x, (x, x), src=1)
    group.all_to_all((x, x), (x, x))
    group.all_to_all_single(out, out, [1, 3], (2, 2))
    group.reduce_scatter_v(x, x, [2, 2], op="prod")
    group.barrier()
    assert calls == [
        ("reduce", (x, 1, int(ReduceOp.MAX), False)),
        ("all_reduce", (x, int(ReduceOp.SUM), True)),
        ("gather", (x, None, 0, False)),
        ("scatter", (x, [x, x], 1, False)),
        ("all_to_all", ([x, x], [x, x], False)),
        ("all_to_all_single", (out, out, [3, 9], [6, 6], False)),
        ("reduce_scatter_v", (x, x, [2, 2], int(ReduceOp.PRODUCT), False)),
        ("barrier", (False,)),
    ]
    assert all(type(arg) is not type(ReduceOp.SUM) for _, args in calls for arg in args)  # codes, not enums
    with pytest.raises(TypeError, match="dst"):
        group.reduce(x, "one")
    with pytest.raises(ValueError, match="op"):
        group.all_reduce(x, "median")
    assert len(calls) == 8  # a refused call never reaches the engine


@pytest.mark.timeout(30)
def test_the_engine_between_nodes_is_named_by_shmcomm_link(monkeypatch):
    """SHMCOMM_LINK chooses the engine between nodes: an unknown one is a ValueError naming the
    variable and the choices; ``mpi`` across nodes outside a job started by mpirun says so (both
    at once, before any group exists; on one node, ``mpi`` changes nothing)."""
    from shmcomm.multinode import link

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("SHMCOMM_JOB", f"link-{os.getpid()}")
    monkeypatch.delenv("SHMCOMM_LINK", raising=False)
    assert link.engine_name() == "gloo"
    monkeypatch.setenv("SHMCOMM_LINK", "nccl")
    with pytest.raises(ValueError, match="SHMCOMM_LINK must be one of gloo, mpi .*'nccl'"):
        sc.init_process_group()
    assert not sc.is_initialized()
    monkeypatch.setenv("SHMCOMM_LINK", "mpi")
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # several nodes, but not MPI's launch
    with pytest.raises(ValueError, match="SHMCOMM_LINK=mpi needs a job started by mpirun"):
        sc.init_process_group()
    assert not sc.is_initialized()
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    pg = sc.init_process_group()
    try:
        assert type(pg) is sc.ProcessGroup and pg.size == 1
    finally:
        sc.destroy_process_group()


def _new_group_on_a_full_dev_shm(rank, size):
    """On a /dev/shm of its own (a small tmpfs), rank 0 fills it but for 64 KiB: it cannot make
    the new group's segment. Returns each rank's error and how long it took to come."""
    import time

    filler = "/dev/shm/filler"
    if rank == 0:
        st = os.statvfs("/dev/shm")
        fd = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o600)
        os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize - (64 << 10))
        os.close(fd)
    sc.barrier()
    start = time.monotonic()
    try:
        sc.new_group([0, 1, 2])
    except sc.ShmcommError as exc:
        error = f"{type(exc).__name__}: {exc}"
    else:
        error = "no error"
    took = time.monotonic() - start
    sc.barrier()
    if rank == 0:
        os.unlink(filler)
    sc.barrier()  # the default group goes on
    return error, took


def run_on_a_full_dev_shm():
    """Inside ``test_new_group_whose_segment_rank_0_cannot_make_fails_at_once``'s namespace:
    its results as JSON on the last line."""
    import json

    print(json.dumps(run_ranks(_new_group_on_a_full_dev_shm, 3, env={"SHMCOMM_TIMEOUT": 30},
                               timeout=90)))


@pytest.mark.timeout(120)
def test_new_group_whose_segment_rank_0_cannot_make_fails_at_once():
    """Rank 0 of a new group cannot make its segment (a full /dev/shm: a small tmpfs of this
    test's own, in a mount namespace). Before, the other members waited the whole timeout (30 s)
    and raised CommTimeoutError asking whether rank 0 was running on this machine; now they
    raise rank 0's cause at once."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from shmcomm.multinode.simulated import refusal

    tests = Path(__file__).resolve().parent

    refused = refusal()  # (unshare and a tmpfs mount: the simulated nodes' needs, and these)
    if refused is not None:
        pytest.skip(refused)
    code = f"import sys; sys.path[:0] = [{str(tests)!r}, {str(tests.parent)!r}]; " \
           "import test_groups; test_groups.run_on_a_full_dev_shm()"
    done = subprocess.run(["unshare", "--mount", "--fork", "sh", "-c",
                           'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$0" -c "$1"',
                           sys.executable, code], capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results[0][0].startswith("ShmcommError: cannot reserve"), results
    assert "No space left on device" in results[0][0], results
    assert re.search(r"MiB in /dev/shm for the group's segment \(\d+ ranks: two slots of [\d.]+ MiB each and "
                     r"a ring of [\d.]+ MiB per pair of ranks\): No space left on device \([\d.]+ MiB free "
                     r"of 64.0 MiB\); enlarge /dev/shm: .*; or lower SHMCOMM_SLOT_BYTES / SHMCOMM_RING_BYTES",
                     results[0][0]), results
    for error, took in results[1:]:
        assert error.startswith("ShmcommError: rank 0 of the new group (rank 0 of the group it is "
                                "made from) could not create the new group's shared segment: "
                                "ShmcommError: cannot reserve"), results
        assert "No space left on device" in error and took < 10, results
