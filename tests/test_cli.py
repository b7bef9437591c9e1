"""Tests of the ``shmcomm`` maintenance CLI (info, ls, clean) on fabricated segment files."""

from __future__ import annotations

import mmap
import os
import re
import struct
import subprocess
import sys
import time

import pytest

from shmcomm import segments

CLI = [sys.executable, "-m", "shmcomm.cli"]


def shmcomm_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``shmcomm ARGS`` in a subprocess (with ``env`` added) and return its result (text output)."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=30,
                          env=None if env is None else {**os.environ, **env})


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def make_segment():
    """Factory writing fake segment files with a valid header; removes whatever it made."""
    made: list[str] = []

    def make(job: str, pids: list[int], part: str = "g0", valid: bool = True) -> str:
        path = os.path.join(segments.SHM_DIR, segments.segment_name(job, part).lstrip("/"))
        data = bytearray(segments.HEADER_BYTES + len(pids) * segments.CONTROL_BLOCK_BYTES)
        if valid:
            struct.pack_into("<QII", data, 0, segments.MAGIC, 1, len(pids))
            data[64:64 + len(job)] = job.encode()
            for r, pid in enumerate(pids):
                offset = segments.HEADER_BYTES + r * segments.CONTROL_BLOCK_BYTES + 8  # pid field
                struct.pack_into("<i", data, offset, pid)
        with open(path, "wb") as f:
            f.write(data)
        made.append(path)
        return path

    yield make
    for path in made:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


@pytest.fixture
def job(request):
    """A job name no other test or process uses."""
    return f"clitest-{os.getpid()}-{request.node.name[:20]}-{time.monotonic_ns() % 10**6}"


@pytest.fixture(autouse=True)
def no_leftover_segments():
    """No segment of a job made by these tests may remain (other processes' ones may come and go)."""
    yield
    left = [s.name for s in segments.list_segments() if s.job.startswith(f"clitest-{os.getpid()}-")
            or f".clitest-{os.getpid()}-" in s.name]
    assert not left, f"segments left in /dev/shm: {left}"


