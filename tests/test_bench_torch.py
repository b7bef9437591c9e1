"""bench/bench_torch_backend.py: one real, tiny run of every section (2 ranks, a few calls, one
round), so the script a lent 16-core machine runs once (bench/run_16core.sh) cannot fail there on
a mistake this machine would have shown; nothing here asserts a time."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch.distributed.fsdp")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "bench", "bench_torch_backend.py")
NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
SIGNED = r"(-?[0-9]+(?:\.[0-9]+)?)"


@pytest.mark.timeout(120)
def test_every_section_runs_and_reports_its_floors():
    proc = subprocess.run([sys.executable, SCRIPT, "-n", "2", "--iters", "100", "--steps", "2",
                           "--rounds", "1", "--large-count", "4096", "--large-iters", "2"],
                          capture_output=True, text=True, timeout=110, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    for row in ("all_reduce 2 x float32 (us)", "functional all_reduce 8 KiB (us)",
                "DDP step", "FSDP2 step 5x512 MLP", "buffers from the process group (ms)",
                "TP MLP forward", "x bfloat16 (ms)"):
        assert re.search(rf"^.*{re.escape(row)}.*\s{NUMBER} +\[.*\]\s+{NUMBER} +\[.*\]\s+{NUMBER}",
                         text, re.M), (row, text)
    # the floors: torch's own layers measured on a backend that does nothing, beside ours
    floor = re.search(rf"FSDP2 step on a backend that does nothing .*: {NUMBER} ms, {NUMBER} of "
                      rf"gloo's step; beyond it shmcomm {SIGNED} ms, gloo {SIGNED} ms",
                      text)
    assert floor and float(floor.group(1)) > 0, text
    assert re.search(rf"torch's own layer \(dist.all_reduce on a backend that does nothing\) {NUMBER} us",
                     text), text
    assert "FSDP2 models on both backends: identical bits" in text  # 2 ranks: one order of sums
