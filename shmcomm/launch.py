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
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import errno
import functools
import os
import re
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import psutil

from shmcomm import __version__, error_file, segments, trust
from shmcomm.cpus import cpu_domains, format_cpulist, usable_cores
from shmcomm.launch_console import PROG, _Console, _Stream
from shmcomm.node_link import Failure, NodeLink, link_key

__all__ = ["LaunchConfig", "parse_args", "rank_environment", "launch", "main", "usable_cores",
           "cpu_domains", "binding_plan"]

EXIT_USAGE = 2  # what argparse uses for bad command lines
TAIL_LINES = 20  # stderr lines of a failed rank repeated in the summary
_POLL_S = 0.1  # fallback wake-up; SIGCHLD normally wakes the loop at once
# When the first rank to fail failed only because a peer did (shmcomm.error_file), how long to
# wait for that root cause to exit too: a rank leaves its groups, so its peers fail, before it
# exits itself.
_ROOT_CAUSE_WAIT_S = 2.0
_DRAIN_S = 2.0  # how long to wait for the last output once every process is gone
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_CHILD_SUBREAPER = 36
_BIND_KINDS = ("none", "core", "numa", "socket")

# Launcher options: those taking a value, and plain switches. The command line is split by hand at
# the first token that is not one of these, so every later token (dashes included) is the program's.
_VALUED = {"-n", "-np", "--nproc", "--nproc-per-node", "--nproc_per_node", "--bind-to", "--log-dir",
           "--log_dir", "--max-restarts", "--max_restarts", "--grace", "--nnodes", "--node-rank",
           "--node_rank", "--master-addr", "--master_addr", "--master-port", "--master_port",
           "-t", "--tee", "-r", "--redirects", "--local-ranks-filter", "--local_ranks_filter", "-x"}
_SWITCHES = {"--no-prefix", "--tag-output", "--timestamp-output", "--report-bindings",
             "--standalone", "--oversubscribe", "--allow-run-as-root", "--no-python", "--no_python",
             "-h", "--help", "--version"}

# Other launchers' options that shmrun does not take: whose they are, and what to give instead.
_STATIC = ("shmrun's rendezvous is static (torchrun's --rdzv-backend static): give every node "
           "--nnodes M --node-rank K --master-addr HOST --master-port PORT")
_ONE_MACHINE = ("shmrun starts ranks on this machine only: run one shmrun per machine with --nnodes "
                "M --node-rank K --master-addr HOST --master-port PORT")
_FOREIGN = {
    **dict.fromkeys(("--rdzv-backend", "--rdzv_backend", "--rdzv-conf", "--rdzv_conf"),
                    ("torchrun", _STATIC)),
    **dict.fromkeys(("--rdzv-endpoint", "--rdzv_endpoint"),
                    ("torchrun", "give --master-addr HOST --master-port PORT (node 0's), the same "
                                 "on every node")),
    **dict.fromkeys(("--rdzv-id", "--rdzv_id"),
                    ("torchrun", "none is needed: the nodes' --master-port names the job")),
    **dict.fromkeys(("--hostfile", "--machinefile", "-H", "--host"), ("mpirun", _ONE_MACHINE)),
    **dict.fromkeys(("-npernode", "--npernode"), ("mpirun", "give -n N, the ranks of this node")),
    "--map-by": ("mpirun", "give --bind-to core|numa|socket"),
    "--mca": ("mpirun", "shmcomm's settings are SHMCOMM_* environment variables; -x NAME=VALUE "
                        "sets one for the ranks"),
}


