"""One rank's sweep: a case per (step, variant) with its buffers and check, the timing loop, the
spread of the per-iteration times, and the worker's main, which streams one event line per step
to the parent.

Each iteration is timed on its own, on every rank. The time of an iteration is the slowest
rank's (a collective is done when its last rank is; nccl-tests takes the maximum over ranks too,
of the mean), and a row reports the minimum, median and 90th percentile of those times.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from .cases import Case, steps
from .common import _MARK, VARIANTS
from .dtypes import BenchDtype, bench_dtype
from .turns import Gate, GateClosed
from .verify import SENTINEL, count_wrong, pattern, reference
from .workers import _WORKERS, _Worker

_MAX_ITERS = 20000
_MIN_ITERS = 5
_PROBES = 3  # the first round of probe calls (_plan_iters doubles it)
_MAX_PROBES = 96
_FILLS = np.arange(1, 5)  # refill values, one per iteration in turn: small, so nothing overflows


@dataclass
class _Case:
    call: object
    fills: list  # arrays refilled before every iteration
    values: np.ndarray  # the refill values, in the dtype
    check: object  # () -> wrong elements on this rank


def _build_case(wk: _Worker, step, variant: str) -> _Case:
    """Buffers, the timed call and the check of one step in one variant."""
    (collective, dtname, op, root), count, chunk = step.case, step.count, step.chunk
    dt: BenchDtype = bench_dtype(dtname)
    dtype, n, r = dt.storage, wk.size, wk.rank
    ip = variant == "in-place"
    send = recv = None
    if collective in ("all_reduce", "reduce", "broadcast", "send_recv", "scan"):
        if ip:
            send = recv = wk.alloc(count, dtype)
        else:
            send, recv = wk.alloc(count, dtype), wk.alloc(count, dtype)
    elif collective in ("all_gather", "gather"):
        recv = wk.alloc(count, dtype)
        send = recv[r * chunk:(r + 1) * chunk] if ip else wk.alloc(chunk, dtype)
    elif collective in ("scatter", "reduce_scatter"):
        send = wk.alloc(count, dtype)
        block = r if collective == "scatter" else wk.rs_inplace_block()
        recv = send[block * chunk:(block + 1) * chunk] if ip else wk.alloc(chunk, dtype)
    elif collective == "all_to_all":
        recv = wk.alloc(count, dtype)
        send = recv if ip else wk.alloc(count, dtype)
    call = wk.make_call(step.case, variant, send, recv, chunk, dt)
    if collective == "barrier":
        fills = []
    elif collective == "send_recv":
        fills = [send] if r == 0 else []
    else:
        fills = [send]
    values = dt.encode(_FILLS % 2 if dt.kind == "bool" else _FILLS)  # bool: alternate

    def check() -> int:
        if collective == "barrier":
            call()
            return 0
        recv[...] = dt.encode(np.array(SENTINEL))
        send[...] = pattern(r, send.size, dt, op)
        call()
        pat = lambda q, length: pattern(q, length, dt, op)  # noqa: E731
        if collective == "all_reduce" or (collective == "reduce" and r == root):
            expected = reference(count, n, dt, op)
        elif collective == "scan":  # ranks 0..r
            expected = reference(count, r + 1, dt, op)
        elif collective == "broadcast":
            expected = pat(root, count)
        elif collective in ("all_gather",) or (collective == "gather" and r == root):
            expected = np.concatenate([pat(q, chunk) for q in range(n)])
        elif collective == "scatter":
            expected = pat(root, count)[r * chunk:(r + 1) * chunk]
        elif collective == "reduce_scatter":
            expected = reference(count, n, dt, op)[r * chunk:(r + 1) * chunk]
        elif collective == "all_to_all":
            expected = np.concatenate([pat(q, count)[r * chunk:(r + 1) * chunk] for q in range(n)])
        elif collective == "send_recv" and r in (0, 1):
            expected = pat(0, count)
        else:
            return 0  # this rank holds no result (non-root of reduce/gather, idle send_recv rank)
        return count_wrong(recv, expected, dt)

    return _Case(call, fills, values, check)


def _time_loop(case: _Case, start: int, iters: int) -> np.ndarray:
    """Seconds spent inside each of ``iters`` calls; the refill before each call is not timed (a
    value that changes every iteration, so no call can reuse the previous result)."""
    call, fills, values, clock = case.call, case.fills, case.values, time.perf_counter
    times = np.empty(iters)
    for k in range(iters):
        value = values[(start + k) % len(values)]
        for buf in fills:
            buf.fill(value)
        t0 = clock()
        call()
        times[k] = clock() - t0
    return times


def spread(seconds: np.ndarray) -> dict:
    """``time_us`` (the median), ``min_us``, ``p90_us`` and ``mean_us`` of per-iteration times.

    Example::

        >>> spread(np.array([1e-6, 2e-6, 3e-6]))["time_us"]
        2.0
    """
    us = seconds * 1e6
    return {"time_us": float(np.median(us)), "min_us": float(us.min()),
            "p90_us": float(np.percentile(us, 90)), "mean_us": float(us.mean())}


def _plan_iters(wk: _Worker, case: _Case, target_time: float) -> int:
    """Iterations that take about ``target_time``, from rounds of probe calls (they also warm
    up). The first calls of a size pay page faults, and right after start-up they meet peers
    still sleeping: 3 probes at 16 ranks on 16 cores once planned 13 iterations of an 8-byte
    all_reduce that then measured the warm-up (70 us a call against 3). So rounds of 3, 6, 12,
    ... calls go on until one's median is within a quarter of the round before, or the probes
    took half the target time. The count must not depend on local timings, or ranks would issue
    different numbers of collectives: rank 0 alone decides, and says so after every round."""
    count, spent, before = _PROBES, 0.0, None
    while True:
        probes = _time_loop(case, 0, count)
        plan = 0  # 0: probe again
        if wk.rank == 0:
            median, spent = float(np.median(probes)), spent + float(probes.sum())
            settled = before is not None and median >= 0.75 * before
            if settled or spent >= target_time / 2 or count >= _MAX_PROBES:
                plan = max(_MIN_ITERS, min(_MAX_ITERS, int(target_time / max(median, 1e-7))))
            before = median
        plan = wk.bcast_obj(plan)
        if plan:
            return plan
        count *= 2


def _measure(wk: _Worker, cfg: dict, case: _Case, collective: str) -> dict:
    """Warm up, time, and (with --check) verify one case; rank 0 gets the numbers of all ranks."""
    wk.barrier()
    iters, warmup = cfg["iters"], cfg["warmup"]
    if iters is None:
        iters = _plan_iters(wk, case, cfg["target_time"])
    if warmup is None:
        warmup = max(1, min(iters // 10, 1000))
    _time_loop(case, 0, warmup)
    wk.barrier()
    times = _time_loop(case, warmup, iters)
    if collective == "send_recv":  # one-way latency from rank 0's round trips
        times = times / 2 if wk.rank == 0 else np.zeros_like(times)
    wrong = case.check() if cfg["check"] else None
    stats = wk.gather_obj((times, wrong))
    if wk.rank != 0:
        return {}
    per_rank = np.stack([s[0] for s in stats])
    return {**spread(per_rank.max(axis=0)), "rank_times_us": [float(np.median(t)) * 1e6 for t in per_rank],
            "iters": iters, "warmup": warmup, "wrong": None if wrong is None else int(sum(s[1] for s in stats))}


def _emit(event: dict) -> None:
    sys.stdout.write(_MARK + json.dumps(event) + "\n")
    sys.stdout.flush()


def _worker_main(backend: str, cfg: dict) -> int:
    """Body of one rank: run this backend's steps, rank 0 streams events to stdout."""
    try:
        wk = _WORKERS[backend](cfg)
    except ImportError as exc:  # not installed (or broken install): a skip, never a fake number
        if os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")) == "0":
            _emit({"event": "skip", "reason": f"{type(exc).__name__}: {exc}"})
        return 0
    gate = None
    try:
        gate = Gate(cfg.get("gate"), wk.rank)
        if wk.rank == 0:
            _emit({"event": "start", "versions": wk.versions(), "nranks": wk.size})
        plan = steps([Case(*c) for c in cfg["cases"]], cfg["sizes"], wk.size, cfg.get("rounds", 1))
        for step in plan:
            gate.wait()  # other backends measure while this one sleeps here
            coll = step.case.collective
            row = {"event": "row", **step.case._asdict(), "count": step.count, "chunk": step.chunk,
                   "size": step.count * bench_dtype(step.case.dtype).itemsize, "round": step.round,
                   "results": {}}
            for variant in VARIANTS:
                if wk.missing(coll, variant) is None:
                    case = _build_case(wk, step, variant)
                    row["results"][variant] = _measure(wk, cfg, case, coll)
                    del case  # frees (zero-copy: unmaps) the buffers before the next one
            if wk.rank == 0:
                _emit(row)
        gate.wait()  # until every backend measured its last step: leaving the group is work too
        wk.barrier()
        if wk.rank == 0:
            _emit({"event": "done"})
    except GateClosed:
        return 1  # the parent stopped the run (another failure, or Ctrl-C); it reports why
    finally:
        if gate is not None:
            gate.close()
        wk.close()
    return 0
