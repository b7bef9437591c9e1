"""The hierarchy's two-level steps (shmcomm.hierarchy.compose.HierarchicalComm) on one machine: four plain
processes told they sit on two "nodes", each node a real shared-memory group and the rails real
gloo links, so every stage runs as across machines (tests/test_multinode.py runs the real thing
in namespaces). Both rank layouts: nodes of consecutive ranks (as torchrun numbers them: the
collectives work on slices in place) and interleaved ones (the copying path)."""

from __future__ import annotations

import numpy as np
import pytest

from harness import run_ranks
from reference import bits, make_input, reduce_reference

torch = pytest.importorskip("torch")

LAYOUTS = {"consecutive": ["a", "a", "b", "b"], "interleaved": ["a", "b", "a", "b"]}
# Counts per rank's piece: one, odd, and large enough for the node's pipelined and single-copy
# paths (the slot is 1 MiB) and the links' gloo paths.
COUNTS = (1, 333, 300_000)
# An all_reduce past the hierarchy's SMALL_BYTES (sharded over the node's ranks) whose count the
# node's two ranks do not divide.
ODD_LARGE = (4 << 20) // 4 + 1


def _hierarchy(rank, size, hosts, store_path, job):
    """This rank's HierarchicalComm over ``hosts`` (its node group a real shared-memory group, its
    links real gloo ones) and its node group, to close after it."""
    import torch.distributed as dist

    from shmcomm import _core
    from shmcomm.hierarchy.compose import HierarchicalComm
    from shmcomm.multinode.gloo_link import BUSY_THREADS, connect
    from shmcomm.multinode.store import StoreMeeting
    from shmcomm.hierarchy.topology import Topology

    topology = Topology(hosts)
    node, local = topology.node_of[rank], topology.local_of[rank]
    comm = _core.Communicator(f"{job}n{node}", "node", local, len(topology.nodes[node]), 30.0,
                              threads_per_rank=1 + BUSY_THREADS)
    meeting = StoreMeeting(dist.FileStore(store_path, size), "test", rank, size)
    rail, world = connect(meeting, 30.0, topology.rails)
    return HierarchicalComm(topology, rank, comm, rail, world), comm


def _compose(rank, size, hosts, store_path, job):
    from shmcomm import _core

    h, comm = _hierarchy(rank, size, hosts, store_path, job)
    got = {}
    try:
        for count in COUNTS:
            for op in ("SUM", "MAX", "AVG"):
                t = make_input(np.dtype(np.float32), count * size, rank)
                h.all_reduce(t, int(_core.OP_NAMES.index(op)))
                got[("all_reduce", op, count)] = bits(t)
                out = np.empty(count, np.float32)
                h.reduce_scatter_into(out, make_input(np.dtype(np.float32), count * size, rank, salt=1),
                                      int(_core.OP_NAMES.index(op)))
                got[("reduce_scatter", op, count)] = bits(out)
            whole = np.empty(count * size, np.int64)
            h.all_gather_into(whole, make_input(np.dtype(np.int64), count, rank))
            got[("all_gather", count)] = bits(whole)
            b = make_input(np.dtype(np.int64), count, rank)
            h.broadcast(b, size - 1)
            got[("broadcast", count)] = bits(b)
        try:  # the root's argument given elsewhere, and missing on the root: refused at once
            h.gather_v(np.ones(1), None if rank == size - 1 else np.empty(size), None, None,
                       dst=size - 1)
        except ValueError as e:
            got["root_only"] = str(e)
        odd = make_input(np.dtype(np.float32), ODD_LARGE, rank)  # node shards of different sizes
        h.all_reduce(odd, 0)
        got["odd"] = bits(odd)
    finally:
        h.close()
        comm.close()
    return got


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_composed_collectives_match_numpy_in_both_rank_layouts(layout, tmp_path):
    size = 4
    job = f"hier-{layout}-{tmp_path.name}"[:40]
    results = run_ranks(_compose, size, LAYOUTS[layout], str(tmp_path / "store"), job, init=False,
                        timeout=150)
    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    from shmcomm.hierarchy.compose import SMALL_BYTES

    assert ODD_LARGE * 4 > SMALL_BYTES
    odd = reduce_reference([make_input(f32, ODD_LARGE, r) for r in range(size)], "SUM")
    for r in range(size):
        assert results[r]["root_only"] == "output is required on the dst rank and must be None elsewhere"
        assert results[r]["odd"] == results[0]["odd"]
        np.testing.assert_allclose(np.frombuffer(results[r]["odd"], np.float32), odd, rtol=1e-5, atol=1e-5)
    for count in COUNTS:
        for op in ("SUM", "MAX", "AVG"):
            inputs = [make_input(f32, count * size, r) for r in range(size)]
            want = reduce_reference(inputs, op)
            wholes = [make_input(f32, count * size, r, salt=1) for r in range(size)]
            want_rs = reduce_reference(wholes, op)
            for r in range(size):
                got = np.frombuffer(results[r][("all_reduce", op, count)], np.float32)
                assert results[r][("all_reduce", op, count)] == results[0][("all_reduce", op, count)]
                # node sums then node order, not rank order: equal up to rounding
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"all_reduce {op}")
                got = np.frombuffer(results[r][("reduce_scatter", op, count)], np.float32)
                np.testing.assert_allclose(got, want_rs[r * count:(r + 1) * count], rtol=1e-5,
                                           atol=1e-5, err_msg=f"reduce_scatter {op} rank {r}")
        everyone = np.concatenate([make_input(i64, count, r) for r in range(size)])
        last = make_input(i64, count, size - 1)
        for r in range(size):
            assert results[r][("all_gather", count)] == bits(everyone), f"all_gather {count} rank {r}"
            assert results[r][("broadcast", count)] == bits(last), f"broadcast {count} rank {r}"


