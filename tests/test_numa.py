"""all_reduce inside each NUMA node first (shmcomm/hierarchy/numa.py), on a forced topology: this machine has
one NUMA node, so ``SHMCOMM_SIMULATE_NUMA=K`` makes blocks of consecutive ranks act as nodes, and
``numa.install`` (then ``add_routes``) places ranks round robin as ``shmrun --bind-to numa`` does. A low
``SHMCOMM_NUMA_BYTES`` sends small arrays through the composition. Results are compared bit for
bit with numpy reducing in the composition's order (each node in rank order, then the nodes in
order), on every rank."""

from __future__ import annotations


import numpy as np
import pytest

from harness import RankFailed, run_ranks
from level_checks import killed_mid_calls, mismatch
from reference import BFLOAT16, DTYPES, FACTORS, assert_same_bits, kernel_ops_for, make_input, \
    reduce_reference

# every array of 64 bytes or more goes through the composition
SIMULATED = {"SHMCOMM_SIMULATE_NUMA": "2", "SHMCOMM_NUMA_BYTES": "64"}


def staged_reference(inputs: list[np.ndarray], nodes: list[list[int]], op: str) -> np.ndarray:
    """The composition's result: each node's ranks reduced in rank order (SUM for AVG; each
    rank's factor for PREMUL_SUM), rounded to the dtype, then the nodes' results in node order
    (SUM for AVG and PREMUL_SUM), then AVG's one division by the number of ranks."""
    local = "SUM" if op == "AVG" else op
    cross = "SUM" if op in ("AVG", "PREMUL_SUM") else op
    per_node = [reduce_reference([inputs[r] for r in node], local,
                                 factors=[FACTORS[r % len(FACTORS)] for r in node]) for node in nodes]
    total = reduce_reference(per_node, cross)
    if op != "AVG":
        return total
    n = len(inputs)
    if total.dtype.kind in "iu":
        return reduce_reference([total], "AVG") if n == 1 else np.array(
            [(abs(int(v)) // n) * (-1 if v < 0 else 1) for v in total], dtype=total.dtype)
    if total.dtype.itemsize <= 2 and total.dtype.kind != "c":  # float16, bfloat16: in float32
        return (total.astype(np.float32) / np.float32(n)).astype(total.dtype)
    return np.divide(total, total.dtype.type(n)).astype(total.dtype)


def _every_dtype_and_op(rank, size, counts):
    """all_reduce and reduce_scatter_into with every op, all_gather_into, on every dtype."""
    from shmcomm import _core, world

    comm = world.default_group()._comm
    numa = comm.levels[0]
    assert numa is not None, "no composition on a simulated topology"
    before, checked = numa.calls, 0
    for dtype in DTYPES:
        for count in counts:
            whole = np.empty(count * size, dtype)
            comm.all_gather_into(whole, make_input(dtype, count, rank))
            expected = np.concatenate([make_input(dtype, count, q) for q in range(size)])
            assert_same_bits(whole, expected, f"all_gather {dtype} count={count}")
            mine = slice(rank * count, (rank + 1) * count)
            for op in kernel_ops_for(dtype):
                code = _core.OP_NAMES.index(op)
                factor = FACTORS[rank % len(FACTORS)] if op == "PREMUL_SUM" else 1.0
                x = make_input(dtype, count, rank)
                comm.all_reduce(x, code, False, factor)
                piece = np.empty(count, dtype)
                comm.reduce_scatter_into(piece, make_input(dtype, count * size, rank, salt=1), code,
                                         False, factor)
                for got, inputs, what in (
                        (x, [make_input(dtype, count, q) for q in range(size)], "all_reduce"),
                        (piece, [make_input(dtype, count * size, q, salt=1)[mine] for q in range(size)],
                         "reduce_scatter")):
                    assert_same_bits(got, staged_reference(inputs, numa.topology.nodes, op),
                                     f"{what} {dtype} {op} count={count}")
                checked += 2
            checked += 1
    assert numa.calls - before == checked, (numa.calls - before, checked)
    return checked


@pytest.mark.timeout(240)
@pytest.mark.parametrize("size,nodes", [(4, 2), (6, 2), (6, 3)])
def test_every_dtype_and_op_matches_numpy_in_the_composition_order(size, nodes):
    """Nodes of 2 and of 3 ranks (counts the node's ranks do not divide: uneven shards); each
    rank's piece of reduce_scatter and all_gather: 97 and 1001 elements."""
    env = dict(SIMULATED, SHMCOMM_SIMULATE_NUMA=str(nodes))
    assert run_ranks(_every_dtype_and_op, size, (97, 1001), env=env, timeout=200)[0] > 200


def _large(rank, size):
    import shmcomm as sc
    from shmcomm import world

    numa = world.default_group()._comm.levels[0]
    # past the 1 MiB slot (the node's pipelined path) and odd
    for count, op in ((600_000, "SUM"), (600_001, "AVG")):
        x = make_input(np.dtype(np.float32), count, rank)
        sc.all_reduce(x, op=op.lower())
        inputs = [make_input(np.dtype(np.float32), count, r) for r in range(size)]
        assert_same_bits(x, staged_reference(inputs, numa.topology.nodes, op), f"{op} {count}")
    return numa.calls


@pytest.mark.timeout(120)
def test_large_arrays_with_the_default_threshold():
    env = {"SHMCOMM_SIMULATE_NUMA": "2"}  # SHMCOMM_NUMA_BYTES's default: 1 MiB
    assert run_ranks(_large, 4, env=env, timeout=100) == [2] * 4


def _round_robin(rank, size):
    from shmcomm import _core, world
    from shmcomm.hierarchy import add_routes, numa

    comm = world.default_group()._comm
    assert not comm.levels  # one NUMA node here, and no simulation asked for
    got = add_routes(comm, numa.install(comm, [r % 2 for r in range(size)], 64))
    assert got is comm.levels[0] and got.topology.nodes == [[0, 2], [1, 3]]
    for dtype in (np.dtype(np.float32), np.dtype(np.int32)):
        for op in ("SUM", "MAX", "AVG"):
            x = make_input(dtype, 333, rank)
            comm.all_reduce(x, _core.OP_NAMES.index(op))
            inputs = [make_input(dtype, 333, r) for r in range(size)]
            assert_same_bits(x, staged_reference(inputs, got.topology.nodes, op), f"{dtype} {op}")
    # the nodes' pieces of a rank-ordered buffer are not one slice here: the copying paths
    out = np.empty(333, np.float32)
    comm.reduce_scatter_into(out, make_input(np.dtype(np.float32), 333 * size, rank), 0)
    inputs = [make_input(np.dtype(np.float32), 333 * size, q)[rank * 333:(rank + 1) * 333]
              for q in range(size)]
    assert_same_bits(out, staged_reference(inputs, got.topology.nodes, "SUM"), "reduce_scatter")
    whole = np.empty(333 * size, np.int32)
    comm.all_gather_into(whole, make_input(np.dtype(np.int32), 333, rank))
    assert_same_bits(whole, np.concatenate([make_input(np.dtype(np.int32), 333, q) for q in range(size)]),
                     "all_gather")
    return got.calls


@pytest.mark.timeout(90)
def test_nodes_of_interleaved_ranks_as_shmrun_binds_them():
    assert run_ranks(_round_robin, 4, timeout=60) == [8] * 4


def _which_path(rank, size):
    import shmcomm as sc
    from shmcomm import world

    comm = world.default_group()._comm
    numa = comm.levels[0]
    sc.all_reduce(np.ones(7, np.float64))  # 56 bytes: below the threshold, flat
    assert numa.calls == 0
    shared = sc.empty(70_000, np.float32)  # sc.empty past 256 KiB: the flat zero-copy path
    shared[...] = rank
    zero_copy = comm.zero_copy_calls
    sc.all_reduce(shared)
    assert numa.calls == 0 and comm.zero_copy_calls == zero_copy + 1
    assert (shared == sum(range(size))).all()
    # issue order holds between composed and flat calls on the same memory
    xs = [np.full(500, float(rank + i)) for i in range(3)]
    works = []
    for x in xs:
        works.append(sc.all_reduce(x, async_op=True))      # composed
        works.append(sc.all_reduce(x[:4], async_op=True))  # flat, on the composed result
    for w in works:
        w.wait()
    for i, x in enumerate(xs):
        s = sum(r + i for r in range(size))
        assert (x[4:] == s).all() and (x[:4] == size * s).all(), (i, x[:6])
    assert numa.calls == 3
    # a sub-group of the whole group composes too; one of two ranks does not
    sub = sc.new_group(list(range(size)))
    y = np.full(100, 1.0)
    sc.all_reduce(y, group=sub)
    assert sub._comm.levels[0].calls == 1 and (y == size).all()
    # groups made through the whole group count its ranks when they decide to spin
    assert sub._comm.busy_ranks == numa._node.busy_ranks == numa._rail.busy_ranks == size
    pair = sc.new_group([0, 1])
    if pair is not None:
        assert not pair._comm.levels
    return True


@pytest.mark.timeout(90)
def test_small_and_shared_arrays_stay_flat_and_issue_order_holds():
    assert run_ranks(_which_path, 4, env=SIMULATED, timeout=60) == [True] * 4


def _layout_with_no_use(rank, size):
    from shmcomm import world

    return not world.default_group()._comm.levels


@pytest.mark.timeout(90)
@pytest.mark.parametrize("size,nodes", [(3, 2), (4, 3), (4, 4), (5, 2)])
def test_no_composition_for_uneven_nodes_or_nodes_of_one_rank(size, nodes):
    env = dict(SIMULATED, SHMCOMM_SIMULATE_NUMA=str(nodes))
    assert run_ranks(_layout_with_no_use, size, env=env, timeout=60) == [True] * size


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["size", "op"])
def test_a_mismatch_is_named_at_once(kind):
    env = dict(SIMULATED, SHMCOMM_TIMEOUT="30")
    results = run_ranks(mismatch, 4, kind, env=env, timeout=60)
    for got in results:
        assert got is not None, results
        elapsed, text = got
        assert elapsed < 10, got
        assert "all_reduce" in text, text


def _torch(rank, size, store):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("shmcomm", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        comm = dist.group.WORLD._get_backend(torch.device("cpu"))._comm
        nodes = comm.levels[0].topology.nodes
        for dtype, np_dtype in ((torch.float32, np.dtype(np.float32)), (torch.bfloat16, BFLOAT16)):
            for op, name in ((dist.ReduceOp.SUM, "SUM"), (dist.ReduceOp.AVG, "AVG")):
                x = make_input(np_dtype, 1001, rank)
                t = torch.from_numpy(x.astype(np.float32)).to(dtype)
                dist.all_reduce(t, op=op)
                got = t.float().numpy().astype(np_dtype)
                inputs = [make_input(np_dtype, 1001, r) for r in range(size)]
                assert_same_bits(got, staged_reference(inputs, nodes, name), f"{dtype} {name}")
        t = torch.from_numpy(make_input(np.dtype(np.float32), 1001, rank))
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(FACTORS[rank]))
        inputs = [make_input(np.dtype(np.float32), 1001, r) for r in range(size)]
        assert_same_bits(t.numpy(), staged_reference(inputs, nodes, "PREMUL_SUM"), "PREMUL_SUM")
        # FSDP's two collectives, on bfloat16
        inp = make_input(BFLOAT16, 100 * size, rank)
        out = torch.empty(100, dtype=torch.bfloat16)
        dist.reduce_scatter_tensor(out, torch.from_numpy(inp.astype(np.float32)).bfloat16(),
                                   op=dist.ReduceOp.AVG)
        pieces = [staged_reference([make_input(BFLOAT16, 100 * size, q)[r * 100:(r + 1) * 100]
                                    for q in range(size)], nodes, "AVG") for r in range(size)]
        assert_same_bits(out.float().numpy().astype(BFLOAT16), pieces[rank], "reduce_scatter_tensor")
        whole = torch.empty(100 * size, dtype=torch.bfloat16)
        dist.all_gather_into_tensor(whole, out)
        assert_same_bits(whole.float().numpy().astype(BFLOAT16), np.concatenate(pieces),
                         "all_gather_into_tensor")
        return comm.levels[0].calls
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_the_torch_backend_composes_too(tmp_path):
    pytest.importorskip("torch")
    if BFLOAT16 is None:
        pytest.skip("ml_dtypes is not installed")
    got = run_ranks(_torch, 4, str(tmp_path / "store"), init=False, env=SIMULATED, timeout=100)
    assert got == [7] * 4


@pytest.mark.timeout(90)
def test_a_rank_killed_mid_composition_is_a_peer_failure_at_once():
    env = dict(SIMULATED, SHMCOMM_TIMEOUT="60")
    try:
        results = run_ranks(killed_mid_calls, 4, env=env, timeout=60, expect_dead=(3,))
    except RankFailed as e:
        raise AssertionError(str(e)) from None
    for got in results[:3]:
        assert got is not None and got[0] < 15, results
        # whichever group a survivor waited in (the whole one, its NUMA node's, its rail: woken
        # by a peer's abort there), the error names the dead process by its whole-group rank
        _, text, rank, pid, victim_pid = got
        assert (rank, pid) == (3, victim_pid), got


def _fake_sysfs(root, nodes: dict[int, str]) -> str:
    for node, cpus in nodes.items():
        d = root / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    return str(root)


def test_a_rank_is_on_a_numa_node_only_when_bound_inside_one(tmp_path):
    """The topology as sysfs tells it: two nodes of one CPU each (this machine's CPUs 0 and 1)."""
    import os

    from shmcomm import cpus, world

    sysfs = _fake_sysfs(tmp_path, {0: "0", 1: "1"})
    assert cpus.machine_numa_nodes(sysfs) == 2
    assert cpus.machine_numa_nodes(_fake_sysfs(tmp_path / "one", {0: "0-1"})) == 1
    allowed = os.sched_getaffinity(0)
    try:
        for cpu in sorted(allowed & {0, 1}):
            os.sched_setaffinity(0, {cpu})
            assert cpus.rank_numa_node(sysfs) == cpu
        if {0, 1} <= allowed:
            os.sched_setaffinity(0, {0, 1})
            assert cpus.rank_numa_node(sysfs) == -1  # free to run on both: unbound
    finally:
        os.sched_setaffinity(0, allowed)


def _bound_ranks(rank, size, sysfs):
    import os

    import shmcomm as sc
    from shmcomm import cpus, world

    cpus.SYSFS = sysfs
    cpu = sorted(os.sched_getaffinity(0))[rank % 2]
    os.sched_setaffinity(0, {cpu})  # as shmrun --bind-to numa binds them: round robin
    sc.init_process_group(rank=rank, world_size=size, name=os.environ["TEST_JOB"], timeout=30)
    comm = world.default_group()._comm
    x = np.full(1000, float(rank))
    sc.all_reduce(x)
    assert (x == sum(range(size))).all()
    return comm.levels[0].topology.nodes, comm.levels[0].calls


@pytest.mark.timeout(90)
def test_ranks_bound_to_two_numa_nodes_compose_on_their_own(tmp_path):
    """No simulation: ranks bound one per CPU, on a machine whose (made-up) sysfs says each CPU
    is a NUMA node, find their nodes, exchange them and compose."""
    import os
    import uuid

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two usable CPUs")
    first, second = sorted(os.sched_getaffinity(0))[:2]
    sysfs = _fake_sysfs(tmp_path, {0: str(first), 1: str(second)})
    job = f"test-numa-{uuid.uuid4().hex[:8]}"
    got = run_ranks(_bound_ranks, 4, sysfs, init=False, job=job, timeout=60,
                    env={"SHMCOMM_NUMA_BYTES": "64", "TEST_JOB": job})
    assert got == [([[0, 2], [1, 3]], 1)] * 4


@pytest.mark.timeout(120)
def test_the_benchmark_compares_both_paths_on_a_simulated_topology():
    import pathlib
    import subprocess
    import sys

    script = pathlib.Path(__file__).resolve().parents[1] / "bench" / "bench_numa.py"
    done = subprocess.run([sys.executable, str(script), "-n", "4", "--simulate", "2", "--rounds", "1",
                           "--sizes", "64K,1M"], capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "# NUMA nodes' ranks: [[0, 1], [2, 3]]" in done.stdout, done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 65536 |")
            or line.startswith("| 1048576 |")]
    assert len(rows) == 2 and all(float(r.split("|")[4]) > 0 for r in rows), done.stdout


@pytest.mark.timeout(180)
def test_nodes_then_numa_nodes_then_shared_memory():
    """Two simulated nodes of four ranks (gloo between), each of two simulated NUMA nodes: a
    large all_reduce's node steps compose inside the NUMA nodes, inside the multi-node steps."""
    import os
    import pathlib
    import subprocess
    import sys

    pytest.importorskip("torch", reason="the link between simulated nodes is torch's gloo")
    script = pathlib.Path(__file__).resolve().parent / "multinode_scripts" / "numa_inside_nodes.py"
    env = dict(os.environ, SHMCOMM_SIMULATE_NODES="2", **SIMULATED)
    done = subprocess.run([sys.executable, "-m", "shmcomm.launch", "-n", "8", str(script)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=170)
    assert done.returncode == 0, done.stdout[-4000:]
    # the node's reduce-scatter and all-gather of the all_reduce, on every rank
    assert done.stdout.count("numa-inside-nodes ok calls=2 HierarchicalGroup") == 8, done.stdout[-3000:]
