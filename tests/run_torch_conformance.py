"""Run torch's own distributed conformance suite against the shmcomm backend.

The suite is ``torch.testing._internal.distributed.distributed_test.DistributedTest`` (shipped in
the torch wheel; it needs ``expecttest``). It reads ``BACKEND`` and ``WORLD_SIZE`` from the
environment when imported, spawns ``WORLD_SIZE`` processes per test, rendezvouses through a
``file://`` store in ``TEMP_DIR`` (set up per test by the suite), and skips backend-specific tests
unless the backend is listed in ``DistTestCases.backend_feature``. This driver registers "shmcomm"
there (as a plugin with DDP and sub-group support) before importing the suite.

It is slow (``WORLD_SIZE`` fresh torch processes per test), so it is not collected by the normal test run::

    python tests/run_torch_conformance.py                      # the default selection below
    python tests/run_torch_conformance.py -k "all_reduce and not cuda"
    python tests/run_torch_conformance.py --all                # every test of the suite
    python tests/run_torch_conformance.py --list               # names only
    python tests/run_torch_conformance.py --fork               # ranks forked, not spawned

``--fork`` (or ``SHMCOMM_CONFORMANCE_START=fork``) starts each test's ranks by forking the pytest
process instead of spawning fresh interpreters: at 3 ranks on two cores, spawned ranks ran 25
tests of the default selection in 4 minutes, forked ones all 205 in one. Spawn, the suite's own
way, stays the default.

It prints pytest's report, then pass/fail/skip counts and every distinct skip reason.
"""

from __future__ import annotations

import os
import sys
import types

# This checkout's shmcomm, also in the processes the suite spawns (they inherit sys.path and env).
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[:1] != [REPO]:
    sys.path.insert(0, REPO)
if REPO not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
os.environ.setdefault("BACKEND", "shmcomm")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", "/tmp")   # replaced per test by the suite's setUp
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import shmcomm.torch  # noqa: E402,F401 - registers the backend in processes started by spawn
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

BACKEND = os.environ["BACKEND"]
for feature in ("plugin", "ddp", "subgroup"):
    DistTestCases.backend_feature[feature].add(BACKEND)

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestShmcommBackend(TestDistBackend, DistributedTest._DistTestBase):
    """torch's DistributedTest on the backend named by ``BACKEND`` (default "shmcomm").

    Example::

        python tests/run_torch_conformance.py -k test_all_reduce_sum
    """

    def setUp(self):
        super().setUp()
        # The suite spawns: each rank imports torch afresh, five to ten seconds a test on a small
        # machine. Forked ranks start from this process's imports (--fork).
        if os.environ.get("SHMCOMM_CONFORMANCE_START", "spawn") == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()


# Tests the suite gates on backend *names* although their bodies are plain CPU code paths that any
# backend should pass (the gates predate third-party backends). Each gets an extra copy named
# `<test>_unlocked` without the gate; the original still reports its skip. A copy keeps any other
# skip marked further in (a world size, a test torch disabled). Helpers in CPU_PATH_HELPERS that
# choose their CPU code path by backend name take it. SHMCOMM_NO_UNLOCK=1 leaves the suite as
# shipped.
UNLOCK_REASONS = (
    "Only MPI supports CPU all_to_all_single",
    "Only MPI supports all_to_all",
    "get_future is only supported on mpi, nccl and gloo",
    "GLOO Batch Send Recv CPU",
    f"Test requires backend {BACKEND} to be one of {{'gloo'}}",
    f"Test requires backend {BACKEND} to be one of {{'",   # {'nccl', 'gloo', 'ucc'} in any order
)


def _unlocks(why: str) -> bool:
    """Whether a skip reason is one of the name gates in UNLOCK_REASONS."""
    return why in UNLOCK_REASONS or (why.startswith(UNLOCK_REASONS[-1]) and "gloo" in why)


def _inner_skip(func) -> str | None:
    """The reason of a skip marked on a function that ``func`` wraps, other than a name gate.

    The gates mark the outermost function; a decorator further in may have marked its own
    function (``require_exact_world_size(4)`` at another world size, ``unittest.skip``), and
    ``functools.wraps`` copied that mark outwards, where the gate's reason overwrote it."""
    inner = getattr(func, "__wrapped__", None)
    while inner is not None:
        why = inner.__dict__.get("__unittest_skip_why__", "")
        if inner.__dict__.get("__unittest_skip__", False) and not _unlocks(why):
            return why
        inner = getattr(inner, "__wrapped__", None)
    return None


def _unlocked_copy(func):
    copy = types.FunctionType(func.__code__, func.__globals__, func.__name__ + "_unlocked",
                              func.__defaults__, func.__closure__)
    copy.__dict__.update({k: v for k, v in func.__dict__.items()
                          if k not in ("__unittest_skip__", "__unittest_skip_why__")})
    copy.__qualname__ = func.__qualname__ + "_unlocked"
    copy.__doc__ = func.__doc__
    why = _inner_skip(func)
    if why is not None:  # keep the skip that is not a name gate (skipped here, without processes)
        copy.__unittest_skip__, copy.__unittest_skip_why__ = True, why
    return copy


