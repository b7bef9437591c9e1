"""bench/bench_scaling.py: one real, tiny run (2 ranks, two sizes, one round, shmcomm only) that
must print the table and write the JSON with the numbers; nothing here asserts a time."""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "bench", "bench_scaling.py")


@pytest.mark.timeout(60)
def test_scaling_tiny_run(tmp_path):
    out = tmp_path / "scaling"
    proc = subprocess.run([sys.executable, SCRIPT, "--ranks", "2", "--sizes", "8,1K", "--rounds", "1",
                           "--backends", "shmcomm", "--target-time", "0.02", "--out", str(out)],
                          capture_output=True, text=True, timeout=50, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    assert "| ranks | 8 B | 1 KiB |" in text
    row = re.search(r"^\| 2 \| ([0-9.]+) \| ([0-9.]+) \|$", text, re.M)
    assert row, text
    assert "check shmcomm: no size slower than a size 4x larger:" in text

    doc = json.loads((out / "scaling.json").read_text())
    assert (out / "scaling.md").read_text() == text
    cells = {(c["peer"], c["nranks"], c["size"]): c["time_us"] for c in doc["cells_us"]}
    assert set(cells) == {("shmcomm", 2, 8), ("shmcomm", 2, 1024)}
    assert all(t > 0 for t in cells.values())
    # the table shows the JSON's numbers, as the script rounds them (fewer decimals above 10 us)
    bench_scaling = runpy.run_path(SCRIPT, run_name="bench_scaling")
    assert row.group(1) == bench_scaling["fmt_us"](cells["shmcomm", 2, 8])
    assert doc["sizes"] == [8, 1024] and doc["ranks"] == [2] and doc["rounds"] == 1
    assert doc["machine"]["cores_usable"] >= 1 and "python" in doc["machine"]["versions"]
    assert doc["commands"] and all("shmcomm.bench all_reduce -n 2" in c and "--serial" in c
                                   for c in doc["commands"])
    (run,) = doc["runs"]
    assert "error" not in run and run["json"]["rows"], run
    assert {r["size"] for r in run["json"]["rows"]} == {8, 1024}


def test_plan_sweeps():
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        import bench_scaling
    finally:
        sys.path.remove(os.path.dirname(SCRIPT))
    plan = bench_scaling.plan_sweeps
    assert plan([8, 1024, 16384, 65536, 262144, 1 << 20, 16 << 20]) == [(8, 1024, 128), (16384, 16 << 20, 4)]
    assert plan([64]) == [(64, 64, 2)]
    assert plan([8, 64, 512]) == [(8, 512, 8)]


def test_the_16_core_run_is_valid_bash_and_returns_few_files():
    """bench/run_16core.sh runs only on a lent machine: here, its syntax, and that it writes no
    more files than the device tool returns (8)."""
    script = os.path.join(os.path.dirname(SCRIPT), "run_16core.sh")
    subprocess.run(["bash", "-n", script], check=True, timeout=30)
    with open(script) as fh:
        text = fh.read()
    outputs = set(re.findall(r'"\$O/([\w.]+)"', text))
    assert outputs == {"machine.txt", "all_reduce.md", "zero_copy.txt", "torch_n8.txt", "torch_ops_n8.txt", "movement.md",
                       "raw.tar.gz", "log.txt"}, outputs
