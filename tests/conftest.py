import os
import threading
import time

import pytest

from shmcomm import segments

# The tests fork ranks (tests/harness.py) from this process, which also runs threads of its own
# (timers, callers). Thread.join returns once Python is done with the thread, but the thread still
# runs its last C code: under AddressSanitizer that takes the sanitizer's thread-registry lock.
# A fork at that moment copies the lock held, and the child hangs at its first thread start (a
# rank at world size 1 hung 60 s in CI twice, right after a test joined its timer). So a join
# here also waits, for up to a second, until the kernel has seen the thread go.
_join = threading.Thread.join


def _join_until_the_thread_is_gone(self, timeout=None):
    _join(self, timeout)
    if self.is_alive() or self.native_id is None:
        return
    task = f"/proc/self/task/{self.native_id}"
    deadline = time.monotonic() + 1.0
    while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.0005)


threading.Thread.join = _join_until_the_thread_is_gone


# this user's segments when the suite began; those it left (both in the controller's stash)
_SEGMENTS_BEFORE = pytest.StashKey[set]()
_LEAKED = pytest.StashKey[list]()


def _is_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session):
    """Note this user's segments before any test runs (in the process that runs them all, or in
    pytest-xdist's controller, which outlives its workers)."""
    if not _is_xdist_worker(session.config):
        session.config.stash[_SEGMENTS_BEFORE] = {s.name for s in segments.list_segments()}


def pytest_sessionfinish(session):
    """The whole suite must leave no shmcomm segment of this user in /dev/shm.

    Checked once every test has ended (with pytest-xdist, in the controller after the last worker:
    a worker checking at its own end would see a segment of a test still running on another).
    Only segments whose owners are all gone count (and are removed): another test session of the
    same user may be running, and its live segments are none of this one's business."""
    if _is_xdist_worker(session.config) or _SEGMENTS_BEFORE not in session.config.stash:
        return
    before = session.config.stash[_SEGMENTS_BEFORE]
    leaked = [s.name for s in segments.list_segments() if s.name not in before and s.stale]
    for name in leaked:
        try:
            os.unlink(os.path.join(segments.SHM_DIR, name))
        except OSError:
            pass
    if leaked:
        session.config.stash[_LEAKED] = leaked
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    """One line per distinct skip reason, with its count (pyproject's addopts asks pytest for
    failures and errors only, "-rfE"): without an optional peer, dozens of tests skip for the same
    reason, and a line each hid the few that skip for another."""
    reasons = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    leaked = terminalreporter.config.stash.get(_LEAKED, None)
    if leaked:
        terminalreporter.write_sep("=", "FAILED: the test suite left segments in /dev/shm", red=True)
        terminalreporter.write_line(f"{leaked} (removed now)")
    if reasons:
        terminalreporter.write_sep("=", "skipped, by reason")
        for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"SKIPPED {count:>3}  {reason}")


@pytest.fixture(autouse=True, scope="session")
def torch_ops_native_kernel_built():
    """Build torch.ops.shmcomm's native kernel (shmcomm/torch_ops/native.py) once, here, before
    any test forks ranks: the first shmcomm group of a process loads it, and ranks that had to
    build it (about 20 s) would do so inside their test's time limit. Nothing without torch."""
    try:
        import torch  # noqa: F401 - only whether it is there
    except ImportError:
        yield
        return
    from shmcomm.torch_ops import native

    native.load()
    yield
