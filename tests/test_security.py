"""Other local users cannot join a job, read its data or inject values (issue: security).

The attacks run as two real unix users created here (alice, the victim, and mallory), each
process started with ``setpriv``. They keep CAP_DAC_READ_SEARCH so that they can run this Python
from wherever it is installed (often under a home directory only root may enter); the checks
under test (owner, mode, links, symlinks, the job's secret) do not depend on read permissions.
Skipped, with the reason, where users cannot be created (not root, no useradd or setpriv).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

import shmcomm as sc
from shmcomm import segments, trust

# the module's users are made once: two workers would make (and remove) the same ones
pytestmark = pytest.mark.xdist_group("security")

SHM = segments.SHM_DIR


def _can_make_users() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create the two test users"
    for tool in ("useradd", "userdel", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


class User:
    """A unix user made for the test; ``run`` starts Python as that user."""

    def __init__(self, role: str):
        self.name = f"shmt{role[0]}{uuid.uuid4().hex[:6]}"
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        self.name], check=True, capture_output=True)
        import pwd
        entry = pwd.getpwnam(self.name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid

    def command(self, argv: list[str]) -> list[str]:
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", *argv]

    def start(self, code: str, *args: str, env: dict | None = None) -> subprocess.Popen:
        full = {**os.environ, "PYTHONPATH": _package_parent(), **(env or {})}
        full.pop(trust.SECRET_ENV, None)  # each user's job makes its own
        return subprocess.Popen(self.command([sys.executable, "-c", textwrap.dedent(code), *args]),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full,
                                cwd="/")

    def remove(self) -> None:
        subprocess.run(["pkill", "-KILL", "-u", str(self.uid)], capture_output=True)
        time.sleep(0.2)
        subprocess.run(["userdel", self.name], capture_output=True)


def _package_parent() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(sc.__file__)))


@pytest.fixture(scope="module")
def users():
    why = _can_make_users()
    if why:
        pytest.skip(why)
    made = []
    try:
        alice, mallory = User("alice"), User("mallory")
        made = [alice, mallory]
    except (subprocess.CalledProcessError, KeyError) as e:
        for u in made:
            u.remove()
        pytest.skip(f"cannot create test users: {e}")
    probe = alice.start("import shmcomm, numpy; print('ok')")
    out, err = probe.communicate(timeout=60)
    if probe.returncode != 0:
        for u in made:
            u.remove()
        pytest.skip(f"a test user cannot run this Python with shmcomm: {err.strip()[-300:]}")
    yield alice, mallory
    for u in made:
        u.remove()


@pytest.fixture
def planted():
    """Paths the test plants in /dev/shm (any owner): removed at the end, as root."""
    paths: list[str] = []
    yield paths
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def shm_path(uid: int, job: str, part: str) -> str:
    return os.path.join(SHM, segments.job_prefix(job, uid) + part)


# Alice's rank: joins `job`, all_reduces her secret data, receives rank 0's broadcast; prints a
# JSON line with what happened and how long the failure took.
VICTIM = """
import json, sys, time
import numpy as np
import shmcomm as sc
rank, job = int(sys.argv[1]), sys.argv[2]
t0 = time.monotonic()
try:
    sc.init_process_group(rank=rank, world_size=2, name=job, timeout=20)
    x = np.array([3.14, 2.71, 1.41, 42.0], np.float32)
    sc.all_reduce(x)
    w = np.zeros(4, np.float32)
    sc.broadcast(w, 0)
    print(json.dumps({"joined": True, "sum": x.tolist(), "weights": w.tolist()}))
except Exception as e:
    print(json.dumps({"joined": False, "error": type(e).__name__, "message": str(e),
                      "seconds": time.monotonic() - t0}))
"""

# Mallory's rank 0 under her own uid and the victim's job name; once her segment exists she
# hard-links it under alice's name, mode 0666 (the attack). Prints what she got.
MALLORY = """
import os, sys, threading, time, json
import numpy as np
import shmcomm as sc
job, target = sys.argv[1], sys.argv[2]
got = {}
def rank0():
    try:
        sc.init_process_group(rank=0, world_size=2, name=job, timeout=15)
        x = np.zeros(4, np.float32); sc.all_reduce(x); got["stole"] = x.tolist()
        sc.broadcast(np.full(4, 666, np.float32), 0)
    except Exception as e:
        got["error"] = type(e).__name__
