"""The one settings table (shmcomm/settings.py): every SHMCOMM_* variable the code reads has a row,
`shmcomm info --json` prints every row, the core's group tuning goes through it (floors and
ceilings enforced with a message naming the variable), secrets are never printed, and settings or
timeouts that cannot work fail at start-up on every rank, naming what is wrong."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import shmcomm as sc
from harness import run_ranks
from shmcomm import _core
from shmcomm.world import job_arguments
from shmcomm.settings import GROUP_TUNING, SETTINGS, find

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"\bSHMCOMM_[A-Z0-9_]+\b")


def _variables_in_code() -> dict[str, str]:
    """Every SHMCOMM_* name in the package, the Cython sources and setup.py (C include guards,
    which end in _H, aside), with one file that names it."""
    found = {}
    files = [*ROOT.joinpath("shmcomm").rglob("*.py"), *ROOT.joinpath("src_cython").rglob("*.p*"),
             *ROOT.joinpath("src_cython").rglob("*.[ch]"), ROOT / "setup.py"]
    for path in files:
        if path.name == "_core.c":  # Cython's output
            continue
        for name in NAME.findall(path.read_text(errors="replace")):
            if not name.endswith("_H"):
                found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def _info_json(**env):
    res = subprocess.run([sys.executable, "-m", "shmcomm.cli", "info", "--json"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, **env})
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.timeout(60)
def test_every_variable_the_code_reads_is_in_the_table_and_in_info():
    in_code = _variables_in_code()
    assert len(in_code) >= 20, in_code  # the scan itself works
    rows = {row["var"] for row in _info_json()["settings"]}
    missing = {name: where for name, where in in_code.items() if name not in rows}
    assert not missing, f"SHMCOMM_* variables read but not in shmcomm/settings.py: {missing}"
    # and no row for a variable nothing reads any more
    stale = rows - set(in_code)
    assert not stale, f"rows in shmcomm/settings.py that no code reads: {sorted(stale)}"


def test_each_row_is_complete():
    assert len({s.var for s in SETTINGS}) == len(SETTINGS), "a variable has two rows"
    for s in SETTINGS:
        assert s.scope in {"group", "job", "kernels", "multinode", "rpc", "torch", "bench", "build"}, s
        assert s.default and s.why, s
    for s in GROUP_TUNING:
        assert s.key and s.compute is not None and s.floor is not None, s


def test_group_settings_come_from_the_table(monkeypatch):
    keys = [s.key for s in GROUP_TUNING]
    assert list(_core.group_settings(2)) == keys
    monkeypatch.setenv("SHMCOMM_RING_BYTES", "8192")
    assert _core.group_settings(2)["ring_bytes"] == 8192
    monkeypatch.setenv("SHMCOMM_RING_BYTES", str(find("SHMCOMM_RING_BYTES").floor - 1))
    with pytest.raises(ValueError, match="SHMCOMM_RING_BYTES must be at least 4096"):
        _core.group_settings(2)
    monkeypatch.setenv("SHMCOMM_RING_BYTES", "lots")
    with pytest.raises(ValueError, match="SHMCOMM_RING_BYTES must be an integer"):
        _core.group_settings(2)


def test_one_shot_size_is_a_budget_of_bytes_read_per_rank(monkeypatch):
    """Every rank of a one-shot reads every rank's message: the default limit shrinks with the
    group, as 64 KiB / ranks^2 while the ranks fit the cores (16 KiB at 2, the 2-core tuning; on
    16 cores two steps won from 1 KiB at 8 ranks and 512 B at 16), as 256 KiB / ranks^2 where
    they outnumber the cores (each step waits for descheduled peers); at most 16 KiB."""
    small = find("SHMCOMM_SMALL_BYTES").compute
    fitting = {size: small({"size": size, "fits": True, "llc": 1 << 25}) for size in (2, 3, 4, 8, 16, 32, 64, 128)}
    assert fitting[2] == 16384 and fitting[8] == 1024 and fitting[16] == 256
    for size, limit in fitting.items():
        assert limit * size * size <= 65536 or limit == 64, size
        assert limit % 64 == 0 and limit >= 64
        assert limit <= fitting.get(size // 2, limit), "a larger group never gets a larger limit"
    crowded = {size: small({"size": size, "fits": False, "llc": 1 << 25}) for size in (3, 4, 8, 32)}
    assert crowded == {3: 16384, 4: 16384, 8: 4096, 32: 256}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert _core.group_settings(16)["small_bytes"] == 256
    monkeypatch.setenv("SHMCOMM_SMALL_BYTES", "65536")  # a user's choice wins at any size
    assert _core.group_settings(16)["small_bytes"] == 65536


@pytest.mark.timeout(60)
def test_info_marks_what_is_set_and_never_prints_a_secret():
    rows = {row["var"]: row for row in _info_json(SHMCOMM_SECRET="hunter2", SHMCOMM_YIELDS="7")["settings"]}
    assert rows["SHMCOMM_YIELDS"]["value"] == "7"
    assert rows["SHMCOMM_SECRET"]["value"] == "(set)"
    text = subprocess.run([sys.executable, "-m", "shmcomm.cli", "info", "--settings"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "SHMCOMM_SECRET": "hunter2"}).stdout
    assert "hunter2" not in text
    assert re.search(r"^\* SHMCOMM_SECRET\s+job\s+\(set\)", text, re.M), text


def test_a_group_counts_the_ranks_of_its_job_that_run_beside_it():
    """A group made through another (a sub-group, a NUMA composition's levels) spins only if its
    parent would: two ranks fit two cores, but not beside two more ranks of the same job. (Two
    ranks of four on two cores spinning in their sub-group made a 64 KiB composed all_reduce
    take 890 us instead of 140.)"""
    import os

    usable = len(os.sched_getaffinity(0))
    assert _core.group_settings(2, 1, busy_ranks=usable + 2)["spin_us"] == 0
    assert _core.group_settings(2, 1, busy_ranks=1) == _core.group_settings(2)  # never below size
    if usable >= 2:
        assert _core.group_settings(2)["spin_us"] > 0


# ---- ceilings (issue 47): a value that cannot work fails at start-up, naming the variable -------
def test_every_size_and_count_has_a_ceiling_enforced_naming_the_variable(monkeypatch):
    """SHMCOMM_SLOT_BYTES=2**62 was accepted: the segment's size wrapped to one without slots."""
    from shmcomm.hierarchy.topology import simulated_nodes
    from shmcomm.settings import read_int

    capped = [s for s in SETTINGS if s.floor is not None]
    assert {s.var for s in GROUP_TUNING} <= {s.var for s in capped}
    for s in capped:
        assert s.ceiling is not None and s.ceiling > s.floor, s
        assert s.ceiling <= 1 << 50, s  # sums and products of a few stay far below 2**64
        monkeypatch.setenv(s.var, str(s.ceiling))
        assert read_int(s, 0) == s.ceiling
        monkeypatch.setenv(s.var, str(s.ceiling + 1))
        with pytest.raises(ValueError, match=rf"{s.var} must be at least {s.floor} and at most "
                                             rf"{s.ceiling}, got {s.ceiling + 1}"):
            read_int(s, 0)
        monkeypatch.delenv(s.var)
    assert find("SHMCOMM_SLOT_BYTES").ceiling == find("SHMCOMM_RING_BYTES").ceiling == 1 << 30
    monkeypatch.setenv("SHMCOMM_SLOT_BYTES", str(2**62))
    with pytest.raises(ValueError, match="SHMCOMM_SLOT_BYTES must be .* at most 1073741824"):
        _core.group_settings(2)
    monkeypatch.delenv("SHMCOMM_SLOT_BYTES")
    monkeypatch.setenv("SHMCOMM_SIMULATE_NODES", "100000")  # read apart from the group tuning
    with pytest.raises(ValueError, match="SHMCOMM_SIMULATE_NODES must be at least 1 and at most"):
        simulated_nodes()


@pytest.mark.timeout(60)
def test_info_shows_each_ceiling_where_it_shows_the_floor():
    rows = {row["var"]: row for row in _info_json()["settings"]}
    assert rows["SHMCOMM_SLOT_BYTES"]["ceiling"] == 1 << 30
    assert rows["SHMCOMM_JOB"]["ceiling"] is None
    text = subprocess.run([sys.executable, "-m", "shmcomm.cli", "info", "--settings"], capture_output=True, text=True,
                          timeout=60).stdout
    assert re.search(r"SHMCOMM_SLOT_BYTES .*; at least 4096; at most 1073741824:", text), text


def _start_with_wrapping_size(rank, size, var):
    with pytest.raises(ValueError, match=f"{var} must be at least 4096 and at most 1073741824, "
                                         f"got {2**62}"):
        sc.init_process_group(rank=rank, world_size=size, name=f"wrap-{os.getppid()}", timeout=5)
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("var", ["SHMCOMM_SLOT_BYTES", "SHMCOMM_RING_BYTES"])
def test_a_size_that_wrapped_the_layout_fails_on_every_rank_at_start_up(var):
    """2**62 bytes per slot at 2 ranks wrapped the segment's size: a broadcast gave zeros on rank
    1 and rank 0 died of SIGSEGV (2**62 per ring killed both). Now every rank refuses it at once;
    no rank dies of a signal (run_ranks fails on one) and nothing is left in /dev/shm."""
    assert run_ranks(_start_with_wrapping_size, 2, var, init=False, timeout=30,
                     env={var: str(2**62)}) == [True, True]


@pytest.mark.timeout(30)
def test_a_layout_larger_than_dev_shm_is_refused_naming_the_settings_and_the_world_size(monkeypatch):
    """Each setting within its ceiling can still make a segment no machine holds: a ring per
    ordered pair of ranks grows with their square (1 GiB rings at 2**17 ranks wrapped 2**64).
    Every rank checks the layout before it creates or attaches anything."""
    monkeypatch.setenv("SHMCOMM_RING_BYTES", str(1 << 30))
    ranks = 1 << 17
    with pytest.raises(ValueError) as info:
        _core.Communicator(f"layout-{os.getpid()}", "g0", 1, ranks, 5.0)  # not rank 0: attaches
    message = str(info.value)
    assert f"a group of {ranks} ranks needs" in message and "of /dev/shm" in message, message
    assert f"SHMCOMM_RING_BYTES={1 << 30}" in message and "SHMCOMM_SLOT_BYTES=" in message, message
    with pytest.raises(ValueError, match=f"a group of {ranks} ranks needs"):
        _core.Communicator(f"layout-{os.getpid()}", "g0", 0, ranks, 5.0)  # rank 0: creates


# ---- SHMCOMM_TIMEOUT and timeout arguments --------------------------------------------------------
@pytest.fixture
def no_group_left():
    """A start-up that should have been refused but was not must not leave this process a
    default group (the ranks later tests fork would inherit it)."""
    yield
    if sc.is_initialized():
        sc.destroy_process_group()
        pytest.fail("init_process_group accepted what it should refuse")


@pytest.mark.parametrize("raw", ["abc", "-1", "0", "nan", ""])
def test_a_bad_timeout_setting_is_refused_at_start_up_naming_it(monkeypatch, raw, no_group_left):
    monkeypatch.setenv("SHMCOMM_TIMEOUT", raw)
    if not raw:  # unset: the default
        assert job_arguments(0, 1, "x", None)[3] == 300.0
        return
    with pytest.raises(ValueError, match=rf"SHMCOMM_TIMEOUT must be a number of seconds > 0 "
                                         rf"\(inf: no timeout\), got '{raw}'"):
        sc.init_process_group(rank=0, world_size=1, name=f"bad-timeout-{os.getpid()}")


def test_timeout_arguments_are_checked_before_anything_starts(monkeypatch, no_group_left):
    monkeypatch.setenv("SHMCOMM_TIMEOUT", "inf")
    assert job_arguments(0, 1, "x", None)[3] == float("inf")
    for bad in (-1, 0, float("nan"), -float("inf")):
        with pytest.raises(ValueError, match="timeout must be > 0 seconds"):
            sc.init_process_group(rank=0, world_size=1, name=f"bad-timeout-{os.getpid()}", timeout=bad)
        with pytest.raises(ValueError, match="timeout must be > 0 seconds"):
            sc.spawn(print, 2, timeout=bad)  # refused before a rank starts
    with pytest.raises(TypeError, match="timeout must be a number of seconds or None"):
        sc.init_process_group(rank=0, world_size=1, name=f"bad-timeout-{os.getpid()}", timeout="60")
