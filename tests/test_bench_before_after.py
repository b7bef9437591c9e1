"""bench/bench_before_after.py: one real launch of its measurement from this checkout (no commit
is built here: that takes minutes), the sizes it reads, and a ref git cannot find refused before
anything runs. Nothing here asserts a time."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "bench", "bench_before_after.py")
tool = runpy.run_path(SCRIPT)


def test_sizes_take_k_m_and_g():
    assert [tool["parse_size"](s) for s in ("8", "4K", "1M", "2g")] == [8, 4096, 1 << 20, 2 << 30]


@pytest.mark.timeout(120)
def test_one_launch_times_every_kind_and_size_from_this_checkout():
    kinds = "all_reduce,broadcast,all_gather,reduce_scatter,barrier"
    got = tool["launch"](tool["tree"](None), "8,20000", kinds)
    assert set(got) == {f"{k} {n}" for k in kinds.split(",") for n in (8, 20000)}
    assert all(us > 0 for us in got.values()), got


@pytest.mark.timeout(60)
def test_a_ref_git_cannot_find_is_refused_before_anything_is_built():
    proc = subprocess.run([sys.executable, SCRIPT, "no-such-ref-anywhere"], capture_output=True,
                          text=True, timeout=50, cwd=REPO)
    assert proc.returncode != 0
    assert "'no-such-ref-anywhere' names no commit of this repository" in proc.stderr
    assert not os.path.exists(os.path.join(REPO, "build", "before_after", "no-such-ref-anywhere"))