def _death_on_the_other_node(rank, size, store_path, job):
    """Nodes a = ranks 0, 1 and b = 2, 3; rank 3 dies. Rank 0 waits in a receive from it (the
    world link), ranks 1 and 2 in an all_reduce (rank 1's rail peer is rank 3; rank 2's node
    peer): each must raise PeerFailureError."""
    import os

    from shmcomm import PeerFailureError

    h, comm = _hierarchy(rank, size, LAYOUTS["consecutive"], store_path, job)
    h.all_reduce(np.ones(8, np.float32), 0)  # every link and group met
    if rank == 3:
        os._exit(3)
    try:
        if rank == 0:
            h.irecv(np.empty(4, np.float32), src=3).wait()
        else:
            h.all_reduce(np.ones(1 << 16, np.float32), 0)
    except PeerFailureError as exc:
        return type(exc).__name__
    finally:
        h.close()
        comm.close()
    return "no error"


@pytest.mark.timeout(120)
def test_a_death_on_another_node_raises_peer_failure_on_every_survivor(tmp_path):
    """Whether a survivor meets the death on a gloo link (its words, "Connection closed by peer",
    became a DistBackendError or a plain ShmcommError) or through its node group."""
    results = run_ranks(_death_on_the_other_node, 4, str(tmp_path / "store"), f"hier-death-{tmp_path.name}"[:40],
                        init=False, timeout=90, expect_dead=(3,))
    assert results[:3] == ["PeerFailureError"] * 3, results


@pytest.mark.timeout(180)
def test_simulated_nodes_run_the_numpy_api_under_shmrun():
    """SHMCOMM_SIMULATE_NODES=2: four ranks of one shmrun act as two nodes of two (shared memory
    inside each block, gloo between), so the hierarchy runs without namespaces."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent / "multinode_scripts" / "numpy_api.py"
    env = {**os.environ, "SHMCOMM_SIMULATE_NODES": "2"}
    done = subprocess.run([sys.executable, "-m", "shmcomm.launch", "-n", "4", str(script)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=170)
    assert done.returncode == 0, done.stdout[-4000:]
    assert done.stdout.count("numpy ok") == 4 and "on 2 nodes" in done.stdout, done.stdout[-3000:]
