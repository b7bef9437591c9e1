"""``shmrun``: start N local ranks of a program and supervise them (``python -m shmcomm.launch``).

Each rank gets the environment ``torchrun`` gives its workers, plus ``SHMCOMM_JOB``, so both
``sc.init_process_group()`` and an unchanged ``torch.distributed`` script (``env://``) work::

    shmrun -n 4 train.py --lr 0.1             # a .py file runs under this Python
    shmrun -n auto -m mypkg.worker            # a module, one rank per usable core
    shmrun -n 2 --log-dir logs python train.py
    shmrun -n 2 sh -c 'echo rank $RANK of $WORLD_SIZE'

Output passes through live, partial lines and prompts included; every line a rank starts is
prefixed ``[rank] `` (``--no-prefix`` turns that off, ``--timestamp-output`` adds the time). When a
rank fails, the others are stopped (SIGTERM, SIGKILL after ``--grace`` seconds), a summary names
the failing rank, and ``shmrun`` exits with that rank's code (128 + signal number for a signal).
Whatever the ending, no process of the job and no ``/dev/shm`` segment of the job is left behind.

This module runs a whole job: the signal handlers, the link to the other nodes' launchers, the
log directory, and one :class:`~shmcomm.launcher.supervisor.Supervisor` per attempt, restarting
the job after a failure up to ``--max-restarts`` times.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import sys

from shmcomm import trust
from shmcomm.launcher.cli import parse_args
from shmcomm.launcher.config import PROG, LaunchConfig
from shmcomm.launcher.console import Console
from shmcomm.launcher.logs import make_run_dir, open_logs
from shmcomm.launcher.node_link import NodeLink, link_key
from shmcomm.launcher.outcome import Outcome, summarize
from shmcomm.launcher.process_tree import become_subreaper
from shmcomm.launcher.supervisor import Supervisor

__all__ = ["launch", "run_job", "main"]

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def launch(cfg: LaunchConfig) -> int:
    """Run the job described by ``cfg`` to its end and return ``shmrun``'s exit code.

    Installs handlers for SIGINT/SIGTERM/SIGHUP (forwarded to the ranks) and SIGCHLD for the
    duration, so it must run in the main thread. Example::

        code = launch(parse_args(["-n", "2", "worker.py"]))
    """
    return run_job(cfg).code


def run_job(cfg: LaunchConfig) -> Outcome:
    """``launch``, returning the whole outcome: the exit code, the failed rank (its ``rank``
    and ``returncode``) and the signal that stopped the launcher, if any. Example::

        outcome = run_job(parse_args(["-n", "2", "worker.py"]))
        if outcome.failed is not None: print(outcome.failed.rank)
    """
    console = Console()
    run_dir = None
    if cfg.log_dir is not None:
        run_dir = make_run_dir(cfg)
        console.say(f"writing the ranks' output to {run_dir}/attempt_<k>/rank<r>.out|.err")
    pending: list[int] = []
    wakeup_r, wakeup_w = os.pipe()
    os.set_blocking(wakeup_r, False)
    os.set_blocking(wakeup_w, False)
    old_wakeup = signal.set_wakeup_fd(wakeup_w)
    old_handlers = {}
    for signum in _FORWARDED:
        old_handlers[signum] = signal.signal(signum, lambda s, _f: pending.append(s))
    # A handler (even one doing nothing) makes SIGCHLD write to the wake-up pipe: exits are seen
    # at once, which also keeps "which rank failed first" accurate.
    old_handlers[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda s, _f: None)
    link = None
    try:
        if cfg.nnodes > 1:
            key = link_key(trust.given_secret(), cfg.nnodes, cfg.nproc, cfg.master_port)
            link = NodeLink(cfg.nnodes, cfg.node_rank, cfg.master_addr, cfg.master_port + 1,
                            wake=functools.partial(_wake, wakeup_w), key=key)
            link.start()
        attempt = 0
        while True:
            logs = open_logs(cfg, run_dir, attempt)
            try:
                outcome = Supervisor(cfg, console, logs, wakeup_r, pending, attempt, link).run()
            finally:
                for f in logs.values():
                    f.close()
            if link is not None:
                link.finish(ok=outcome.code == 0)
                for notice in link.take_notices():
                    console.say(notice)
                if outcome.code == 0 and link.news:  # a node failed after this one's ranks ended
                    outcome = Outcome(link.news[0].code, remote=link.news[0])
            if cfg.summary:
                summarize(console, outcome, cfg)
            if outcome.code == 0 or outcome.launcher_signal is not None or pending:
                return outcome
            if outcome.failed is None or attempt >= cfg.max_restarts:
                return outcome
            attempt += 1
            console.say(f"restarting the job (restart {attempt} of {cfg.max_restarts})")
    finally:
        if link is not None:
            link.close()
        for signum, handler in old_handlers.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(old_wakeup)
        os.close(wakeup_r)
        os.close(wakeup_w)


def _wake(fd: int) -> None:
    """Wake the supervisor's ``select()`` (the node link's threads call it) through the signal
    wake-up pipe ``fd``."""
    try:
        os.write(fd, b"\0")
    except (BlockingIOError, OSError):
        pass  # the pipe is full (a wake-up is pending anyway) or closed (launch ended)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``shmrun`` and ``python -m shmcomm.launch``; returns the exit code.

    Example::

        sys.exit(main(["-n", "2", "train.py"]))
    """
    cfg = parse_args(argv)
    become_subreaper()
    try:
        return launch(cfg)
    except OSError as e:
        if e.errno == errno.EPIPE:
            return 1
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
