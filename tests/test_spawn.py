"""sc.spawn: ranks started from plain Python (a script, ``python -c``, stdin as a notebook has no
file either), their return values, failures raised in the caller, Ctrl-C, bad arguments.

Each case runs the caller in a subprocess of its own, as a user's script would be."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from shmcomm import segments

pytestmark = pytest.mark.timeout(120)

EXAMPLE = """
import numpy as np
import shmcomm as sc

def work(rank, n):
    x = np.ones(3) * (rank + 1); sc.all_reduce(x); return float(x[0])
"""


def python(code: str, *, stdin: bool = False, path=None, timeout: float = 90.0):
    """Run ``code`` as ``python -c``, from stdin, or as the script ``path``; (returncode, output)."""
    code = textwrap.dedent(code)
    if path is not None:
        path.write_text(code)
        argv = [sys.executable, str(path)]
    else:
        argv = [sys.executable, "-"] if stdin else [sys.executable, "-c", code]
    res = subprocess.run(argv, input=code if stdin else None, capture_output=True, text=True,
                         timeout=timeout)
    return res.returncode, res.stdout + res.stderr


@pytest.mark.parametrize("how", ["-c", "stdin", "script"])
def test_the_issue_example_returns_every_ranks_value(how, tmp_path):
    code = EXAMPLE + "if __name__ == '__main__':\n    print('RESULT', sc.spawn(work, 3))\n"
    rc, out = python(code, stdin=how == "stdin", path=tmp_path / "job.py" if how == "script" else None)
    assert rc == 0, out
    assert "RESULT [6.0, 6.0, 6.0]" in out, out


def test_ranks_import_what_the_caller_imports_from_any_working_directory(tmp_path):
    """A script run from another directory: fn uses a module beside the script (the ranks used to
    search the working directory instead, and raised ModuleNotFoundError), and a package named
    shmcomm in the working directory shadows nothing (the ranks take the caller's sys.path)."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    (elsewhere / "shmcomm").mkdir(parents=True)
    (elsewhere / "shmcomm" / "__init__.py").write_text("raise ImportError('the shadow shmcomm was imported')\n")
    (project / "helpers.py").write_text("def triple(x):\n    return 3 * x\n")
    (project / "job.py").write_text(textwrap.dedent("""
        import shmcomm as sc
        import helpers

        def work(rank, n):
            return helpers.triple(rank)

        if __name__ == "__main__":
            print("RESULT", sc.spawn(work, 3))
    """))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, str(project / "job.py")], cwd=elsewhere, env=env,
                         capture_output=True, text=True, timeout=90)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "RESULT [0, 3, 6]" in out, out


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_values_come_back_in_rank_order_with_args(nprocs):
    rc, out = python(f"""
        import numpy as np, shmcomm as sc
        def work(rank, n, base, scale):
            x = np.array([float(rank)])
            sc.all_reduce(x)
            return {{"rank": rank, "n": n, "sum": float(x[0]), "mine": base + scale * rank}}
        got = sc.spawn(work, {nprocs}, args=(10, 3))
        want = [{{"rank": r, "n": {nprocs}, "sum": float(sum(range({nprocs}))), "mine": 10 + 3 * r}}
                for r in range({nprocs})]
        assert got == want, got
        assert sc.spawn(lambda rank, n: rank * 2, 2) == [0, 2]   # a lambda travels by value
        print("OK")
    """)
    assert rc == 0 and "OK" in out, out


def test_a_failing_rank_raises_its_exception_with_its_traceback_and_stops_the_others():
    rc, out = python("""
        import time, shmcomm as sc
        from shmcomm.spawn import RemoteTraceback
        def work(rank, n):
            if rank == 1:
                raise ValueError(f"rank {rank} refuses")
            time.sleep(60)          # the launcher must stop these
        start = time.monotonic()
        try:
            sc.spawn(work, 3)
        except ValueError as e:
            assert str(e) == "rank 1 refuses", e
            assert isinstance(e.__cause__, RemoteTraceback) and e.__cause__.rank == 1
            assert "in work" in e.__cause__.text and "ValueError: rank 1 refuses" in e.__cause__.text
            print(f"CAUGHT after {time.monotonic() - start:.1f} s")
    """)
    assert rc == 0 and "CAUGHT" in out, out
    took = float(out.split("CAUGHT after ")[1].split()[0])
    assert took < 30, f"the other ranks kept the caller waiting {took} s"


