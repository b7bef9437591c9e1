"""The numpy examples (examples/*.py), each run as a user would, with its output checked. The
torch examples are run by test_torch_examples.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
pytestmark = pytest.mark.timeout(180)


def run(*argv: str, timeout: float = 150.0) -> str:
    res = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    return out


def test_data_parallel_regression():
    out = run("-m", "shmcomm.launch", "-n", "4", str(EXAMPLES / "data_parallel_regression.py"),
              "--rows-per-rank", "4000", "--steps", "100")
    assert "weights identical on every rank: True" in out, out
    error = float(out.split("max |w - true_w| = ")[1].split()[0])
    assert error < 0.1, out  # gradient descent got close to the true weights


@pytest.mark.parametrize("ranks", [2, 4])
def test_pipeline_p2p(ranks):
    out = run("-m", "shmcomm.launch", "-n", str(ranks), str(EXAMPLES / "pipeline_p2p.py"),
              "--micro-batches", "9", "--rows", "33", "--width", "300")
    assert f"9 micro-batches of 33x300 through {ranks - 1} stage(s); every result equals numpy's" in out, out


def test_spawn_monte_carlo():
    out = run(str(EXAMPLES / "spawn_monte_carlo.py"), "--ranks", "3", "--samples", "200000")
    estimate = float(out.split("pi ~ ")[1].split()[0])
    assert abs(estimate - 3.14159) < 0.02, out


def test_bench_with_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib: pip install 'shmcomm[plot]'")
    png = tmp_path / "all_reduce.png"
    out = run(str(EXAMPLES / "bench_with_plot.py"), "--plot", str(png), "--max-bytes", "64K",
              "--iters", "5")
    assert "all_reduce" in out, out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "the plot is not a PNG"
