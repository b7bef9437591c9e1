"""Jobs on several simulated nodes: hierarchical groups (shared memory inside a node, gloo between).

Each node is its own UTS, IPC and mount namespace (``unshare``) with its own hostname and an
empty tmpfs on /dev/shm, sharing the loopback network: started with ``torchrun --nnodes N
--node-rank K --master-addr 127.0.0.1``, such trees behave as separate machines. Skipped, with
the reason, where torch or the namespaces are not available.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent
torch = pytest.importorskip("torch")


from shmcomm.multinode.simulated import finish as _finish, kill_node, refusal, start_nodes  # noqa: E402

REFUSAL = refusal()
pytestmark = pytest.mark.skipif(REFUSAL is not None, reason=str(REFUSAL))


def finish(nodes, timeout: float) -> list[tuple[int, str]]:
    try:
        return _finish(nodes, timeout)
    except TimeoutError as exc:
        pytest.fail(str(exc))


def run_nodes(script: str, per_node: list[int], *args: str, timeout: float = 240.0,
              launcher: str = "torchrun") -> str:
    results = finish(start_nodes(script, per_node, *args, launcher=launcher), timeout)
    text = "\n".join(out for _, out in results)
    for k, (rc, out) in enumerate(results):
        assert rc == 0, f"node {k} exited with {rc}:\n{out[-4000:]}"
        assert "shm-left=0" in out, f"node {k} left files in its /dev/shm:\n{out[-2000:]}"
    return text


@pytest.mark.timeout(300)
@pytest.mark.parametrize("per_node", [[2, 2], [2, 2, 2], [2, 1, 2]], ids=["2x2", "3x2", "uneven-2+1+2"])
def test_every_torch_collective_across_nodes(per_node):
    """All of checks.py (every collective, dtype and op, p2p, groups, objects) across 2 x 2; 3 x 2,
    whose rails have three ranks and so take gloo's collectives instead of the two-rank swap; and
    three uneven nodes (plain gloo)."""
    text = run_nodes(str(SCRIPTS / "torch_scripts" / "all_ops.py"), per_node)
    ranks = sum(per_node)
    assert sum(f"rank {r} ok" in text for r in range(ranks)) == ranks, text[-3000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("per_node", [[2, 2], [1, 1], [2, 1]], ids=["2x2", "2x1", "uneven-2+1"])
def test_ddp_matches_gloo_across_nodes(per_node):
    """DDP on shmcomm across nodes gives gloo's parameters (uneven nodes: plain gloo inside)."""
    text = run_nodes(str(SCRIPTS / "torch_scripts" / "ddp_compare.py"), per_node)
    assert text.count("ddp ok") == sum(per_node), text[-3000:]


