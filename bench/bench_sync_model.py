"""How should many ranks exchange a small message: flat, recursive doubling, or a tree?

Issue 45, item 5, asks whether small all_reduces at 8+ ranks should go by a tree or a
dissemination of flags with the data inline rather than shmcomm's flat step, where every rank
reads every other rank's line. Which is faster depends on how the machine moves a cache line
between cores (and how it serves many readers of one line), so this measures it: it builds
``bench/c/sync_model.c`` (a C model of the three ways, 8 bytes per rank, one process per rank pinned
to its own CPU, nothing of shmcomm around them) and runs it at each rank count that fits the CPUs.

Run from the repository root::

    python bench/bench_sync_model.py                  # 2, 4, 8, 16, ... up to the usable CPUs
    python bench/bench_sync_model.py --ranks 8,16 --iters 500000

Prints, per rank count, ns per all_reduce for each way (the slowest rank's; doubling only at
powers of two) and each way's time over flat's. Every sum is checked in the model ("WRONG"
otherwise). Rank counts above the usable CPUs are skipped (``--oversubscribe`` runs them, for the
sums only): spinning ranks that share a core measure the scheduler. It needs a C compiler (``cc``); without one it says so and exits 2.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "c" / "sync_model.c"
WAYS = ("flat", "doubling", "tree")


def build(workdir: str) -> str:
    """Compile the model into ``workdir``; the executable's path."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("bench_sync_model.py: no C compiler (cc or gcc) on PATH", file=sys.stderr)
        sys.exit(2)
    exe = os.path.join(workdir, "sync_model")
    subprocess.run([cc, "-O2", "-std=gnu11", "-o", exe, str(SOURCE)], check=True, timeout=120)
    return exe


def measure(exe: str, ranks: int, iters: int) -> dict[str, tuple[float, bool]]:
    """{way: (ns per call, every sum right)} for one rank count."""
    out = subprocess.run([exe, str(ranks), str(iters)], capture_output=True, text=True, check=True,
                         timeout=600).stdout
    rows = {}
    for line in out.splitlines():
        way, _, ns, check = line.split()
        rows[way] = (float(ns), check == "ok")
    return rows


def default_ranks(cpus: int) -> list[int]:
    """2, 4, 8, ... up to ``cpus``, and ``cpus`` itself.

    >>> default_ranks(12)
    [2, 4, 8, 12]
    >>> default_ranks(2)
    [2]
    """
    counts, n = [], 2
    while n <= cpus:
        counts.append(n)
        n *= 2
    if cpus >= 2 and counts[-1] != cpus:
        counts.append(cpus)
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", help="comma list of rank counts (default: powers of two up to the usable CPUs)")
    ap.add_argument("--iters", type=int, default=200_000, help="all_reduces per way and rank count")
    ap.add_argument("--oversubscribe", action="store_true",
                    help="run rank counts above the usable CPUs too (their sums are checked; their times say nothing)")
    args = ap.parse_args(argv)
    cpus = len(os.sched_getaffinity(0))
    ranks = [int(r) for r in args.ranks.split(",")] if args.ranks else default_ranks(cpus)
    if args.iters < 1 or any(r < 1 for r in ranks):
        ap.error("--iters and every rank count must be at least 1")
    print(f"# sync_model: 8-byte all_reduce, one process per rank pinned to its CPU, {cpus} usable CPUs, "
          f"{args.iters} calls per way; ns per call (slowest rank), and / flat")
    print(f"{'ranks':>6} " + " ".join(f"{w:>16}" for w in WAYS))
    all_right = True
    with tempfile.TemporaryDirectory(prefix="sync-model-") as workdir:
        exe = build(workdir)
        for n in ranks:
            if n > cpus and not args.oversubscribe:
                print(f"{n:>6}  skipped: more ranks than the {cpus} usable CPUs")
                continue
            rows = measure(exe, n, args.iters)
            all_right &= all(ok for _, ok in rows.values())
            flat_ns = rows["flat"][0]
            cells = []
            for w in WAYS:
                if w not in rows:
                    cells.append(f"{'-':>16}")
                    continue
                ns, ok = rows[w]
                cells.append(f"{ns:>8.1f} {ns / flat_ns:>5.2f}x" + ("" if ok else " WRONG"))
            print(f"{n:>6} " + " ".join(f"{c:>16}" for c in cells) + ("  (oversubscribed)" if n > cpus else ""))
    if not all_right:
        print("# WRONG: a way gave a wrong sum (see the marked cells)")
    return 0 if all_right else 1


if __name__ == "__main__":
    sys.exit(main())
