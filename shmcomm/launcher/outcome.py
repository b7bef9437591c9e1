"""How one attempt of a job ended, and what ``shmrun`` says about it: each started rank's record
(:class:`Rank`), the attempt's :class:`Outcome` (the exit code, the root-cause rank, the ranks
stopped), shmrun's exit code for a rank's, and the summary printed after a failure::

    outcome = Outcome(exit_code(-9), failed=rank)    # code 137: the rank was killed by SIGKILL
    summarize(console, outcome, cfg)                 # "shmrun: rank 1 (pid 4242) failed with ..."
"""

from __future__ import annotations

import collections
import signal
import subprocess
from dataclasses import dataclass, field

from shmcomm.launcher.config import LaunchConfig
from shmcomm.launcher.console import Console
from shmcomm.launcher.node_link import Failure

__all__ = ["Rank", "Outcome", "exit_code", "how_ended", "left_early", "signal_name", "who", "summarize"]

TAIL_LINES = 20  # stderr lines of a failed rank repeated in the summary


def signal_name(signum: int) -> str:
    """A signal's name: ``signal_name(2)`` is ``'SIGINT'``; an unknown one ``'signal 99'``."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass
class Rank:
    """One started rank of an attempt: its local rank, its process, the last lines of its stderr
    and what the supervisor learnt of it. Example::

        rk = Rank(0, subprocess.Popen(["true"]))
        rk.returncode    # None while it runs
    """

    rank: int
    proc: subprocess.Popen
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    stderr_shown: bool = True       # its stderr went to the console as it came
    stderr_log: str | None = None   # the log file of its stderr, if any
    error_path: str = ""            # its TORCHELASTIC_ERROR_FILE
    fallout: str | None = None      # failed only because a peer did: its exception's first line

    @property
    def returncode(self) -> int | None:
        """Its exit code once it has been reaped (negative: the signal that ended it), else None."""
        return self.proc.returncode


@dataclass
class Outcome:
    """How an attempt (or the whole job: ``run_job``) ended. ``code`` is shmrun's exit code;
    ``failed`` the rank blamed as the root cause; ``launcher_signal`` the signal that stopped the
    launcher, if any. Example::

        outcome = run_job(cfg)
        if outcome.failed is not None: print(outcome.failed.rank, outcome.failed.returncode)
    """

    code: int
    failed: Rank | None = None
    launcher_signal: int | None = None
    stopped: list[int] = field(default_factory=list)  # ranks still running when the job was stopped
    remote: Failure | None = None  # the failure on another node that stopped this one
    fallout: list[Rank] = field(default_factory=list)  # failed before ``failed``, because of it
    left: Rank | None = None  # exited with 0 while ``failed`` still needed it: the failures' cause


def who(cfg: LaunchConfig, rank: int) -> str:
    """Local rank ``rank`` as messages name it: ``'rank 1'``, or on several nodes ``'rank 5
    (local rank 1)'``."""
    if cfg.nnodes > 1:  # the global rank the program knows, and this node's local one
        return f"rank {cfg.node_rank * cfg.nproc + rank} (local rank {rank})"
    return f"rank {rank}"


def exit_code(returncode: int) -> int:
    """shmrun's exit code for a rank's: the same, or 128 + signal for a signal.

    Example: ``exit_code(3)`` is 3, ``exit_code(-9)`` (SIGKILL) is 137.
    """
    return returncode if returncode > 0 else 128 - returncode


def how_ended(returncode: int) -> str:
    """A rank's end in words: ``'exit code 3'``, or ``'signal SIGKILL (9)'`` for ``-9``."""
    return (f"exit code {returncode}" if returncode > 0
            else f"signal {signal_name(-returncode)} ({-returncode})")


def left_early(cfg: LaunchConfig, rk: Rank) -> str:
    """A rank that exited with 0 while its peers still needed it, in words."""
    return (f"{who(cfg, rk.rank)} (pid {rk.proc.pid}) exited with code 0 while other ranks still "
            "needed it: it left the job early")


def summarize(console: Console, outcome: Outcome, cfg: LaunchConfig) -> None:
    """Tell the user on ``console`` which rank failed, how, which ranks failed only because of it,
    which were stopped, and where its stderr is (repeating its tail when it was not shown live).
    Nothing for an attempt that ended well. Example::

        summarize(console, outcome, cfg)   # "shmrun: rank 1 (pid 4242) failed with exit code 3"
    """
    if outcome.remote is not None:
        f = outcome.remote
        stopped = f": stopped rank(s) {', '.join(map(str, outcome.stopped))}" if outcome.stopped else ""
        console.say(f"the job failed on node {f.node} ({f.text}){stopped}; exiting with {outcome.code}")
        return
    rk = outcome.failed
    if rk is None:
        return
    if outcome.left is not None:
        console.say(f"{left_early(cfg, outcome.left)}; the ranks below failed because it had")
    console.say(f"{who(cfg, rk.rank)} (pid {rk.proc.pid}) failed with {how_ended(rk.returncode)}")
    if outcome.fallout:
        console.say(f"rank(s) {', '.join(str(o.rank) for o in outcome.fallout)} exited before it, "
                    f"failing only because it had ({outcome.fallout[0].fallout})")
    if outcome.stopped:
        console.say(f"stopped the other running rank(s): {', '.join(map(str, outcome.stopped))}")
    if not rk.tail:
        console.say(f"rank {rk.rank} wrote nothing to stderr")
    elif rk.stderr_shown and not console.broken[2]:
        # Shown live already: repeating it would print the same traceback twice.
        prefixed = f" (the lines prefixed [{rk.rank}])" if cfg.prefix else ""
        logged = f"; also in {rk.stderr_log}" if rk.stderr_log else ""
        console.say(f"rank {rk.rank}'s stderr is above{prefixed}{logged}")
    else:
        if cfg.local_ranks_filter is not None and rk.rank not in cfg.local_ranks_filter:
            why = "not shown above: --local-ranks-filter"
        else:
            why = "redirected"
        if rk.stderr_log:
            why += f"; all of it is in {rk.stderr_log}"
        console.say(f"last {len(rk.tail)} line(s) of rank {rk.rank} stderr ({why}):")
        console.write(2, b"".join(b"    " + line + b"\n" for line in rk.tail))