@pytest.mark.timeout(30)
def test_info():
    res = shmcomm_cli("info")
    assert res.returncode == 0, res.stderr
    import shmcomm
    assert re.search(rf"^version:\s+{re.escape(shmcomm.__version__)}$", res.stdout, re.M)
    m = re.search(r"^/dev/shm:\s+([\d.]+) (\w+) free of ([\d.]+) (\w+)$", res.stdout, re.M)
    assert m, res.stdout
    assert re.search(r"^cores:\s+\d+ usable of \d+$", res.stdout, re.M)
    from shmcomm.cpus import machine_numa_nodes
    assert re.search(rf"^NUMA nodes:\s+{machine_numa_nodes()}\b", res.stdout, re.M), res.stdout
    share = max(1, min(8, len(os.sched_getaffinity(0)) // 2))
    assert re.search(rf"^threads a rank:\s+{share} at 2 ranks, ", res.stdout, re.M), res.stdout
    forced = shmcomm_cli("info", env={"SHMCOMM_RANK_THREADS": "3"})
    assert re.search(r"^threads a rank:\s+3 \(SHMCOMM_RANK_THREADS\)", forced.stdout, re.M), forced.stdout
    assert re.search(r"^simd:\s+\S", res.stdout, re.M)
    from shmcomm import _core
    best = _core.simd_levels()[-1]
    assert re.search(rf"^kernels:\s+{best} \(the best this CPU runs; runs: baseline", res.stdout, re.M)
    # build facts recorded by setup.py, and the settings in effect with their source
    assert re.search(r"^build cython:\s+\d+\.\d+", res.stdout, re.M), res.stdout
    assert re.search(r"^slot_bytes \(\d+ ranks\):\s+1\.0 MiB \(default; SHMCOMM_SLOT_BYTES\)$", res.stdout, re.M)


@pytest.mark.timeout(30)
def test_info_says_first_what_works_here_and_keeps_the_table_behind_settings():
    res = shmcomm_cli("info")
    assert res.returncode == 0, res.stderr
    keys = [line.split(":")[0] for line in res.stdout.splitlines()[:4]]
    assert keys == ["version", "torch backend", "bench peers", "single copy"], res.stdout
    assert re.search(r"^single copy:\s+(yes|no): ", res.stdout, re.M)
    assert "SHMCOMM_SLOT_BYTES " not in res.stdout  # the table only with --settings
    assert re.search(r"^settings: \d+ SHMCOMM_\* variables, \d+ set here( \(.*\))?; the table: shmcomm info --settings$",
                     res.stdout, re.M), res.stdout
    full = shmcomm_cli("info", "--settings")
    assert full.returncode == 0 and re.search(r"^  SHMCOMM_SLOT_BYTES +group +1 MiB", full.stdout, re.M)


def test_capabilities_name_what_is_missing(monkeypatch):
    import importlib.metadata

    from shmcomm import capabilities

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: (_ for _ in ()).throw(
        importlib.metadata.PackageNotFoundError(name)) if name == "torch" else real(name))
    assert capabilities.torch_backend() == 'no: torch is not installed (pip install ".[torch]" from a checkout)'
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.5.1" if name == "torch" else real(name))
    assert capabilities.torch_backend() == "no: torch 2.5.1 is outside the supported 2.7 to 2.15"
    monkeypatch.setenv("SHMCOMM_BENCH_UNAVAILABLE", "gloo,mpi")
    missing = capabilities.bench_peers().split("; missing: ")[1]
    assert missing.startswith("gloo (marked unavailable by SHMCOMM_BENCH_UNAVAILABLE), mpi (marked")
    # this machine lets siblings read each other (the suite's single-copy tests rely on it)
    assert capabilities.single_copy().startswith("yes: sibling processes may read each other's memory")


@pytest.mark.timeout(30)
def test_info_json_and_settings_from_the_environment():
    import json

    res = subprocess.run([sys.executable, "-m", "shmcomm.cli", "info", "--json"], capture_output=True,
                         text=True, env=dict(os.environ, SHMCOMM_SLOT_BYTES="2097152"))
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    import shmcomm
    assert report["version"] == shmcomm.__version__
    slot = next(v for k, v in report.items() if k.startswith("slot_bytes"))
    assert slot == "2.0 MiB (from SHMCOMM_SLOT_BYTES)", report
    assert report["kernels"].split()[0] in shmcomm._core.simd_levels()


@pytest.mark.timeout(30)
def test_ls_empty_job():
    res = shmcomm_cli("ls", "--job", "no-such-job-for-sure")
    assert res.returncode == 0
    assert res.stdout.strip() == "no segments"


@pytest.mark.timeout(30)
def test_ls_and_clean_remove_stale_only(make_segment, job):
    stale = make_segment(job, [dead_pid(), dead_pid()], part="stale")
    live = make_segment(job, [dead_pid(), os.getpid()], part="live")

    res = shmcomm_cli("ls", "--job", job)
    assert res.returncode == 0, res.stderr
    rows = {line.split()[0]: line.split() for line in res.stdout.splitlines()[1:]}
    assert rows[os.path.basename(stale)][-1] == "stale"
    assert rows[os.path.basename(live)][-1] == "alive"
    assert rows[os.path.basename(live)][1] == job
    assert str(os.getpid()) in rows[os.path.basename(live)][-2]

    res = shmcomm_cli("clean", "--dry-run", "--job", job)
    assert res.returncode == 0, res.stderr
    assert f"would remove {os.path.basename(stale)}" in res.stdout
    assert os.path.basename(live) not in res.stdout
    assert os.path.exists(stale)

    res = shmcomm_cli("clean", "--job", job)
    assert res.returncode == 0, res.stderr
    assert f"removed {os.path.basename(stale)}" in res.stdout
    assert os.path.basename(live) not in res.stdout
    assert not os.path.exists(stale)
    assert os.path.exists(live)

    assert "no stale segments" in shmcomm_cli("clean", "--job", job).stdout


@pytest.mark.timeout(30)
def test_clean_keeps_a_mapped_segment_whatever_its_header_says(make_segment, job):
    # Dead owner pids in the header, but this process maps the file: it is in use.
    path = make_segment(job, [dead_pid()], part="mapped")
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0):
        res = shmcomm_cli("clean", "--job", job)
        assert "no stale segments" in res.stdout
        assert os.path.exists(path)
        assert shmcomm_cli("ls", "--job", job).stdout.split()[-1] == "alive"


