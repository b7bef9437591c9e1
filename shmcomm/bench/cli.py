"""Command line: argument types, the parser and its cross-checks (which dtype/op/root combinations
run), ``run`` (sweep every backend, print and write the reports) and ``main`` (also the entry of
the worker processes)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import traceback

import shmcomm
from shmcomm.cpus import usable_cores

from .cases import ANY, OP_ALIASES, OPS, Case, expand, steps
from .common import BACKENDS, COLLECTIVES, EXIT_USAGE, PROG, BenchError
from .dtypes import NAMES as DTYPE_NAMES, canonical as canonical_dtype, unavailable
from .measure import _worker_main
from .plot import import_pyplot, write_plot
from .progress import Progress
from .report import _records, format_ratios, format_skips, format_table, write_csv, write_json
from .runner import backend_cases, run_backends
from .sizes import format_size, parse_size, sweep_sizes

ALL = "all"


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _names_arg(what: str, names, spell):
    """An argparse type: a comma list of ``names`` (``spell`` maps aliases) or ``all``, in order,
    once each."""
    def parse(text: str) -> list[str]:
        out = []
        for part in text.split(","):
            name = ALL if part.strip().lower() == ALL else spell(part)
            if name is None:
                raise argparse.ArgumentTypeError(f"unknown {what} {part.strip()!r}; choose from all, "
                                                 f"{', '.join(names)}")
            if name not in out:
                out.append(name)
        return out
    return parse


def _spell_op(text: str) -> str | None:
    name = OP_ALIASES.get(text.strip().lower(), text.strip().lower())
    return name if name in OPS else None


def _root_arg(text: str) -> list:
    if text.strip().lower() == ALL:
        return [ALL]
    try:
        roots = [int(part) for part in text.split(",")]
    except ValueError:
        roots = [-1]
    if min(roots) < 0:
        raise argparse.ArgumentTypeError(f"expected ranks (integers >= 0, comma-separated) or all, got {text!r}")
    return list(dict.fromkeys(roots))


def _backends_arg(text: str) -> list[str]:
    names = [b.strip().lower() for b in text.split(",") if b.strip()]
    bad = [b for b in names if b not in BACKENDS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown backend(s) {', '.join(bad) or repr(text)}; "
                                         f"choose from {', '.join(BACKENDS)}")
    return list(dict.fromkeys(names))  # keep order, drop repeats


def _collective_arg(text: str) -> str:
    name = text.strip().lower().replace("-", "_")
    name = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
            "alltoall": "all_to_all", "sendrecv": "send_recv", "bcast": "broadcast"}.get(name, name)
    if name != ALL and name not in COLLECTIVES:
        raise argparse.ArgumentTypeError(f"unknown collective {text!r}; choose from all, "
                                         f"{', '.join(COLLECTIVES)}")
    return name


def _int_at_least(minimum: int, what: str):
    """An argparse type accepting integers >= ``minimum``; errors say ``expected <what>``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return parse


_positive_int = _int_at_least(1, "a positive integer")
_nonneg_int = _int_at_least(0, "an integer >= 0")