threading.Thread(target=rank0, daemon=True).start()
mine = f"/dev/shm/shmcomm.{os.getuid()}.{job}.g0"
while not os.path.exists(mine):
    time.sleep(0.01)
time.sleep(0.2)
os.link(mine, target)
os.chmod(mine, 0o666)
print("planted", flush=True)
time.sleep(float(sys.argv[3]))
print(json.dumps(got), flush=True)
"""


def _result(proc: subprocess.Popen, timeout: float = 60) -> dict:
    out, err = proc.communicate(timeout=timeout)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    assert lines, f"no result (exit {proc.returncode}): {out}\n{err}"
    return json.loads(lines[-1])


def _assert_refused(res: dict, path: str, owner_uid: int, within: float = 10.0):
    assert res["joined"] is False, res
    assert res["error"] == "UntrustedFileError", res
    assert path in res["message"] and f"uid {owner_uid}" in res["message"], res["message"]
    assert res["seconds"] < within, res  # at once, not after the 20 s timeout


@pytest.mark.timeout(90)
def test_planted_hard_link_to_another_users_segment_is_refused(users, planted):
    alice, mallory = users
    job = f"train{uuid.uuid4().hex[:6]}"
    target = shm_path(alice.uid, job, "g0")
    planted += [target, shm_path(mallory.uid, job, "g0")]
    attacker = mallory.start(MALLORY, job, target, "8")
    assert attacker.stdout.readline().strip() == "planted", attacker.stderr.read()
    st = os.lstat(target)
    assert st.st_uid == mallory.uid and st.st_nlink == 2  # the attack is in place
    victims = [alice.start(VICTIM, str(r), job) for r in (1, 0)]
    for v in victims:
        _assert_refused(_result(v), target, mallory.uid)
    got = _result(attacker)
    assert "stole" not in got, got  # no data read, nothing injected


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["root-owned", "victim-0644", "symlink", "fifo"])
def test_planted_file_under_the_job_name_fails_fast(users, planted, tmp_path, kind):
    alice, _ = users
    job = f"job{uuid.uuid4().hex[:6]}"
    target = shm_path(alice.uid, job, "g0")
    planted.append(target)
    owner = 0
    if kind == "root-owned":
        with open(target, "wb") as f:
            f.write(b"\0" * 8192)
        os.chmod(target, 0o600)
    elif kind == "victim-0644":
        with open(target, "wb") as f:
            f.write(b"\0" * 8192)
        os.chown(target, alice.uid, alice.gid)
        os.chmod(target, 0o644)
        owner = alice.uid
    elif kind == "symlink":
        dest = os.path.join(SHM, f"shmt-dest-{uuid.uuid4().hex[:6]}")
        planted.append(dest)
        with open(dest, "wb") as f:
            f.write(b"\0" * 8192)
        os.chown(dest, alice.uid, alice.gid)
        os.chmod(dest, 0o600)
        os.symlink(dest, target)
    else:
        os.mkfifo(target, 0o666)
    victims = [alice.start(VICTIM, str(r), job) for r in (0, 1)]
    for v in victims:
        res = _result(v)
        _assert_refused(res, target, owner)
        if kind == "symlink":
            assert "symlink" in res["message"]
    assert os.path.lexists(target)  # never deleted: it is not ours


# `shmcomm ls` / `clean` as a user, printing the exit code and the listing.
CLI = """
import sys
from shmcomm import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def _fake_stale_segment(path: str, job: str, uid: int, gid: int) -> None:
    data = bytearray(segments.HEADER_BYTES + 2 * segments.CONTROL_BLOCK_BYTES)
    import struct
    struct.pack_into("<QII", data, 0, segments.MAGIC, 4, 2)
    data[64:64 + len(job)] = job.encode()
    with open(path, "wb") as f:
        f.write(data)
    os.chown(path, uid, gid)
    os.chmod(path, 0o600)
    old = time.time() - 3600  # past the start-up grace period
    os.utime(path, (old, old))


