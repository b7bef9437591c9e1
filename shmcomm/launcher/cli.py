"""``shmrun``'s command line: argparse for the launcher's own options, a hand-made split that
leaves everything after the program untouched, torchrun's and mpirun's spellings (``-np``,
``--nproc_per_node``, ``--tag-output``, ``-x NAME=VALUE``, ``--no-python``...), and clear refusals
of other launchers' options that shmrun does not take::

    cfg = parse_args(["-n", "2", "--bind-to", "core", "train.py", "--lr", "0.1"])
    cfg.command   # [sys.executable, "train.py", "--lr", "0.1"]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys

from shmcomm import __version__
from shmcomm.launcher.config import PROG, LaunchConfig
from shmcomm.cpus import usable_cores
from shmcomm.launcher.environment import LAUNCHER_VARIABLES
from shmcomm.launcher.limits import MAX_RANKS, too_many_ranks

__all__ = ["parse_args"]

EXIT_USAGE = 2  # what argparse uses for bad command lines
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


def _nproc_value(text: str) -> int | str:
    """``-n``: a number of ranks, or ``"auto"`` (also torchrun's ``cpu``)."""
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
    """``--local-ranks-filter``: ``0,2`` -> {0, 2}."""
    try:
        ranks = frozenset(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: expected local ranks separated by commas, such as 0,2") from None
    if any(r < 0 for r in ranks):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: local ranks are >= 0")
    return ranks


def _build_parser() -> argparse.ArgumentParser:
    """The parser of the launcher's own options (the program's are split off before it runs)."""
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
                        help=f"number of ranks to start on this node, at most {MAX_RANKS} and "
                             f"what ulimit -u and -n allow (refused before any rank starts); "
                             f"'auto': one per usable core")
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
    """The local ranks a ``--tee``/``--redirects`` value names one by one."""
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
    too_many = too_many_ranks(ns.nproc)
    if too_many:
        parser.error(f"-n {ns.nproc} is too many: {too_many}")
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
    _warn_overridden_exports(ns.export)
    return LaunchConfig(nproc=ns.nproc, command=command, bind_to=ns.bind_to, prefix=ns.prefix,
                        log_dir=ns.log_dir, max_restarts=ns.max_restarts, grace=ns.grace,
                        nnodes=ns.nnodes, node_rank=ns.node_rank,
                        master_addr=ns.master_addr or "127.0.0.1", master_port=ns.master_port,
                        timestamp=ns.timestamp, report_bindings=ns.report_bindings, tee=ns.tee,
                        redirects=ns.redirects, local_ranks_filter=ns.local_ranks_filter,
                        env={name: value for name, value in ns.export if value is not None})


# What to do instead of -x NAME=VALUE for a variable shmrun sets itself.
_INSTEAD = {
    "SHMCOMM_JOB": "each run gets a job name of its own, so two jobs never meet; ranks started "
                   "without shmrun take init_process_group(name=...)",
    "SHMCOMM_SECRET": "shmrun makes one up per job",
    "RANK": "-n gives the ranks", "WORLD_SIZE": "-n gives the ranks (and --nnodes)",
    "LOCAL_WORLD_SIZE": "-n gives the ranks", "MASTER_ADDR": "give --master-addr",
    "MASTER_PORT": "give --master-port",
}


def _warn_overridden_exports(exports: list[tuple[str, str | None]]) -> None:
    """-x NAME=VALUE for a variable shmrun sets for every rank would be overridden without a word:
    say so on stderr, with what to do instead."""
    for name in dict.fromkeys(name for name, value in exports if value is not None):
        if name in LAUNCHER_VARIABLES:
            instead = _INSTEAD.get(name, "it is set as torchrun sets it")
            print(f"{PROG}: warning: -x {name}=... is not used: shmrun sets {name} for every rank "
                  f"({instead})", file=sys.stderr)


def _resolve_program(parser: argparse.ArgumentParser, program: list[str],
                     no_python: bool = False) -> list[str]:
    """The argv that runs ``program`` (a script under this Python, or an executable)."""
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
