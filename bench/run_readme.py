"""Regenerate the README's benchmark results: raw outputs in bench/results/ and a Markdown summary.

Run from the repository root (takes about three minutes on a 2-core machine)::

    python bench/run_readme.py                 # every step, then bench/results/README_table.md
    python bench/run_readme.py --steps allreduce_n2,all_8B_n2
    python bench/run_readme.py --table-only    # rebuild the summary from the existing JSON files
    python bench/run_readme.py --rounds 5      # five rounds per size and backend (default 3)

Each step is one ``shmcomm-bench`` command (printed before it runs); it writes
``<step>.txt`` (the tables as printed), ``<step>.json`` and ``<step>.csv``, and for the all_reduce
sweep ``<step>.png`` when matplotlib is installed. The steps:

  allreduce_n2        all_reduce, 2 ranks, 8 B .. 32 MiB (x2), shmcomm vs gloo vs mpi
  allreduce_n2_f8     the same with -f 8 (the sizes of the issue's command; 32 MiB is not a power of 8 from 8)
  zero_copy_32M_n2    all_reduce at 32 MiB, shmcomm with --zero-copy (sc.empty buffers)
  all_8B_n2           every collective at 8 B, shmcomm vs mpi, --check
  all_32M_n2          every collective at 32 MiB, shmcomm vs mpi, --check
  allreduce_8B_n4     all_reduce at 8 B with 4 ranks (mpirun gets --oversubscribe on 2 cores)
  allreduce_8B_n8     the same with 8 ranks
  copy_floor_32M_n2   bench/bench_copy_floor.py: 32 MiB all_reduce (numpy and sc.empty arrays)
                      against one np.copyto of 32 MiB, interleaved in the same processes

Absolute times drift on a shared machine; the ratios between backends measured in one run are the
robust part. Within a step the backends take turns size by size (``shmcomm-bench`` runs them at
once), and each row keeps the best of ``--rounds`` rounds; every round's time is in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
ROOT = os.path.dirname(HERE)
# Benchmark the checkout this script lives in, whatever copy of shmcomm is installed.
sys.path.insert(0, ROOT)
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))

# (name, arguments of shmcomm-bench, draw a plot)
STEPS = [
    ("allreduce_n2", "all_reduce -n 2 -b 8 -e 32M -f 2 --backend shmcomm,gloo,mpi", True),
    ("allreduce_n2_f8", "all_reduce -n 2 -b 8 -e 32M -f 8 --backend shmcomm,gloo,mpi", False),
    ("zero_copy_32M_n2", "all_reduce -n 2 -b 32M -e 32M --zero-copy --backend shmcomm", False),
    ("all_8B_n2", "all -n 2 -b 8 -e 8 --backend shmcomm,mpi --check", False),
    ("all_32M_n2", "all -n 2 -b 32M -e 32M --backend shmcomm,mpi --check", False),
    ("allreduce_8B_n4", "all_reduce -n 4 -b 8 -e 8 --backend shmcomm,mpi", False),
    ("allreduce_8B_n8", "all_reduce -n 8 -b 8 -e 8 --backend shmcomm,mpi", False),
]
COPY_FLOOR = "copy_floor_32M_n2"  # not a shmcomm-bench step: bench_copy_floor.py
VARIANTS = ("out-of-place", "in-place")


def have_matplotlib() -> bool:
    """True when matplotlib can be imported (plots are optional)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def run_step(name: str, args: str, plot: bool, rounds: int, source: str) -> int:
    """Run one step (its backends taking turns, ``rounds`` rounds each); keep its text, JSON and CSV,
    the JSON naming ``source``, the checkout measured."""
    base = os.path.join(RESULTS, name)
    rel = os.path.relpath(base, ROOT)  # the tool runs in ROOT; recorded argv names no machine path
    argv = shlex.split(args) + ["--rounds", str(rounds), "--json", rel + ".json", "--csv", rel + ".csv"]
    if plot and have_matplotlib():
        argv += ["--plot", rel + ".png"]
    print(f"$ shmcomm-bench {' '.join(argv)}", flush=True)
    proc = subprocess.run([sys.executable, "-m", "shmcomm.bench", *argv], stdout=subprocess.PIPE,
                          text=True, env=ENV, cwd=ROOT)
    sys.stdout.write(proc.stdout)
    with open(base + ".txt", "w") as f:
        f.write(f"$ shmcomm-bench {' '.join(argv)}\n{proc.stdout}")
    with open(base + ".json") as f:
        doc = json.load(f)
    doc["meta"]["source"] = source
    with open(base + ".json", "w") as f:  # rewritten: adds the source version
        json.dump(doc, f, indent=1)
        f.write("\n")
    return proc.returncode


