"""``--plot``: time and bus bandwidth against size, a row of two panels per collective; per
backend and variant the median as a line and the min-p90 spread as a band; the measured sizes on
the x axis, the legend beside the panels, and who, when and where in the subtitle.

Needs matplotlib (``pip install 'shmcomm[plot]'``); nothing else of the bench does.
"""

from __future__ import annotations

import math

from .common import BACKENDS, VARIANTS, BenchError

_COLORS = {"shmcomm": "tab:blue", "gloo": "tab:orange", "mpi": "tab:green", "impi": "tab:red",
           "deepspeed": "tab:purple"}
_MARKERS = "osD^v<>pP*Xh"
_MAX_TICKS = 12


def import_pyplot():
    """matplotlib.pyplot on the file-only Agg backend; BenchError naming the extra to install."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never needs a display
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise BenchError(f"--plot needs matplotlib ({exc}); install it with "
                         f"`pip install 'shmcomm[plot]'` (or `pip install matplotlib`)") from None
    return plt


def _size_label(value: float) -> str:
    """Axis label of a size: 8, 1K, 32M."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value >= scale:
            return f"{value / scale:g}{unit}"
    return f"{value:g}"


def _series(records: list[dict]):
    """(backend, variant, case label, points sorted by size) per line to draw."""
    keys = list(dict.fromkeys((r["type"], r["redop"], r["root"]) for r in records))
    for backend in BACKENDS:
        for variant in VARIANTS:
            for key in keys:
                pts = sorted((r["size"], r["time_us"], r["min_us"], r["p90_us"], r["busbw_factor"])
                             for r in records if r["backend"] == backend and r["variant"] == variant
                             and (r["type"], r["redop"], r["root"]) == key)
                if pts:
                    label = " ".join(str(k) for k in key if k not in ("none", -1)) if len(keys) > 1 else ""
                    yield backend, variant, label, keys.index(key), pts


def _draw_barrier(ax, records: list[dict]) -> None:
    """Barrier moves no data: one bar per backend, its median with a min-p90 error bar."""
    best = {}
    for r in records:
        if r["backend"] not in best or r["time_us"] < best[r["backend"]]["time_us"]:
            best[r["backend"]] = r
    names = [b for b in BACKENDS if b in best]
    med = [best[b]["time_us"] for b in names]
    err = [[m - best[b]["min_us"] for b, m in zip(names, med)], [best[b]["p90_us"] - m for b, m in zip(names, med)]]
    ax.bar(names, med, yerr=err, capsize=4, color=[_COLORS[b] for b in names])
    ax.set_yscale("log")
    ax.set_ylabel("time (us)")
    ax.set_title("barrier: time per call (median, min-p90)")


def write_plot(path: str, records: list[dict], collectives: list[str], title: str = "",
               subtitle: str = "") -> None:
    """Draw time and bus bandwidth against size (log-log) for every backend and variant: one
    figure, a row of two panels per collective (barrier: a bar chart of its time), the median as
    a line and the min-p90 spread as a band; ``subtitle`` goes under ``title`` (version, date,
    machine).

    Raises BenchError when matplotlib is missing. Example::

        write_plot("out.png", records, ["all_reduce"], "all_reduce, 2 ranks", "shmcomm 0.1.0, 2 cores")
    """
    plt = import_pyplot()
    from matplotlib import ticker

    colls = [c for c in collectives if any(r["collective"] == c for r in records)]
    if not colls:
        raise BenchError("--plot: nothing was measured, so there is nothing to draw")
    # Constrained layout keeps the title, the panels and the outside legends clear of each other.
    fig, axes = plt.subplots(len(colls), 2, figsize=(13, 3.8 * len(colls) + 0.8), squeeze=False,
                             layout="constrained")
    for (ax_t, ax_b), coll in zip(axes, colls):
        mine = [r for r in records if r["collective"] == coll]
        if coll == "barrier":
            _draw_barrier(ax_t, mine)
            ax_b.axis("off")
            continue
        sizes = sorted({r["size"] for r in mine})
        for backend, variant, label, k, pts in _series(mine):
            x = [p[0] for p in pts]
            style = dict(color=_COLORS[backend], marker=_MARKERS[k % len(_MARKERS)], ms=3,
                         linestyle="-" if variant == "out-of-place" else "--")
            name = " ".join(p for p in (backend, variant, label) if p)
            ax_t.plot(x, [p[1] for p in pts], label=name, **style)
            ax_t.fill_between(x, [p[2] for p in pts], [p[3] for p in pts], color=_COLORS[backend], alpha=0.15,
                              linewidth=0)
            # busbw from the median time; the band spans the p90 (slowest) to the min (fastest) time
            bw = [(s, s * f / (t * 1e3), s * f / (hi * 1e3), s * f / (lo * 1e3)) for s, t, lo, hi, f in pts
                  if f > 0 and lo > 0]
            if bw:  # log axes cannot show 0 (one rank, barrier)
                ax_b.plot([b[0] for b in bw], [b[1] for b in bw], label=name, **style)
                ax_b.fill_between([b[0] for b in bw], [b[2] for b in bw], [b[3] for b in bw],
                                  color=_COLORS[backend], alpha=0.15, linewidth=0)
        ticks = sizes[::math.ceil(len(sizes) / _MAX_TICKS)]  # every k-th size, the first one always
        for ax, ylabel in ((ax_t, "time (us)"), (ax_b, "busbw (GB/s)")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks)
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: _size_label(v)))
            ax.xaxis.set_minor_formatter(ticker.NullFormatter())
            ax.set_yscale("log")
            ax.set_xlabel("size (B)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        ax_t.set_title(f"{coll}: time (lower is better)")
        ax_b.set_title(f"{coll}: bus bandwidth (higher is better)")
        if ax_t.get_lines():
            ax_b.legend(*ax_t.get_legend_handles_labels(), fontsize=7, loc="upper left",
                        bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.suptitle("\n".join(t for t in (title, subtitle) if t), fontsize=10)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # "tight" keeps the outside legends in the file
    plt.close(fig)