@pytest.mark.timeout(90)
def test_clean_never_touches_another_users_files(users, planted):
    alice, mallory = users
    job = f"cl{uuid.uuid4().hex[:6]}"
    alices = shm_path(alice.uid, job, "g0")
    planted_under_alice = shm_path(alice.uid, job, "g1")  # mallory's file under alice's names
    planted += [alices, planted_under_alice]
    _fake_stale_segment(alices, job, alice.uid, alice.gid)
    _fake_stale_segment(planted_under_alice, job, mallory.uid, mallory.gid)

    # mallory neither sees nor removes alice's stale segment
    p = mallory.start(CLI, "clean")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert os.path.exists(alices) and job not in out
    p = mallory.start(CLI, "ls")
    out, _ = p.communicate(timeout=60)
    assert job not in out

    # alice removes her own stale segment, lists mallory's as foreign and leaves it alone
    p = alice.start(CLI, "ls", "--job", job)
    out, err = p.communicate(timeout=60)
    assert "foreign" in out and f"uid {mallory.uid}" in err, (out, err)
    p = alice.start(CLI, "clean", "--job", job)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert not os.path.exists(alices), out
    st = os.lstat(planted_under_alice)
    assert st.st_uid == mallory.uid


# Alice's two ranks join, then call sc.empty (or init_rpc) whose name mallory planted first.
HEAP_VICTIM = """
import json, sys, time
import numpy as np
import shmcomm as sc
rank, job, what = int(sys.argv[1]), sys.argv[2], sys.argv[3]
sc.init_process_group(rank=rank, world_size=2, name=job, timeout=20)
t0 = time.monotonic()
try:
    if what == "empty":
        x = sc.empty(16, np.float32) if hasattr(sc, "empty") else sc.shared_arrays.empty(sc.group.default_group(), 16)
    else:
        from shmcomm import rpc
        rpc.init_rpc(f"w{rank}", rank, 2, job=job, timeout=20)
    print(json.dumps({"joined": True}))
except Exception as e:
    print(json.dumps({"joined": False, "error": type(e).__name__, "message": str(e),
                      "seconds": time.monotonic() - t0}))
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("what", ["empty", "rpc"])
def test_sc_empty_and_rpc_refuse_a_planted_segment(users, planted, what):
    alice, mallory = users
    job = f"hp{uuid.uuid4().hex[:6]}"
    part = "g0.h1" if what == "empty" else "rpc"
    target = shm_path(alice.uid, job, part)
    planted.append(target)
    with open(target, "wb") as f:
        f.write(b"\0" * 65536)
    os.chown(target, mallory.uid, mallory.gid)
    os.chmod(target, 0o666)
    ranks = [alice.start(HEAP_VICTIM, str(r), job, what) for r in (0, 1)]
    results = [_result(p) for p in ranks]
    if what == "empty":  # a heap's name carries rank 0's nonce: the plant is never even opened
        assert all(r["joined"] for r in results), results
        assert os.lstat(target).st_uid == mallory.uid
        return
    assert not any(r["joined"] for r in results), results
    rank0 = results[0]
    _assert_refused(rank0, target, mallory.uid)
    assert all(r["seconds"] < 10 for r in results), results  # the other rank is told at once too
    assert os.lstat(target).st_uid == mallory.uid


# One job of `shmrun`: every rank reports the tag of the job it was started in and the tags of
# the ranks it ended up grouped with (a mixed group would show two tags).
TWO_JOBS = """
import os, sys, time
import shmcomm as sc
tag, name = os.environ["JOB_TAG"], sys.argv[1]
rank = int(os.environ["RANK"])
time.sleep({"A": [0.0, 1.0], "B": [0.3, 0.3]}[tag][rank])
try:
    sc.init_process_group(name=name, timeout=15)
    tags = [None, None]
    sc.all_gather_object(tags, tag)
    print("tags", tag, ",".join(tags), flush=True)
    sc.destroy_process_group()
