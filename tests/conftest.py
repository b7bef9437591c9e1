import os

import pytest

from shmcomm import segments


@pytest.fixture(autouse=True, scope="session")
def nothing_left_in_dev_shm():
    """The whole suite must leave no shmcomm segment of this user in /dev/shm.

    Only segments whose owners are all gone count (and are removed): another test session of the
    same user may be running, and its live segments are none of this one's business."""
    before = {s.name for s in segments.list_segments()}
    yield
    leaked = [s.name for s in segments.list_segments() if s.name not in before and s.stale]
    for name in leaked:
        try:
            os.unlink(os.path.join(segments.SHM_DIR, name))
        except OSError:
            pass
    assert not leaked, f"the test suite left segments in /dev/shm: {leaked}"


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
    if reasons:
        terminalreporter.write_sep("=", "skipped, by reason")
        for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"SKIPPED {count:>3}  {reason}")
