"""Reports: flat records of every measurement, the nccl-tests table, shmcomm/peer time ratios, CSV,
JSON, the plot, and the progress lines shown during a sweep."""

from __future__ import annotations

import csv
import json
import math
import shutil
import sys
import time

from .common import BACKENDS, PROG, VARIANTS, _REDUCING, _ROOTED, BenchError, _numpy_dtype
from .runner import BackendResult
from shmcomm.launch import usable_cores
from .sizes import busbw_factor, format_size


def _best_of_rounds(rows: list[dict]) -> list[dict]:
    """One row per (collective, size): per variant the round with the lowest time, with every
    round's time in ``round_times_us`` and the wrong elements of all rounds added up."""
    merged: dict[tuple, dict] = {}
    for row in rows:
        key = row["collective"], row["size"]
        if key not in merged:
            merged[key] = dict(row, results={})
        into = merged[key]["results"]
        for variant, m in row["results"].items():
            prev = into.get(variant)
            if prev is None:
                into[variant] = dict(m, round_times_us=[m["time_us"]])
                continue
            best = m if m["time_us"] < prev["time_us"] else prev
            wrong = None if m["wrong"] is None else (prev["wrong"] or 0) + m["wrong"]  # None: no --check
            into[variant] = dict(best, round_times_us=prev["round_times_us"] + [m["time_us"]], wrong=wrong)
    return list(merged.values())


def _records(results: list[BackendResult], nranks: int, cfg: dict) -> list[dict]:
    """One flat record per (backend, collective, size, variant) that was measured (the best round)."""
    dtype = _numpy_dtype(cfg["dtype"])
    records = []
    for res in results:
        for row in _best_of_rounds(res.rows):
            coll = row["collective"]
            for variant in VARIANTS:
                m = row["results"].get(variant)
                if not m:
                    continue
                size = row["size"]
                seconds = m["time_us"] * 1e-6
                algbw = size / seconds / 1e9 if seconds > 0 else 0.0
                factor = busbw_factor(coll, nranks)
                records.append({
                    "backend": res.backend, "collective": coll, "nranks": nranks, "size": size,
                    "count": row["count"] if coll != "barrier" else 0, "type": dtype.name,
                    "redop": cfg["op"] if coll in _REDUCING else "none",
                    "root": 0 if coll in _ROOTED else -1, "variant": variant,
                    "time_us": m["time_us"], "algbw_GBps": algbw, "busbw_GBps": algbw * factor,
                    "busbw_factor": factor, "wrong": m["wrong"], "iters": m["iters"],
                    "warmup": m["warmup"], "zero_copy": bool(cfg["zero_copy"]) and res.backend == "shmcomm",
                    "rank_times_us": m["rank_times_us"], "round_times_us": m["round_times_us"],
                })
    return records


def _fmt_time(us: float) -> str:
    if us < 1000:
        return f"{us:.2f}"
    if us < 100000:
        return f"{us:.1f}"
    return f"{us:.0f}"


def _fmt_bw(gbps: float) -> str:
    return f"{gbps:.2f}" if gbps < 1000 else f"{gbps:.0f}"


# (title, unit, width) of the leading columns and of each variant's columns; rows use the same widths.
_LEAD_COLS = (("size", "(B)", 12), ("count", "(elements)", 12), ("type", "", 8), ("redop", "", 6),
              ("root", "", 6))
_VARIANT_COLS = (("time", "(us)", 9), ("algbw", "(GB/s)", 6), ("busbw", "(GB/s)", 6), ("#wrong", "", 6))


def _table_head() -> list[str]:
    lead = sum(w + 2 for _, _, w in _LEAD_COLS) - 2
    span = sum(w + 2 for _, _, w in _VARIANT_COLS)
    top = " " * lead + "".join(f"{v:^{span}}" for v in VARIANTS)
    names = "  ".join(f"{t:>{w}}" for t, _, w in _LEAD_COLS)
    units = "  ".join(f"{u:>{w}}" for _, u, w in _LEAD_COLS)
    for _ in VARIANTS:
        names += "".join(f"  {t:>{w}}" for t, _, w in _VARIANT_COLS)
        units += "".join(f"  {u:>{w}}" for _, u, w in _VARIANT_COLS)
    return ["#" + line[1:].rstrip() for line in (top, names, units)]