except Exception as e:
    print("refused", tag, type(e).__name__, str(e).replace(chr(10), " "), flush=True)
    sys.exit(3)
"""


@pytest.mark.timeout(120)
def test_two_jobs_with_one_name_never_form_mixed_groups(tmp_path):
    script = tmp_path / "two_jobs.py"
    script.write_text(TWO_JOBS)
    name = f"same{uuid.uuid4().hex[:6]}"
    procs = {tag: subprocess.Popen([sys.executable, "-m", "shmcomm.launch", "-n", "2", str(script), name],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "JOB_TAG": tag})
             for tag in "AB"}
    outs = {tag: p.communicate(timeout=100)[0] for tag, p in procs.items()}
    for tag, out in outs.items():
        for line in out.splitlines():
            if " tags " in line:
                assert line.split()[-1] == f"{tag},{tag}", outs  # never (A, B)
    refused = [line for out in outs.values() for line in out.splitlines() if " refused " in line]
    assert refused, outs  # B's ranks found A's segment: a clear error, not a mixed group
    assert any("another job" in line or "in use by live processes" in line for line in refused), refused
    assert not [n for n in os.listdir(SHM) if f".{name}." in n]


@pytest.mark.timeout(90)
def test_a_planted_subgroup_name_neither_stops_the_job_nor_is_touched(users, tmp_path, planted):
    """Another user who learnt the job's name planted its next sub-group's name: the rank that
    found it failed, and the job with it. (shmrun also crashed in its cleanup, EPERM unlinking
    the file.) A sub-group's name now carries a suffix from the group's random salt, which only
    its members can read: the job goes on, and the file is left alone."""
    alice, mallory = users
    script = tmp_path / "subgroup.py"
    go = tmp_path / "go"
    script.write_text(textwrap.dedent(f"""
        import os, time
        import shmcomm as sc
        sc.init_process_group(timeout=20)
        print("job", os.environ["SHMCOMM_JOB"], flush=True)
        while not os.path.exists({str(go)!r}):
            time.sleep(0.05)
        sub = sc.new_group([0, 1])
        print("sub-group", sub.size, flush=True)
        """))
    os.chmod(tmp_path, 0o777)
    os.chmod(script, 0o644)
    env = {**os.environ, "PYTHONPATH": _package_parent()}
    env.pop(trust.SECRET_ENV, None)
    proc = subprocess.Popen(alice.command([sys.executable, "-m", "shmcomm.launch", "-n", "2", str(script)]),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd="/")
    job = None
    while job is None:
        line = proc.stdout.readline()
        assert line, "shmrun ended before printing the job name"
        if " job " in line:
            job = line.split()[-1]
    target = shm_path(alice.uid, job, "g1")
    planted.append(target)
    with open(target, "wb") as f:
        f.write(b"\0" * 8192)
    os.chown(target, mallory.uid, mallory.gid)
    os.chmod(target, 0o666)
    go.write_text("go")
    out = proc.stdout.read()
    proc.wait(timeout=60)
    assert proc.returncode == 0, out
    assert out.count("sub-group 2") == 2, out
    assert os.lstat(target).st_uid == mallory.uid  # left alone


def test_credentials_tell_jobs_apart_and_hand_started_ranks_match_by_name():
    a, b = trust.credentials("secret-a"), trust.credentials("secret-b")
    assert a.accepts(a.tag("j", "g0"), False, "j", "g0")
    assert not b.accepts(a.tag("j", "g0"), False, "j", "g0")
    assert not a.accepts(a.tag("j", "g0"), False, "j", "g1")  # another segment's tag
    mine = f"auto-{os.getpid()}-{'0' * 32}"
    other = f"auto-{os.getpid() + 1}-{'1' * 32}"
    old = os.environ.get(trust.SECRET_ENV)
    try:
        os.environ[trust.SECRET_ENV] = mine
        self_made = trust.credentials()
        os.environ[trust.SECRET_ENV] = other
        inherited = trust.credentials()
    finally:
        if old is not None:
            os.environ[trust.SECRET_ENV] = old
    assert self_made.self_made and not inherited.self_made
    # two processes that each made their secret up (started by hand) match by name alone ...
    assert self_made.accepts(b"x" * 32, True, "j", "g0")
    # ... but a child that inherited a parent's secret never joins another parent's job
    assert not inherited.accepts(b"x" * 32, True, "j", "g0")
    assert not self_made.accepts(b"x" * 32, False, "j", "g0")


def test_peer_identity_names_one_process():
    me = trust.process_identity(os.getpid())
    assert me is not None and me[0] == os.geteuid() and me[1] > 0
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert trust.process_identity(child.pid) is None  # reaped: no such process


def test_log_files_are_never_written_through_a_symlink_or_into_another_users_file(tmp_path):
    victim = tmp_path / "precious"
    victim.write_text("keep")
    link = tmp_path / "rank0.out"
    link.symlink_to(victim)
    with pytest.raises(sc.UntrustedFileError, match="symlink"):
        trust.open_private_output(str(link))
    assert victim.read_text() == "keep"
    hard = tmp_path / "rank1.out"
    os.link(victim, hard)
    with pytest.raises(sc.UntrustedFileError, match="more than one link"):
        trust.open_private_output(str(hard))
    assert victim.read_text() == "keep"
    fd = trust.open_private_output(str(tmp_path / "rank2.out"))
    assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
    os.close(fd)


def _join_under_umask(rank, size, job):
    os.umask(0o277)  # would make the segment 0400: attach requires exactly 0600
    sc.init_process_group(rank=rank, world_size=size, name=job, timeout=20)
    x = np.full(3, rank + 1.0)
    sc.all_reduce(x)
    sc.destroy_process_group()
    return x.tolist()


@pytest.mark.timeout(60)
def test_segments_are_created_0600_whatever_the_umask():
    from harness import run_ranks
    job = f"um{uuid.uuid4().hex[:6]}"
    assert run_ranks(_join_under_umask, 2, job, init=False, job=job) == [[3.0] * 3] * 2


JOIN_TWO = """
import sys, shmcomm as sc
sc.init_process_group(rank=int(sys.argv[1]), world_size=2, name=sys.argv[2], timeout=30)
sc.barrier()
sc.destroy_process_group()
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("creator", ["running", "killed"])
def test_a_segment_being_named_from_its_staging_name_is_waited_for_not_refused(creator):
    """Without O_TMPFILE rank 0 names its segment by linking its staging name to the name, then
    removes the staging name: a rank attaching in between sees two links. It waits that out
    while rank 0 runs ("running": the second link goes after 0.5 s), and removes the staging
    name of a rank 0 killed in between ("killed"), instead of refusing the file as a planted
    link. Made here by hand: the real moment lasts microseconds."""
    job = f"pub{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, SHMCOMM_SECRET="pub-test")
    rank0 = subprocess.Popen([sys.executable, "-c", JOIN_TWO, "0", job], env=env)
    try:
        deadline = time.monotonic() + 30
        while not any(s.valid for s in segments.list_segments(job=job)):
            assert time.monotonic() < deadline and rank0.poll() is None, "rank 0 never named its segment"
            time.sleep(0.01)
        path = segments.list_segments(job=job)[0].path
        pid, start = (rank0.pid, trust.process_identity(rank0.pid)[1]) if creator == "running" else (2**22 + 1, 1)
        staged = segments.staging_name(path, pid, start)
        os.link(path, staged)
        rank1 = subprocess.Popen([sys.executable, "-c", JOIN_TWO, "1", job], env=env,
                                 stderr=subprocess.PIPE, text=True)
        if creator == "running":
            time.sleep(0.5)
            assert rank1.poll() is None, rank1.communicate()[1]  # still waiting, not refused
            os.unlink(staged)
        assert rank1.wait(timeout=60) == 0, rank1.communicate()[1]
        assert rank0.wait(timeout=30) == 0
        assert not os.path.exists(staged) and not segments.list_segments(job=job)
    finally:
        rank0.kill()
        for s in segments.list_segments(job=job):
            os.unlink(s.path)
