"""The ranks' process trees: finding every process the launcher started (ranks, their children,
orphans reparented to it), signalling a rank's whole process group, and reaping what exits, so
that no process of a job outlives it::

    become_subreaper()                    # once, at start: orphans of the job come back to us
    for p in descendants(): p.terminate()
    killpg(rank_pid, signal.SIGKILL)      # the rank's group (each rank leads its own)
"""

from __future__ import annotations

import ctypes
import os
import sys

import psutil

__all__ = ["descendants", "is_running", "killpg", "group_alive", "reap_orphans", "become_subreaper"]

_PR_SET_CHILD_SUBREAPER = 36  # from <linux/prctl.h>, which ctypes cannot read


def descendants() -> list[psutil.Process]:
    """Every living process below this one (children, theirs...); ``[]`` when psutil cannot tell."""
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def is_running(p: psutil.Process) -> bool:
    """Whether ``p`` still exists and is not a zombie (one that exited, waiting to be reaped)."""
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def killpg(pgid: int, signum: int) -> None:
    """``os.killpg``, quiet when the group is gone (or not ours): ``killpg(rank_pid, SIGTERM)``."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    """True when a live (non-zombie) process is still in group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    # killpg(0) also succeeds for zombies, which cannot run anymore: look closer.
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and is_running(p):
                return True
        except (OSError, psutil.Error):
            continue
    return False


def reap_orphans(rank_pids: set[int]) -> None:
    """Reap the exited children of this process that are not ranks (``Popen`` reaps those):
    ``reap_orphans({rk.proc.pid for rk in ranks})``."""
    # Orphans reparented to us (subreaper) become our zombies; Popen reaps only the ranks.
    try:
        orphans = [p for p in psutil.Process().children() if p.pid not in rank_pids]
    except psutil.Error:
        return
    psutil.wait_procs(orphans, timeout=0)   # reaps those that have exited, waits for none


def become_subreaper() -> None:
    """Make this process the reaper of its orphaned descendants (Linux; elsewhere nothing):
    ``become_subreaper()`` before the first rank starts."""
    # Grandchildren whose rank died are reparented to us instead of init, so the final sweep can
    # still find (and reap) them even when they left the rank's process group.
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
