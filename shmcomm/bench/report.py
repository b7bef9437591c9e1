"""Reports: flat records of every measurement, the nccl-tests table, shmcomm/peer time ratios, the
list of skipped combinations, CSV and JSON.

Every time is a spread over iterations (see ``measure``): ``time_us`` is the median, with
``min_us`` and ``p90_us``; bandwidths and ratios come from the medians.
"""

from __future__ import annotations

import csv
import json
import math

from .cases import ANY
from .common import VARIANTS
from .runner import BackendResult
from .sizes import busbw_factor
from .table import Column, render
from .workers import _WORKERS


def _best_of_rounds(rows: list[dict]) -> list[dict]:
    """One row per (case, size): per variant the round with the lowest median, with every round's
    median in ``round_times_us`` and the wrong elements of all rounds added up."""
    merged: dict[tuple, dict] = {}
    for row in rows:
        key = tuple(row.get(k) for k in ("collective", "dtype", "op", "root", "size"))
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
    """One flat record per (backend, case, size, variant) that was measured (the best round)."""
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
                    "count": row["count"], "type": row["dtype"], "redop": row["op"], "root": row["root"],
                    "variant": variant, "time_us": m["time_us"], "min_us": m["min_us"], "p90_us": m["p90_us"],
                    "mean_us": m["mean_us"], "algbw_GBps": algbw, "busbw_GBps": algbw * factor,
                    "busbw_factor": factor, "wrong": m["wrong"], "iters": m["iters"], "warmup": m["warmup"],
                    "zero_copy": bool(cfg["zero_copy"]) and res.backend == "shmcomm",
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


_LEAD_COLS = [Column("size", "(B)", 12), Column("count", "(elements)", 12), Column("type", "", 8),
              Column("redop", "", 6), Column("root", "", 6)]
_VARIANT_COLS = [Column("time", "(us)", 8), Column("min", "(us)", 8), Column("p90", "(us)", 8),
                 Column("algbw", "(GB/s)", 6), Column("busbw", "(GB/s)", 6), Column("#wrong", "", 6)]
MISSING = "-"  # cells of a variant the backend's API does not have; a legend line says why


def _variant_cells(r: dict | None) -> list[str]:
    if r is None:
        return [MISSING] * len(_VARIANT_COLS)
    wrong = "N/A" if r["wrong"] is None else str(r["wrong"])  # N/A: not checked (as nccl-tests)
    return [_fmt_time(r["time_us"]), _fmt_time(r["min_us"]), _fmt_time(r["p90_us"]),
            _fmt_bw(r["algbw_GBps"]), _fmt_bw(r["busbw_GBps"]), wrong]


def format_table(records: list[dict], backend: str, collective: str) -> str:
    """The nccl-tests table of one backend and collective: a row per (type, redop, root, size),
    out-of-place then in-place columns, each with the median time and its min and p90; ``-``
    where the backend's API has no such variant (a legend line says why); ``N/A`` #wrong without
    ``--check``; then the average bus bandwidth.

    Example::

        print(format_table(records, "shmcomm", "all_reduce"))
    """
    by_row: dict[tuple, dict] = {}
    for r in records:
        if r["backend"] == backend and r["collective"] == collective:
            by_row.setdefault((r["type"], r["redop"], r["root"], r["size"]), {})[r["variant"]] = r
    rows, busbws, missing = [], [], []
    for cells in by_row.values():
        first = next(iter(cells.values()))
        line = [str(first["size"]), str(first["count"]), first["type"], first["redop"], str(first["root"])]
        for variant in VARIANTS:
            line += _variant_cells(cells.get(variant))
            if variant in cells:
                busbws.append(cells[variant]["busbw_GBps"])
            elif variant not in missing:
                missing.append(variant)
        rows.append(line)
    lines = render(_LEAD_COLS + _VARIANT_COLS * len(VARIANTS), rows,
                   [("", len(_LEAD_COLS))] + [(v, len(_VARIANT_COLS)) for v in VARIANTS])
    for variant in missing:
        why = _WORKERS[backend].missing(collective, variant) or "not measured"
        lines.append(f"# {MISSING} {variant}: {why}")
    if busbws and collective != "barrier":
        lines.append(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.4g} GB/s (from the medians)")
    return "\n".join(lines)


def _common_variant(a: dict, b: dict) -> str | None:
    """Compare like with like: out-of-place when both have it, else in-place."""
    for variant in VARIANTS:
        if variant in a and variant in b:
            return variant
    return None


