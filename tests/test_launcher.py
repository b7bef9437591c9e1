"""Tests of ``shmrun`` (``python -m shmcomm.launch``), each run as a real subprocess.

The rank programs live in ``tests/launcher_scripts``; they only use the standard library (and
torch for the gloo test), so these tests do not depend on the compiled collectives.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from shmcomm import segments
from shmcomm import cpus as cpu_topology
from shmcomm.launcher.environment import free_port_pair

SCRIPTS = Path(__file__).parent / "launcher_scripts"
LAUNCH = [sys.executable, "-m", "shmcomm.launch"]
LINE = re.compile(rb"^\[(\d+)\] (.*)$")


_launcher_pids: list[int] = []  # shmrun processes started by the current test


@pytest.fixture(autouse=True)
def no_leftover_segments():
    """No segment of a job launched by the test may remain in /dev/shm.

    Only this test's jobs are checked (their names start ``shmrun-<launcher pid>-``): other
    shmcomm processes of this user may come and go meanwhile.
    """
    _launcher_pids.clear()
    yield
    prefixes = tuple(segments.job_prefix(f"shmrun-{pid}-") for pid in _launcher_pids)
    left = [s.name for s in segments.list_segments() if prefixes and s.name.startswith(prefixes)]
    assert not left, f"segments left in /dev/shm: {left}"


@pytest.fixture
def pid_dir(tmp_path):
    """A directory where rank scripts record the pids the test later checks."""
    d = tmp_path / "pids"
    d.mkdir()
    return d


def shmrun(*args: str, timeout: float = 30, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run shmrun to completion from the scripts directory; output is kept as bytes."""
    with launcher(list(args), env=env) as proc:
        out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@contextlib.contextmanager
def launcher(args: list[str], env: dict | None = None, stdin=None, stderr=subprocess.PIPE):
    """Start shmrun with piped output; it is killed if the test leaves the block early."""
    proc = subprocess.Popen([*LAUNCH, *args], cwd=SCRIPTS, env=env, stdin=stdin,
                            stdout=subprocess.PIPE, stderr=stderr)
    _launcher_pids.append(proc.pid)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def by_rank(out: bytes) -> dict[int, list[bytes]]:
    """Group prefixed output lines by rank; a line without a prefix fails the test."""
    lines: dict[int, list[bytes]] = {}
    for line in out.splitlines():
        m = LINE.match(line)
        assert m, f"line without a rank prefix: {line[:200]!r}"
        lines.setdefault(int(m.group(1)), []).append(m.group(2))
    return lines


def reports(out: bytes) -> dict[int, dict]:
    """The JSON lines printed by env_report.py, by rank."""
    return {r: json.loads(lines[0]) for r, lines in by_rank(out).items()}


def read_pids(d: Path) -> dict[str, int]:
    """Every pid a rank script has finished recording, by file name (a shell creates the file
    before it writes the number, so an empty or partial file is skipped)."""
    pids = {}
    for p in d.iterdir():
        if p.name.startswith("."):  # a temporary file, renamed into place once written
            continue
        try:
            text = p.read_text().strip()
        except FileNotFoundError:
            continue
        if text.isdigit():
            pids[p.name] = int(text)
    return pids