def build_parser() -> argparse.ArgumentParser:
    """The ``shmcomm-bench`` argument parser (see the package docstring for examples).

    Example::

        build_parser().print_help()
    """
    p = argparse.ArgumentParser(
        prog=PROG, description="Sweep message sizes for shmcomm's collectives (nccl-tests columns), "
        "optionally against torch.distributed gloo and MPI measured in the same run.",
        epilog="Every iteration is timed; its time is the slowest rank's. Rows show the median "
        "(time), min and p90 over iterations. Sizes take K/M/G (x1024).")
    p.add_argument("--version", action="version", version=f"{PROG} {shmcomm.__version__}")
    p.add_argument("collective", type=_collective_arg, metavar="COLLECTIVE|all",
                   help=f"one of: {', '.join(COLLECTIVES)}; or all")
    p.add_argument("-n", "--nranks", type=_positive_int, required=True, help="number of ranks")
    p.add_argument("-b", "--minbytes", type=_size_arg, default=8, help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", type=_size_arg, default=64 << 20, help="largest size (default 64M)")
    p.add_argument("-f", "--stepfactor", type=float, default=2.0, help="size multiplier (default 2)")
    p.add_argument("--dtype", type=_names_arg("dtype", DTYPE_NAMES, canonical_dtype), default=["float32"],
                   help=f"one, a comma list, or all (default float32): {', '.join(DTYPE_NAMES)}")
    p.add_argument("--op", type=_names_arg("op", OPS, _spell_op), default=["sum"],
                   help=f"reduction of all_reduce, reduce, reduce_scatter: one, a comma list, or all "
                   f"(default sum): {', '.join(OPS)}")
    p.add_argument("--root", type=_root_arg, default=[0],
                   help="root rank of broadcast, reduce, gather, scatter: one, a comma list, or all "
                   "(default 0)")
    p.add_argument("--iters", type=_positive_int, default=None,
                   help="timed iterations per size (default: about --target-time seconds' worth)")
    p.add_argument("--warmup", type=_nonneg_int, default=None,
                   help="untimed iterations before timing (default: a tenth of the iterations)")
    p.add_argument("--target-time", type=float, default=0.1, metavar="SECONDS",
                   help="aim of the automatic iteration count, per size and variant (default 0.1)")
    p.add_argument("--backend", type=_backends_arg, default=["shmcomm"],
                   help="comma-separated: shmcomm,gloo,mpi (default shmcomm)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--serial", action="store_true",
                      help="run the backends one after another, each alone (the default when ranks x "
                      "backends exceed the cores)")
    mode.add_argument("--interleave", action="store_true",
                      help="start every backend at once; they take turns size by size (the default "
                      "otherwise)")
    p.add_argument("--rounds", type=_positive_int, default=1,
                   help="measure every size this many times per backend, the backends alternating, "
                   "and report the round with the best median (default 1)")
    p.add_argument("--zero-copy", action="store_true", help="shmcomm buffers from sc.empty (shared memory)")
    p.add_argument("--check", action="store_true",
                   help="verify every result against a numpy reference (#wrong column)")
    p.add_argument("--json", metavar="FILE", help="write every row of every backend as JSON")
    p.add_argument("--csv", metavar="FILE", help="write every row of every backend as CSV")
    p.add_argument("--plot", metavar="FILE.png",
                   help="time and busbw against size, median and min-p90 band (needs matplotlib)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="stop a backend that finishes no size for this long (default 300)")
    p.add_argument("--mpirun-args", default="", metavar="ARGS",
                   help="extra mpirun arguments, e.g. \"--bind-to none\"")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return p


def _plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Expand ``all`` and check the combinations: sets ``collectives``, ``cases`` and ``skipped``
    on ``args``. In an ``all`` sweep invalid combinations are skipped with their reason; asked for
    by name, they are an error."""
    n = args.nranks
    args.collectives = list(COLLECTIVES) if args.collective == ALL else [args.collective]
    sweep_all = ALL in args.dtype or ALL in args.op
    names = list(DTYPE_NAMES) if ALL in args.dtype else args.dtype
    ops = list(OPS) if ALL in args.op else args.op
    roots = list(range(n)) if ALL in args.root else args.root
    if max(roots) >= n:
        parser.error(f"--root {max(roots)} is not a rank of {n} (0 to {n - 1})")
    held = [d for d in names if unavailable(d) is None]
    if ALL not in args.dtype and len(held) < len(names):
        parser.error(f"--dtype: {unavailable(next(d for d in names if d not in held))}")
    cases, skipped = expand(args.collectives, held, ops, roots, n)
    invalid = [(c, why) for c, why in skipped if c.dtype != ANY]
    if invalid and not sweep_all:
        case, why = invalid[0]
        parser.error(f"--op {case.op} does not apply to --dtype {case.dtype}: {why} (a sweep with "
                     f"--op all or --dtype all skips such pairs)")
    if not cases:
        parser.error("nothing to run: " + "; ".join(dict.fromkeys(why for _, why in skipped)))
    # the dtypes this Python cannot hold: skips of every backend
    skipped += [(Case(ALL, d, "none", -1), unavailable(d)) for d in names if d not in held]
    args.cases, args.skipped = cases, skipped
    args.dtypes, args.ops, args.roots = held, ops, roots
    args.serial, args.mode = _mode(args)


def _mode(args: argparse.Namespace) -> tuple[bool, str]:
    """Whether the backends run one after another, and the header's words for how they ran."""
    running = [b for b in args.backend if backend_cases(b, args.cases)[0]]
    if len(running) < 2:
        return True, f"backend {running[0]} alone" if running else "no backend can run"
    cores = len(usable_cores())
    crowded = args.nranks * len(running) > cores
    why = ("--serial" if args.serial else "--interleave" if args.interleave else
           f"default for {args.nranks} ranks x {len(running)} backends {'>' if crowded else '<='} {cores} cores")
    serial = args.serial or (crowded and not args.interleave)
    if serial:
        return True, f"backends one after another, each alone ({why})"
    return False, f"backends at once, taking turns size by size ({why})"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the command line; exits with status 2 and a message when invalid.

    Example::

        args = parse_args(["all_reduce", "-n", "2", "-b", "8", "-e", "1M", "--dtype", "all"])
        len(args.cases), args.skipped[0]
    """
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.argv = argv
    if args.minbytes < 1:
        parser.error("-b/--minbytes must be at least 1 byte")
    if args.minbytes > args.maxbytes:
        parser.error(f"-b/--minbytes ({format_size(args.minbytes)}) must not exceed "
                     f"-e/--maxbytes ({format_size(args.maxbytes)})")
    if not args.stepfactor > 1:
        parser.error(f"-f/--stepfactor must be greater than 1, got {args.stepfactor:g}")
    if not args.target_time > 0 or not args.timeout > 0:
        parser.error("--target-time and --timeout must be positive")
    _plan(args, parser)
    if args.plot:
        try:
            import_pyplot()
        except BenchError as exc:  # say so now, not after a long sweep
            parser.error(str(exc))
    return args


def _config(args) -> dict:
    return {"cases": [list(c) for c in args.cases],
            "sizes": sweep_sizes(args.minbytes, args.maxbytes, args.stepfactor),
            "iters": args.iters, "warmup": args.warmup, "target_time": args.target_time,
            "zero_copy": args.zero_copy, "check": args.check, "timeout": args.timeout, "rounds": args.rounds}


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


UNSTEADY = 3.0  # rows whose p90 / min exceed this are flagged under their table


def _busy_warning(load: float | None, when: str) -> str | None:
    """A warning when other work held more than the cores (load average above their count)."""
    cores = len(usable_cores())
    if load is None or load <= cores:
        return None
    return (f"WARNING: load average {load:.1f} {when} on {cores} cores: other work is running, and "
            "every time here is slower than this machine can do (the peers' too, unevenly)")


def _unsteady_rows(records: list[dict], backend: str, collective: str) -> str | None:
    """The rows of one table whose spread says the machine was busy during them."""
    wild = [f"{format_size(r['size'])} {'ip' if r['variant'] == 'in-place' else 'oop'} "
            f"(p90/min {r['p90_us'] / r['min_us']:.1f})"
            for r in records if r["backend"] == backend and r["collective"] == collective
            and r.get("min_us") and r.get("p90_us") and r["p90_us"] / r["min_us"] > UNSTEADY]
    if not wild:
        return None
    return (f"# unsteady (p90/min > {UNSTEADY:g}: something else ran, or the machine changed state): "
            + ", ".join(wild))


def _load_text(load: float | None) -> str:
    return "unknown" if load is None else f"{load:.2f}"


def _one_or_list(values: list):
    return values[0] if len(values) == 1 else values


def _preamble(args, cfg: dict) -> list[str]:
    """What ran and how to read the numbers, above the tables (as nccl-tests prints its setup)."""
    sizes = cfg["sizes"]
    span = f"size {format_size(sizes[0])}" if len(sizes) == 1 else \
        f"sizes {format_size(sizes[0])} to {format_size(sizes[-1])}, x{args.stepfactor:g}"
    iters = f"{args.iters} iters" if args.iters else f"auto iters (~{args.target_time:g} s per size)"
    iters += f", {args.warmup} warmup" if args.warmup is not None else ""
    if args.rounds > 1:
        iters += f", best median of {args.rounds} rounds"
    return [f"# {PROG} {shmcomm.__version__} | {args.nranks} ranks on {len(usable_cores())} cores "
            f"({platform.machine()}) | {span} | dtype {','.join(args.dtypes)} | op {','.join(args.ops)} | "
            f"root {','.join(map(str, args.roots))} | {iters} | check {'on' if args.check else 'off'}",
            f"# {args.mode}",
            "# time: each iteration is timed on every rank and takes the slowest rank's time; "
            "'time' is the median over iterations, 'min' and 'p90' the fastest and the 90th "
            "percentile; algbw and busbw use the median"]


def _header(res, args, collective: str) -> str:
    """The title line above one backend's table of one collective."""
    version = ", ".join(f"{k} {v}" if k != "mpi" else v for k, v in res.versions.items())
    mode = ""
    if res.backend == "shmcomm":
        mode = ", zero-copy (sc.empty)" if args.zero_copy else ", numpy buffers (copy)"
    return f"# {PROG} {collective} | backend {res.backend} ({version}{mode}) | {args.nranks} ranks"


def run(args: argparse.Namespace, out=None) -> int:
    """Run the parsed command: sweep every backend, print tables and ratios, write the files.

    Returns the exit status: 0, or 1 if a backend failed or ``--check`` found wrong elements.
    Example::

        sys.exit(run(parse_args(["barrier", "-n", "2"])))
    """
    out = out or sys.stdout
    cfg = _config(args)
    total = sum(len(steps(backend_cases(b, args.cases)[0], cfg["sizes"], args.nranks, args.rounds))
                for b in args.backend)
    progress = Progress(total, enabled=not args.quiet)
    progress.start(f"{', '.join(args.collectives) if len(args.collectives) < 3 else 'all collectives'} "
                   f"on {', '.join(args.backend)}")
    load_before = _loadavg()
    busy = _busy_warning(load_before, "before the run")
    if busy:
        print(f"{PROG}: {busy}", file=sys.stderr)
    try:
        results = run_backends(args.backend, args.nranks, cfg, progress, args.timeout,
                               shlex.split(args.mpirun_args), serial=args.serial)
    except KeyboardInterrupt:
        results = None
    progress.finish()
    if results is None:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    load_after = _loadavg()
    records = _records(results, args.nranks, cfg)
    status = _print_report(args, cfg, results, records, (load_before, load_after), out)
    meta = {"tool": PROG, "version": shmcomm.__version__, "argv": getattr(args, "argv", None),
            "nranks": args.nranks, "cores": len(usable_cores()), "collectives": args.collectives,
            "sizes": cfg["sizes"], "dtype": _one_or_list(args.dtypes), "op": _one_or_list(args.ops),
            "root": _one_or_list(args.roots), "iters": args.iters, "warmup": args.warmup,
            "target_time": args.target_time, "rounds": args.rounds, "mode": args.mode,
            "serial": args.serial, "zero_copy": args.zero_copy,
            "check": args.check, "time": "time_us: median over iterations of the slowest rank's time; "
            "min_us, p90_us: minimum and 90th percentile of the same", "loadavg_before": load_before,
            "loadavg_after": load_after, "python": platform.python_version(), "machine": platform.machine(),
            "date": datetime.datetime.now().isoformat(timespec="seconds")}
    if args.json:
        write_json(args.json, meta, results, records, args.skipped)
    if args.csv:
        write_csv(args.csv, records)
    if args.plot:
        try:
            write_plot(args.plot, records, args.collectives,
                       f"{PROG}: {args.nranks} ranks, {', '.join(args.dtypes)}, op {', '.join(args.ops)}",
                       f"shmcomm {shmcomm.__version__} | {meta['date'].replace('T', ' ')} | "
                       f"{platform.machine()}, {meta['cores']} cores, {args.nranks} ranks | "
                       f"{'backends one after another' if args.serial else 'backends taking turns'} | "
                       f"load {_load_text(load_before)} before, {_load_text(load_after)} after | "
                       f"line: median, band: min to p90")
        except BenchError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            status = status or 1
    return status


def _print_report(args, cfg, results, records, loads, out) -> int:
    """Print the preamble, skips, tables, check summary, load and ratios; returns the exit status."""
    status = 0
    lines = _preamble(args, cfg) + format_skips(args.skipped)
    for res in results:
        if res.status == "skipped":
            lines.append(f"# backend {res.backend}: skipped ({res.reason})")
        else:
            lines += format_skips(res.skipped, f"backend {res.backend}:")
        if res.status == "failed":
            status = 1
            lines.append(f"# backend {res.backend}: FAILED")
            lines += ["#   " + line for line in res.reason.splitlines()]
        lines += [f"# backend {res.backend}: warning: {w}" for w in res.warnings]
    ran = [res for res in results if res.rows]
    for coll in args.collectives:
        for res in ran:
            if any(r["collective"] == coll and r["backend"] == res.backend for r in records):
                lines += ["#", _header(res, args, coll), format_table(records, res.backend, coll)]
                unsteady = _unsteady_rows(records, res.backend, coll)
                if unsteady:
                    lines.append(unsteady)
    if args.check:
        wrong = sum(r["wrong"] or 0 for r in records)
        lines += ["#", f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}"]
        status = status or int(wrong > 0)
    if None not in loads:  # other work on the machine moves every number; say how busy it was
        lines += ["#", f"# load average (1 min) before: {loads[0]:.2f}, after: {loads[1]:.2f} "
                       f"on {len(usable_cores())} cores"]
        lines += [f"# {w}" for w in (_busy_warning(loads[0], "before the run"),
                                     _busy_warning(loads[1], "after it")) if w]
    peers = [res.backend for res in ran if res.backend != "shmcomm"]
    if peers and any(res.backend == "shmcomm" for res in ran):
        lines += ["#", format_ratios(records, args.collectives, peers)]
    print("\n".join(lines), file=out)
    return status


def _worker_config(text: str) -> dict:
    """The worker's --config: JSON, or ``@FILE`` holding it (what the parent passes)."""
    if text.startswith("@"):
        with open(text[1:]) as f:
            return json.load(f)
    return json.loads(text)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``shmcomm-bench`` and ``python -m shmcomm.bench``; returns the exit status.

    Example::

        main(["all_reduce", "-n", "2", "-b", "8", "-e", "1K", "--check"])
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--worker"]:  # internal: one rank of a sweep, started by run_backends
        if len(argv) != 4 or argv[2] != "--config":
            print(f"{PROG}: usage: --worker BACKEND --config JSON|@FILE", file=sys.stderr)
            return EXIT_USAGE
        try:
            return _worker_main(argv[1], _worker_config(argv[3]))
        except Exception:  # noqa: BLE001 - the parent shows this text as the failure reason
            traceback.print_exc()
            return 1
    try:
        return run(parse_args(argv))
    except BenchError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
