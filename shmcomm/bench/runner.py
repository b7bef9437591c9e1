"""Parent side: which backends can run, starting their workers (N processes, or ``mpirun``),
following rank 0's event lines with a no-progress timeout, and reporting a failure with the
workers' last words."""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field

from shmcomm.cpus import usable_cores
from shmcomm.launcher.environment import free_port, threads_per_rank

from .peers import deepspeed_leftovers, deepspeed_missing, intel_mpi, mpirun, remove_deepspeed_buffers
from .cases import Case, peer_skip, steps
from .common import _MARK, MPI_BACKENDS
from .turns import Gates

_TAIL_LINES = 15


def backend_available(name: str) -> tuple[bool, str]:
    """``(True, "")`` if ``name`` can run here, else ``(False, reason)``. Cheap: imports nothing.

    ``SHMCOMM_BENCH_UNAVAILABLE=gloo,mpi`` makes backends look missing (for tests). Example::

        ok, why = backend_available("mpi")
    """
    hidden = {b.strip() for b in os.environ.get("SHMCOMM_BENCH_UNAVAILABLE", "").split(",")}
    if name in hidden:
        return False, "marked unavailable by SHMCOMM_BENCH_UNAVAILABLE"
    if name == "shmcomm":
        if importlib.util.find_spec("shmcomm._core") is None:
            return False, "shmcomm._core is not built"
        return True, ""
    if name == "gloo":
        return (True, "") if importlib.util.find_spec("torch") else (False, "torch is not installed")
    if name == "mpi":
        if importlib.util.find_spec("mpi4py") is None:
            return False, "mpi4py is not installed"
        if mpirun() is None:
            return False, "no mpirun or mpiexec on PATH"
        return True, ""
    if name == "impi":
        why = intel_mpi().reason
        return (False, why) if why else (True, "")
    if name == "deepspeed":
        why = deepspeed_missing()
        return (False, why) if why else (True, "")
    return False, f"unknown backend {name!r}"


def backend_cases(backend: str, cases: list[Case]) -> tuple[list, list, str]:
    """``(cases it runs, [(case, reason)] it skips, why it runs none)`` for ``backend`` here.

    Example::

        mine, skipped, why = backend_cases("mpi", [Case("all_reduce", "float16", "sum", -1)])
        # [], [(Case(...), 'MPI has no standard float16 datatype')], 'MPI has no standard float16 datatype'
    """
    ok, why = backend_available(backend)
    if not ok:
        return [], [], why
    verdicts = [(c, peer_skip(backend, c)) for c in cases]
    skipped = [(c, reason) for c, reason in verdicts if reason]
    return [c for c, reason in verdicts if reason is None], skipped, "; ".join(dict.fromkeys(r for _, r in skipped))


@dataclass
class BackendResult:
    """What one backend's run produced: ``status`` is ``ok``, ``skipped`` or ``failed``."""

    backend: str
    status: str
    reason: str = ""
    rows: list = field(default_factory=list)  # "row" events of rank 0
    skipped: list = field(default_factory=list)  # (Case, reason) for the cases this backend cannot run
    versions: dict = field(default_factory=dict)
    command: str = ""
    warnings: list = field(default_factory=list)


def _worker_env(nranks: int) -> dict:
    env = dict(os.environ)
    # The workers must import this very shmcomm, even from a source tree that is not installed.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    # As shmrun does: N ranks share the cores, so library thread pools must not oversubscribe them.
    env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(nranks)))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _is_open_mpi(mpirun: str) -> bool:
    try:
        proc = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return True  # the usual one; a wrong guess shows up as mpirun's own error message
    return "open mpi" in (proc.stdout + proc.stderr).lower() or "open-rte" in proc.stdout.lower()