def test_a_rank_dying_without_an_exception_is_named():
    rc, out = python("""
        import os, shmcomm as sc
        def work(rank, n):
            if rank == 0:
                os._exit(7)
            sc.barrier()
        try:
            sc.spawn(work, 2)
        except sc.ShmcommError as e:
            print("CAUGHT", e)
    """)
    assert rc == 0, out
    assert "CAUGHT rank 0 failed with exit code 7 without a Python exception" in out, out


def test_an_unpicklable_return_value_is_an_error_naming_the_rank():
    rc, out = python("""
        import threading, shmcomm as sc
        try:
            sc.spawn(lambda rank, n: threading.Lock(), 2)
        except TypeError as e:
            print("CAUGHT", e)
    """)
    assert rc == 0, out
    assert re.search(r"CAUGHT rank [01]'s return value cannot be pickled back to the caller", out), out


def test_a_rank_may_return_a_lambda():
    rc, out = python("""
        import shmcomm as sc
        fns = sc.spawn(lambda rank, n: (lambda x: x * 10 + rank), 2)
        print("GOT", [f(1) for f in fns])
    """)
    assert rc == 0, out
    assert "GOT [10, 11]" in out, out


def test_bad_arguments_are_refused_at_once():
    import shmcomm as sc

    with pytest.raises(ValueError, match="nprocs must be an integer >= 1, got 0"):
        sc.spawn(print, 0)
    with pytest.raises(TypeError, match="fn must be callable"):
        sc.spawn("work", 2)
    with pytest.raises(TypeError, match="args must be a tuple"):
        sc.spawn(print, 2, args=[1])


def test_ctrl_c_stops_every_rank_and_leaves_nothing(tmp_path):
    code = textwrap.dedent("""
        import time, numpy as np, shmcomm as sc
        def work(rank, n):
            sc.empty(1 << 20)            # a shared heap, so there is something to clean up
            print(f"rank {rank} ready", flush=True)
            time.sleep(60)
        try:
            sc.spawn(work, 2)
        except KeyboardInterrupt as e:
            print("INTERRUPTED", e, flush=True)
    """)
    before = {s.name for s in segments.list_segments()}
    # spawn's temporary directory goes under tmp_path: another test (on another worker) may be
    # spawning at the same time, in /tmp
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    seen = ""
    deadline = time.monotonic() + 60
    while seen.count("ready") < 2 and time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        seen += line
    assert seen.count("ready") == 2, seen
    p.send_signal(signal.SIGINT)
    start = time.monotonic()
    out, _ = p.communicate(timeout=60)
    assert time.monotonic() - start < 20, "Ctrl-C took too long to stop the ranks"
    assert "INTERRUPTED" in out, seen + out
    left = [s.name for s in segments.list_segments() if s.name not in before and s.stale]
    assert not left, f"left in /dev/shm: {left}"
    assert not [q for q in os.listdir(tmp_path) if q.startswith("shmcomm-spawn-")], \
        "the call's temporary directory was left behind"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("nprocs", [2, 3])
def test_the_root_cause_comes_back_as_its_own_class_while_the_others_wait_in_a_collective(nprocs):
    """Rank 1 raises a class of the caller's script (pickle refuses it in the rank: cloudpickle)
    while the others wait in a collective and then fail with PeerFailureError: the caller gets
    rank 1's exception, as that very class, whichever rank exits first."""
    rc, out = python(f"""
        import numpy as np, shmcomm as sc
        from shmcomm.spawn import RemoteTraceback

        class ScriptError(Exception):
            pass

        def local_class():
            class LocalError(LookupError):
                pass
            return LocalError

        LocalError = local_class()

        def work(rank, n, cls):
            if rank == 1:
                raise cls(f"rank {{rank}} gives up")
            sc.all_reduce(np.ones(4))   # waits for rank 1, which never comes

        for i in range(3):
            for cls in (ScriptError, LocalError):
                try:
                    sc.spawn(work, {nprocs}, args=(cls,))
                except Exception as e:
                    assert type(e) is cls, (i, type(e), e)
                    assert str(e) == "rank 1 gives up", e
                    assert isinstance(e.__cause__, RemoteTraceback) and e.__cause__.rank == 1
                    assert "in work" in e.__cause__.text, e.__cause__.text
                else:
                    raise AssertionError("no exception")
        print("OK")
    """, timeout=80)
    assert rc == 0 and "OK" in out, out
