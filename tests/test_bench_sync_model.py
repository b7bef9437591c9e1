"""bench/bench_sync_model.py: the C model of flat, recursive-doubling and tree exchanges builds and
every way's sums come out right at 1-16 ranks (oversubscribed here: only the sums are checked;
nothing here asserts a time), and rank counts above the CPUs are skipped unless asked for."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "bench", "bench_sync_model.py")

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="the model is C: needs cc or gcc")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=100,
                          cwd=REPO)


@pytest.mark.timeout(120)
def test_every_way_sums_right_at_one_to_sixteen_ranks():
    proc = _run("--ranks", "1,2,3,4,8,16", "--iters", "200", "--oversubscribe")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {int(line.split()[0]): line for line in proc.stdout.splitlines()
            if re.match(r"\s*\d+\s", line)}
    assert sorted(rows) == [1, 2, 3, 4, 8, 16], proc.stdout
    assert "WRONG" not in proc.stdout
    for n, line in rows.items():
        times = re.findall(r"([\d.]+)\s+([\d.]+)x", line)
        power_of_two = n & (n - 1) == 0
        assert len(times) == (3 if power_of_two else 2), line  # doubling: powers of two only
        assert all(float(ns) > 0 for ns, _ in times), line


@pytest.mark.timeout(60)
def test_more_ranks_than_cpus_are_skipped_unless_asked_for():
    too_many = len(os.sched_getaffinity(0)) + 1
    proc = _run("--ranks", str(too_many), "--iters", "10")
    assert proc.returncode == 0, proc.stderr
    assert f"{too_many:>6}  skipped: more ranks than the" in proc.stdout


@pytest.mark.timeout(60)
def test_bad_counts_are_refused():
    proc = _run("--iters", "0")
    assert proc.returncode == 2 and "--iters and every rank count must be at least 1" in proc.stderr