def wait_for_pids(d: Path, count: int, proc: subprocess.Popen, timeout: float = 15) -> dict[str, int]:
    """Wait until ``count`` pid files exist (the ranks are up) or fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = read_pids(d)
        if len(pids) >= count:
            return pids
        assert proc.poll() is None, f"shmrun exited early: {proc.communicate()}"
        time.sleep(0.05)
    pytest.fail(f"ranks did not start: {read_pids(d)}")


def assert_all_dead(pids: dict[str, int]) -> None:
    """None of ``pids`` may still run (a zombie waiting for its reaper counts as dead)."""
    deadline = time.monotonic() + 2
    while True:
        alive = {}
        for name, pid in pids.items():
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive[name] = pid
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in alive.values():  # do not leave them to the next test
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not alive, f"processes survived shmrun: {alive}"


@pytest.mark.timeout(30)
def test_environment_and_arguments():
    res = shmrun("-n", "3", "env_report.py", "--flag", "x", "-n", "7")
    assert res.returncode == 0, res.stderr
    rep = reports(res.stdout)
    assert sorted(rep) == [0, 1, 2]
    cores = len(os.sched_getaffinity(0))
    jobs = {r["SHMCOMM_JOB"] for r in rep.values()}
    ports = {r["MASTER_PORT"] for r in rep.values()}
    assert len(jobs) == 1 and re.fullmatch(r"shmrun-\d+-[0-9a-f]+", jobs.pop())
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536
    for rank, r in rep.items():
        assert r["RANK"] == r["LOCAL_RANK"] == r["ROLE_RANK"] == str(rank)
        assert r["WORLD_SIZE"] == r["LOCAL_WORLD_SIZE"] == "3"
        assert r["GROUP_RANK"] == "0"
        assert r["MASTER_ADDR"] == "127.0.0.1"
        assert r["TORCHELASTIC_RUN_ID"] == r["SHMCOMM_JOB"]
        assert r["OMP_NUM_THREADS"] == str(max(1, cores // 3))
        assert r["PYTHONUNBUFFERED"] == "1"
        assert r["THP_MEM_ALLOC_ENABLE"] == "1"
        assert r["argv"] == ["--flag", "x", "-n", "7"]  # flags after the script are the script's
        assert os.path.realpath(r["executable"]) == os.path.realpath(sys.executable)
    errs = by_rank(res.stderr)
    assert {r: lines[0] for r, lines in errs.items()} == {r: f"rank {r} on stderr".encode() for r in range(3)}


@pytest.mark.timeout(30)
def test_preset_environment_kept_and_job_new_per_launch():
    env = dict(os.environ, OMP_NUM_THREADS="7", THP_MEM_ALLOC_ENABLE="0")
    first = reports(shmrun("-n", "1", "env_report.py", env=env).stdout)[0]
    second = reports(shmrun("-n", "1", "env_report.py", env=env).stdout)[0]
    assert first["OMP_NUM_THREADS"] == "7"
    assert first["THP_MEM_ALLOC_ENABLE"] == "0"
    assert first["SHMCOMM_JOB"] != second["SHMCOMM_JOB"]


@pytest.mark.timeout(30)
def test_an_export_of_a_variable_shmrun_sets_is_warned_about_and_others_pass():
    """-x SHMCOMM_JOB=... used to be overridden without a word."""
    res = shmrun("-n", "2", "-x", "SHMCOMM_JOB=mine", "-x", "MY_SETTING=on", "-x", "RANK=5",
                 "env_report.py")
    assert res.returncode == 0, res.stderr
    rep = reports(res.stdout)
    assert {r["SHMCOMM_JOB"] for r in rep.values()} != {"mine"} and {r: v["RANK"] for r, v in rep.items()} == {0: "0", 1: "1"}
    warned = [line for line in res.stderr.decode().splitlines() if "warning: -x" in line]
    assert warned == [
        "shmrun: warning: -x SHMCOMM_JOB=... is not used: shmrun sets SHMCOMM_JOB for every rank (each "
        "run gets a job name of its own, so two jobs never meet; ranks started without shmrun take "
        "init_process_group(name=...))",
        "shmrun: warning: -x RANK=... is not used: shmrun sets RANK for every rank (-n gives the ranks)"]


def test_the_launcher_variables_are_what_each_rank_gets_from_shmrun():
    from shmcomm.launcher.cli import parse_args
    from shmcomm.launcher.environment import LAUNCHER_VARIABLES, rank_environment

    env = rank_environment(parse_args(["-n", "2", "true"]), 1, "job-1", 29500, base={}, secret="s")
    defaults = {"OMP_NUM_THREADS", "PYTHONUNBUFFERED", "THP_MEM_ALLOC_ENABLE"}  # the user's win
    assert set(env) - defaults == set(LAUNCHER_VARIABLES)


@pytest.mark.timeout(30)
def test_failing_rank_stops_the_others(pid_dir):
    start = time.monotonic()
    res = shmrun("-n", "3", "--grace", "2", "fail_rank.py", str(pid_dir), "1", "3")
    elapsed = time.monotonic() - start
    pids = read_pids(pid_dir)
    assert res.returncode == 3, res.stderr
    assert elapsed < 15  # the other ranks sleep 60 s: they were stopped, not waited for
    err = res.stderr.decode()
    assert f"rank 1 (pid {pids['rank1']}) failed with exit code 3" in err
    # its stderr was shown live: the summary points there instead of printing it a second time
    assert "[1] rank 1 is failing on purpose\n" in err
    assert err.count("rank 1 is failing on purpose") == 1, err
    assert "rank 1's stderr is above (the lines prefixed [1])" in err
    assert "stopped the other running rank(s): 0, 2" in err
    assert len(pids) == 3
    assert_all_dead(pids)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nproc", [2, 3])
@pytest.mark.parametrize("how,code", [("exit", 3), ("raise", 1)])
def test_the_root_cause_is_blamed_and_gives_the_exit_code(nproc, how, code):
    """Rank 1 fails (sys.exit(3), or a ValueError) while the others wait for it in a collective:
    they fail with PeerFailureError and often exit first. shmrun blames rank 1 and exits with its
    code, every time; in every other run rank 1 lingers after leaving its group, so that the
    others surely exit first. Two jobs at a time: quicker, and the load shuffles exit orders."""
    from concurrent.futures import ThreadPoolExecutor

    def run(i: int) -> subprocess.CompletedProcess:
        return shmrun("-n", str(nproc), "root_cause.py", how, *(["linger"] if i % 2 else []),
                      timeout=60)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, range(10)))
    for i, res in enumerate(results):
        linger = i % 2
        said = [line for line in res.stderr.splitlines() if line.startswith(b"shmrun: ")]
        assert res.returncode == code, (i, res.stderr.decode()[-3000:])
        assert said[0].startswith(b"shmrun: rank 1 (pid ") and said[0].endswith(
            b"failed with exit code %d" % code), (i, said)
        if linger:
            assert b"exited before it, failing only because it had (PeerFailureError: " in said[1], said


@pytest.mark.timeout(30)
def test_sigkilled_rank(pid_dir):
    res = shmrun("-n", "2", "--grace", "2", "fail_rank.py", str(pid_dir), "1", "0", "kill")
    assert res.returncode == 128 + signal.SIGKILL, res.stderr
    err = res.stderr.decode()
    assert re.search(r"rank 1 \(pid \d+\) failed with signal SIGKILL", err), err
    assert_all_dead(read_pids(pid_dir))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_stops_every_process(pid_dir, sig):
    with launcher(["-n", "2", "--grace", "2", "sleeper.py", str(pid_dir)]) as proc:
        pids = wait_for_pids(pid_dir, 6, proc)  # 2 ranks, each with a child and a daemon
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == 128 + sig, err
    assert f"received {signal.Signals(sig).name}".encode() in err
    assert by_rank(out) == {0: [b"ready"], 1: [b"ready"]}
    assert_all_dead(pids)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_start_up_stops_the_launch_at_once(pid_dir, sig):
    """A signal used to wait until every rank had started: no later rank starts now, the ones
    started are stopped, and shmrun exits 128 + the signal."""
    n = 400
    with launcher(["-n", str(n), "--grace", "2", "sh", "-c",
                   f'echo $$ > {pid_dir}/.r$RANK; mv {pid_dir}/.r$RANK {pid_dir}/rank$RANK; '
                   'exec sleep 60']) as proc:
        wait_for_pids(pid_dir, 1, proc)  # rank 0 runs: the launcher is starting the others
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, err
    started = re.search(rf"received {signal.Signals(sig).name} during start-up, stopping the (\d+) "
                        rf"of {n} rank\(s\) started".encode(), err)
    assert started and int(started.group(1)) < n, err
    assert_all_dead(read_pids(pid_dir))


def _lower_open_files(limit: int):
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                      (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@pytest.mark.timeout(30)
def test_more_ranks_than_the_launcher_can_watch_are_refused_before_any_starts(pid_dir):
    """Two pipes per rank: past ulimit -n, rank ~25 of 40 failed to start, after the first ones
    had started."""
    proc = subprocess.run([*LAUNCH, "-n", "40", "sh", "-c", f"echo $$ > {pid_dir}/rank$RANK"],
                          cwd=SCRIPTS, capture_output=True, timeout=20, preexec_fn=_lower_open_files(64))
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "-n 40 is too many: the launcher would hold about" in err and "ulimit -n" in err, err
    assert not read_pids(pid_dir)


@pytest.mark.timeout(30)
def test_rank_ignoring_sigterm_is_killed_after_grace(pid_dir):
    start = time.monotonic()
    res = shmrun("-n", "2", "--grace", "1", "sh", "-c",
                 f'cd {pid_dir}; if [ $RANK = 1 ]; then echo $$ > rank1; '
                 'while [ ! -f rank0 ]; do sleep 0.05; done; exit 4; fi; '
                 'trap "" TERM; echo $$ > rank0; sleep 30')
    assert res.returncode == 4, res.stderr
    assert 1 <= time.monotonic() - start < 10
    assert_all_dead(read_pids(pid_dir))


@pytest.mark.timeout(30)
def test_second_signal_kills_at_once(pid_dir):
    with launcher(["-n", "2", "--grace", "20", "sh", "-c",
                   f'trap "" INT; echo $$ > {pid_dir}/rank$RANK; sleep 30']) as proc:
        pids = wait_for_pids(pid_dir, 2, proc)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)  # ignored by the ranks
        time.sleep(0.5)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert time.monotonic() - start < 5  # not the 20 s grace
    assert b"killing every rank" in err
    assert_all_dead(pids)


@pytest.mark.timeout(30)
def test_leftover_children_of_a_successful_job_are_stopped(pid_dir):
    res = shmrun("-n", "2", "--grace", "2", "sh", "-c",
                 f'sleep 30 & echo $! > {pid_dir}/bg$RANK; setsid sleep 31 & echo $! > {pid_dir}/sid$RANK')
    assert res.returncode == 0, res.stderr
    pids = read_pids(pid_dir)
    assert len(pids) == 4
    assert_all_dead(pids)


@pytest.mark.timeout(30)
def test_restart_after_a_failure(tmp_path):
    marker = tmp_path / "failed-once"
    res = shmrun("-n", "2", "--max-restarts", "2", "fail_once.py", str(marker))
    assert res.returncode == 0, res.stderr
    err = res.stderr.decode()
    assert "rank 1" in err and "exit code 5" in err
    assert "restarting the job (restart 1 of 2)" in err
    assert "restart 2" not in err
    lines = by_rank(res.stdout)
    final = {r: [ln for ln in lines[r] if ln.startswith(b"ok attempt=1 ")] for r in (0, 1)}
    assert all(len(v) == 1 for v in final.values()), lines
    first = [ln for ln in lines.get(0, []) if ln.startswith(b"ok attempt=0 ")]
    if first:  # rank 0 may have finished before rank 1 failed: its job name was a different one
        assert first[0].split(b"job=")[1] != final[0][0].split(b"job=")[1]


@pytest.mark.timeout(30)
def test_no_restart_without_the_flag(tmp_path):
    res = shmrun("-n", "2", "fail_once.py", str(tmp_path / "marker"))
    assert res.returncode == 5
    assert b"restarting" not in res.stderr


def run_dir_of(logs: Path, stderr: bytes) -> Path:
    """The one run directory under ``logs``, checked against the one shmrun announced."""
    runs = os.listdir(logs)
    assert len(runs) == 1, runs
    run = logs / runs[0]
    assert stderr.count(b"writing the ranks' output to ") == 1, stderr
    assert f"writing the ranks' output to {run}/attempt_<k>/".encode() in stderr, stderr
    return run


@pytest.mark.timeout(30)
def test_log_dir(tmp_path):
    logs = tmp_path / "logs"
    res = shmrun("-n", "2", "--log-dir", str(logs), "env_report.py")
    assert res.returncode == 0, res.stderr
    run = run_dir_of(logs, res.stderr)
    assert re.fullmatch(r"\d{8}-\d{6}-\d+", run.name)  # start time and shmrun's pid
    assert os.listdir(run) == ["attempt_0"]
    files = run / "attempt_0"
    assert sorted(os.listdir(files)) == ["rank0.err", "rank0.out", "rank1.err", "rank1.out"]
    for r in (0, 1):
        assert json.loads((files / f"rank{r}.out").read_text())["RANK"] == str(r)  # no prefix in files
        assert (files / f"rank{r}.err").read_text() == f"rank {r} on stderr\n"
        for ext in ("out", "err"):
            assert (files / f"rank{r}.{ext}").stat().st_mode & 0o777 == 0o600
    for d in (run, files):
        assert d.stat().st_mode & 0o077 == 0  # private
    assert sorted(reports(res.stdout)) == [0, 1]  # the console still gets everything


@pytest.mark.timeout(30)
def test_log_dir_keeps_every_run_and_attempt(tmp_path):
    logs, marker = tmp_path / "logs", tmp_path / "failed-once"
    res = shmrun("-n", "2", "--log-dir", str(logs), "--max-restarts", "1", "fail_once.py", str(marker))
    assert res.returncode == 0, res.stderr
    run = run_dir_of(logs, res.stderr)
    assert sorted(os.listdir(run)) == ["attempt_0", "attempt_1"]
    assert (run / "attempt_0" / "rank1.err").read_text() == "first attempt fails\n"
    assert (run / "attempt_1" / "rank1.err").read_text() == ""
    assert (run / "attempt_1" / "rank1.out").read_text().startswith("ok attempt=1 ")
    # a second run gets its own directory and leaves the first one's files alone
    res = shmrun("-n", "2", "--log-dir", str(logs), "fail_once.py", str(marker))
    assert res.returncode == 0, res.stderr
    second = [logs / name for name in os.listdir(logs) if logs / name != run]
    assert len(second) == 1 and os.listdir(second[0]) == ["attempt_0"]
    assert (run / "attempt_0" / "rank1.err").read_text() == "first attempt fails\n"
    assert (second[0] / "attempt_0" / "rank1.out").read_text().startswith("ok attempt=0 ")


@pytest.mark.timeout(30)
def test_no_prefix():
    res = shmrun("-n", "2", "--no-prefix", "env_report.py")
    assert res.returncode == 0, res.stderr
    ranks = sorted(json.loads(line)["RANK"] for line in res.stdout.splitlines())
    assert ranks == ["0", "1"]
    assert sorted(res.stderr.splitlines()) == [b"rank 0 on stderr", b"rank 1 on stderr"]


@pytest.mark.timeout(60)
def test_lines_are_never_mixed():
    count, width = 1000, 4000
    res = shmrun("-n", "3", "chatter.py", str(count), str(width), timeout=50)
    assert res.returncode == 0, res.stderr[-2000:]
    for stream, every, w in ((res.stdout, 1, width), (res.stderr, 10, 100)):
        lines = by_rank(stream)
        assert sorted(lines) == [0, 1, 2]
        for rank, got in lines.items():
            digit = str(rank).encode()
            if stream is res.stdout:
                assert got[-1] == b"no-newline-" + digit  # the partial last line, flushed whole
                got = got[:-1]
            expected = [f"{i}:".encode() + digit * w for i in range(0, count, every)]
            assert got == expected, f"rank {rank}: a line was split or mixed"


@pytest.mark.timeout(30)
def test_module():
    env = dict(os.environ, PYTHONPATH=str(SCRIPTS))
    res = shmrun("-n", "2", "-m", "env_report", "a", "--b", env=env)
    assert res.returncode == 0, res.stderr
    rep = reports(res.stdout)
    assert sorted(rep) == [0, 1]
    assert all(r["argv"] == ["a", "--b"] for r in rep.values())


@pytest.mark.timeout(30)
def test_program_python_by_name():
    python = "python" if shutil.which("python") else sys.executable
    res = shmrun("-n", "2", python, "env_report.py", "x")
    assert res.returncode == 0, res.stderr
    rep = reports(res.stdout)
    assert sorted(rep) == [0, 1] and all(r["argv"] == ["x"] for r in rep.values())


@pytest.mark.timeout(30)
def test_program_shell():
    res = shmrun("-n", "2", "sh", "-c", "echo rank=$RANK size=$WORLD_SIZE; exit 0")
    assert res.returncode == 0, res.stderr
    assert by_rank(res.stdout) == {0: [b"rank=0 size=2"], 1: [b"rank=1 size=2"]}


@pytest.mark.timeout(30)
def test_bind_to_core():
    res = shmrun("-n", "3", "--bind-to", "core", "env_report.py")
    assert res.returncode == 0, res.stderr
    cores = sorted(os.sched_getaffinity(0))
    for rank, r in reports(res.stdout).items():
        assert r["affinity"] == [cores[rank % len(cores)]]
        assert r["OMP_NUM_THREADS"] == "1"


@pytest.mark.timeout(30)
def test_leftover_segment_of_the_job_is_removed():
    res = shmrun("-n", "2", "make_segment.py")
    assert res.returncode == 0, res.stderr
    paths = [lines[0].decode() for lines in by_rank(res.stdout).values()]
    assert len(paths) == 2
    for p in paths:
        assert os.path.basename(p).startswith(f"shmcomm.{os.getuid()}.shmrun-")
        assert not os.path.exists(p)
    assert b"removed 2 leftover shared-memory segment(s)" in res.stderr


def _needs_shmcomm_groups():
    import shmcomm as sc
    if not hasattr(sc, "init_process_group"):
        pytest.skip("the compiled core does not provide process groups yet")


@pytest.mark.timeout(60)
def test_shmcomm_job_needs_no_arguments():
    _needs_shmcomm_groups()
    res = shmrun("-n", "3", "shmcomm_job.py", timeout=50)
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    assert by_rank(res.stdout) == {r: [f"rank {r} of 3 sum 6".encode()] for r in range(3)}


@pytest.mark.timeout(60)
def test_shmcomm_job_with_a_crashed_rank_leaves_nothing():
    _needs_shmcomm_groups()
    res = shmrun("-n", "3", "--grace", "2", "shmcomm_job.py", "crash", timeout=50)
    assert res.returncode == 128 + signal.SIGKILL, res.stderr.decode()[-3000:]
    assert b"rank 1 (pid" in res.stderr and b"SIGKILL" in res.stderr
    # no_leftover_segments checks /dev/shm for this job


@pytest.mark.timeout(120)
def test_unchanged_torch_gloo_script():
    pytest.importorskip("torch")
    res = shmrun("-n", "2", "torch_allreduce.py", timeout=110)
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    out = by_rank(res.stdout)
    assert out == {0: [b"rank 0 of 2 sum 3"], 1: [b"rank 1 of 2 sum 3"]}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("args, message", [
    (["-n", "0", "env_report.py"], "-n must be at least 1"),
    (["-n", "-2", "env_report.py"], "-n must be at least 1"),
    (["-n", "two", "env_report.py"], "invalid int value"),
    (["-n", "2", "missing_script.py"], "script not found: missing_script.py"),
    (["-n", "2", "./missing_program"], "program not found"),
    (["-n", "2", "no-such-program-shmcomm"], "program not found on PATH"),
    (["--bogus", "-n", "2", "env_report.py"], "unrecognized arguments: --bogus"),
    (["-n", "2"], "no program given"),
    ([], "required: -n"),
    (["-n", "2", "-m"], "-m needs a module name"),
    (["-n", "2", "--bind-to", "l3cache", "env_report.py"], "invalid choice"),
    (["-n", "several", "env_report.py"], "'auto' for one per usable core"),
    (["-n", "2", "--redirects", "3", "env_report.py"], "--redirects needs --log-dir"),
    (["-n", "2", "-t", "1", "env_report.py"], "--tee needs --log-dir"),
    (["-n", "2", "--log-dir", "x", "-r", "4", "env_report.py"], "invalid value '4'"),
    (["-n", "2", "--log-dir", "x", "--tee", "0:1,2:3", "env_report.py"], "names local rank(s) [2]"),
    (["-n", "2", "--local-ranks-filter", "0,5", "env_report.py"], "names local rank(s) [5]"),
    (["-n", "2", "--local-ranks-filter", "one", "env_report.py"], "expected local ranks"),
    (["-n", "2", "--standalone", "--nnodes", "2", "--master-port", "29500", "env_report.py"],
     "--standalone runs one node"),
    (["-n", "2", "--standalone", "--master-port", "29500", "env_report.py"], "drop --master-addr"),
    (["-n", "2", "--grace", "-1", "env_report.py"], "--grace must be >= 0"),
    (["-n", "2", "--max-restarts", "-1", "env_report.py"], "--max-restarts must be >= 0"),
    # a typo once started processes until fork failed, deaf to SIGTERM meanwhile
    (["-n", "100000", "env_report.py"], "-n 100000 is too many: at most 4096 ranks start on one machine"),
])
def test_bad_usage(args, message):
    res = shmrun(*args)
    err = res.stderr.decode()
    assert res.returncode == 2, err
    assert message in err and "usage: shmrun" in err
    assert res.stdout == b""


@pytest.mark.timeout(30)
def test_help():
    res = shmrun("--help")
    assert res.returncode == 0
    assert b"--max-restarts" in res.stdout and b"--bind-to" in res.stdout


def test_several_nodes_get_torchruns_environment(capsys):
    """--nnodes/--node-rank/--master-addr/--master-port: global RANK, GROUP_RANK, the node's
    LOCAL_WORLD_SIZE, node 0's address and port, one job name on every node."""
    from shmcomm.launcher.cli import parse_args
    from shmcomm.launcher.environment import rank_environment

    cfg = parse_args(["-n", "2", "--nnodes", "3", "--node-rank", "2", "--master-addr", "10.0.0.1",
                      "--master-port", "29400", "true"])
    env = rank_environment(cfg, 1, "job", 29400, base={})
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("5", "1", "6", "2")
    assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("2", "3")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29400")
    for bad, message in ((["--nnodes", "2", "true"], "--master-port"),
                         (["--nnodes", "2", "--node-rank", "2", "--master-port", "1", "true"], "--node-rank"),
                         (["--nnodes", "2", "--master-port", "1", "--max-restarts", "1", "true"],
                          "--max-restarts works on one node only")):
        with pytest.raises(SystemExit):
            parse_args(["-n", "1", *bad])
        assert message in capsys.readouterr().err


