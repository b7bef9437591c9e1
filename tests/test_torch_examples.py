"""The torch users' examples (examples/torch), each run under shmrun with ``--check``: the same
job repeated on gloo over the same ranks must give the same numbers.

DDP, FSDP2 (gradient divide factor = PREMUL_SUM, buffers from the process group), HSDP on a 2x2
mesh (all shmcomm, and mixed with gloo by DeviceMesh's backend_override), DTensor tensor
parallelism and redistributions, functional collectives under torch.compile(fullgraph=True), and
a parameter server over shmcomm.rpc.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch.distributed.fsdp")

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "torch"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script,ranks,expect", [
    ("ddp.py", 2, ["DDP: shmcomm matches gloo"]),
    ("fsdp2.py", 2, ["FSDP2: shmcomm matches gloo", "gradient divide factor: shmcomm matches gloo",
                     "buffers in shared memory: shmcomm matches its own run", "shared buffers made"]),
    # torch at 8 ranks, as the users run it (here 8 ranks share 2 cores)
    ("fsdp2.py", 8, ["FSDP2: shmcomm matches gloo", "gradient divide factor: shmcomm matches gloo",
                     "buffers in shared memory: shmcomm matches its own run", "shared buffers made"]),
    ("hsdp.py", 4, ["HSDP: shmcomm matches gloo", "gloo across replicas, shmcomm within: shmcomm matches"]),
    ("tensor_parallel.py", 2, ["DTensor: shmcomm matches gloo"]),
    ("compiled_collectives.py", 2, ["compiled collectives: shmcomm matches gloo"]),
    ("rpc_parameter_server.py", 3, ["converged between the trainers' targets"]),
])
def test_example_matches_gloo(script, ranks, expect):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    proc = subprocess.run([sys.executable, "-m", "shmcomm.launch", "-n", str(ranks), sys.executable,
                           str(EXAMPLES / script), "--check"], cwd=str(REPO), env=env,
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for line in expect:
        assert line in proc.stdout, (line, proc.stdout[-2000:])
