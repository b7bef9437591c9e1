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