def forge(port: int, read_first: bool) -> None:
    """What any local user can do: connect to the node link and say node 1 failed (read the
    challenge first and answer it with a made-up proof, or just talk)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        if read_first:
            with contextlib.suppress(OSError):
                s.recv(4096)
        lines = [{"kind": "hello", "node": 1, "nonce": "00", "proof": "00" * 32},
                 {"kind": "fail", "node": 1, "code": 9, "text": "forged"}, {"kind": "bye"}]
        with contextlib.suppress(OSError):
            s.sendall(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
            s.recv(4096)  # until node 0 closes it (or the timeout)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("rank1_code", [0, 3])
def test_the_node_link_ignores_strangers_and_still_carries_news(tmp_path, rank1_code):
    """Two nodes' shmrun on 127.0.0.1: lines forged by a client that does not hold the job's
    key (a local user who read the ports from ps) are ignored and reported once, never taken as
    a failure; a real failure on node 1 still stops node 0 with its code."""
    port = free_port_pair()
    steps = [str(tmp_path), "0/out:ready\\n", "1/out:ready\\n", "0/wait:go", "1/wait:go",
             f"1/exit:{rank1_code}"]
    flags = ["-n", "1", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    with launcher([*flags, "--node-rank", "0", "steps.py", *steps], stderr=subprocess.STDOUT) as node0, \
            launcher([*flags, "--node-rank", "1", "steps.py", *steps], stderr=subprocess.STDOUT) as node1:
        out0, out1 = Reader(node0), Reader(node1)
        out0.until(b"[0] ready")
        out1.until(b"ready")  # its local rank 0
        forge(port + 1, read_first=False)
        forge(port + 1, read_first=True)
        out0.until(b"ignored a connection to the node link from 127.0.0.1")
        touch(tmp_path, "go")
        text0, _ = out0.finish(timeout=30)
        text1, _ = out1.finish(timeout=30)
    assert (node0.returncode, node1.returncode) == (rank1_code, rank1_code), (text0, text1)
    assert text0.count(b"ignored a connection") == 1, text0
    assert b"forged" not in text0 + text1, (text0, text1)
    if rank1_code:
        assert b"the job failed on node 1 (rank 1 (pid" in text0, text0


def test_node_links_with_different_keys_refuse_each_other_and_say_so(monkeypatch):
    """Node 0 listens on --master-addr only; launchers given different SHMCOMM_SECRETs never
    take each other's news and each says why; one that a shmcomm process made up is no key."""
    from shmcomm import trust
    from shmcomm.launcher.node_link import NodeLink, link_key

    monkeypatch.setenv(trust.SECRET_ENV, "auto-1-" + "0" * 32)
    assert trust.given_secret() is None
    monkeypatch.setenv(trust.SECRET_ENV, "s3cret")
    assert trust.given_secret() == "s3cret"
    port = free_port_pair() + 1
    node0 = NodeLink(2, 0, "127.0.0.1", port, wake=lambda: None, key=link_key("a", 2, 1, port))
    node1 = NodeLink(2, 1, "127.0.0.1", port, wake=lambda: None, key=link_key("b", 2, 1, port))
    try:
        node0.start()
        assert node0._server.getsockname()[0] == "127.0.0.1"
        node1.start()
        node1.report_failure(3, "rank 1 failed")
        said0, said1, deadline = [], [], time.monotonic() + 10
        while not (said0 and said1) and time.monotonic() < deadline:
            time.sleep(0.05)
            said0 += node0.take_notices()
            said1 += node1.take_notices()
        assert len(said0) == 1 and "does not hold this job's key" in said0[0], said0
        assert len(said1) == 1 and "do not accept each other" in said1[0], said1
        assert not node0.news and not node1.news
    finally:
        node1.close()
        node0.close()