def _header(res: BackendResult, args, collective: str) -> str:
    """The title line above one backend's table of one collective."""
    version = ", ".join(f"{k} {v}" if k != "mpi" else v for k, v in res.versions.items())
    mode = ""
    if res.backend == "shmcomm":
        mode = ", zero-copy (sc.empty)" if args.zero_copy else ", numpy buffers (copy)"
    iters = f"{args.iters} iters" if args.iters else f"auto iters (~{args.target_time:g} s per size)"
    if args.rounds > 1:
        iters += f", best of {args.rounds} rounds"
    return (f"# {PROG} {collective} | backend {res.backend} ({version}{mode}) | {args.nranks} ranks on "
            f"{len(usable_cores())} cores | {iters}, check {'on' if args.check else 'off'}")


def format_table(records: list[dict], backend: str, collective: str) -> str:
    """The nccl-tests table of one backend and collective: a row per size, out-of-place then
    in-place columns (``n/a`` where the backend's API has no such form; ``N/A`` #wrong without
    ``--check``), then the average bus bandwidth.

    Example::

        print(format_table(records, "shmcomm", "all_reduce"))
    """
    mine = [r for r in records if r["backend"] == backend and r["collective"] == collective]
    by_size: dict[int, dict] = {}
    for r in mine:
        by_size.setdefault(r["size"], {})[r["variant"]] = r
    lines = _table_head()
    busbws = []
    for size in sorted(by_size):
        cells = by_size[size]
        first = next(iter(cells.values()))
        line = (f"{size:12d}  {first['count']:12d}  {first['type']:>8}  {first['redop']:>6}  "
                f"{first['root']:6d}")
        for variant in VARIANTS:
            r = cells.get(variant)
            if r is None:
                line += f"  {'n/a':>9}  {'':>6}  {'':>6}  {'':>6}"
                continue
            wrong = "N/A" if r["wrong"] is None else str(r["wrong"])
            line += (f"  {_fmt_time(r['time_us']):>9}  {_fmt_bw(r['algbw_GBps']):>6}  "
                     f"{_fmt_bw(r['busbw_GBps']):>6}  {wrong:>6}")
            busbws.append(r["busbw_GBps"])
        lines.append(line.rstrip())
    if busbws and collective != "barrier":
        lines.append(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.4g} GB/s")
    return "\n".join(lines)


def _common_variant(a: dict, b: dict) -> str | None:
    """Compare like with like: out-of-place when both have it, else in-place."""
    for variant in VARIANTS:
        if variant in a and variant in b:
            return variant
    return None


def format_ratios(records: list[dict], collectives: list[str], peers: list[str]) -> str:
    """Per collective and size, shmcomm's time divided by each peer's (below 1: shmcomm faster),
    on the variant both measured (``oop``/``ip``), and the geometric mean per collective.

    Example::

        print(format_ratios(records, ["all_reduce"], ["gloo", "mpi"]))
    """
    index: dict[tuple, dict] = {}
    for r in records:
        index.setdefault((r["backend"], r["collective"], r["size"]), {})[r["variant"]] = r["time_us"]
    head = f"# {'collective':<15}{'size (B)':>12}" + "".join(f"{'vs ' + p:>16}" for p in peers)
    lines = ["# shmcomm time / peer time (below 1: shmcomm is faster; oop/ip: variant compared)", head]
    for coll in collectives:
        sizes = sorted({s for (b, c, s) in index if b == "shmcomm" and c == coll})
        logs: dict[str, list] = {p: [] for p in peers}
        for size in sizes:
            mine = index[("shmcomm", coll, size)]
            cells = []
            for peer in peers:
                theirs = index.get((peer, coll, size), {})
                variant = _common_variant(mine, theirs)
                if variant is None or theirs[variant] <= 0:
                    cells.append(f"{'-':>16}")
                    continue
                ratio = mine[variant] / theirs[variant]
                logs[peer].append(math.log(ratio))
                tag = "oop" if variant == "out-of-place" else "ip"
                cells.append(f"{ratio:>11.3g} ({tag})")
            lines.append(f"  {coll:<15}{size:>12}" + "".join(cells))
        if any(logs.values()) and len(sizes) > 1:
            geo = "".join(f"{math.exp(sum(v) / len(v)):>16.3g}" if v else f"{'-':>16}"
                          for v in logs.values())
            lines.append(f"  {coll + ' geomean':<27}" + geo)
    return "\n".join(lines)


_CSV_FIELDS = ("backend", "collective", "nranks", "size", "count", "type", "redop", "root", "variant",
               "time_us", "algbw_GBps", "busbw_GBps", "busbw_factor", "wrong", "iters", "warmup",
               "zero_copy")


def write_csv(path: str, records: list[dict]) -> None:
    """One CSV line per measured (backend, collective, size, variant); ``wrong`` empty without --check.

    Example::

        write_csv("out.csv", records)
    """
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=_CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in records:
            writer.writerow({k: ("" if r[k] is None else r[k]) for k in _CSV_FIELDS})