@pytest.mark.timeout(300)
def test_mesh_dimensions_and_subgroups_across_nodes():
    """A 2-D DeviceMesh over 2 x 2: the dimension inside a node and new_group([0, 1]) stay pure
    shared memory, the one across nodes is hierarchical; HSDP on such a mesh matches gloo."""
    text = run_nodes(str(SCRIPTS / "multinode_scripts" / "mesh.py"), [2, 2])
    assert text.count("mesh ok") == 4, text[-3000:]
    text = run_nodes(str(REPO / "examples" / "torch" / "hsdp.py"), [2, 2], "--check")
    assert "HSDP: shmcomm matches gloo" in text, text[-3000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("per_node,launcher", [([2, 2], "torchrun"), ([1, 1], "shmrun")],
                         ids=["2x2-torchrun", "2x1-shmrun"])
def test_numpy_api_across_nodes(per_node, launcher):
    """The numpy API across nodes, started by torchrun or by shmrun --nnodes (same flags)."""
    text = run_nodes(str(SCRIPTS / "multinode_scripts" / "numpy_api.py"), per_node, launcher=launcher)
    assert text.count("numpy ok") == sum(per_node), text[-3000:]


@pytest.mark.timeout(300)
def test_a_node_killed_mid_run_fails_the_others_clearly():
    """Node 1 is killed while every rank loops over all_reduce: node 0's ranks stop with an
    error naming the failure, well within the group timeout, and leave its /dev/shm empty."""
    nodes = start_nodes(str(SCRIPTS / "multinode_scripts" / "loop.py"), [2, 2])
    seen = _read_until(nodes[0], "looping", 120.0)
    kill_node(nodes[1])
    killed_at = time.monotonic()
    (rc0, rest), _ = finish(nodes, 120.0)
    took, out0 = time.monotonic() - killed_at, seen + rest
    assert "looping" in seen, f"the job never started:\n{out0[-3000:]}"
    assert rc0 != 0, out0[-3000:]
    # a PeerFailureError, naming what gloo saw ("Connection closed by peer" or "... reset by peer")
    assert re.search(r"PeerFailureError: .*another node died or left the group \(.*Connection (closed|reset) by peer",
                     out0), out0[-3000:]
    assert took < 55, f"survivors took {took:.0f} s to stop (their timeout is 60 s)"
    assert "shm-left=0" in out0, out0[-2000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fail_rank", [1, 2], ids=["on-node0", "on-node1"])
def test_shmrun_stops_every_node_when_one_fails(fail_rank):
    """A rank fails on one node while the others compute without communicating: every node's
    shmrun stops its ranks at once, names the failure, exits with the rank's code (3), and
    leaves its /dev/shm empty."""
    start = time.monotonic()
    nodes = start_nodes(str(SCRIPTS / "multinode_scripts" / "fail_one.py"), [2, 2], launcher="shmrun",
                        env={"FAIL_RANK": str(fail_rank)})
    results = finish(nodes, 100.0)
    took = time.monotonic() - start
    failed_node = fail_rank // 2
    for k, (rc, out) in enumerate(results):
        assert rc == 3, f"node {k} exited with {rc}:\n{out[-3000:]}"
        assert "shm-left=0" in out, out[-2000:]
        if k == failed_node:
            assert f"rank {fail_rank} (local rank {fail_rank % 2}) (pid" in out, out[-3000:]
            assert "failed with exit code 3" in out, out[-3000:]
        else:
            assert f"the job failed on node {failed_node} (rank {fail_rank} (pid" in out, out[-3000:]
    assert took < 60, f"the nodes took {took:.0f} s to stop (the healthy ranks sleep 120 s)"


@pytest.mark.timeout(150)
def test_a_rank_that_leaves_early_is_named_across_nodes():
    """Rank 3 (node 1's second rank; SHMCOMM_SIMULATE_NODES=2 under one shmrun) returns while
    the others wait for it in an all_reduce. Its node peer names it as the whole group numbers
    it, the ranks of node 0 raise PeerFailureError (their link to it closed), and shmrun's
    summary names it as the cause. Before, its node peer said "rank 1 (pid ...)" (its number in
    the node group: a live rank of the whole group) and the summary blamed a rank that had only
    failed because it had left."""
    from harness import shmrun_leave_early

    rc, out, pid = shmrun_leave_early(4, 3, env={"SHMCOMM_SIMULATE_NODES": "2"})
    assert rc == 1, out[-3000:]
    assert re.search(rf"rank 2 raised PeerFailureError: \w+: rank 3 \(pid {pid}\) died or left the "
                     r"group\n", out), out[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} raised PeerFailureError: " in out, out[-3000:]


def _read_until(p, marker: str, timeout: float) -> str:
    """Lines of ``p``'s output until one holds ``marker`` (or ``timeout`` seconds pass)."""
    import selectors

    seen, deadline = "", time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(p.stdout, selectors.EVENT_READ)
        while marker not in seen and time.monotonic() < deadline:
            if sel.select(timeout=1.0):
                line = p.stdout.readline()
                if not line:
                    break
                seen += line
    return seen


def check_mismatches(text: str, ranks: int, modes: int = 7) -> None:
    """Every rank of a mismatch.py job raised CollectiveMismatchError in each of its ``modes``
    (the script checks, on each rank, that its error names what differed) and its group stayed
    usable. (tests/test_mpi_link.py repeats this check.)"""
    for rank in range(ranks):
        raised = text.count(f"rank {rank} mode ")
        mismatches = len(re.findall(rf"rank {rank} mode [\w ]+ raised CollectiveMismatchError: ", text))
        assert raised == mismatches == modes, f"rank {rank}:\n{text[-4000:]}"
        assert f"rank {rank} mismatch ok: {modes} modes" in text, f"rank {rank}:\n{text[-4000:]}"


@pytest.mark.timeout(300)
def test_mismatched_collectives_across_nodes_raise_on_every_rank():
    """Node 1 calls another size, dtype (same bytes), collective, root or path (8 MiB by shards
    against 2 MiB by the leaders) than node 0, or one rank that crosses no link differs from its
    node peer (mismatch.py, one job). Before: a rank died with SIGABRT inside gloo (sizes), every
    rank got garbage (dtypes) or returned (all_reduce against reduce), the job waited the whole
    timeout and raised gloo's RuntimeError (roots, paths), and node peers got AbortedError. Now
    every rank of both nodes raises CollectiveMismatchError at once, naming each rank's call, and
    the group stays usable."""
    start = time.monotonic()
    text = run_nodes(str(SCRIPTS / "multinode_scripts" / "mismatch.py"), [2, 2], timeout=200)
    assert time.monotonic() - start < 50, f"took {time.monotonic() - start:.0f} s (timeout 60 s)"
    check_mismatches(text, 4)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSTOP"])
def test_a_rank_killed_or_stopped_on_another_node_is_reported_as_such(sig, tmp_path):
    """One rank of node 1 is killed (or stopped) while every rank loops over the numpy
    all_reduce. Before, node 0's ranks reported CollectiveMismatchError (a node peer left a
    composite early and paired its node step with the next operation) and the job took three
    timeouts to end; now a failed composite aborts its node group with the cause, and every
    survivor names a failure, not a mismatch, within one timeout (10 s here)."""
    import os
    import signal

    os.chmod(tmp_path, 0o777)
    import threading

    nodes = start_nodes(str(SCRIPTS / "multinode_scripts" / "loop_numpy.py"), [2, 2], str(tmp_path), "10")
    seen = _read_until(nodes[0], "looping", 120.0)
    assert "looping" in seen, seen
    victim = int((tmp_path / "3").read_text())
    def end_victim():  # a stopped rank holds its launcher's teardown: end it once measured
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass

    os.kill(victim, getattr(signal, sig))
    stopped_at = time.time()
    reaper = threading.Timer(20.0, end_victim)
    reaper.start()
    try:
        results = finish(nodes, 200.0)
    finally:
        reaper.cancel()
        end_victim()
    text = seen + "\n".join(out for _, out in results)
    # (the launcher stops a node's other ranks once one failed: not every survivor gets to say)
    raised = re.findall(r"rank (\d) raised at ([\d.]+) (\w+): (.*)", text)
    assert {r for r, *_ in raised} & {"0", "1"}, f"no rank of node 0 raised:\n{text[-3000:]}"
    assert not [line for line in raised if line[2] == "CollectiveMismatchError"], raised
    if sig == "SIGKILL":  # a death, whether a rank met it on its link or through its node group
        assert all(line[2] == "PeerFailureError" for line in raised if line[0] in "01"), raised
    late = max(float(at) for _, at, _, _ in raised) - stopped_at
    assert late < 15, f"a survivor raised {late:.0f} s after rank 3 was stopped (timeout 10 s): {raised}"