def _as_cpu_backend(func):
    """``func`` reading ``BACKEND`` as "gloo": for helpers whose bodies pick their CPU code path
    by backend name (``if BACKEND == "mpi" or BACKEND == "gloo": <build the CPU model>``). The
    group itself is still made with the real backend (by ``_run``, which reads the module's)."""
    return types.FunctionType(func.__code__, dict(func.__globals__, BACKEND="gloo"), func.__name__,
                              func.__defaults__, func.__closure__)


# Helpers that build their model only `if BACKEND in ("mpi", "gloo")` (else only for nccl).
CPU_PATH_HELPERS = ("_test_accumulate_gradients_no_sync",)


def _unlock(cls) -> list[str]:
    names = []
    for helper in CPU_PATH_HELPERS:
        setattr(cls, helper, _as_cpu_backend(getattr(cls, helper)))
    for name in dir(cls):
        func = getattr(cls, name, None)
        why = getattr(func, "__unittest_skip_why__", "")
        if not name.startswith("test_") or not getattr(func, "__unittest_skip__", False):
            continue
        if "cuda" in name or "nccl" in name or "monitored_barrier" in name or "profil" in name:
            continue  # GPU paths, and monitored_barrier/profiler checks that are gloo API details
        if _unlocks(why):
            setattr(cls, name + "_unlocked", _unlocked_copy(func))
            names.append(name + "_unlocked")
    return names


UNLOCKED = [] if os.environ.get("SHMCOMM_NO_UNLOCK") == "1" else _unlock(TestShmcommBackend)


# CPU collectives, point-to-point, groups, object collectives and DDP; "cuda"/"nccl" ones would
# only skip, at the price of two torch start-ups each.
DEFAULT_SELECTION = (
    "(test_all_reduce or test_reduce or test_broadcast or test_all_gather or test_gather or "
    "test_scatter or test_all_to_all or test_barrier or test_send_recv or test_isend or test_irecv "
    "or test_batch_isend_irecv or test_coalescing_manager or test_get_ or test_destroy or "
    "test_new_subgroups or test_Backend_enum_class or test_average_parameters or "
    "object or test_DistributedDataParallel or test_ddp_hook_parity_allreduce or "
    "test_accumulate_gradients or test_ddp_uneven_inputs or test_ddp_join or test_ddp_sync or "
    "test_ddp_broadcast_buffer or test_ddp_static_graph or test_ddp_logging_data_cpu or "
    "test_static_graph_api_cpu or test_ddp_comm_hook_logging or test_ddp_update_process_group or "
    "test_ddp_inference or test_ddp_create_graph or test_ddp_zero_output_features or "
    "test_SyncBatchNorm_process_group or test_ddp_grad_div_uneven_inputs or unlocked) "
    "and not cuda and not nccl and not profiler and not timeout"
)


class _Summary:
    """pytest plugin: counts outcomes and collects skip reasons."""

    def __init__(self):
        self.counts = {"passed": 0, "failed": 0, "skipped": 0}
        self.skips: dict[str, list[str]] = {}
        self.failed: list[str] = []

    def pytest_runtest_logreport(self, report):
        name = report.nodeid.rsplit("::", 1)[-1]
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            if report.outcome == "skipped":
                longrepr = report.longrepr
                reason = str(longrepr[-1]) if isinstance(longrepr, tuple) else str(longrepr)
                self.skips.setdefault(reason.removeprefix("Skipped: "), []).append(name)
            elif report.outcome == "failed":
                self.failed.append(name)
            self.counts[report.outcome] = self.counts.get(report.outcome, 0) + 1

    def report(self) -> str:
        lines = [f"conformance ({BACKEND}, WORLD_SIZE={os.environ['WORLD_SIZE']}): "
                 + ", ".join(f"{k} {v}" for k, v in self.counts.items())]
        for name in self.failed:
            lines.append(f"  FAILED {name}")
        for reason, names in sorted(self.skips.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"  skipped {len(names)}: {reason}")
            lines.append(f"      {', '.join(sorted(names))}")
        return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run the selected tests of the suite with pytest; print counts and skip reasons.

    Example::

        python tests/run_torch_conformance.py -k "test_broadcast" --timeout 300
        WORLD_SIZE=4 BACKEND=gloo python tests/run_torch_conformance.py --fork
    """
    import pytest

    args = list(argv)
    if "--list" in args:
        args.remove("--list")
        args += ["--collect-only", "-q"]
    if "--fork" in args:
        args.remove("--fork")
        os.environ["SHMCOMM_CONFORMANCE_START"] = "fork"
    if "--all" in args:
        args.remove("--all")
    elif "-k" not in args:
        args += ["-k", DEFAULT_SELECTION]
    if not any(a.startswith("--timeout") for a in args):
        args += ["--timeout", "400"]
    summary = _Summary()
    code = pytest.main([__file__, "-p", "no:cacheprovider", "-q", "-o", "addopts=", *args],
                       plugins=[summary])
    if "--collect-only" not in args:
        print(summary.report(), flush=True)
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
