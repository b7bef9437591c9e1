"""Run a function on N real processes that form a shmcomm group, and collect what each returns.

Children are forked (fast, and the function need not be importable); each joins a group under a
job name unique to the call, runs ``fn(rank, size, *args)``, and sends back its return value or
its traceback text. A hang becomes a failure after ``timeout`` seconds, with every child killed.
``shmrun_leave_early`` runs a job under shmrun whose one rank leaves early.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import threading
import traceback
import uuid
from pathlib import Path

import shmcomm as sc
from shmcomm import segments

_ctx = mp.get_context("fork")


class RankFailed(AssertionError):
    pass


def _child(fn, rank, size, job, args, conn, init, env):
    os.environ.update(env)
    try:
        if init:
            sc.init_process_group(rank=rank, world_size=size, name=job, timeout=float(env.get("SHMCOMM_TIMEOUT", 30)))
        result = ("ok", fn(rank, size, *args))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        result = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    try:
        conn.send(result)
    except Exception as exc:  # noqa: BLE001 - an unpicklable result
        conn.send(("error", f"result not picklable: {exc!r}"))
    finally:
        if init and sc.is_initialized():
            sc.destroy_process_group()
        conn.close()
        os._exit(0)


def run_ranks(fn, size: int, *args, timeout: float = 60.0, init: bool = True, env: dict | None = None,
              job: str | None = None, expect_dead=()):
    """Run ``fn(rank, size, *args)`` on ``size`` processes; return the list of results by rank.

    Raises RankFailed naming every rank that raised or hung. Ranks in ``expect_dead`` may die
    without reporting (their result is None). Asserts the job left nothing in /dev/shm.
    """
    job = job or f"test-{uuid.uuid4().hex[:12]}"
    env = {k: str(v) for k, v in (env or {}).items()}
    # Ranks are forked: a thread of this process still running (an earlier test's timer) could
    # hold an allocator lock the child inherits held, and the child would hang on it (seen in CI
    # under ASan). Let such threads end first (tests/conftest.py: a join waits until they are gone).
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join(timeout=5)
    procs, conns = [], []
    for rank in range(size):
        parent, child = _ctx.Pipe(duplex=False)
        p = _ctx.Process(target=_child, args=(fn, rank, size, job, args, child, init, env), daemon=True)
        p.start()
        child.close()
        procs.append(p)
        conns.append(parent)
    results, failures = [None] * size, []
    import time

    deadline = time.monotonic() + timeout
    for rank, (p, conn) in enumerate(zip(procs, conns)):
        remaining = max(0.1, deadline - time.monotonic())
        if conn.poll(remaining):
            try:
                status, value = conn.recv()
            except EOFError:
                status, value = "died", f"rank {rank} died (exit code {p.exitcode})"
        else:
            status, value = ("died", "died") if not p.is_alive() else ("hung", f"rank {rank} hung for {timeout} s")
        if status == "ok":
            results[rank] = value
        elif rank not in expect_dead:
            failures.append(f"--- rank {rank}: {value}")
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join()
    left = [s.name for s in segments.list_segments(job=job)]
    segments.remove_job_segments(job)
    if failures:
        raise RankFailed("\n".join(failures))
    assert not left, f"segments left in /dev/shm: {left}"
    return results


def shmrun_leave_early(n: int, leaver: int, env: dict | None = None) -> tuple[int, str, str]:
    """Run tests/launcher_scripts/leave_early.py under ``shmrun -n n``: its exit code, its output,
    and the leaver's pid as shmrun's summary names it (asserted there: the root cause)."""
    script = Path(__file__).resolve().parent / "launcher_scripts" / "leave_early.py"
    done = subprocess.run([sys.executable, "-m", "shmcomm.launch", "-n", str(n), str(script), str(leaver)],
                          env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=100)
    out = done.stdout
    said = re.search(rf"shmrun: rank {leaver} \(pid (\d+)\) exited with code 0 while other ranks "
                     rf"still needed it: it left the job early", out)
    assert said, out[-3000:]
    return done.returncode, out, said.group(1)


def torch_ranks(fn, size, store_dir, *args, backend="shmcomm", timeout=90.0, **kw):
    """Run ``fn(rank, size, *args)`` on ``size`` forked ranks inside an initialized torch group
    (a FileStore under ``store_dir``; ``backend`` "shmcomm" unless told)."""
    import torch
    import torch.distributed as dist
    from datetime import timedelta

    store = str(store_dir / f"store-{fn.__name__}-{size}")

    def body(rank, size, *args):
        torch.set_num_threads(1)  # forked children: keep OpenMP out of the picture
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=size,
                                timeout=timedelta(seconds=60))
        try:
            return fn(rank, size, *args)
        finally:
            dist.destroy_process_group()

    return run_ranks(body, size, *args, init=False, timeout=timeout, **kw)


REPO = Path(__file__).resolve().parents[1]
TORCH_SCRIPTS = Path(__file__).parent / "torch_scripts"


def import_torch_distributed():
    """``(torch, torch.distributed)`` for a torch test module, with ``tests/torch_scripts`` on
    ``sys.path`` (its check modules); the module is skipped, with the reason, where torch or its
    distributed package is missing.

    Example::

        torch, dist = import_torch_distributed()   # at the top of a test module
    """
    import pytest

    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch was built without torch.distributed", allow_module_level=True)
    if str(TORCH_SCRIPTS) not in sys.path:
        sys.path.insert(0, str(TORCH_SCRIPTS))
    return torch, dist