# -- live output: unfinished lines, prompts, progress bars --------------------------------------

class Reader:
    """Reads shmrun's stdout as it comes, so a test can see what arrived before a rank went on."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.out = proc, b""
        self.fd = proc.stdout.fileno()

    def until(self, needle: bytes, timeout: float = 15) -> bytes:
        import selectors
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.fd, selectors.EVENT_READ)
            while needle not in self.out:
                left = deadline - time.monotonic()
                assert left > 0, f"{needle!r} did not arrive; got {self.out!r}"
                if sel.select(left):
                    data = os.read(self.fd, 65536)
                    assert data, f"shmrun ended before {needle!r}: {self.out!r} {self.proc.communicate()}"
                    self.out += data
        return self.out

    def finish(self, timeout: float = 15) -> tuple[bytes, bytes]:
        out, err = self.proc.communicate(timeout=timeout)
        self.out += out
        return self.out, err


def touch(d: Path, name: str) -> None:
    (d / name).write_text("")


def test_console_writes_everything_to_a_raw_stdout_that_takes_part_of_each_write(monkeypatch):
    """Under PYTHONUNBUFFERED, stdout's binary layer is a raw file, whose write takes only part
    of the data when a signal (a rank's SIGCHLD) interrupts it on a full pipe: the console must
    write the rest (it dropped it, and `shmrun ... | ...` lost whole lines)."""
    import io

    from shmcomm.launcher.console import Console

    class Stingy(io.RawIOBase):  # takes at most 1000 bytes per call, as an interrupted write
        def __init__(self):
            self.got = bytearray()

        def writable(self):
            return True

        def write(self, b):
            take = bytes(b[:1000])
            self.got += take
            return len(take)

    raw = Stingy()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, write_through=True))
    data = bytes(range(256)) * 100
    Console().write(1, data)
    assert bytes(raw.got) == data


def test_unfinished_lines_are_held_briefly_on_a_terminal_and_longer_into_a_pipe():
    import pty

    from shmcomm.launcher.console import _HOLD_S, _PIPE_HOLD_S, _hold_for

    master, replica = pty.openpty()
    with os.fdopen(replica, "w") as terminal:
        assert _hold_for(terminal) == _HOLD_S
    os.close(master)
    r, w = os.pipe()
    with os.fdopen(w, "w") as pipe:
        assert _hold_for(pipe) == _PIPE_HOLD_S
    os.close(r)
    assert _HOLD_S < _PIPE_HOLD_S


@pytest.mark.timeout(30)
def test_a_line_stalled_mid_way_stays_whole_in_a_pipe():
    """A rank descheduled between two writes of one line while another rank prints: into a
    pipe, the line still comes out whole (this split under load with the terminal's hold)."""
    res = shmrun("-n", "2", "stall.py")
    assert res.returncode == 0, res.stderr[-2000:]
    lines = by_rank(res.stdout)
    assert lines[0] == [b"first half, second half"], lines[0]
    assert lines[1] == [b"tick %d" % i for i in range(60)]


@pytest.mark.timeout(30)
def test_unfinished_line_is_shown_live(tmp_path):
    """\\r progress without a newline reaches the console while the rank is still working."""
    with launcher(["-n", "1", "steps.py", str(tmp_path), "0/out:\\rstep 0", "0/wait:go",
                   "0/out:\\rstep 1", "0/wait:go2", "0/out:\\n"]) as proc:
        reader = Reader(proc)
        start = time.monotonic()
        out = reader.until(b"step 0")
        assert time.monotonic() - start < 10
        assert proc.poll() is None and b"step 1" not in out  # the rank waits for us: it was live
        touch(tmp_path, "go")
        reader.until(b"step 1")  # the rest of the line follows at once, still without a newline
        assert proc.poll() is None
        touch(tmp_path, "go2")
        out, err = reader.finish()
    assert proc.returncode == 0, err
    # the prefix is written at the line start and again after each \r, so the bar keeps it
    assert out == b"\r[0] step 0\r[0] step 1\n"


@pytest.mark.timeout(30)
def test_a_line_growing_faster_than_the_hold_is_still_shown_live(tmp_path):
    """Dots 30 ms apart: the unfinished line is shown one hold (1 s into a pipe) after its first
    piece, not held on for as long as more pieces keep coming."""
    with launcher(["-n", "1", "steps.py", str(tmp_path), "0/dots:go", "0/out:\\n"]) as proc:
        reader = Reader(proc)
        reader.until(b"[0] .")
        assert proc.poll() is None
        touch(tmp_path, "go")
        out, err = reader.finish()
    assert proc.returncode == 0, err
    assert re.fullmatch(rb"\[0\] \.+\n", out), out  # one line, prefixed once


@pytest.mark.timeout(30)
def test_prompt_is_shown_before_the_answer(tmp_path):
    with launcher(["-n", "2", "steps.py", str(tmp_path), "0/input:prompt> "],
                  stdin=subprocess.PIPE) as proc:
        reader = Reader(proc)
        out = reader.until(b"[0] prompt> ")
        assert b"got" not in out
        proc.stdin.write(b"yes\n")
        proc.stdin.flush()  # communicate() closes it
        out, err = reader.finish()
    assert proc.returncode == 0, err
    assert out == b"[0] prompt> got yes\n"  # the answer's newline was the terminal's echo


@pytest.mark.timeout(30)
@pytest.mark.parametrize("steps,stderr,rank0_shows,rank1_shows,expected", [
    # rank 1's line starts a line of its own; rank 0's own newline, arriving later, only ends
    # the line shmrun already ended, so it adds no empty line
    (["0/out:partial-0", "0/wait:go2", "0/out:\\nmore\\n", "1/wait:go1", "1/out:line-1\\n"],
     subprocess.PIPE, b"[0] partial-0", b"line-1\n", b"[0] partial-0\n[1] line-1\n[0] more\n"),
    # with 2>&1 (or a terminal) stdout and stderr share the console's line
    (["0/out:working...", "0/wait:go2", "0/out: done\\n", "1/wait:go1", "1/err:warning-1\\n"],
     subprocess.STDOUT, b"[0] working...", b"warning-1\n", b"[0] working...\n[1] warning-1\n[0]  done\n"),
], ids=["another-rank", "other-stream-on-one-console"])
def test_other_output_ends_an_unfinished_line_first(tmp_path, steps, stderr, rank0_shows, rank1_shows,
                                                     expected):
    with launcher(["-n", "2", "steps.py", str(tmp_path), *steps], stderr=stderr) as proc:
        reader = Reader(proc)
        reader.until(rank0_shows)
        touch(tmp_path, "go1")
        reader.until(rank1_shows)
        touch(tmp_path, "go2")
        out, err = reader.finish()
    assert proc.returncode == 0, err or out
    assert out == expected


@pytest.mark.timeout(30)
def test_last_unfinished_line_is_ended_and_in_the_summary(tmp_path):
    # rank 1 fails only once rank 0 wrote its unfinished line (else shmrun may stop rank 0 first)
    res = shmrun("-n", "2", "--no-prefix", "steps.py", str(tmp_path), "0/out:a\\rb", "0/touch:written",
                 "0/wait:never", "1/wait:written", "1/err:no newline", "1/exit:4")
    assert res.returncode == 4
    assert res.stdout == b"a\rb\n"
    assert res.stderr.startswith(b"no newline\n"), res.stderr  # ended before the summary
    assert b"rank 1's stderr is above\n" in res.stderr


# -- torchrun's spellings -------------------------------------------------------------------------

@pytest.mark.timeout(30)
def test_standalone_and_nproc_auto():
    cores = len(os.sched_getaffinity(0))
    res = shmrun("--standalone", "--nproc_per_node", "auto", "env_report.py")
    assert res.returncode == 0, res.stderr
    rep = reports(res.stdout)
    assert sorted(rep) == list(range(cores))
    assert all(r["WORLD_SIZE"] == str(cores) and r["MASTER_ADDR"] == "127.0.0.1" for r in rep.values())
    assert len({r["MASTER_PORT"] for r in rep.values()}) == 1


def test_torchrun_spellings_parse():
    from shmcomm.launcher.cli import parse_args
    from shmcomm.cpus import usable_cores

    cores = len(usable_cores())
    assert parse_args(["-n", "auto", "true"]).nproc == cores
    assert parse_args(["--nproc-per-node=auto", "true"]).nproc == cores
    cfg = parse_args(["-n", "3", "--log_dir", "d", "-r3", "-t", "0:1,2:3", "--max_restarts", "1",
                      "--local_ranks_filter", "0,2", "true", "-r", "x"])
    assert cfg.log_dir == "d" and cfg.max_restarts == 1
    assert cfg.redirects == 3 and cfg.tee == {0: 1, 2: 3}
    assert cfg.local_ranks_filter == {0, 2}
    assert cfg.command == ["true", "-r", "x"]  # the program's own -r is left alone
    cfg = parse_args(["-n", "1", "--standalone", "true"])
    assert cfg.master_addr == "127.0.0.1" and cfg.master_port is None


@pytest.mark.timeout(30)
def test_mpirun_habits_run(tmp_path):
    """-np, -x NAME=VALUE (over a variable set "unless set"), --tag-output, and --oversubscribe
    with more ranks than cores, which shmrun never refuses anyway."""
    nproc = len(os.sched_getaffinity(0)) + 2
    res = shmrun("-np", str(nproc), "--oversubscribe", "--allow-run-as-root", "--no-prefix",
                 "--tag-output", "-x", "GREETING=hello world", "-x", "OMP_NUM_THREADS=5", "-x", "HOME",
                 "sh", "-c", 'echo "$RANK $GREETING $OMP_NUM_THREADS"')
    assert res.returncode == 0, res.stderr
    assert by_rank(res.stdout) == {r: [b"%d hello world 5" % r] for r in range(nproc)}


@pytest.mark.timeout(30)
def test_no_python_runs_a_py_file_as_a_program(tmp_path):
    tool = tmp_path / "tool.py"
    tool.write_text("#!/bin/sh\necho \"run by sh: $1\"\n")  # not Python: a SyntaxError there
    tool.chmod(0o755)
    res = shmrun("-n", "1", "--no-python", str(tool), "x")
    assert res.returncode == 0, res.stderr
    assert by_rank(res.stdout) == {0: [b"run by sh: x"]}


@pytest.mark.parametrize("args, message", [
    (["--rdzv-backend", "c10d"], "--rdzv-backend is torchrun's; shmrun does not take it: shmrun's "
                                 "rendezvous is static"),
    (["--rdzv_endpoint=node0:29400"], "give --master-addr HOST --master-port PORT"),
    (["--rdzv-id", "42"], "the nodes' --master-port names the job"),
    (["--hostfile", "hosts"], "--hostfile is mpirun's; shmrun does not take it: shmrun starts ranks "
                              "on this machine only"),
    (["--map-by", "core"], "give --bind-to core|numa|socket"),
    (["--mca", "btl", "self"], "-x NAME=VALUE sets one"),
    (["-x", "1BAD=2"], "expected NAME or NAME=VALUE"),
    (["--no-python", "-m", "http.server"], "--no-python runs a program directly"),
])
def test_other_launchers_options_are_refused_naming_shmruns(capsys, args, message):
    from shmcomm.launcher.cli import parse_args

    with pytest.raises(SystemExit):
        parse_args(["-n", "2", *args, "true"])
    assert message in capsys.readouterr().err


@pytest.mark.timeout(30)
@pytest.mark.parametrize("flags, console_out, console_err", [
    (["--redirects", "1"], [], [0, 1]),
    (["-r", "3", "-t", "0:2"], [], [0]),             # tee wins over redirect: rank 0's stderr
    (["--redirects", "0:3,1:2", "--tee", "0"], [1], []),
    (["--tee", "3"], [0, 1], [0, 1]),                 # what --log-dir does anyway
])
def test_tee_and_redirects(tmp_path, flags, console_out, console_err):
    logs = tmp_path / "logs"
    res = shmrun("-n", "2", "--log-dir", str(logs), *flags, "env_report.py")
    assert res.returncode == 0, res.stderr
    assert sorted(by_rank(res.stdout)) == console_out
    err = b"".join(ln + b"\n" for ln in res.stderr.splitlines() if not ln.startswith(b"shmrun: "))
    assert sorted(by_rank(err)) == console_err
    files = run_dir_of(logs, res.stderr) / "attempt_0"
    for r in (0, 1):  # the log files get every stream
        assert json.loads((files / f"rank{r}.out").read_text())["RANK"] == str(r)
        assert (files / f"rank{r}.err").read_text() == f"rank {r} on stderr\n"


@pytest.mark.timeout(30)
def test_local_ranks_filter(tmp_path):
    logs = tmp_path / "logs"
    res = shmrun("-n", "3", "--local-ranks-filter", "0,2", "--log-dir", str(logs), "env_report.py")
    assert res.returncode == 0, res.stderr
    assert sorted(reports(res.stdout)) == [0, 2]
    err = [ln for ln in res.stderr.splitlines() if not ln.startswith(b"shmrun: ")]
    assert sorted(err) == [b"[0] rank 0 on stderr", b"[2] rank 2 on stderr"]
    files = run_dir_of(logs, res.stderr) / "attempt_0"
    assert json.loads((files / "rank1.out").read_text())["RANK"] == "1"
    assert (files / "rank1.err").read_text() == "rank 1 on stderr\n"


@pytest.mark.timeout(30)
def test_summary_repeats_the_stderr_that_was_not_shown(pid_dir, tmp_path):
    res = shmrun("-n", "3", "--grace", "2", "--local-ranks-filter", "0", "fail_rank.py",
                 str(pid_dir), "1", "3")
    assert res.returncode == 3, res.stderr
    err = res.stderr.decode()
    assert re.search(r"rank 1 \(pid \d+\) failed with exit code 3", err), err
    assert "last 1 line(s) of rank 1 stderr (not shown above: --local-ranks-filter):\n" \
           "    rank 1 is failing on purpose\n" in err
    assert "[1] " not in err
    assert_all_dead(read_pids(pid_dir))

    logs = tmp_path / "logs"
    res = shmrun("-n", "2", "--log-dir", str(logs), "-r", "1:2", "steps.py", str(tmp_path),
                 "1/err:Traceback\\n  boom\\nValueError", "1/exit:5")
    assert res.returncode == 5
    log = run_dir_of(logs, res.stderr) / "attempt_0" / "rank1.err"
    assert log.read_text() == "Traceback\n  boom\nValueError"
    assert (f"last 3 line(s) of rank 1 stderr (redirected; all of it is in {log}):\n"
            "    Traceback\n      boom\n    ValueError\n") in res.stderr.decode()


# -- timestamps and bindings ----------------------------------------------------------------------

@pytest.mark.timeout(30)
def test_timestamp_output():
    from datetime import datetime

    before = datetime.now().replace(microsecond=0)
    res = shmrun("-n", "2", "--timestamp-output", "sh", "-c", "echo hi; echo there >&2")
    after = datetime.now()
    assert res.returncode == 0, res.stderr
    stamp = rb"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\] "
    for stream, word in ((res.stdout, b"hi"), (res.stderr, b"there")):
        lines = stream.splitlines()
        assert len(lines) == 2
        for line in lines:
            m = re.fullmatch(stamp + rb"\[[01]\] " + word, line)
            assert m, line
            assert before <= datetime.strptime(m.group(1).decode(), "%Y-%m-%d %H:%M:%S.%f") <= after
    res = shmrun("-n", "1", "--timestamp-output", "--no-prefix", "sh", "-c", "echo hi")
    assert re.fullmatch(stamp + rb"hi\n", res.stdout), res.stdout


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["numa", "socket"])
def test_bind_to_numa_or_socket_with_report(kind):
    from shmcomm.cpus import cpu_domains

    res = shmrun("-n", "3", "--bind-to", kind, "--report-bindings", "env_report.py")
    assert res.returncode == 0, res.stderr
    domains = cpu_domains(kind)
    assert sorted(c for _, cpus in domains for c in cpus) == sorted(os.sched_getaffinity(0))
    what = {"numa": "numa node", "socket": "socket"}[kind]
    for rank, r in reports(res.stdout).items():
        ident, cpus = domains[rank % len(domains)]
        assert r["affinity"] == cpus  # on one node/socket: every usable core
        sharing = len(range(rank % len(domains), 3, len(domains)))
        assert r["OMP_NUM_THREADS"] == str(max(1, len(cpus) // sharing))
        listed = ",".join(str(c) for c in cpus) if len(cpus) < 2 else None
        m = re.search(rf"shmrun: rank {rank} \(pid \d+\) bound to {what} {ident}: cpus (\S+)\n".encode(),
                      res.stderr)
        assert m, res.stderr
        assert listed is None or m.group(1).decode() == listed


@pytest.mark.timeout(30)
def test_report_bindings_core_and_none():
    cores = sorted(os.sched_getaffinity(0))
    res = shmrun("-n", "2", "--bind-to", "core", "--report-bindings", "true")
    assert res.returncode == 0, res.stderr
    for r in (0, 1):
        c = cores[r % len(cores)]
        assert re.search(rf"rank {r} \(pid \d+\) bound to core {c}: cpus {c}\n".encode(), res.stderr)
    res = shmrun("-n", "1", "--report-bindings", "true")
    assert re.search(rb"rank 0 \(pid \d+\) not bound: cpus \S+\n", res.stderr), res.stderr


def test_cpu_domains_from_sysfs(tmp_path, monkeypatch):
    from shmcomm.launcher import environment
    from shmcomm.launcher.cli import parse_args

    for node, cpus in ((0, "0-1,4"), (1, "2-3,5")):
        d = tmp_path / "devices/system/node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    for cpu, package in enumerate([0, 0, 1, 1, 0, 1]):
        d = tmp_path / "devices/system/cpu" / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{package}\n")
    every = list(range(6))
    assert cpu_topology.cpu_domains("numa", every, str(tmp_path)) == [(0, [0, 1, 4]), (1, [2, 3, 5])]
    assert cpu_topology.cpu_domains("socket", every, str(tmp_path)) == [(0, [0, 1, 4]), (1, [2, 3, 5])]
    assert cpu_topology.cpu_domains("numa", [2, 3], str(tmp_path)) == [(1, [2, 3])]  # only usable ones
    assert cpu_topology.cpu_domains("core", [1, 3], str(tmp_path)) == [(1, [1]), (3, [3])]
    assert cpu_topology.cpu_domains("numa", [0, 1], str(tmp_path / "none")) == [(0, [0, 1])]  # no sysfs
    assert cpu_topology.format_cpulist([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert cpu_topology.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]

    # rank r gets group r mod #groups; OMP_NUM_THREADS shares a group's cores among its ranks
    monkeypatch.setattr(environment, "cpu_domains", lambda kind: [(0, [0, 1]), (1, [2, 3])])
    cfg = parse_args(["-n", "3", "--bind-to", "numa", "true"])
    plan = environment.binding_plan(cfg)
    assert plan == [({0, 1}, "numa node 0"), ({2, 3}, "numa node 1"), ({0, 1}, "numa node 0")]
    threads = [environment.rank_environment(cfg, r, "j", 1, base={})["OMP_NUM_THREADS"] for r in range(3)]
    assert threads == ["1", "2", "1"]
