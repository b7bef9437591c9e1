"""One rank's sweep: a case per (collective, size, variant) with its buffers and check, the timing
loop, and the worker's main, which streams one event line per size to the parent."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from .common import _MARK, VARIANTS, _numpy_dtype
from .sizes import collective_sizes
from .turns import Gate, GateClosed
from .verify import _SENTINEL, _count_wrong, _pattern, _reference
from .workers import _WORKERS, _Worker

_MAX_ITERS = 20000
_MIN_ITERS = 5
_PROBES = 3


@dataclass
class _Case:
    call: object
    fills: list  # arrays refilled before every iteration
    check: object  # () -> wrong elements on this rank


def _build_case(wk: _Worker, cfg: dict, collective: str, variant: str, count: int, chunk: int):
    """Buffers, the timed call and the check for one measurement; None if the API lacks it."""
    if not wk.supports(collective, variant):
        return None
    dtname, op, root = cfg["dtype"], cfg["op"], 0
    dtype, n, r = _numpy_dtype(dtname), wk.size, wk.rank
    ip = variant == "in-place"
    send = recv = None
    if collective in ("all_reduce", "reduce", "broadcast", "send_recv"):
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
    call = wk.make_call(collective, variant, send, recv, chunk, root)
    if collective == "barrier":
        fills = []
    elif collective == "send_recv":
        fills = [send] if r == 0 else []
    else:
        fills = [send]

    def check() -> int:
        if collective == "barrier":
            call()
            return 0
        recv.fill(_SENTINEL)
        send[...] = _pattern(r, send.size, dtype, dtname, op)
        call()
        pat = lambda q, length: _pattern(q, length, dtype, dtname, op)  # noqa: E731
        if collective == "all_reduce" or (collective == "reduce" and r == root):
            expected = _reference(count, n, dtype, dtname, op)
        elif collective == "broadcast":
            expected = pat(root, count)
        elif collective in ("all_gather",) or (collective == "gather" and r == root):
            expected = np.concatenate([pat(q, chunk) for q in range(n)])
        elif collective == "scatter":
            expected = pat(root, count)[r * chunk:(r + 1) * chunk]
        elif collective == "reduce_scatter":
            expected = _reference(count, n, dtype, dtname, op)[r * chunk:(r + 1) * chunk]
        elif collective == "all_to_all":
            expected = np.concatenate([pat(q, count)[r * chunk:(r + 1) * chunk] for q in range(n)])
        elif collective == "send_recv" and r in (0, 1):
            expected = pat(0, count)
        else:
            return 0  # this rank holds no result (non-root of reduce/gather, idle send_recv rank)
        return _count_wrong(recv, expected, dtname)

    return _Case(call, fills, check)


def _time_loop(case: _Case, start: int, iters: int) -> float:
    """Total seconds spent inside ``iters`` calls; the refill before each call is not timed."""
    call, fills, clock = case.call, case.fills, time.perf_counter
    total = 0.0
    for i in range(start, start + iters):
        value = i % 4 + 1  # changes every iteration; small so products and sums never overflow
        for buf in fills:
            buf.fill(value)
        t0 = clock()
        call()
        total += clock() - t0
    return total


def _measure(wk: _Worker, cfg: dict, case: _Case, collective: str) -> dict:
    """Warm up, time, and (with --check) verify one case; rank 0 gets the numbers of all ranks."""
    wk.barrier()
    iters, warmup = cfg["iters"], cfg["warmup"]
    if iters is None:
        # Time a fixed number of probe calls (they also warm up; the first pays the page faults)
        # and aim at target_time. The count must not depend on local timings, or ranks would
        # issue different numbers of collectives; rank 0 alone turns its estimate into the plan.
        probes = sorted(_time_loop(case, i, 1) for i in range(_PROBES))
        typical = probes[len(probes) // 2]  # the median: neither the page-faulting first call nor a lucky one
        plan = None
        if wk.rank == 0:
            planned = int(cfg["target_time"] / max(typical, 1e-7))
            plan = max(_MIN_ITERS, min(_MAX_ITERS, planned))
        iters = wk.bcast_obj(plan)
    if warmup is None:
        warmup = max(1, min(iters // 10, 1000))
    _time_loop(case, 0, warmup)
    wk.barrier()
    total = _time_loop(case, warmup, iters)
    mean = total / iters
    if collective == "send_recv":
        mean = mean / 2 if wk.rank == 0 else 0.0  # one-way latency from rank 0's round trips
    wrong = case.check() if cfg["check"] else None
    stats = wk.gather_obj((mean, wrong))
    if wk.rank != 0:
        return {}
    times = [s[0] for s in stats]
    return {"time_us": max(times) * 1e6, "rank_times_us": [t * 1e6 for t in times], "iters": iters,
            "warmup": warmup, "wrong": None if wrong is None else int(sum(s[1] for s in stats))}


def _emit(event: dict) -> None:
    sys.stdout.write(_MARK + json.dumps(event) + "\n")
    sys.stdout.flush()


def _worker_main(backend: str, cfg: dict) -> int:
    """Body of one rank: run the sweep, rank 0 streams events to stdout."""
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
        dtype = _numpy_dtype(cfg["dtype"])
        for collective in cfg["collectives"]:
            if collective == "send_recv" and wk.size < 2:
                if wk.rank == 0:
                    _emit({"event": "note", "collective": collective, "reason": "needs at least 2 ranks"})
                continue
            for count, chunk in collective_sizes(collective, cfg["sizes"], wk.size, dtype.itemsize):
                for turn in range(cfg.get("rounds", 1)):
                    gate.wait()  # other backends measure while this one sleeps here
                    row = {"event": "row", "collective": collective, "count": count, "chunk": chunk,
                           "size": count * dtype.itemsize, "round": turn, "results": {}}
                    for variant in VARIANTS:
                        case = _build_case(wk, cfg, collective, variant, count, chunk)
                        if case is not None:
                            row["results"][variant] = _measure(wk, cfg, case, collective)
                        del case  # frees (zero-copy: unmaps) the buffers before the next size
                    if wk.rank == 0:
                        _emit(row)
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
