"""Command line: argument types, the parser and its cross-checks, ``run`` (sweep every backend, print
and write the reports) and ``main`` (also the entry of the worker processes)."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shlex
import sys
import traceback

from .common import (BACKENDS, COLLECTIVES, EXIT_USAGE, PROG, _DTYPES, _OP_ALIASES, _OPS, BenchError,
                     _is_float, _numpy_dtype)
from .runner import run_backends
from shmcomm.launch import usable_cores
from .measure import _worker_main
from .report import (_header, _import_pyplot, _Progress, _records, format_ratios, format_table, write_csv,
                     write_json, write_plot)
from .sizes import collective_sizes, format_size, parse_size, sweep_sizes


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dtype_arg(text: str) -> list[str]:
    """A comma-separated list of dtype names or aliases -> canonical names, in order, once each."""
    names = []
    for part in text.split(","):
        name = part.strip().lower()
        canonical = next((c for c, aliases in _DTYPES.items() if name == c or name in aliases), None)
        if canonical is None:
            raise argparse.ArgumentTypeError(f"unknown dtype {part.strip()!r}; choose from {', '.join(_DTYPES)}")
        if canonical not in names:
            names.append(canonical)
    return names


def _op_arg(text: str) -> str:
    name = _OP_ALIASES.get(text.strip().lower(), text.strip().lower())
    if name not in _OPS:
        raise argparse.ArgumentTypeError(f"unknown op {text!r}; choose from {', '.join(_OPS)}")
    return name


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
    if name != "all" and name not in COLLECTIVES:
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
        epilog="Times are the maximum over ranks of the mean per-call time. Sizes take K/M/G (x1024).")
    p.add_argument("collective", type=_collective_arg, metavar="COLLECTIVE|all",
                   help=f"one of: {', '.join(COLLECTIVES)}; or all")
    p.add_argument("-n", "--nranks", type=_positive_int, required=True, help="number of ranks")
    p.add_argument("-b", "--minbytes", type=_size_arg, default=8, help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", type=_size_arg, default=64 << 20, help="largest size (default 64M)")
    p.add_argument("-f", "--stepfactor", type=float, default=2.0, help="size multiplier (default 2)")
    p.add_argument("--dtype", type=_dtype_arg, default=["float32"],
                   help=f"one or more, comma-separated (each swept in turn, every backend compared per "
                   f"dtype): {', '.join(_DTYPES)}")
    p.add_argument("--op", type=_op_arg, default="sum",
                   help=f"one of {', '.join(_OPS)} (reducing collectives)")
    p.add_argument("--iters", type=_positive_int, default=None,
                   help="timed iterations per size (default: about --target-time seconds' worth)")
    p.add_argument("--warmup", type=_nonneg_int, default=None,
                   help="untimed iterations before timing (default: a tenth of the iterations)")
    p.add_argument("--target-time", type=float, default=0.1, metavar="SECONDS",
                   help="aim of the automatic iteration count, per size and variant (default 0.1)")
    p.add_argument("--backend", type=_backends_arg, default=["shmcomm"],
                   help="comma-separated: shmcomm,gloo,mpi (default shmcomm); they run at the same "
                   "time and take turns size by size")
    p.add_argument("--rounds", type=_positive_int, default=1,
                   help="measure every size this many times per backend, taking turns, and report "
                   "the best (default 1)")
    p.add_argument("--zero-copy", action="store_true", help="shmcomm buffers from sc.empty (shared memory)")
    p.add_argument("--check", action="store_true", help="verify results against numpy (#wrong column)")
    p.add_argument("--json", metavar="FILE", help="write every row of every backend as JSON")
    p.add_argument("--csv", metavar="FILE", help="write every row of every backend as CSV")
    p.add_argument("--plot", metavar="FILE.png", help="time and busbw against size (needs matplotlib)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="stop a backend that finishes no size for this long (default 300)")
    p.add_argument("--mpirun-args", default="", metavar="ARGS",
                   help="extra mpirun arguments, e.g. \"--bind-to none\"")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the command line; exits with status 2 and a message when invalid.

    Example::

        args = parse_args(["all_reduce", "-n", "2", "-b", "8", "-e", "1M"])
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
    floats = [d for d in args.dtype if _is_float(d)]
    integers = [d for d in args.dtype if not _is_float(d)]
    if args.op == "avg" and integers:
        parser.error(f"--op avg needs a floating-point --dtype, got {', '.join(integers)}")
    if args.op in ("band", "bor", "bxor") and floats:
        parser.error(f"--op {args.op} needs an integer --dtype, got {', '.join(floats)}")
    if "bfloat16" in args.dtype and importlib.util.find_spec("ml_dtypes") is None:
        parser.error("--dtype bfloat16 needs the ml_dtypes package (pip install ml_dtypes)")
    if args.plot:
        try:
            _import_pyplot()
        except BenchError as exc:  # say so now, not after a long sweep
            parser.error(str(exc))
    return args


def _config(args, collectives: list[str]) -> dict:
    return {"nranks": args.nranks, "collectives": collectives,
            "sizes": sweep_sizes(args.minbytes, args.maxbytes, args.stepfactor),
            "dtype": args.dtype, "op": args.op, "iters": args.iters, "warmup": args.warmup,
            "target_time": args.target_time, "zero_copy": args.zero_copy, "check": args.check,
            "timeout": args.timeout, "rounds": args.rounds}


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def run(args: argparse.Namespace, out=None) -> int:
    """Run the parsed command: sweep every backend for each dtype, print tables and ratios, write files.

    Returns the exit status: 0, or 1 if a backend failed or ``--check`` found wrong elements.
    Example::

        sys.exit(run(parse_args(["barrier", "-n", "2"])))
    """
    out = out or sys.stdout
    collectives = list(COLLECTIVES) if args.collective == "all" else [args.collective]
    dtypes = args.dtype
    status, records, results, peers, loads = 0, [], [], [], []
    for dtname in dtypes:
        if len(dtypes) > 1:
            print(f"#\n# ===== dtype {dtname} =====", file=out)
        one = argparse.Namespace(**{**vars(args), "dtype": dtname})
        swept = _sweep(one, collectives, out)
        if swept is None:
            return 130
        dt_status, dt_results, dt_records, dt_peers, dt_loads = swept
        status = status or dt_status
        records += dt_records
        results += dt_results
        peers += [p for p in dt_peers if p not in peers]
        loads.append(dt_loads)
    if len(dtypes) > 1 and peers:
        print("#\n# ===== per dtype, in this run =====", file=out)
        for dtname in dtypes:
            mine = [r for r in records if r["type"] == dtname]
            if any(r["backend"] == "shmcomm" for r in mine):
                print(f"# {dtname}\n" + format_ratios(mine, collectives, peers), file=out)
    cfg = _config(args, collectives)
    meta = {"tool": PROG, "argv": getattr(args, "argv", None), "nranks": args.nranks, "cores": len(usable_cores()),
            "collectives": collectives, "sizes": cfg["sizes"],
            "dtype": dtypes[0] if len(dtypes) == 1 else dtypes, "op": args.op,
            "iters": args.iters, "warmup": args.warmup, "target_time": args.target_time,
            "rounds": args.rounds,
            "zero_copy": args.zero_copy, "check": args.check, "loadavg_before": loads[0][0],
            "loadavg_after": loads[-1][1], "python": platform.python_version(),
            "machine": platform.machine(), "date": datetime.datetime.now().isoformat(timespec="seconds")}
    if args.json:
        write_json(args.json, meta, results, records)
    if args.csv:
        write_csv(args.csv, records)
    if args.plot:
        try:
            title = f"{args.nranks} ranks, {', '.join(dtypes)}, {len(usable_cores())} cores"
            write_plot(args.plot, records, collectives, title)
        except BenchError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            status = status or 1
    return status


def _sweep(args: argparse.Namespace, collectives: list[str], out):
    """One dtype's sweep over every backend, its tables and ratios printed. Returns (status,
    results, records, peers that ran, (load before, load after)), or None when interrupted."""
    cfg = _config(args, collectives)
    itemsize = _numpy_dtype(args.dtype).itemsize
    total = args.rounds * sum(len(collective_sizes(c, cfg["sizes"], args.nranks, itemsize))
                              for c in collectives)
    progress = _Progress(total, enabled=not args.quiet)
    mpi_args = shlex.split(args.mpirun_args) if args.mpirun_args else []
    load_before = _loadavg()
    try:
        results = run_backends(args.backend, args.nranks, cfg, progress, args.timeout, mpi_args)
        progress.finish()
    except KeyboardInterrupt:
        progress.finish()
        print(f"{PROG}: interrupted", file=sys.stderr)
        return None
    records = _records(results, args.nranks, cfg)
    load_after = _loadavg()
    status = 0
    for res in results:
        if res.status == "skipped":
            print(f"# backend {res.backend}: skipped ({res.reason})", file=out)
        elif res.status == "failed":
            status = 1
            reason = "\n".join("#   " + line for line in res.reason.splitlines())
            print(f"# backend {res.backend}: FAILED\n{reason}", file=out)
        for w in res.warnings:
            print(f"# backend {res.backend}: warning: {w}", file=out)
    ran = [res for res in results if res.rows]
    for coll in collectives:
        for res in ran:
            note = [why for (c, why) in res.notes if c == coll]
            if note:
                print(f"#\n# {coll} on {res.backend}: not run ({note[0]})", file=out)
            if any(r["collective"] == coll for r in records if r["backend"] == res.backend):
                print("#\n" + _header(res, args, coll), file=out)
                print(format_table(records, res.backend, coll), file=out)
    wrong = sum(r["wrong"] or 0 for r in records)
    if args.check:
        print(f"#\n# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}", file=out)
        if wrong:
            status = 1
    if load_before is not None and load_after is not None:
        # Other work on the machine moves every number; say how busy it was.
        print(f"#\n# load average (1 min) before: {load_before:.2f}, after: {load_after:.2f} "
              f"on {len(usable_cores())} cores", file=out)
    peers = [res.backend for res in ran if res.backend != "shmcomm"]
    if peers and any(res.backend == "shmcomm" for res in ran):
        print("#\n" + format_ratios(records, collectives, peers), file=out)
    return status, results, records, peers, (load_before, load_after)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``shmcomm-bench`` and ``python -m shmcomm.bench``; returns the exit status.

    Example::

        main(["all_reduce", "-n", "2", "-b", "8", "-e", "1K", "--check"])
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--worker"]:  # internal: one rank of a sweep, started by run_backends
        if len(argv) != 4 or argv[2] != "--config":
            print(f"{PROG}: usage: --worker BACKEND --config JSON", file=sys.stderr)
            return EXIT_USAGE
        try:
            return _worker_main(argv[1], json.loads(argv[3]))
        except Exception:  # noqa: BLE001 - the parent shows this text as the failure reason
            traceback.print_exc()
            return 1
    try:
        return run(parse_args(argv))
    except BenchError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