def write_json(path: str, meta: dict, results: list[BackendResult], records: list[dict]) -> None:
    """``{"meta", "backends": {name: status, reason, versions, ...}, "rows": records}``.

    Example::

        write_json("out.json", meta, results, records)
    """
    doc = {
        "meta": meta,
        "backends": {res.backend: {"status": res.status, "reason": res.reason, "versions": res.versions,
                                   "command": res.command, "notes": [list(n) for n in res.notes],
                                   "warnings": res.warnings} for res in results},
        "rows": records,
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def _import_pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never needs a display
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise BenchError(f"--plot needs matplotlib ({exc}); install it with "
                         f"`pip install matplotlib` or `pip install shmcomm[bench]`") from None
    return plt


def _size_tick(value: float, _pos) -> str:
    """Axis label of a power-of-two size: 8, 1K, 32M."""
    if value <= 0:
        return ""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value >= scale:
            return f"{value / scale:g}{unit}"
    return f"{value:g}"


def write_plot(path: str, records: list[dict], collectives: list[str], title: str = "") -> None:
    """Draw time and bus bandwidth against size (log-log) for every backend and variant: one
    figure, a row of two panels per collective (barrier: a bar chart of its time).

    Raises BenchError when matplotlib is missing. Example::

        write_plot("out.png", records, ["all_reduce", "broadcast"])
    """
    plt = _import_pyplot()
    from matplotlib import ticker

    colls = [c for c in collectives if any(r["collective"] == c for r in records)]
    if not colls:
        raise BenchError("--plot: nothing was measured, so there is nothing to draw")
    fig, axes = plt.subplots(len(colls), 2, figsize=(12, 3.8 * len(colls)), squeeze=False)
    colors = {"shmcomm": "tab:blue", "gloo": "tab:orange", "mpi": "tab:green"}
    for (ax_t, ax_b), coll in zip(axes, colls):
        mine = [r for r in records if r["collective"] == coll]
        backends = [b for b in BACKENDS if any(r["backend"] == b for r in mine)]
        if coll == "barrier":
            times = [min(r["time_us"] for r in mine if r["backend"] == b) for b in backends]
            ax_t.bar(backends, times, color=[colors[b] for b in backends])
            ax_t.set_yscale("log")
            ax_t.set_ylabel("time (us)")
            ax_t.set_title("barrier: time per call")
            ax_b.axis("off")
            continue
        for backend in backends:
            for variant, style in zip(VARIANTS, ("-", "--")):
                pts = sorted((r["size"], r["time_us"], r["busbw_GBps"]) for r in mine
                             if r["backend"] == backend and r["variant"] == variant)
                if not pts:
                    continue
                label = f"{backend} {variant}"
                ax_t.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3,
                          color=colors[backend], label=label)
                bw = [p for p in pts if p[2] > 0]  # log axes cannot show 0 (e.g. one rank)
                if bw:
                    ax_b.plot([p[0] for p in bw], [p[2] for p in bw], style, marker="o", ms=3,
                              color=colors[backend], label=label)
        for ax, ylabel in ((ax_t, "time (us)"), (ax_b, "busbw (GB/s)")):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(_size_tick))
            ax.set_yscale("log")
            ax.set_xlabel("size (B)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_lines():
                ax.legend(fontsize=7)
        ax_t.set_title(f"{coll}: time (lower is better)")
        ax_b.set_title(f"{coll}: bus bandwidth (higher is better)")
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))  # room for the title
    fig.savefig(path, dpi=110)
    plt.close(fig)


class _Progress:
    """One stderr line per finished size, or a self-overwriting line when stderr is a terminal."""

    def __init__(self, total_per_backend: int, enabled: bool, stream=None):
        self.total, self.enabled = total_per_backend, enabled
        self.stream = stream or sys.stderr
        self.tty = self.enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.done: dict[str, int] = {}
        self.started = time.monotonic()

    def __call__(self, backend: str, row: dict) -> None:
        if not self.enabled:
            return
        self.done[backend] = done = self.done.get(backend, 0) + 1
        times = ", ".join(f"{'oop' if v == 'out-of-place' else 'ip'} {_fmt_time(m['time_us'])} us"
                          for v, m in row["results"].items())
        text = (f"[{backend}] {done}/{self.total} {row['collective']} {format_size(row['size'])}"
                + (f" (round {row['round'] + 1})" if row.get("round") else "") + ": "
                f"{times} ({time.monotonic() - self.started:.0f} s)")
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r" + text[:width].ljust(width))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self) -> None:
        """End a self-overwriting line so later output starts on a fresh one."""
        if self.tty and self.done:
            self.stream.write("\n")
            self.stream.flush()