def _worker_cmd(backend: str, cfg: dict, directory: str) -> list[str]:
    # In a file, not on the command line: an "all" sweep's case list can outgrow an argument.
    path = os.path.join(directory, f"config-{backend}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return [sys.executable, "-m", "shmcomm.bench", "--worker", backend, "--config", "@" + path]


def _launch(backend: str, nranks: int, cfg: dict, logdir: str, mpi_args: list[str]):
    """Start the workers; returns (processes, their stderr log paths, shown command, job name)."""
    env, job = _worker_env(nranks), None
    cmd = _worker_cmd(backend, cfg, logdir)
    procs, logs = [], []
    if backend == "mpi":
        launcher = [mpirun(), "-n", str(nranks)]
        if _is_open_mpi(launcher[0]):  # these flags are Open MPI's; MPICH's hydra allows both anyway
            if nranks > len(usable_cores()):
                launcher.append("--oversubscribe")
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                launcher.append("--allow-run-as-root")
        launcher += mpi_args
        # Open MPI warns about unused components and hwloc on many containers; the numbers stand.
        env.setdefault("OMPI_MCA_btl_base_warn_component_unused", "0")
        env.setdefault("OMPI_MCA_hwloc_base_report_bindings", "0")
        shown = " ".join(launcher) + " python -m shmcomm.bench --worker mpi ..."
        groups = [(launcher + cmd, env)]
    elif backend == "impi":
        impi = intel_mpi()
        env.update({k: env.get(k, v) if k == "I_MPI_FABRICS" else v for k, v in impi.environment().items()})
        launcher = [impi.mpiexec, "-n", str(nranks)]  # --mpirun-args are for the mpi backend's
        shown = " ".join(launcher) + " python -m shmcomm.bench --worker impi ..."
        groups = [(launcher + cmd, env)]
    else:
        per_rank = {"RANK": None, "WORLD_SIZE": str(nranks), "LOCAL_WORLD_SIZE": str(nranks)}
        if backend == "shmcomm":
            job = f"bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            per_rank["SHMCOMM_JOB"] = job
        else:
            per_rank.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: never pick an outside interface
        groups = []
        for r in range(nranks):
            e = dict(env, **{k: v for k, v in per_rank.items() if v is not None})
            e["RANK"] = e["LOCAL_RANK"] = str(r)
            groups.append((cmd, e))
        shown = f"{nranks} x python -m shmcomm.bench --worker {backend} ..."
    for i, (argv, e) in enumerate(groups):
        path = os.path.join(logdir, f"{backend}.{i}.log")
        logs.append(path)
        with open(path, "wb") as err:
            procs.append(subprocess.Popen(argv, env=e, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE if i == 0 else err, stderr=err))
    return procs, logs, shown, job


def _tail(path: str, lines: int = _TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            text = f.read()[-65536:].decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 3.0
    for p in procs:
        try:
            p.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_backend(backend: str, nranks: int, cfg: dict, progress=None, timeout: float = 300.0,
                mpi_args: list[str] | None = None) -> BackendResult:
    """Run the sweep described by ``cfg`` on ``backend`` alone; see ``run_backends``::

        res = run_backend("shmcomm", 2, cfg)
        res.status, len(res.rows)
    """
    return run_backends([backend], nranks, cfg, progress, timeout, mpi_args)[0]


def run_backends(backends: list[str], nranks: int, cfg: dict, progress=None, timeout: float = 300.0,
                 mpi_args: list[str] | None = None, serial: bool = False) -> list[BackendResult]:
    """Run the sweep described by ``cfg`` on every backend, ``nranks`` ranks each, and return one
    result per backend in order; never raises for a failing or missing backend (see
    ``BackendResult.status``).

    ``cfg`` holds ``cases`` (``cases.Case`` tuples), ``sizes``, ``iters``, ``warmup``,
    ``target_time``, ``zero_copy``, ``check``, ``timeout`` and ``rounds``. A backend runs the
    cases it can (``cases.peer_skip`` says why not for the others, in ``BackendResult.skipped``).

    Either way nothing runs beside the backend that measures: the others sleep at a gate (see
    ``turns``), and none leaves its group (gloo's threads, MPI's finalize) before every backend
    has measured its last step.

    - ``serial=False``: every backend's workers start at once and take turns: each step (a case at
      a size, each of ``cfg["rounds"]`` rounds) is measured by one backend after the other, the
      order alternating, so machine drift hits all of them alike.
    - ``serial=True``: one backend's workers at a time, each sweep alone (no idle peer holds
      memory or threads), a round at a time, the order of the backends alternating per round.

    ``progress(backend, row)`` is called for every step; ``timeout`` is how long a backend may take
    to start or to finish one step before it is stopped::

        shm, mpi = run_backends(["shmcomm", "mpi"], 2, cfg)
        shm, mpi = run_backends(["shmcomm", "mpi"], 2, cfg, serial=True)
    """
    args = (nranks, progress, timeout, mpi_args or [])
    if not serial:
        return _take_turns(backends, cfg, *args)
    results: dict[str, BackendResult] = {}
    for rnd in range(cfg.get("rounds", 1)):
        for backend in backends if rnd % 2 == 0 else backends[::-1]:
            if results.get(backend, BackendResult(backend, "ok")).status != "ok":
                continue  # skipped or failed in an earlier round: its result stands
            (res,) = _take_turns([backend], dict(cfg, rounds=1), *args)
            for row in res.rows:
                row["round"] = rnd
            results[backend] = _merged(results.get(backend), res)
    return [results[b] for b in backends]


def _merged(earlier: BackendResult | None, res: BackendResult) -> BackendResult:
    """One backend's result over the rounds of a serial run: ``res`` added to ``earlier``."""
    if earlier is None:
        return res
    earlier.rows += res.rows
    earlier.warnings += res.warnings
    earlier.status, earlier.reason = res.status, res.reason
    return earlier


def _take_turns(backends: list[str], cfg: dict, nranks: int, progress, timeout: float,
                mpi_args: list[str]) -> list[BackendResult]:
    """``run_backends`` with every backend's workers at once, taking turns step by step."""
    results: dict[str, BackendResult] = {}
    running: list[_Running] = []
    every = [Case(*c) for c in cfg["cases"]]
    with tempfile.TemporaryDirectory(prefix="shmcomm-bench-") as tmp:
        try:
            for backend in backends:
                mine, skipped, why = backend_cases(backend, every)
                if not mine:
                    results[backend] = BackendResult(backend, "skipped", why, skipped=skipped)
                    continue
                run = _Running.start(backend, nranks, dict(cfg, cases=mine), tmp, mpi_args, timeout,
                                     progress)
                run.result.skipped = skipped
                running.append(run)
                results[backend] = run.result
            for run in running:  # all initialised (MPI's start-up is CPU-heavy) before anyone measures
                run.next("start")
            for turn, step in enumerate(steps(every, cfg["sizes"], nranks, cfg.get("rounds", 1))):
                for run in running if turn % 2 == 0 else running[::-1]:
                    if run.live and step.case in run.cases:
                        run.gates.open()
                        run.next("row")
            # Every backend measured its last step: only now may they leave their groups (each
            # waits at one last gate), so no teardown runs beside another backend's measurement.
            for run in running:
                if run.live:
                    run.gates.open()
            for run in running:
                run.next("done")
        finally:
            for run in running:
                run.finish()
    return [results[b] for b in backends]


class _Running:
    """One backend's workers while they run: rank 0's event stream, every rank's gate, the result.

    ``next(kind)`` handles events until one of that kind; when the run ends instead (done, skipped
    or failed) ``live`` turns False. ``finish()`` reaps or stops the workers and checks /dev/shm.
    """

    def __init__(self, result: BackendResult, procs, logs, job, gates, timeout: float, progress=None,
                 cases=()):
        self.result, self.procs, self.logs, self.job, self.gates = result, procs, logs, job, gates
        self.cases = set(cases)  # the ones this backend runs
        self.timeout, self.progress = timeout, progress
        self.live, self.finished = True, False  # finished: rank 0 said "done" or "skip"
        self._pending, self._events = b"", collections.deque()
        self._sel = selectors.DefaultSelector()
        self._sel.register(procs[0].stdout, selectors.EVENT_READ)
        self._shm_before = None  # DeepSpeed's: /dev/shm before its workers started (see start)

    @classmethod
    def start(cls, backend, nranks, cfg, tmp, mpi_args, timeout, progress) -> "_Running":
        gates = Gates(tmp, backend, nranks)
        cfg = dict(cfg, nranks=nranks, gate=gates.template)
        result = BackendResult(backend, "failed")
        # DeepSpeed's op never removes its /dev/shm buffers: the ones its run adds are removed
        before = deepspeed_leftovers() if backend == "deepspeed" else None
        try:
            procs, logs, result.command, job = _launch(backend, nranks, cfg, tmp, mpi_args)
        except BaseException:
            gates.close()
            raise
        run = cls(result, procs, logs, job, gates, timeout, progress, [Case(*c) for c in cfg["cases"]])
        run._shm_before = before
        return run

    def next(self, kind: str) -> dict | None:
        """Handle rank 0's events until one of ``kind`` (returned); None if the run ended."""
        last = time.monotonic()
        while self.live:
            while self._events:  # one read can bring several events (the last row and "done")
                event = self._events.popleft()
                last = time.monotonic()
                if self._handle(event) == kind:
                    return event
                if not self.live:
                    return None
            self._read(0.2)
            if self._events:
                continue
            if self.live and any(p.poll() not in (None, 0) for p in self.procs):
                self.live = False  # a rank failed; finish() names it
            elif self.live and time.monotonic() - last > self.timeout:
                self.live = False
                self.result.reason = (f"no progress for {self.timeout:g} s (a hang?); workers stopped\n"
                                      + _failure_text(self.result.backend, self.procs, self.logs))
        return None

    def _read(self, wait: float) -> None:
        """Queue rank 0's events that arrive within ``wait`` seconds; other lines go to stderr."""
        if not self._sel.select(wait):
            return
        chunk = os.read(self.procs[0].stdout.fileno(), 1 << 16)
        if not chunk:  # rank 0 (or mpirun) closed stdout before "done": it died
            self.live = False
            return
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            if line.startswith(_MARK):
                self._events.append(json.loads(line[len(_MARK):]))
            elif line.strip():  # e.g. a library's notice; keep it visible
                print(f"[{self.result.backend}] {line}", file=sys.stderr)

    def _handle(self, event: dict) -> str:
        kind, result = event.get("event"), self.result
        if kind == "row":
            result.rows.append(event)
            if self.progress:
                self.progress(result.backend, event)
        elif kind == "start":
            result.versions = event.get("versions", {})
        elif kind == "skip":
            result.status, result.reason = "skipped", event["reason"]
            self.live, self.finished = False, True
        elif kind == "done":
            self.live, self.finished = False, True
        return kind

    def finish(self) -> None:
        """Reap the workers (stop them if they still run), close everything, check /dev/shm."""
        result, procs = self.result, self.procs
        self.live = False
        if self.gates is not None:
            self.gates.close()  # workers waiting at a gate see end of file and stop
        try:
            if self.finished:
                try:
                    for p in procs:
                        p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    result.warnings.append("workers did not exit within 30 s after finishing; stopped")
            else:
                # A closed pipe can arrive before the exit status: give the ranks a moment so the
                # report names who failed, but never wait on a rank that hangs.
                deadline = time.monotonic() + 5.0
                while (time.monotonic() < deadline and any(p.poll() is None for p in procs)
                       and not any(p.poll() not in (None, 0) for p in procs)):
                    time.sleep(0.05)
            bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode not in (0, None)]
            if self.finished and not bad:
                result.status = "skipped" if result.status == "skipped" else "ok"
            elif not result.reason:
                result.reason = _failure_text(result.backend, procs, self.logs)
        finally:
            _stop(procs)
            self._sel.close()
            for p in procs:
                if p.stdout:
                    p.stdout.close()
            if self.job is not None:
                _remove_leftovers(self.job, result)
            if self._shm_before is not None:
                note = remove_deepspeed_buffers(self._shm_before)
                if note:
                    result.warnings.append(note)


def _failure_text(backend: str, procs, logs) -> str:
    parts = []
    for i, (p, log) in enumerate(zip(procs, logs)):
        code = p.poll()
        if code not in (None, 0):
            who = "mpirun" if backend in MPI_BACKENDS else f"rank {i}"
            state = f"signal {-code}" if code < 0 else f"exit code {code}"
            parts.append(f"{who} (pid {p.pid}) ended with {state}")
            tail = _tail(log)
            if tail:
                parts.append(tail)
        if len(parts) >= 4:
            break
    if not parts:  # nobody exited with an error yet (timeout): show what rank 0 said
        tail = _tail(logs[0])
        parts.append(tail or "workers ended without a result")
    return "\n".join(parts)


def _remove_leftovers(job: str, result: BackendResult) -> None:
    """The core unlinks its segments once every rank attached; anything left is a bug we report."""
    from shmcomm import segments

    left = segments.remove_job_segments(job)
    if left:
        result.warnings.append(f"/dev/shm held {len(left)} segment(s) of job {job} after the run "
                               f"(removed): {', '.join(left)}")