@dataclass
class LaunchConfig:
    """A parsed ``shmrun`` command line; ``command`` is the argv every rank executes.

    ``tee`` and ``redirects`` are torchrun's: 0 none, 1 stdout, 2 stderr, 3 both, for every local
    rank (an ``int``) or per local rank (a ``dict``). Example::

        cfg = parse_args(["-n", "2", "train.py", "--lr", "0.1"])
        cfg.nproc, cfg.command  # 2, [sys.executable, "train.py", "--lr", "0.1"]
    """

    nproc: int
    command: list[str]
    bind_to: str = "none"           # none, core, numa or socket
    prefix: bool = True
    log_dir: str | None = None      # each run writes DIR/<run id>/attempt_<k>/rank<r>.out|.err
    max_restarts: int = 0
    grace: float = 5.0
    nnodes: int = 1                 # several nodes: each runs its own shmrun (static rendezvous)
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # None: a free port (one node only)
    summary: bool = True            # False: the caller (sc.spawn) reports a failure itself
    timestamp: bool = False         # prefix every output line with the time it was shown
    report_bindings: bool = False   # print each rank's CPU set when it starts
    tee: int | dict[int, int] = 0   # streams written to the console and the log
    redirects: int | dict[int, int] = 0  # streams written to the log only
    local_ranks_filter: frozenset[int] | None = None  # None: every rank's output on the console
    env: dict[str, str] = field(default_factory=dict)  # set for every rank (-x NAME=VALUE)


def _nproc_value(text: str) -> int | str:
    if text.strip().lower() in ("auto", "cpu"):
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid int value: {text!r} (a number of ranks, or 'auto' for one per usable core)"
        ) from None


def _export_value(text: str) -> tuple[str, str | None]:
    """mpirun's ``-x NAME`` or ``-x NAME=VALUE``: (NAME, VALUE or None)."""
    name, eq, value = text.partition("=")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected NAME or NAME=VALUE")
    return name, value if eq else None


def _streams_value(text: str) -> int | dict[int, int]:
    """torchrun's stream selector: ``3`` for every local rank, or ``0:1,1:2`` per local rank."""
    bad = argparse.ArgumentTypeError(
        f"invalid value {text!r}: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or "
        f"LOCAL_RANK:VALUE pairs such as 0:3,1:2")
    try:
        if ":" not in text:
            value = int(text)
            if not 0 <= value <= 3:
                raise bad
            return value
        spec: dict[int, int] = {}
        for item in text.split(","):
            rank, value = (int(x) for x in item.split(":"))
            if rank < 0 or not 0 <= value <= 3 or rank in spec:
                raise bad
            spec[rank] = value
        return spec
    except ValueError:
        raise bad from None


