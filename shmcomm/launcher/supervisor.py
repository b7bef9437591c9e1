"""The supervisor: one attempt of a job, from starting its ranks to the last byte of their output.

It starts each rank in a process group of its own (pinned, with its environment), passes their
output to the console and the log files as it comes, and watches them exit. The first rank to fail
for a reason of its own is the root cause: ranks that failed only because a peer did (their error
file says so) are not blamed while that cause may still be on its way out. Then, or on a signal to
the launcher, or on news of a failure from another node, it stops every rank's process tree
(SIGTERM, SIGKILL after the grace time), sweeps up what the ranks left running, and removes the
job's leftover ``/dev/shm`` segments::

    outcome = Supervisor(cfg, console, logs, wakeup_r, pending, attempt=0).run()
    outcome.code, outcome.failed    # 3, the Rank that exited with 3
"""

from __future__ import annotations

import functools
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time

import psutil

from shmcomm import segments, trust
from shmcomm.launcher import error_file
from shmcomm.launcher.config import LaunchConfig
from shmcomm.launcher.console import Console, Stream
from shmcomm.cpus import format_cpulist, usable_cores
from shmcomm.launcher.environment import binding_plan, free_port, job_name, rank_environment
from shmcomm.launcher.node_link import Failure, NodeLink
from shmcomm.launcher.outcome import Outcome, Rank, exit_code, how_ended, left_early, signal_name, who
from shmcomm.launcher.process_tree import (
    descendants,
    group_alive,
    is_running,
    killpg,
    reap_orphans,
)

__all__ = ["Supervisor"]

_POLL_S = 0.1  # fallback wake-up; SIGCHLD normally wakes the loop at once
# When the first rank to fail failed only because a peer did (its error file says so), how long
# to wait for that root cause to exit too: a rank leaves its groups, so its peers fail, before it
# exits itself.
_ROOT_CAUSE_WAIT_S = 2.0
_DRAIN_S = 2.0  # how long to wait for the last output once every process is gone


def _streams_of(spec: int | dict[int, int], rank: int) -> int:
    """The streams (1 stdout, 2 stderr, 3 both) a ``--tee``/``--redirects`` value gives ``rank``."""
    return spec if isinstance(spec, int) else spec.get(rank, 0)


def _on_console(cfg: LaunchConfig, rank: int, fd: int) -> bool:
    """Whether stream ``fd`` (1 stdout, 2 stderr) of local rank ``rank`` is shown on the console."""
    if cfg.local_ranks_filter is not None and rank not in cfg.local_ranks_filter:
        return False
    redirected = _streams_of(cfg.redirects, rank) & ~_streams_of(cfg.tee, rank)
    return not redirected & fd