def _ratio_cell(ratio: float, lo: float, hi: float, tag: str = "") -> str:
    return f"{ratio:.3g} [{lo:.2g}, {hi:.2g}]" + (f" {tag}" if tag else "")


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def format_ratios(records: list[dict], collectives: list[str], peers: list[str]) -> str:
    """Per collective, case and size, shmcomm's median time divided by each peer's (below 1:
    shmcomm faster), with the range the spreads allow (shmcomm's min / the peer's p90 to
    shmcomm's p90 / the peer's min), on the variant both measured (``oop``/``ip``); then the
    geometric means per dtype and op (when several ran) and per collective.

    Example::

        print(format_ratios(records, ["all_reduce"], ["gloo", "mpi"]))
    """
    index: dict[tuple, dict] = {}
    for r in records:
        index.setdefault((r["backend"], r["collective"], r["type"], r["redop"], r["root"], r["size"]),
                         {})[r["variant"]] = r
    rows = []
    for coll in collectives:
        keys = [k[1:] for k in index if k[0] == "shmcomm" and k[1] == coll]
        logs: dict[tuple, dict[str, list]] = {}  # (type, redop) -> peer -> [(ratio, lo, hi)]
        for key in keys:
            mine, cells = index[("shmcomm", *key)], []
            for peer in peers:
                theirs = index.get((peer, *key), {})
                variant = _common_variant(mine, theirs)
                if variant is None or min(theirs[variant]["min_us"], mine[variant]["min_us"]) <= 0:
                    cells.append("-")
                    continue
                a, b = mine[variant], theirs[variant]
                spread = (a["time_us"] / b["time_us"], a["min_us"] / b["p90_us"], a["p90_us"] / b["min_us"])
                logs.setdefault(key[1:3], {}).setdefault(peer, []).append(spread)
                cells.append(_ratio_cell(*spread, "oop" if variant == "out-of-place" else "ip"))
            if any(c != "-" for c in cells):  # no peer ran it (each peer's skip line says why)
                rows.append([coll, key[1], key[2], str(key[3]), str(key[4])] + cells)
        groups = list(logs.items()) if len(logs) > 1 else []
        everything = {p: [s for per_peer in logs.values() for s in per_peer.get(p, [])] for p in peers}
        overall = next(iter(logs)) if len(logs) == 1 else ("all", "all")
        for (dtname, op), per_peer in groups + [(overall, everything)]:
            if sum(len(v) for v in per_peer.values()) < 2:
                continue
            cells = [_ratio_cell(*(_geomean([s[i] for s in per_peer[p]]) for i in range(3)))
                     if per_peer.get(p) else "-" for p in peers]
            rows.append([coll, dtname, op, "", "geomean"] + cells)
    head = ["# shmcomm time / peer time, of the medians (below 1: shmcomm is faster); [lo, hi]: "
            "shmcomm min / peer p90 to shmcomm p90 / peer min; oop/ip: the variant compared"]
    cols = [Column("collective", left=True), Column("type", left=True), Column("redop", left=True),
            Column("root"), Column("size", "(B)")] + [Column(f"vs {p}") for p in peers]
    return "\n".join(head + render(cols, rows))


def format_skips(skipped: list[tuple], who: str = "") -> list[str]:
    """One ``#`` line per reason, naming the collectives, dtypes and ops skipped for it.

    Example::

        >>> from .cases import Case
        >>> format_skips([(Case("all_reduce", "float32", "band", -1), "bitwise ops need an integer or bool dtype")])
        ['# skipped op band on float32 in all_reduce: bitwise ops need an integer or bool dtype']
    """
    by_reason: dict[str, list] = {}
    for case, reason in skipped:
        by_reason.setdefault(reason, []).append(case)
    lines = []
    for reason, cases in by_reason.items():
        # ops and roots are named only where every case has one (else the reason is not theirs)
        ops = ", ".join(dict.fromkeys(c.op for c in cases)) if all(c.op != "none" for c in cases) else ""
        names = ", ".join(dict.fromkeys(c.dtype for c in cases if c.dtype != ANY))
        roots = ", ".join(map(str, sorted({c.root for c in cases}))) if all(c.root >= 0 for c in cases) else ""
        what = (f"op {ops} on " if ops else "") + (f"{names} in " if names else "") \
            + ", ".join(dict.fromkeys(c.collective for c in cases)) + (f" (root {roots})" if roots else "")
        lines.append(f"# {who + ' ' if who else ''}skipped {what}: {reason}")
    return lines


_CSV_FIELDS = ("backend", "collective", "nranks", "size", "count", "type", "redop", "root", "variant",
               "time_us", "min_us", "p90_us", "mean_us", "algbw_GBps", "busbw_GBps", "busbw_factor", "wrong",
               "iters", "warmup", "zero_copy")


def write_csv(path: str, records: list[dict]) -> None:
    """One CSV line per measured (backend, case, size, variant); ``time_us`` is the median;
    ``wrong`` empty without --check.

    Example::

        write_csv("out.csv", records)
    """
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=_CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in records:
            writer.writerow({k: ("" if r[k] is None else r[k]) for k in _CSV_FIELDS})


def _skip_list(skipped) -> list[dict]:
    return [{**case._asdict(), "reason": reason} for case, reason in skipped]


def write_json(path: str, meta: dict, results: list[BackendResult], records: list[dict],
               skipped: list = ()) -> None:
    """``{"meta", "skipped", "backends": {name: status, reason, versions, skipped, ...}, "rows"}``;
    ``skipped`` lists the combinations shmcomm cannot run, each backend's those it cannot.

    Example::

        write_json("out.json", meta, results, records, skipped)
    """
    doc = {
        "meta": meta,
        "skipped": _skip_list(skipped),
        "backends": {res.backend: {"status": res.status, "reason": res.reason, "versions": res.versions,
                                   "command": res.command, "skipped": _skip_list(res.skipped),
                                   "warnings": res.warnings} for res in results},
        "rows": records,
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