def _ranks_value(text: str) -> frozenset[int]:
    try:
        ranks = frozenset(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: expected local ranks separated by commas, such as 0,2") from None
    if any(r < 0 for r in ranks):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: local ranks are >= 0")
    return ranks


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} -n N|auto [options] (script.py | -m module | program) [args...]",
        description="Run N local ranks of a program for shmcomm or torch.distributed "
                    "(torchrun-compatible environment and spellings).",
        epilog="Everything after the script, module or program is passed to it untouched.",
        allow_abbrev=False,  # the hand-made split below must know every spelling of an option
    )
    parser.add_argument("-n", "-np", "--nproc", "--nproc-per-node", "--nproc_per_node", dest="nproc",
                        type=_nproc_value, metavar="N", required=True,
                        help="number of ranks to start on this node; 'auto': one per usable core")
    parser.add_argument("--oversubscribe", action="store_true",
                        help="accepted as mpirun takes it; shmrun never refuses more ranks than "
                             "cores")
    parser.add_argument("--allow-run-as-root", action="store_true",
                        help="accepted as mpirun takes it; shmrun runs as any user")
    parser.add_argument("-x", dest="export", type=_export_value, action="append", default=[],
                        metavar="NAME[=VALUE]",
                        help="set NAME=VALUE for every rank (mpirun's); a bare NAME passes this "
                             "shell's value on, as every variable is anyway")
    parser.add_argument("--no-python", "--no_python", dest="no_python", action="store_true",
                        help="run script.py as a program (by its #! line), not under this Python "
                             "(torchrun's)")
    parser.add_argument("--standalone", action="store_true",
                        help="one node on localhost with a free port (torchrun's spelling; the "
                             "default without --nnodes)")
    parser.add_argument("--bind-to", choices=_BIND_KINDS, default="none",
                        help="pin rank r to usable core r mod #cores ('core'), or to all usable "
                             "cores of NUMA node / socket r mod #nodes (default: none)")
    parser.add_argument("--report-bindings", action="store_true",
                        help="print each rank's CPU set when it starts")
    parser.add_argument("--no-prefix", dest="prefix", action="store_false",
                        help="do not prefix output lines with [rank]")
    parser.add_argument("--tag-output", dest="prefix", action="store_const", const=True,
                        default=True,
                        help="prefix output lines with [rank] (mpirun's spelling; the default)")
    parser.add_argument("--timestamp-output", dest="timestamp", action="store_true",
                        help="prefix output lines with the time they were shown")
    parser.add_argument("--local-ranks-filter", "--local_ranks_filter", dest="local_ranks_filter",
                        type=_ranks_value, metavar="RANKS",
                        help="show only these local ranks' output on the console, e.g. 0,2 (log "
                             "files still get every rank's)")
    parser.add_argument("--log-dir", "--log_dir", dest="log_dir", metavar="DIR",
                        help="also write each rank's output to "
                             "DIR/<run id>/attempt_<k>/rank<r>.out and .err")
    parser.add_argument("-r", "--redirects", type=_streams_value, default=0, metavar="STREAMS",
                        help="with --log-dir: write these streams to the log only, not the console "
                             "(1 stdout, 2 stderr, 3 both, or per local rank: 0:3,1:2)")
    parser.add_argument("-t", "--tee", type=_streams_value, default=0, metavar="STREAMS",
                        help="with --log-dir: write these streams to the console and the log (as "
                             "--log-dir does for every stream not redirected); wins over "
                             "--redirects")
    parser.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", type=int,
                        default=0, metavar="K",
                        help="restart the whole job up to K times after a failure (default: 0)")
    parser.add_argument("--grace", type=float, default=5.0, metavar="SECONDS",
                        help="time between SIGTERM and SIGKILL when stopping ranks (default: 5)")
    parser.add_argument("--nnodes", type=int, default=1, metavar="M",
                        help="nodes in the job; each node runs shmrun with the same flags and its "
                             "--node-rank (default: 1)")
    parser.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=0,
                        metavar="K", help="this node's index in [0, M) (default: 0)")
    parser.add_argument("--master-addr", "--master_addr", dest="master_addr", default=None,
                        metavar="HOST", help="address of node 0 (default: 127.0.0.1)")
    parser.add_argument("--master-port", "--master_port", dest="master_port", type=int,
                        metavar="PORT", help="port of the job's store on node 0 (needed with "
                        "--nnodes); the launchers also use PORT+1 to stop every node when one fails")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def _split_argv(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """Split into (launcher options, module or None, program argv) without looking past the program."""
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return argv[:i], None, argv[i + 1:]
        if tok == "-m":
            if i + 1 >= len(argv):
                return argv[:i] + ["-m"], None, []  # reported as "-m needs a module name"
            return argv[:i], argv[i + 1], argv[i + 2:]
        if tok.startswith("-m") and not tok.startswith("--"):
            return argv[:i], tok[2:], argv[i + 1:]
        if not tok.startswith("-") or tok == "-":
            return argv[:i], None, argv[i:]
        name = tok.split("=", 1)[0]
        if name in _VALUED and "=" not in tok:
            i += 2
        else:
            i += 1  # -n4, a switch, --opt=value, or an unknown option argparse will reject
    return argv, None, []


def _stream_ranks(spec: int | dict[int, int]) -> set[int]:
    return set(spec) if isinstance(spec, dict) else set()


def parse_args(argv: list[str] | None = None) -> LaunchConfig:
    """Parse a ``shmrun`` command line; bad use prints a message and raises ``SystemExit(2)``.

    Example::

        >>> parse_args(["-n", "2", "-m", "http.server", "8000"]).command[1:]
        ['-m', 'http.server', '8000']
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    opts, module, program = _split_argv(argv)
    if opts and opts[-1] == "-m":
        parser.error("-m needs a module name")
    for tok in opts:
        name = tok.split("=", 1)[0]
        if name in _FOREIGN:
            whose, instead = _FOREIGN[name]
            parser.error(f"{name} is {whose}'s; shmrun does not take it: {instead}")
    ns = parser.parse_args(opts)
    if ns.nproc == "auto":
        ns.nproc = len(usable_cores())
    if ns.nproc < 1:
        parser.error(f"-n must be at least 1, got {ns.nproc}")
    if ns.max_restarts < 0:
        parser.error(f"--max-restarts must be >= 0, got {ns.max_restarts}")
    if not ns.grace >= 0:  # also rejects nan
        parser.error(f"--grace must be >= 0 seconds, got {ns.grace}")
    if ns.standalone:
        if ns.nnodes > 1:
            parser.error(f"--standalone runs one node; it cannot be combined with --nnodes {ns.nnodes}")
        if ns.master_addr is not None or ns.master_port is not None:
            parser.error("--standalone uses a free port on 127.0.0.1; drop --master-addr and "
                         "--master-port, or drop --standalone")
    if ns.nnodes < 1 or not 0 <= ns.node_rank < ns.nnodes:
        parser.error(f"--node-rank must be in [0, --nnodes={ns.nnodes}), got {ns.node_rank}")
    if ns.nnodes > 1 and ns.master_port is None:
        parser.error("--nnodes needs --master-port (and --master-addr: node 0's address), the same "
                     "on every node")
    if ns.nnodes > 1 and ns.max_restarts:
        parser.error("--max-restarts works on one node only: a restart on several nodes would have "
                     "to restart every node together, which shmrun does not do")
    for flag, spec in (("--redirects", ns.redirects), ("--tee", ns.tee)):
        if ns.log_dir is None and (spec if isinstance(spec, int) else any(spec.values())):
            parser.error(f"{flag} needs --log-dir DIR: it selects the streams written to the log "
                         f"files there (shmrun has no default log directory)")
        beyond = sorted(r for r in _stream_ranks(spec) if r >= ns.nproc)
        if beyond:
            parser.error(f"{flag} names local rank(s) {beyond}, but -n is {ns.nproc}")
    if ns.local_ranks_filter is not None:
        beyond = sorted(r for r in ns.local_ranks_filter if r >= ns.nproc)
        if beyond:
            parser.error(f"--local-ranks-filter names local rank(s) {beyond}, but -n is {ns.nproc}")
    if module is not None:
        if not module:
            parser.error("-m needs a module name")
        if ns.no_python:
            parser.error("--no-python runs a program directly, so it cannot run a module (-m); "
                         "drop one of them")
        command = [sys.executable, "-m", module, *program]
    elif not program:
        parser.error("no program given: expected script.py, -m module, or a program")
    else:
        command = _resolve_program(parser, program, ns.no_python)
    return LaunchConfig(nproc=ns.nproc, command=command, bind_to=ns.bind_to, prefix=ns.prefix,
                        log_dir=ns.log_dir, max_restarts=ns.max_restarts, grace=ns.grace,
                        nnodes=ns.nnodes, node_rank=ns.node_rank,
                        master_addr=ns.master_addr or "127.0.0.1", master_port=ns.master_port,
                        timestamp=ns.timestamp, report_bindings=ns.report_bindings, tee=ns.tee,
                        redirects=ns.redirects, local_ranks_filter=ns.local_ranks_filter,
                        env={name: value for name, value in ns.export if value is not None})


def _resolve_program(parser: argparse.ArgumentParser, program: list[str],
                     no_python: bool = False) -> list[str]:
    # Checked here, once, so a typo is one clear message instead of N identical rank failures.
    target, args = program[0], program[1:]
    if target.endswith(".py") and not no_python:
        if not os.path.isfile(target):
            parser.error(f"script not found: {target}")
        return [sys.executable, target, *args]
    if os.sep in target:
        if not os.path.isfile(target):
            parser.error(f"program not found: {target}")
        if not os.access(target, os.X_OK):
            parser.error(f"program is not executable: {target}")
    elif shutil.which(target) is None:
        here = f" (./{target} for the one here)" if os.path.isfile(target) else ""
        parser.error(f"program not found on PATH: {target}{here}")
    return [target, *args]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for MASTER_PORT). It is released before rank 0 binds
    it; the window is tiny and torchrun does the same. Example::

        env["MASTER_PORT"] = str(free_port())
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _new_job_name() -> str:
    return f"{PROG}-{os.getpid()}-{secrets.token_hex(4)}"


def threads_per_rank(nranks: int, bind_to: str = "none") -> int:
    """``OMP_NUM_THREADS`` for ``nranks`` ranks sharing this process's cores: a rank pinned to
    one core gains nothing from more threads than that core. Example::

        env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(4)))
    """
    return 1 if bind_to == "core" else max(1, len(usable_cores()) // nranks)



def binding_plan(cfg: LaunchConfig) -> list[tuple[set[int], str]] | None:
    """Per local rank, the cores it is pinned to and where they are (``"core 3"``, ``"numa node
    0"``, ``"socket 1"``): rank r gets group r mod #groups of :func:`cpu_domains`. ``None`` for
    ``--bind-to none``. Example::

        binding_plan(parse_args(["-n", "2", "--bind-to", "core", "true"]))  # [({0}, 'core 0'), ({1}, 'core 1')]
    """
    if cfg.bind_to == "none":
        return None
    domains = cpu_domains(cfg.bind_to)
    what = {"core": "core", "numa": "numa node", "socket": "socket"}[cfg.bind_to]
    plan = []
    for r in range(cfg.nproc):
        ident, cpus = domains[r % len(domains)]
        plan.append((set(cpus), f"{what} {ident}"))
    return plan


def _threads(cfg: LaunchConfig, rank: int, plan: list[tuple[set[int], str]] | None) -> int:
    if plan is None or cfg.bind_to == "core":
        return threads_per_rank(cfg.nproc, cfg.bind_to)
    cpus, where = plan[rank]
    sharing = sum(1 for _, w in plan if w == where)
    return max(1, len(cpus) // sharing)


def rank_environment(cfg: LaunchConfig, rank: int, job: str, port: int, attempt: int = 0,
                     base: dict[str, str] | None = None, secret: str | None = None,
                     plan: list[tuple[set[int], str]] | None = None,
                     error_path: str | None = None) -> dict[str, str]:
    """The environment of ``rank``: ``base`` (default ``os.environ``) plus the torchrun variables
    and, when given, the job's ``SHMCOMM_SECRET`` (one per attempt; see shmcomm.trust) and the
    rank's ``TORCHELASTIC_ERROR_FILE`` (see shmcomm.error_file). ``plan`` is
    :func:`binding_plan`'s (computed when omitted), for ``OMP_NUM_THREADS``.

    Example::

        env = rank_environment(parse_args(["-n", "2", "true"]), 1, "job-1", 29500)
        env["RANK"], env["WORLD_SIZE"], env["SHMCOMM_JOB"]  # '1', '2', 'job-1'
    """
    env = dict(os.environ if base is None else base)
    env.update(cfg.env)
    n = cfg.nproc
    world, global_rank = n * cfg.nnodes, cfg.node_rank * n + rank  # ``rank`` is the local rank
    env.update({
        "RANK": str(global_rank), "LOCAL_RANK": str(rank), "GROUP_RANK": str(cfg.node_rank),
        "ROLE_RANK": str(global_rank), "ROLE_NAME": "default", "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(n), "GROUP_WORLD_SIZE": str(cfg.nnodes), "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": cfg.master_addr, "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": job, "TORCHELASTIC_RESTART_COUNT": str(attempt),
        "TORCHELASTIC_MAX_RESTARTS": str(cfg.max_restarts),
        # torch's env:// would otherwise wait for an agent-hosted store that shmrun does not run
        # (this matters when shmrun itself is started by torchrun).
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "SHMCOMM_JOB": job,
    })
    if secret is not None:
        env[trust.SECRET_ENV] = secret
    env.pop(error_file.ENV, None)  # an outer launcher's file, not ours
    if error_path is not None:
        env[error_file.ENV] = error_path
    if "OMP_NUM_THREADS" not in env:
        if plan is None and cfg.bind_to in ("numa", "socket"):
            plan = binding_plan(cfg)
        env["OMP_NUM_THREADS"] = str(_threads(cfg, rank, plan))
    env.setdefault("PYTHONUNBUFFERED", "1")  # otherwise Python ranks' output arrives in bursts
    # torch's CPU allocator then backs tensors of 2 MiB and more with huge pages (numpy does so by
    # default). Every large collective touches each page of its tensors, and single-copy reads
    # pin each page of the peer's: with 4 KiB pages that took about 40% of a 32 MiB all_reduce of
    # torch tensors on two ranks (3.9 ms against 2.3, bench_torch_backend.py).
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    return env


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass
class _Rank:
    rank: int
    proc: subprocess.Popen
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    stderr_shown: bool = True       # its stderr went to the console as it came
    stderr_log: str | None = None   # the log file of its stderr, if any
    error_path: str = ""            # its TORCHELASTIC_ERROR_FILE
    fallout: str | None = None      # failed only because a peer did: its exception's first line

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode


@dataclass
class _Outcome:
    code: int
    failed: _Rank | None = None
    launcher_signal: int | None = None
    stopped: list[int] = field(default_factory=list)  # ranks still running when the job was stopped
    remote: Failure | None = None  # the failure on another node that stopped this one
    fallout: list[_Rank] = field(default_factory=list)  # failed before ``failed``, because of it


def _streams_of(spec: int | dict[int, int], rank: int) -> int:
    return spec if isinstance(spec, int) else spec.get(rank, 0)


def _on_console(cfg: LaunchConfig, rank: int, fd: int) -> bool:
    """Whether stream ``fd`` (1 stdout, 2 stderr) of local rank ``rank`` is shown on the console."""
    if cfg.local_ranks_filter is not None and rank not in cfg.local_ranks_filter:
        return False
    redirected = _streams_of(cfg.redirects, rank) & ~_streams_of(cfg.tee, rank)
    return not redirected & fd


def _who(cfg: LaunchConfig, rank: int) -> str:
    if cfg.nnodes > 1:  # the global rank the program knows, and this node's local one
        return f"rank {cfg.node_rank * cfg.nproc + rank} (local rank {rank})"
    return f"rank {rank}"


class _Supervisor:
    """Runs one attempt of the job: spawn, pump output, watch exits, stop, clean up."""

    def __init__(self, cfg: LaunchConfig, console: _Console, logs: dict, wakeup_r: int,
                 pending_signals: list[int], attempt: int, link: NodeLink | None = None) -> None:
        self.cfg, self.console, self.logs, self.link = cfg, console, logs, link
        self.remote: Failure | None = None
        self.wakeup_r, self.pending = wakeup_r, pending_signals
        self.attempt = attempt
        # one job name on every node (the numpy API meets there under it); one node: unique
        self.job = _new_job_name() if cfg.nnodes == 1 else f"shmrun-{cfg.master_port}-{attempt}"
        self.secret = trust.new_secret()  # a straggler of an earlier attempt cannot join this one
        self.ranks: list[_Rank] = []
        self.sel = selectors.DefaultSelector()
        self.streams: dict[int, _Stream] = {}
        self.failed: _Rank | None = None  # the root cause, once chosen
        self.failures: list[_Rank] = []   # failed ranks in the order they exited, till then
        self.blame_by: float | None = None  # when to blame the first failure, for want of a cause
        self.error_dir = tempfile.mkdtemp(prefix="shmrun-errors-")  # mode 0700
        self.stopped: list[int] = []
        self.launcher_signal: int | None = None
        self.kill_at: float | None = None  # when the SIGTERMed ranks get SIGKILL
        self.killed = False

    # -- start -------------------------------------------------------------------------------
    def spawn(self) -> int | None:
        """Start every rank; returns an exit code when one could not even be started."""
        port = self.cfg.master_port or free_port()
        plan = binding_plan(self.cfg)
        self.sel.register(self.wakeup_r, selectors.EVENT_READ, None)
        for r in range(self.cfg.nproc):
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
                    self.console.say(f"{_who(self.cfg, r)} (pid {proc.pid}) not bound: cpus "
                                     f"{format_cpulist(usable_cores())}")
                else:
                    self.console.say(f"{_who(self.cfg, r)} (pid {proc.pid}) bound to {plan[r][1]}: "
                                     f"cpus {format_cpulist(plan[r][0])}")
            err_log = self.logs.get((r, 2))
            rk = _Rank(r, proc, stderr_shown=_on_console(self.cfg, r, 2),
                       stderr_log=err_log.path if err_log is not None else None,
                       error_path=error_path)
            self.ranks.append(rk)
            prefix = f"[{r}] ".encode() if self.cfg.prefix else b""
            for pipe, fd, tail in ((proc.stdout, 1, None), (proc.stderr, 2, rk.tail)):
                stream = _Stream(self.console, fd, prefix, self.logs.get((r, fd)), tail,
                                 show=_on_console(self.cfg, r, fd), timestamp=self.cfg.timestamp)
                self.streams[pipe.fileno()] = stream
                self.sel.register(pipe.fileno(), selectors.EVENT_READ, pipe)
        return None

    # -- main loop ---------------------------------------------------------------------------
    def run(self) -> _Outcome:
        """Supervise until every rank has exited; returns the attempt's outcome."""
        try:
            return self._run()
        finally:
            shutil.rmtree(self.error_dir, ignore_errors=True)

    def _run(self) -> _Outcome:
        code = self.spawn()
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
            return _Outcome(code)
        if self.remote is not None:
            return _Outcome(self.remote.code, None, None, self.stopped, self.remote)
        if self.failed is not None:
            return _Outcome(_exit_code(self.failed.returncode), self.failed, self.launcher_signal,
                            self.stopped, fallout=self.failures[:self.failures.index(self.failed)])
        if self.launcher_signal is not None:
            return _Outcome(128 + self.launcher_signal, None, self.launcher_signal)
        return _Outcome(0)

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
                self.console.say(f"received {_signal_name(signum)}, stopping {self.cfg.nproc} rank(s)")
                self.stop(signum)  # forward the same signal: SIGINT reaches Python ranks as Ctrl-C
            elif not self.killed:
                self.launcher_signal = self.launcher_signal or signum
                self.console.say(f"received {_signal_name(signum)} again, killing every rank")
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

    def _blame(self, rk: _Rank) -> None:
        """``rk`` is the root cause: stop the others, and tell the other nodes."""
        self.failed = rk
        self.stop(signal.SIGTERM)
        if self.link is not None:
            rank = self.cfg.node_rank * self.cfg.nproc + rk.rank
            self.link.report_failure(_exit_code(rk.returncode),
                                     f"rank {rank} (pid {rk.proc.pid}) on node "
                                     f"{self.cfg.node_rank} failed with {_how(rk.returncode)}")

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
        for proc in _descendants():
            try:
                proc.send_signal(signum)
            except psutil.Error:
                pass
        for rk in self.ranks:
            _killpg(rk.proc.pid, signum)

    def _sweep_leftovers(self) -> None:
        # Ranks are gone; what remains are their children (daemons, orphans in their groups, or
        # reparented to us as subreaper). They get the same SIGTERM, grace, SIGKILL treatment,
        # polled here while their output is pumped (see stop() for why not psutil.wait_procs).
        rank_pids = {rk.proc.pid for rk in self.ranks}
        kill_at = time.monotonic() + (0.0 if self.killed else self.cfg.grace)
        give_up = kill_at + 10.0  # only a process stuck in the kernel survives SIGKILL that long
        signalled: dict[int, int] = {}  # pid or -pgid -> last signal sent
        while True:
            _reap_orphans(rank_pids)
            targets = {p.pid: p for p in _descendants() if _running(p)}
            targets.update({-pgid: None for pgid in rank_pids if _group_alive(pgid)})
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
                    _killpg(-key, signum)
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


def _descendants() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """True when a live (non-zombie) process is still in group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    # killpg(0) also succeeds for zombies, which cannot run anymore: look closer.
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and _running(p):
                return True
        except (OSError, psutil.Error):
            continue
    return False


def _reap_orphans(rank_pids: set[int]) -> None:
    # Orphans reparented to us (subreaper) become our zombies; Popen reaps only the ranks.
    try:
        orphans = [p for p in psutil.Process().children() if p.pid not in rank_pids]
    except psutil.Error:
        return
    psutil.wait_procs(orphans, timeout=0)   # reaps those that have exited, waits for none


def _become_subreaper() -> None:
    # Grandchildren whose rank died are reparented to us instead of init, so the final sweep can
    # still find (and reap) them even when they left the rank's process group.
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class _Log:
    """One rank's log file of one stream: the raw bytes, written as they come."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file = os.fdopen(trust.open_private_output(path, "log file"), "wb")

    def write(self, data: bytes) -> None:
        self.file.write(data)

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _make_run_dir(cfg: LaunchConfig) -> str:
    """DIR/<run id>: a new private directory for this invocation of shmrun (never an earlier
    run's), named by its start time and pid (and node on several nodes)."""
    os.makedirs(cfg.log_dir, exist_ok=True)
    base = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    if cfg.nnodes > 1:
        base += f"-node{cfg.node_rank}"
    for i in range(1000):
        path = os.path.join(cfg.log_dir, base if i == 0 else f"{base}.{i}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue  # an earlier run (or anything else) has that name: never reuse it
        return path
    raise FileExistsError(errno.EEXIST, f"no free run directory name under {cfg.log_dir}")


def _open_logs(cfg: LaunchConfig, run_dir: str | None, attempt: int) -> dict:
    logs: dict = {}
    if run_dir is None:
        return logs
    attempt_dir = os.path.join(run_dir, f"attempt_{attempt}")
    os.mkdir(attempt_dir, 0o700)
    try:
        for r in range(cfg.nproc):
            for fd, ext in ((1, "out"), (2, "err")):
                logs[(r, fd)] = _Log(os.path.join(attempt_dir, f"rank{r}.{ext}"))
    except BaseException:
        for f in logs.values():
            f.close()
        raise
    return logs


def _exit_code(returncode: int) -> int:
    """shmrun's exit code for a rank's: the same, or 128 + signal for a signal."""
    return returncode if returncode > 0 else 128 - returncode


def _how(returncode: int) -> str:
    return (f"exit code {returncode}" if returncode > 0
            else f"signal {_signal_name(-returncode)} ({-returncode})")


def _summarize(console: _Console, outcome: _Outcome, cfg: LaunchConfig) -> None:
    if outcome.remote is not None:
        f = outcome.remote
        stopped = f": stopped rank(s) {', '.join(map(str, outcome.stopped))}" if outcome.stopped else ""
        console.say(f"the job failed on node {f.node} ({f.text}){stopped}; exiting with {outcome.code}")
        return
    rk = outcome.failed
    if rk is None:
        return
    console.say(f"{_who(cfg, rk.rank)} (pid {rk.proc.pid}) failed with {_how(rk.returncode)}")
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


def launch(cfg: LaunchConfig) -> int:
    """Run the job described by ``cfg`` to its end and return ``shmrun``'s exit code.

    Installs handlers for SIGINT/SIGTERM/SIGHUP (forwarded to the ranks) and SIGCHLD for the
    duration, so it must run in the main thread. Example::

        code = launch(parse_args(["-n", "2", "worker.py"]))
    """
    return run_job(cfg).code


def run_job(cfg: LaunchConfig) -> _Outcome:
    """``launch``, returning the whole outcome: the exit code, the failed rank (its ``rank``
    and ``returncode``) and the signal that stopped the launcher, if any. Example::

        outcome = run_job(parse_args(["-n", "2", "worker.py"]))
        if outcome.failed is not None: print(outcome.failed.rank)
    """
    console = _Console()
    run_dir = None
    if cfg.log_dir is not None:
        run_dir = _make_run_dir(cfg)
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
            logs = _open_logs(cfg, run_dir, attempt)
            try:
                outcome = _Supervisor(cfg, console, logs, wakeup_r, pending, attempt, link).run()
            finally:
                for f in logs.values():
                    f.close()
            if link is not None:
                link.finish(ok=outcome.code == 0)
                for notice in link.take_notices():
                    console.say(notice)
                if outcome.code == 0 and link.news:  # a node failed after this one's ranks ended
                    outcome = _Outcome(link.news[0].code, remote=link.news[0])
            if cfg.summary:
                _summarize(console, outcome, cfg)
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
    _become_subreaper()
    try:
        return launch(cfg)
    except OSError as e:
        if e.errno == errno.EPIPE:
            return 1
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