class Supervisor:
    """Runs one attempt of the job: spawn, pump output, watch exits, stop, clean up. Example::

        outcome = Supervisor(cfg, Console(), logs={}, wakeup_r=r, pending_signals=[], attempt=0).run()
    """

    def __init__(self, cfg: LaunchConfig, console: Console, logs: dict, wakeup_r: int,
                 pending_signals: list[int], attempt: int, link: NodeLink | None = None) -> None:
        self.cfg, self.console, self.logs, self.link = cfg, console, logs, link
        self.remote: Failure | None = None
        self.wakeup_r, self.pending = wakeup_r, pending_signals
        self.attempt = attempt
        self.job = job_name(cfg, attempt)
        self.secret = trust.new_secret()  # a straggler of an earlier attempt cannot join this one
        self.ranks: list[Rank] = []
        self.sel = selectors.DefaultSelector()
        self.streams: dict[int, Stream] = {}
        self.failed: Rank | None = None  # the root cause, once chosen
        self.left: Rank | None = None    # a rank that exited with 0 while ``failed`` needed it
        self.failures: list[Rank] = []   # failed ranks in the order they exited, till then
        self.blame_by: float | None = None  # when to blame the first failure, for want of a cause
        self.error_dir = tempfile.mkdtemp(prefix="shmrun-errors-")  # mode 0700
        self.stopped: list[int] = []
        self.launcher_signal: int | None = None
        self.kill_at: float | None = None  # when the SIGTERMed ranks get SIGKILL
        self.killed = False

    # -- start -------------------------------------------------------------------------------
    def spawn(self) -> int | None:
        """Start every rank; returns an exit code when one could not even be started. A signal
        to the launcher meanwhile ends the start-up at once: the main loop stops the ranks
        started so far (it waited for every rank to start)."""
        port = self.cfg.master_port or free_port()
        plan = binding_plan(self.cfg)
        self.sel.register(self.wakeup_r, selectors.EVENT_READ, None)
        for r in range(self.cfg.nproc):
            if self.pending:
                break
            error_path = os.path.join(self.error_dir, f"rank{r}.json")
            env = rank_environment(self.cfg, r, self.job, port, self.attempt, secret=self.secret,
                                   plan=plan, error_path=error_path)
            preexec = None
            if plan is not None:
                # Pinned before exec, so every thread the rank ever starts inherits the mask.
                # preexec_fn is safe here: the launcher runs no other threads.
                preexec = functools.partial(os.sched_setaffinity, 0, plan[r][0])
            try:
                proc = subprocess.Popen(
                    self.cfg.command, env=env,
                    stdin=None if r == 0 else subprocess.DEVNULL,  # like mpirun: stdin goes to rank 0
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    start_new_session=True,  # own process group: a rank's whole tree is signalled at once
                    preexec_fn=preexec,
                )
            except OSError as e:
                self.console.say(f"cannot start rank {r}: {e}")
                self.stop(signal.SIGTERM)
                return 126 if isinstance(e, PermissionError) else 127
            if self.cfg.report_bindings:
                if plan is None:
                    self.console.say(f"{who(self.cfg, r)} (pid {proc.pid}) not bound: cpus "
                                     f"{format_cpulist(usable_cores())}")
                else:
                    self.console.say(f"{who(self.cfg, r)} (pid {proc.pid}) bound to {plan[r][1]}: "
                                     f"cpus {format_cpulist(plan[r][0])}")
            err_log = self.logs.get((r, 2))
            rk = Rank(r, proc, stderr_shown=_on_console(self.cfg, r, 2),
                       stderr_log=err_log.path if err_log is not None else None,
                       error_path=error_path)
            self.ranks.append(rk)
            prefix = f"[{r}] ".encode() if self.cfg.prefix else b""
            for pipe, fd, tail in ((proc.stdout, 1, None), (proc.stderr, 2, rk.tail)):
                stream = Stream(self.console, fd, prefix, self.logs.get((r, fd)), tail,
                                 show=_on_console(self.cfg, r, fd), timestamp=self.cfg.timestamp)
                self.streams[pipe.fileno()] = stream
                self.sel.register(pipe.fileno(), selectors.EVENT_READ, pipe)
        return None

    # -- main loop ---------------------------------------------------------------------------
    def run(self) -> Outcome:
        """Supervise until every rank has exited; returns the attempt's outcome."""
        try:
            return self._run()
        finally:
            shutil.rmtree(self.error_dir, ignore_errors=True)

    def _run(self) -> Outcome:
        code = self.spawn()
        self._handle_signals()  # one that ended the start-up, even before the first rank
        while any(rk.returncode is None for rk in self.ranks) or self._blame_pending():
            self._pump(_POLL_S)
            self._handle_signals()
            self._hear_other_nodes()
            if self.console.broken[1] and self.launcher_signal is None and self.kill_at is None:
                self.launcher_signal = signal.SIGPIPE
                self.console.say("stdout was closed, stopping every rank")
                self.stop(signal.SIGTERM)
            self._reap_ranks()
            if self.kill_at is not None and not self.killed and time.monotonic() >= self.kill_at:
                self._kill_all(signal.SIGKILL)
                self.killed = True
        self._sweep_leftovers()
        self._drain()
        self.sel.close()
        removed = segments.remove_job_segments(self.job)
        if removed:
            self.console.say(f"removed {len(removed)} leftover shared-memory segment(s) of job "
                             f"{self.job}: {', '.join(removed)}")
        if code is not None:
            return Outcome(code)
        if self.remote is not None:
            return Outcome(self.remote.code, None, None, self.stopped, self.remote)
        if self.failed is not None:
            return Outcome(exit_code(self.failed.returncode), self.failed, self.launcher_signal,
                            self.stopped, fallout=self.failures[:self.failures.index(self.failed)],
                            left=self.left)
        if self.launcher_signal is not None:
            return Outcome(128 + self.launcher_signal, None, self.launcher_signal)
        return Outcome(0)

    def _pump(self, timeout: float) -> None:
        due = min((d for d in (s.due() for s in self.streams.values()) if d is not None), default=None)
        if due is not None:
            timeout = max(0.0, min(timeout, due - time.monotonic()))
        for key, _ in self.sel.select(timeout):
            if key.data is None:  # the signal wake-up pipe: its bytes only served to wake us
                try:
                    while os.read(self.wakeup_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                continue
            fd = key.fd
            try:
                data = os.read(fd, 1 << 16)
            except OSError:
                data = b""
            if data:
                self.streams[fd].feed(data)
            else:
                self._close_stream(fd, key.data)
        now = time.monotonic()  # after reading, so a line whose end has arrived is shown whole
        for stream in self.streams.values():
            due = stream.due()
            if due is not None and due <= now:
                stream.flush()

    def _close_stream(self, fd: int, pipe) -> None:
        self.sel.unregister(fd)
        self.streams.pop(fd).close()
        pipe.close()

    def _handle_signals(self) -> None:
        while self.pending:
            signum = self.pending.pop(0)
            if self.launcher_signal is None and self.kill_at is None:
                self.launcher_signal = signum
                started = len(self.ranks)
                what = (f", stopping {started} rank(s)" if started == self.cfg.nproc else
                        f" during start-up, stopping the {started} of {self.cfg.nproc} rank(s) started")
                self.console.say(f"received {signal_name(signum)}{what}")
                self.stop(signum)  # forward the same signal: SIGINT reaches Python ranks as Ctrl-C
            elif not self.killed:
                self.launcher_signal = self.launcher_signal or signum
                self.console.say(f"received {signal_name(signum)} again, killing every rank")
                self._kill_all(signal.SIGKILL)
                self.killed = True

    def _reap_ranks(self) -> None:
        """Note the ranks that exited; blame the first that failed for a reason of its own."""
        for rk in self.ranks:
            if rk.returncode is not None or rk.proc.poll() is None:
                continue  # already handled, or still running
            if rk.returncode == 0 or self.failed is not None or self.kill_at is not None:
                continue  # a success, or fallout of a failure already blamed or of a stop
            rk.fallout = error_file.fallout(rk.error_path)
            self.failures.append(rk)
            if rk.fallout is None:
                self._blame(rk)
            elif self.blame_by is None:  # its cause may still be on its way out: wait for it
                self.blame_by = time.monotonic() + _ROOT_CAUSE_WAIT_S
        if self._blame_pending():
            # One node: once every rank is out, no cause can come. Several: it may be on another
            # node, whose news arrive through the link (_hear_other_nodes).
            out = self.link is None and all(rk.returncode is not None for rk in self.ranks)
            if out or time.monotonic() >= self.blame_by:
                self._blame(self.failures[0])

    def _blame_pending(self) -> bool:
        """Whether ranks failed only because a peer did and the root cause is yet to come."""
        return (bool(self.failures) and self.failed is None and self.remote is None
                and self.kill_at is None)

    def _blame(self, rk: Rank) -> None:
        """``rk`` is the root cause: stop the others, and tell the other nodes. Unless it failed
        only because a peer did and a failed rank's error names a rank of this node that exited
        with 0 (it left while its peers still needed it): then that one is, and the summary
        says so first."""
        self.failed = rk
        if rk.fallout is not None:
            named = {error_file.peer_pid(f.error_path) for f in self.failures if f.fallout is not None}
            self.left = next((o for o in self.ranks if o.returncode == 0 and o.proc.pid in named), None)
        self.stop(signal.SIGTERM)
        if self.link is not None:
            rank = self.cfg.node_rank * self.cfg.nproc + rk.rank
            self.link.report_failure(exit_code(rk.returncode),
                                     f"{left_early(self.cfg, self.left)} (node {self.cfg.node_rank})"
                                     if self.left is not None else
                                     f"rank {rank} (pid {rk.proc.pid}) on node "
                                     f"{self.cfg.node_rank} failed with {how_ended(rk.returncode)}")

    def _hear_other_nodes(self) -> None:
        """A failure on another node stops this node's ranks too."""
        if self.link is None:
            return
        for notice in self.link.take_notices():
            self.console.say(notice)
        if not self.link.news or self.remote is not None:
            return
        if self.failed is None and self.kill_at is None:
            self.remote = self.link.news[0]
            running = sum(rk.returncode is None for rk in self.ranks)
            self.console.say(f"node {self.remote.node} failed; stopping this node's {running} "
                             "running rank(s)")
            self.stop(signal.SIGTERM)

    # -- stopping ----------------------------------------------------------------------------
    def stop(self, signum: int) -> None:
        """Send ``signum`` to every rank's process tree and arm the SIGKILL after the grace time.

        The grace time runs in the main loop (``kill_at``), not in ``psutil.wait_procs``: that
        sleeps in a loop of its own, and meanwhile the ranks' output must still be read (a rank
        cleaning up after SIGTERM blocks on a full pipe and never exits) and a second signal
        must still kill at once.
        """
        if self.kill_at is None:
            self.stopped = [rk.rank for rk in self.ranks if rk.returncode is None]
            self.kill_at = time.monotonic() + self.cfg.grace
        self._kill_all(signum)

    def _kill_all(self, signum: int) -> None:
        for proc in descendants():
            try:
                proc.send_signal(signum)
            except psutil.Error:
                pass
        for rk in self.ranks:
            killpg(rk.proc.pid, signum)

    def _sweep_leftovers(self) -> None:
        # Ranks are gone; what remains are their children (daemons, orphans in their groups, or
        # reparented to us as subreaper). They get the same SIGTERM, grace, SIGKILL treatment,
        # polled here while their output is pumped (see stop() for why not psutil.wait_procs).
        rank_pids = {rk.proc.pid for rk in self.ranks}
        kill_at = time.monotonic() + (0.0 if self.killed else self.cfg.grace)
        give_up = kill_at + 10.0  # only a process stuck in the kernel survives SIGKILL that long
        signalled: dict[int, int] = {}  # pid or -pgid -> last signal sent
        while True:
            reap_orphans(rank_pids)
            targets = {p.pid: p for p in descendants() if is_running(p)}
            targets.update({-pgid: None for pgid in rank_pids if group_alive(pgid)})
            if not targets:
                return
            now = time.monotonic()
            if self.pending:  # a signal to the launcher now means "stop waiting"
                kill_at = min(kill_at, now)
            if now >= give_up:
                self.console.say(f"could not kill: {sorted(abs(k) for k in targets)}")
                return
            signum = signal.SIGKILL if now >= kill_at else signal.SIGTERM
            for key, proc in targets.items():
                if signalled.get(key) == signum:
                    continue  # one SIGTERM each: repeating it would only disturb their cleanup
                signalled[key] = signum
                if proc is None:
                    killpg(-key, signum)
                else:
                    try:
                        proc.send_signal(signum)
                    except psutil.Error:
                        pass
            self._pump(0.05)  # keep their pipes drained so they can exit instead of block on write

    def _drain(self) -> None:
        deadline = time.monotonic() + _DRAIN_S
        while self.streams and time.monotonic() < deadline:
            self._pump(0.05)
        for fd in list(self.streams):
            key = self.sel.get_key(fd)
            self._close_stream(fd, key.data)
