"""How many ranks one launch may start, decided before the first one starts: a number that cannot
succeed (a typo such as ``-n 100000``) used to start processes until ``fork`` failed. Refused are:

* more than ``MAX_RANKS`` (4096) on one machine, whatever its cores: each group's segment holds a
  ring per ordered pair of ranks (16.8 million at 4096), and 4096 ranks already oversubscribe the
  largest machines many times over;
* more processes than this user may still start (``ulimit -u``; root is not held to it);
* more than the launcher can watch: it holds two pipes per rank (``ulimit -n``).

    too_many_ranks(100000)   # "at most 4096 ranks start on one machine (...)"
"""

from __future__ import annotations

import os
import resource

import psutil

__all__ = ["MAX_RANKS", "too_many_ranks"]

MAX_RANKS = 4096
_FDS_PER_RANK = 2      # the launcher reads each rank's stdout and stderr through a pipe
_FDS_SPARE = 16        # its own: the selector, the signal wake-up pipe, a rank being started


def too_many_ranks(n: int) -> str | None:
    """Why ``n`` ranks cannot be started here, or None when they can.

    Example::

        >>> too_many_ranks(2) is None
        True
    """
    if n > MAX_RANKS:
        return (f"at most {MAX_RANKS} ranks start on one machine (every group holds a ring for "
                f"each pair of ranks)")
    left = _processes_left()
    if left is not None and n > left:
        return f"this user may start only {left} more processes (ulimit -u)"
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY:
        needed = _FDS_PER_RANK * n + _FDS_SPARE + len(os.listdir("/proc/self/fd"))
        if needed > soft:
            return (f"the launcher would hold about {needed} open files (two pipes per rank), "
                    f"over its limit of {soft} (ulimit -n)")
    return None


def _processes_left() -> int | None:
    """Tasks (processes and threads) this user may still start under RLIMIT_NPROC; None when
    unlimited, for root (whom the kernel does not hold to it), or when they cannot be counted."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY or os.getuid() == 0:
        return None
    uid, used = os.getuid(), 0
    try:
        for p in psutil.process_iter(["uids", "num_threads"]):
            uids, threads = p.info["uids"], p.info["num_threads"]
            if uids is not None and uids.real == uid:
                used += threads or 1
    except psutil.Error:
        return None
    return max(0, soft - used)