_HOLDER = """
import ctypes, mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
if sys.argv[2] == "mapped":
    # libc's mmap, not Python's: mmap.mmap keeps a duplicate of the descriptor open
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    addr = libc.mmap(None, os.fstat(fd).st_size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value)   # MAP_FAILED
    os.close(fd)          # only the mapping is left: no descriptor lists the file
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["mapped", "open"])
def test_a_segment_only_mapped_or_only_open_in_another_process_is_alive(make_segment, job, how):
    from shmcomm import cli

    path = make_segment(job, [dead_pid()], part=how)   # the header names only a dead pid
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, path, how], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        fd_dir = f"/proc/{holder.pid}/fd"
        fds = [os.readlink(f"{fd_dir}/{fd}") for fd in os.listdir(fd_dir)]
        assert (path in fds) == (how == "open")
        assert cli.segment_users().get(os.path.basename(path)) == {holder.pid}
        assert shmcomm_cli("ls", "--job", job).stdout.split()[-1] == "alive"
        assert "no stale segments" in shmcomm_cli("clean", "--job", job).stdout
        assert os.path.exists(path)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert shmcomm_cli("ls", "--job", job).stdout.split()[-1] == "stale"


@pytest.mark.timeout(30)
def test_headerless_segment_is_stale_only_when_old(make_segment, job):
    path = make_segment(job, [0], part="nohdr", valid=False)
    assert shmcomm_cli("ls", "--job", job).stdout.split()[-1] == "starting"
    assert os.path.exists(path) and "no stale segments" in shmcomm_cli("clean", "--job", job).stdout
    old = time.time() - 3600
    os.utime(path, (old, old))
    res = shmcomm_cli("clean", "--job", job)
    assert f"removed {os.path.basename(path)}" in res.stdout
    assert not os.path.exists(path)


@pytest.mark.timeout(30)
def test_staging_names_are_stale_once_their_creator_is_gone(make_segment, job):
    """Without O_TMPFILE a segment is made under a staging name carrying its creator's pid and
    start time: ``clean`` removes it at once when that process is gone (or the pid now names
    another process: another start time), never while its creator runs, however old."""
    from shmcomm import trust

    me = trust.process_identity(os.getpid())[1]
    dead = make_segment(job, [0], part=f"g0~{dead_pid()}-{me}", valid=False)
    recycled = make_segment(job, [0], part=f"g1~{os.getpid()}-{me + 1}", valid=False)
    live = make_segment(job, [0], part=f"g2~{os.getpid()}-{me}", valid=False)
    old = time.time() - 3600
    os.utime(live, (old, old))
    states = {line.split()[0]: line.split()[-1] for line in shmcomm_cli("ls", "--job", job).stdout.splitlines()[1:]}
    assert states == {os.path.basename(dead): "stale", os.path.basename(recycled): "stale",
                      os.path.basename(live): "starting"}, states
    res = shmcomm_cli("clean", "--job", job)
    assert f"removed {os.path.basename(dead)}" in res.stdout
    assert f"removed {os.path.basename(recycled)}" in res.stdout
    assert not os.path.exists(dead) and not os.path.exists(recycled) and os.path.exists(live)


@pytest.mark.timeout(30)
def test_a_segment_linked_from_its_staging_name_is_being_published(make_segment, job):
    """Naming a segment without O_TMPFILE links its staging name to the name, then removes the
    staging name: attaching ranks take a second link that is the staging name for that moment,
    not for a planted link; one left by a creator killed in between is removed."""
    from shmcomm import trust

    path = make_segment(job, [os.getpid()], part="g0")
    os.chmod(path, 0o600)
    staged = f"{path}~{os.getpid()}-{trust.process_identity(os.getpid())[1]}"
    os.link(path, staged)
    try:
        assert segments.publishing(path) and os.path.exists(staged)  # its creator runs: wait
    finally:
        os.unlink(staged)
    left = f"{path}~{dead_pid()}-1"
    os.link(path, left)
    assert segments.publishing(path) and not os.path.exists(left)
    assert os.stat(path).st_nlink == 1
    assert segments.publishing(path)  # (a file refused a moment ago, fine now: look again)
    other = f"{path}.other"
    os.link(path, other)
    try:
        assert not segments.publishing(path)  # any other second link is refused, as before
        with pytest.raises(trust.UntrustedFileError, match="more than one link"):
            trust.open_checked(path, os.O_RDONLY)
    finally:
        os.unlink(other)


def test_staging_names_fit_in_a_file_name():
    """The longest segment name (a job name is cut to 48 characters, parts are a sub-group's
    heap at most) with the largest pid and start time stays within NAME_MAX."""
    name = "/" + segments.job_prefix("j" * 200, uid=2**32 - 1) + "g999.%s.h99999.%s" % ("f" * 16, "f" * 16)
    staged = segments.staging_name(name, 2**22, 2**64 - 1)
    assert len(staged) - 1 <= segments.NAME_MAX
    assert segments.staging_creator(staged) == (2**22, 2**64 - 1)
    assert segments.staging_creator(name) is None


@pytest.mark.timeout(30)
def test_no_command_is_a_usage_error():
    res = shmcomm_cli()
    assert res.returncode == 2
    assert "usage: shmcomm" in res.stderr