def run_copy_floor(rounds: int) -> int:
    """bench_copy_floor.py at 32 MiB (``rounds`` x 3 rounds: its rounds are short); text and JSON."""
    base = os.path.join(RESULTS, COPY_FLOOR)
    argv = ["bench/bench_copy_floor.py", "--size", "32M", "--rounds", str(3 * rounds),
            "--json", os.path.relpath(base, ROOT) + ".json"]
    print(f"$ python {' '.join(argv)}", flush=True)
    proc = subprocess.run([sys.executable, *argv], stdout=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    sys.stdout.write(proc.stdout)
    with open(base + ".txt", "w") as f:
        f.write(f"$ python {' '.join(argv)}\n{proc.stdout}")
    return proc.returncode


def load(name: str) -> dict | None:
    """The JSON of a step, or None if it has not run."""
    try:
        with open(os.path.join(RESULTS, name + ".json")) as f:
            return json.load(f)
    except OSError:
        return None


def pick(doc: dict | None, backend: str, collective: str, size: int, variant: str | None = None):
    """Time (us) of one row: the named variant, or in-place first (shmcomm's only all_reduce form)."""
    if doc is None:
        return None
    found = {r["variant"]: r["time_us"] for r in doc["rows"]
             if r["backend"] == backend and r["collective"] == collective and r["size"] == size}
    if variant:
        return found.get(variant)
    return found.get("in-place", found.get("out-of-place"))


def common(doc, collective: str, size: int, a: str, b: str):
    """Times of backends ``a`` and ``b`` on the variant both measured (out-of-place preferred)."""
    for variant in VARIANTS:
        ta, tb = pick(doc, a, collective, size, variant), pick(doc, b, collective, size, variant)
        if ta is not None and tb is not None:
            return ta, tb, variant
    return None, None, None


def fmt(us) -> str:
    """A time for the table: us below 1 ms, else ms."""
    if us is None:
        return "-"
    return f"{us:.1f} us" if us < 1000 else f"{us / 1000:.2f} ms"


def ratio(a, b) -> str:
    """a / b, or '-' when either is missing."""
    return "-" if a is None or b is None or b <= 0 else f"{a / b:.3g}"


def source_version() -> str:
    """The checkout's commit (``+dirty`` with local changes), so results name the code they measured;
    taken before the first step rewrites the tracked result files."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (head + ("+dirty" if dirty else "")) if head else "unknown"


def write_table() -> str:
    """Build bench/results/README_table.md from the step JSON files; returns its text."""
    sweep = load("allreduce_n2")
    lines = ["# shmcomm benchmark results", ""]
    if sweep:
        m = sweep["meta"]
        lines += [f"Measured {m['date']} on {m['cores']} cores ({m['machine']}, Python {m['python']}), "
                  f"{m['dtype']} {m['op']}; time = "
                  f"{m.get('time', 'max over ranks of the mean per-call time (older results)')}. "
                  f"Load average (1 min) during the all_reduce sweep: {m['loadavg_before']:.2f} before, "
                  f"{m['loadavg_after']:.2f} after. Source: {m.get('source', 'unknown')}. Versions: "
                  + "; ".join(f"{b}: " + ", ".join(f"{k} {v}" if k != "mpi" else v
                                                   for k, v in s["versions"].items())
                              for b, s in sweep["backends"].items() if s["versions"]) + ".", ""]
    sizes = [(8, "8 B"), (32 << 10, "32 KiB"), (2 << 20, "2 MiB"), (32 << 20, "32 MiB")]
    lines += ["## all_reduce, 2 ranks (in place)", "",
              "| system | " + " | ".join(label for _, label in sizes) + " |",
              "|---" * (len(sizes) + 1) + "|"]
    zc = load("zero_copy_32M_n2")
    rows = [("shmcomm (numpy buffers)", sweep, "shmcomm"),
            ("shmcomm `--zero-copy` (sc.empty)", zc, "shmcomm"),
            ("Open MPI via mpi4py", sweep, "mpi"), ("torch.distributed gloo", sweep, "gloo")]
    for label, doc, backend in rows:
        cells = [fmt(pick(doc, backend, "all_reduce", s, "in-place")) for s, _ in sizes]
        if doc is not None and any(c != "-" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "| shmcomm / peer | " + " | ".join(label for _, label in sizes) + " |",
              "|---" * (len(sizes) + 1) + "|"]
    for peer, label in (("mpi", "vs Open MPI"), ("gloo", "vs gloo")):
        cells = [ratio(pick(sweep, "shmcomm", "all_reduce", s, "in-place"),
                       pick(sweep, peer, "all_reduce", s, "in-place")) for s, _ in sizes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    small, big = load("all_8B_n2"), load("all_32M_n2")
    if small or big:
        lines += ["", "## Every collective, 2 ranks: shmcomm vs Open MPI (same variant on both)", "",
                  "| collective | shmcomm 8 B | MPI 8 B | ratio | shmcomm 32 MiB | MPI 32 MiB | ratio |",
                  "|---|---|---|---|---|---|---|"]
        from shmcomm.bench import COLLECTIVES

        for coll in COLLECTIVES:
            s8 = m8 = s32 = m32 = None
            if small:
                size = next((r["size"] for r in small["rows"] if r["collective"] == coll), None)
                s8, m8, _ = common(small, coll, size, "shmcomm", "mpi")
            if big and coll != "barrier":
                size = next((r["size"] for r in big["rows"] if r["collective"] == coll), None)
                s32, m32, _ = common(big, coll, size, "shmcomm", "mpi")
            lines.append(f"| {coll} | {fmt(s8)} | {fmt(m8)} | {ratio(s8, m8)} | {fmt(s32)} | {fmt(m32)} "
                         f"| {ratio(s32, m32)} |")
        wrong = sum((r["wrong"] or 0) for d in (small, big) if d for r in d["rows"])
        lines += ["", f"`--check`: {wrong} wrong elements over both sweeps."]

    floor = load(COPY_FLOOR)
    if floor:
        med = floor["median_us"]
        lines += ["", f"## 32 MiB all_reduce against one `np.copyto` of 32 MiB (same processes, median of "
                  f"{floor['rounds']} interleaved rounds)", "",
                  "| case | time | / np.copyto |", "|---|---|---|"]
        for case, label in (("copyto", "one `np.copyto` (rank 0)"), ("numpy", "all_reduce, numpy arrays"),
                            ("sc.empty", "all_reduce, `sc.empty` arrays")):
            lines.append(f"| {label} | {fmt(med[case])} | {ratio(med[case], med['copyto'])} |")

    over = [(n, load(f"allreduce_8B_n{n}")) for n in (4, 8)]
    if any(doc for _, doc in over):
        lines += ["", "## 8 B all_reduce with more ranks than cores (oversubscribed)", "",
                  "| ranks | shmcomm | Open MPI (`--oversubscribe`) | ratio |", "|---|---|---|---|"]
        for n, doc in over:
            if doc:
                s, m, _ = common(doc, "all_reduce", 8, "shmcomm", "mpi")
                lines.append(f"| {n} | {fmt(s)} | {fmt(m)} | {ratio(s, m)} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(RESULTS, "README_table.md"), "w") as f:
        f.write(text)
    return text


def main(argv: list[str] | None = None) -> int:
    """Run the chosen steps, then write the summary; the exit status is non-zero if a step failed."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", default=",".join([name for name, _, _ in STEPS] + [COPY_FLOOR]),
                   help="comma-separated step names (default: all)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds per size and backend, taking turns; each row keeps its best (default 3)")
    p.add_argument("--table-only", action="store_true", help="only rebuild README_table.md")
    args = p.parse_args(argv)
    os.makedirs(RESULTS, exist_ok=True)
    status = 0
    if not args.table_only:
        chosen = [s.strip() for s in args.steps.split(",") if s.strip()]
        unknown = sorted(set(chosen) - {name for name, _, _ in STEPS} - {COPY_FLOOR})
        if unknown:
            p.error(f"unknown step(s): {', '.join(unknown)}")
        source = source_version()
        for name, cmd, plot in STEPS:
            if name in chosen:
                status = run_step(name, cmd, plot, max(1, args.rounds), source) or status
        if COPY_FLOOR in chosen:
            status = run_copy_floor(max(1, args.rounds)) or status
    print(write_table())
    return status


if __name__ == "__main__":
    sys.exit(main())
