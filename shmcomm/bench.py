"""``shmcomm-bench``: nccl-tests-style sweeps of every collective, with peers measured in the same run.

Same as ``python -m shmcomm.bench``::

    shmcomm-bench all_reduce -n 2 -b 8 -e 32M -f 8 --backend shmcomm,gloo,mpi
    shmcomm-bench all -n 4 -b 8 -e 1M --check --json out.json --csv out.csv --plot out.png
    shmcomm-bench broadcast -n 2 -b 1M -e 1M --zero-copy --iters 50

For each backend the tool starts N worker processes (``shmcomm``: this Python, one job name per
run; ``gloo``: ``torch.distributed`` over 127.0.0.1; ``mpi``: ``mpi4py`` under ``mpirun``). Every
worker runs the same sweep; rank 0 streams one JSON line per size back to this process, which
shows progress on stderr and prints, per collective and backend, a table with the nccl-tests
columns, then (when peers ran) shmcomm's time divided by each peer's.

How a time is measured: each iteration first refills the input buffers (a cheap fill with a value
that changes every iteration, outside the timed region, so no iteration reuses the previous
result), then times one call from Python to its return. After a warm-up, the mean over the
iterations is taken on every rank and the maximum over ranks is reported. Without ``--iters``,
the iteration count aims at ``--target-time`` seconds per size (at most 20000, at least 5), so
8-byte calls run many thousand times and 32 MiB ones a few dozen.

Out-of-place and in-place follow each library's own API: shmcomm and ``torch.distributed`` reduce
and broadcast in place only (``n/a`` out of place); their in-place all_gather, gather, scatter and
reduce_scatter pass a slice of the output as the input (as FSDP does); MPI uses ``MPI.IN_PLACE``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import json
import math
import os
import platform
import re
import selectors
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from dataclasses import dataclass, field

import numpy as np

__all__ = ["COLLECTIVES", "BACKENDS", "BenchError", "BackendResult", "parse_size", "format_size",
           "sweep_sizes", "collective_sizes", "busbw_factor", "backend_available", "build_parser",
           "parse_args", "run_backend", "format_table", "format_ratios", "write_json", "write_csv",
           "write_plot", "run", "main"]

PROG = "shmcomm-bench"
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter",
               "reduce_scatter", "all_to_all", "send_recv", "barrier")
BACKENDS = ("shmcomm", "gloo", "mpi")
VARIANTS = ("out-of-place", "in-place")
EXIT_USAGE = 2  # what argparse uses
# Collectives whose result is a reduction; only these use --op (nccl-tests prints "none" otherwise).
_REDUCING = ("all_reduce", "reduce", "reduce_scatter")
# Collectives with a root rank (rank 0 here); -1 in the table for the others, as nccl-tests does.
_ROOTED = ("broadcast", "reduce", "gather", "scatter")
# Size-per-rank collectives: the sweep size is the total over ranks (nccl-tests convention).
_PER_RANK = ("all_gather", "gather", "scatter", "reduce_scatter", "all_to_all")

_MARK = "@@shmcomm-bench@@ "  # prefix of the worker's event lines, so stray prints cannot confuse us
_MAX_ITERS = 20000
_MIN_ITERS = 5
_PROBES = 3
_TAIL_LINES = 15

# dtype name -> (aliases accepted on the command line). numpy names are the canonical ones.
_DTYPES = {
    "int8": ("char",), "uint8": ("byte",), "int32": ("int",), "uint32": (), "int64": ("long",),
    "uint64": (), "float16": ("half", "fp16"), "bfloat16": ("bf16",), "float32": ("float", "fp32"),
    "float64": ("double", "fp64"),
}
_OPS = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX", "avg": "AVG"}
_OP_ALIASES = {"product": "prod", "mean": "avg"}


class BenchError(Exception):
    """A problem the user can fix (bad arguments, missing optional package); printed, exit 2."""


# ---------------------------------------------------------------------------------------------
# Sizes, shapes and bus-bandwidth factors
# ---------------------------------------------------------------------------------------------
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes in ``text``: a number with an optional binary K/M/G/T suffix (``B``/``iB`` allowed).

    As in nccl-tests, K means 1024. Raises ValueError for anything else::

        >>> parse_size("64M"), parse_size("8"), parse_size("1.5K"), parse_size("2KiB")
        (67108864, 8, 1536, 2048)
    """
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(f"invalid size {text!r}: use a number with an optional K, M, G or T suffix "
                         f"(binary units, e.g. 8, 32K, 64M)")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value != int(value):
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    return int(value)


def format_size(nbytes: int) -> str:
    """Short human form of a byte count, exact where possible.

    Example::

        >>> format_size(8), format_size(32768), format_size(33554432), format_size(1500)
        ('8 B', '32 KiB', '32 MiB', '1500 B')
    """
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def sweep_sizes(minbytes: int, maxbytes: int, factor: float) -> list[int]:
    """Sizes from ``minbytes`` to ``maxbytes`` (inclusive), each ``factor`` times the previous.

    Example::

        >>> sweep_sizes(8, 1024, 8)
        [8, 64, 512]
    """
    if minbytes < 1 or maxbytes < minbytes or factor <= 1:
        raise ValueError(f"need 1 <= minbytes <= maxbytes and factor > 1, "
                         f"got {minbytes}, {maxbytes}, {factor}")
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        size = max(size + 1, int(size * factor))  # a factor like 1.1 must still move forward
    return sizes


def collective_sizes(collective: str, sizes: list[int], nranks: int, itemsize: int) -> list[tuple[int, int]]:
    """``(count, chunk)`` pairs the sweep runs for ``collective``: total and per-rank element counts.

    The size of a row is ``count * itemsize`` bytes. For all_gather, gather, scatter,
    reduce_scatter and all_to_all the size is the total over ranks (nccl-tests convention), so
    each rank's part is ``chunk = count / nranks`` elements, at least one. Sizes that round to the
    same count are measured once; barrier has a single row of size 0::

        >>> collective_sizes("all_gather", [8, 16, 64], 4, 4)
        [(4, 1), (16, 4)]
    """
    if collective == "barrier":
        return [(0, 0)]
    pairs = []
    for size in sizes:
        if collective in _PER_RANK:
            chunk = max(1, size // (itemsize * nranks))
            pair = (chunk * nranks, chunk)
        else:
            count = max(1, size // itemsize)
            pair = (count, count)
        if pair not in pairs:
            pairs.append(pair)
    return pairs


def busbw_factor(collective: str, nranks: int) -> float:
    """Bus bandwidth / algorithm bandwidth for ``collective`` on ``nranks`` ranks (as nccl-tests).

    ``all_reduce`` moves 2(n-1)/n of the data per rank; all_gather, reduce_scatter, gather,
    scatter and all_to_all (n-1)/n of the total; broadcast, reduce and send_recv 1; barrier 0::

        >>> busbw_factor("all_reduce", 4), busbw_factor("all_gather", 4), busbw_factor("broadcast", 4)
        (1.5, 0.75, 1.0)
    """
    n = nranks
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in _PER_RANK:
        return (n - 1) / n
    if collective in ("broadcast", "reduce", "send_recv"):
        return 1.0
    if collective == "barrier":
        return 0.0
    raise ValueError(f"unknown collective {collective!r}")


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # numpy has no bfloat16; ml_dtypes is what shmcomm accepts for it

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _is_float(name: str) -> bool:
    return name.startswith(("float", "bfloat"))


# ---------------------------------------------------------------------------------------------
# Check patterns and numpy references
# ---------------------------------------------------------------------------------------------
_SENTINEL = 99  # what outputs hold before a checked call; outside the patterns' range


def _pattern(rank: int, length: int, dtype: np.dtype, dtname: str, op: str) -> np.ndarray:
    """Input of ``rank`` for the check: small integers, so every sum is exact in every dtype
    (float16 included) and wrong placement (rank or offset) shows as wrong values."""
    idx = np.arange(length, dtype=np.int64)
    if op == "prod":  # factors 1, 2, -1 keep products exact powers of two for many ranks
        table = np.array([1, 2, 3] if dtname.startswith("uint") else [1, 2, -1], np.int64)
        values = table[(idx + rank) % 3]
    else:
        values = (idx * 5 + rank * 3 + 1) % 9
        if not dtname.startswith("uint"):
            values = values - 4
    return values.astype(dtype)


def _reference(length: int, nranks: int, dtype: np.dtype, dtname: str, op: str) -> np.ndarray:
    """The reduction over ranks of their patterns, computed the way a correct library must:
    integers wrap in their own dtype; floats are exact in float64 and rounded once at the end."""
    acc_dtype = np.float64 if _is_float(dtname) else dtype
    acc = _pattern(0, length, dtype, dtname, op).astype(acc_dtype)
    with np.errstate(over="ignore"):
        for q in range(1, nranks):
            x = _pattern(q, length, dtype, dtname, op).astype(acc_dtype)
            if op in ("sum", "avg"):
                acc = acc + x
            elif op == "prod":
                acc = acc * x
            elif op == "min":
                acc = np.minimum(acc, x)
            else:
                acc = np.maximum(acc, x)
        if op == "avg":
            acc = acc / nranks
        return acc.astype(dtype)


def _count_wrong(got: np.ndarray, expected: np.ndarray, dtname: str) -> int:
    """Elements of ``got`` that differ from ``expected`` (floats: beyond a few ulps of the dtype)."""
    if _is_float(dtname):
        rtol = {2: 1e-2, 4: 1e-5, 8: 1e-12}[expected.dtype.itemsize]
        ok = np.isclose(got.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=0.0,
                        equal_nan=True)
        return int(ok.size - np.count_nonzero(ok))
    return int(np.count_nonzero(got != expected))


# ---------------------------------------------------------------------------------------------
# Worker side: one class per backend wraps its API; a Case is one (collective, size, variant)
# ---------------------------------------------------------------------------------------------
class _Worker:
    """One rank of one backend: what the sweep needs from it. Subclasses fill in the API calls."""

    name = ""
    torch_like = True  # shmcomm and torch.distributed share one API shape

    rank = 0
    size = 1

    def alloc(self, count: int, dtype: np.dtype) -> np.ndarray:
        """A 1-D buffer the backend's calls accept; every rank allocates the same ones in order."""
        return np.empty(count, dtype)

    def make_call(self, collective: str, variant: str, send, recv, chunk: int, root: int):
        """The timed call: a closure running ``collective`` on numpy buffers ``send``/``recv``
        (the same or overlapping arrays for in-place), ``chunk`` elements per rank."""
        raise NotImplementedError

    def versions(self) -> dict:
        """Versions worth printing in the table header."""
        return {}

    def barrier(self) -> None:
        """Synchronise the ranks (outside any timed region)."""
        raise NotImplementedError

    def bcast_obj(self, obj):
        """Rank 0's ``obj`` on every rank (the iteration plan)."""
        raise NotImplementedError

    def gather_obj(self, obj):
        """Every rank's ``obj`` as a list on rank 0 (None elsewhere)."""
        raise NotImplementedError

    def close(self) -> None:
        """Leave the group; for shmcomm this releases the shared memory."""

    def supports(self, collective: str, variant: str) -> bool:
        """Whether the library's API has this variant of ``collective`` at all."""
        if self.torch_like:
            if collective in ("all_reduce", "broadcast", "reduce"):
                return variant == "in-place"  # these APIs have no separate output
            if collective in ("all_to_all", "send_recv", "barrier"):
                return variant == "out-of-place"
            return True
        if collective in ("broadcast",):
            return variant == "in-place"
        if collective in ("send_recv", "barrier"):
            return variant == "out-of-place"
        return True

    def rs_inplace_block(self) -> int:
        """Which block of the input an in-place reduce_scatter leaves its result in."""
        return self.rank

    def _ping_pong(self, send, recv, send_fn, recv_fn):
        """Rank 0 sends to rank 1 and waits for the echo; other ranks idle."""
        if self.rank == 0:
            def call():
                send_fn(send, 1)
                recv_fn(recv, 1)
        elif self.rank == 1:
            def call():  # echo what arrived, so rank 0 can check the round trip too
                recv_fn(recv, 0)
                send_fn(recv, 0)
        else:
            def call():
                pass
        return call


class _TorchLikeWorker(_Worker):
    """shmcomm and torch.distributed: same call shapes, different module and buffer wrapper."""

    api = None

    def wrap(self, array: np.ndarray):
        """The object the library's calls take for ``array``, sharing its memory."""
        return array

    def make_call(self, collective, variant, send, recv, chunk, root):
        api, w, op, r, n = self.api, self.wrap, self.op, self.rank, self.size
        if collective == "all_reduce":
            buf = w(recv)
            return lambda: api.all_reduce(buf, op=op)
        if collective == "broadcast":
            buf = w(recv)
            return lambda: api.broadcast(buf, src=root)
        if collective == "reduce":
            buf = w(recv)
            return lambda: api.reduce(buf, dst=root, op=op)
        if collective == "all_gather":
            out, inp, fn = w(recv), w(send), self.all_gather_into
            return lambda: fn(out, inp)
        if collective == "gather":
            inp = w(send)
            parts = [w(recv[q * chunk:(q + 1) * chunk]) for q in range(n)] if r == root else None
            return lambda: api.gather(inp, gather_list=parts, dst=root)
        if collective == "scatter":
            out = w(recv)
            parts = [w(send[q * chunk:(q + 1) * chunk]) for q in range(n)] if r == root else None
            return lambda: api.scatter(out, scatter_list=parts, src=root)
        if collective == "reduce_scatter":
            out, inp, fn = w(recv), w(send), self.reduce_scatter_into
            return lambda: fn(out, inp, op=op)
        if collective == "all_to_all":
            out, inp = w(recv), w(send)
            return lambda: api.all_to_all_single(out, inp)
        if collective == "send_recv":
            return self._ping_pong(w(send), w(recv), lambda b, d: api.send(b, d), lambda b, s: api.recv(b, s))
        if collective == "barrier":
            return api.barrier
        raise ValueError(collective)

    # Both modules spell these the same way.
    def barrier(self):
        self.api.barrier()

    def bcast_obj(self, obj):
        box = [obj]
        self.api.broadcast_object_list(box, src=0)
        return box[0]

    def gather_obj(self, obj):
        out = [None] * self.size if self.rank == 0 else None
        self.api.gather_object(obj, out, dst=0)
        return out

    def close(self):
        self.api.destroy_process_group()


class _ShmcommWorker(_TorchLikeWorker):
    name = "shmcomm"

    def __init__(self, cfg: dict):
        import shmcomm as sc

        self.api = sc
        self.rank, self.size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        sc.init_process_group(rank=self.rank, world_size=self.size, name=os.environ["SHMCOMM_JOB"],
                              timeout=float(cfg["timeout"]))
        self.op = sc.ReduceOp[_OPS[cfg["op"]]]
        self.zero_copy = bool(cfg["zero_copy"])
        self.all_gather_into = sc.all_gather_into
        self.reduce_scatter_into = sc.reduce_scatter_into

    def alloc(self, count, dtype):
        # sc.empty is collective: every rank allocates the same buffers in the same order.
        return self.api.empty(count, dtype) if self.zero_copy else np.empty(count, dtype)

    def versions(self) -> dict:
        return {"shmcomm": self.api.__version__}


class _GlooWorker(_TorchLikeWorker):
    name = "gloo"

    def __init__(self, cfg: dict):
        import warnings
        from datetime import timedelta

        # torch deprecates names across releases; the warnings would only clutter the output
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        import torch
        import torch.distributed as dist

        self.torch, self.api = torch, dist
        dist.init_process_group("gloo", init_method="env://",
                                timeout=timedelta(seconds=float(cfg["timeout"])))
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.op = getattr(dist.ReduceOp, _OPS[cfg["op"]])
        self.all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self.reduce_scatter_into = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def wrap(self, array):
        # The tensor shares the numpy array's memory, so fills and checks work on the array.
        if array.dtype.name == "bfloat16":
            return self.torch.from_numpy(array.view(np.int16)).view(self.torch.bfloat16)
        return self.torch.from_numpy(array)

    def versions(self) -> dict:
        return {"torch": self.torch.__version__}


class _MpiWorker(_Worker):
    name = "mpi"
    torch_like = False

    def __init__(self, cfg: dict):
        import mpi4py
        from mpi4py import MPI

        self.mpi4py, self.MPI = mpi4py, MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        if self.size != cfg["nranks"]:
            # mpi4py built for another MPI than this mpirun: each process is a world of its own
            raise RuntimeError(f"MPI world size is {self.size}, expected {cfg['nranks']}: is mpi4py "
                               f"built against the MPI of {_mpirun()}?")
        self.op = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}[cfg["op"]]

    def rs_inplace_block(self) -> int:
        return 0  # MPI_IN_PLACE Reduce_scatter_block leaves the result at the start of the buffer

    def make_call(self, collective, variant, send, recv, chunk, root):
        c, op, MPI, r, ip = self.comm, self.op, self.MPI, self.rank, variant == "in-place"
        IN_PLACE = MPI.IN_PLACE
        if collective == "all_reduce":
            return (lambda: c.Allreduce(IN_PLACE, recv, op)) if ip else (lambda: c.Allreduce(send, recv, op))
        if collective == "broadcast":
            return lambda: c.Bcast(recv, root)
        if collective == "reduce":
            if not ip:
                out = recv if r == root else None
                return lambda: c.Reduce(send, out, op, root)
            if r == root:
                return lambda: c.Reduce(IN_PLACE, recv, op, root)
            return lambda: c.Reduce(recv, None, op, root)
        if collective == "all_gather":
            return (lambda: c.Allgather(IN_PLACE, recv)) if ip else (lambda: c.Allgather(send, recv))
        if collective == "gather":
            if ip and r == root:
                return lambda: c.Gather(IN_PLACE, recv, root)
            out = recv if r == root else None
            return lambda: c.Gather(send, out, root)
        if collective == "scatter":
            if ip and r == root:
                return lambda: c.Scatter(send, IN_PLACE, root)
            src = send if r == root else None
            return lambda: c.Scatter(src, recv, root)
        if collective == "reduce_scatter":
            if ip:
                return lambda: c.Reduce_scatter_block(IN_PLACE, send, op)
            return lambda: c.Reduce_scatter_block(send, recv, op)
        if collective == "all_to_all":
            return (lambda: c.Alltoall(IN_PLACE, recv)) if ip else (lambda: c.Alltoall(send, recv))
        if collective == "send_recv":
            return self._ping_pong(send, recv, lambda b, d: c.Send(b, d), lambda b, s: c.Recv(b, s))
        if collective == "barrier":
            return c.Barrier
        raise ValueError(collective)

    def versions(self) -> dict:
        # The library string is long, multi-line and NUL-padded; its first field names it.
        library = self.MPI.Get_library_version().replace("\0", "").strip().splitlines()[0]
        return {"mpi4py": self.mpi4py.__version__, "mpi": library.split(",")[0].strip()}

    def barrier(self):
        self.comm.Barrier()

    def bcast_obj(self, obj):
        return self.comm.bcast(obj, root=0)

    def gather_obj(self, obj):
        return self.comm.gather(obj, root=0)

    def close(self):
        pass  # mpi4py finalizes MPI at exit


_WORKERS = {"shmcomm": _ShmcommWorker, "gloo": _GlooWorker, "mpi": _MpiWorker}


def _static_skip(backend: str, dtname: str, op: str) -> str | None:
    """Why ``backend`` cannot run this dtype/op at all (checked before starting any process)."""
    if backend == "mpi" and dtname in ("float16", "bfloat16"):
        return f"MPI has no standard {dtname} datatype"
    if backend == "mpi" and op == "avg":
        return "MPI has no average reduction (MPI_AVG does not exist)"
    if backend == "gloo" and dtname in ("uint32", "uint64"):
        return f"torch.distributed gloo does not support {dtname}"
    return None


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
    try:
        if wk.rank == 0:
            _emit({"event": "start", "versions": wk.versions(), "nranks": wk.size})
        dtype = _numpy_dtype(cfg["dtype"])
        for collective in cfg["collectives"]:
            if collective == "send_recv" and wk.size < 2:
                if wk.rank == 0:
                    _emit({"event": "note", "collective": collective, "reason": "needs at least 2 ranks"})
                continue
            for count, chunk in collective_sizes(collective, cfg["sizes"], wk.size, dtype.itemsize):
                row = {"event": "row", "collective": collective, "count": count, "chunk": chunk,
                       "size": count * dtype.itemsize, "results": {}}
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
    finally:
        wk.close()
    return 0


# ---------------------------------------------------------------------------------------------
# Parent side: availability, starting workers, following their progress
# ---------------------------------------------------------------------------------------------
def _mpirun() -> str | None:
    return os.environ.get("SHMCOMM_BENCH_MPIRUN") or shutil.which("mpirun") or shutil.which("mpiexec")


def backend_available(name: str) -> tuple[bool, str]:
    """``(True, "")`` if ``name`` can run here, else ``(False, reason)``. Cheap: imports nothing.

    ``SHMCOMM_BENCH_UNAVAILABLE=gloo,mpi`` makes backends look missing (for tests). Example::

        ok, why = backend_available("mpi")
    """
    hidden = {b.strip() for b in os.environ.get("SHMCOMM_BENCH_UNAVAILABLE", "").split(",")}
    if name in hidden:
        return False, "marked unavailable by SHMCOMM_BENCH_UNAVAILABLE"
    if name == "shmcomm":
        if importlib.util.find_spec("shmcomm._core") is None:
            return False, "shmcomm._core is not built"
        return True, ""
    if name == "gloo":
        return (True, "") if importlib.util.find_spec("torch") else (False, "torch is not installed")
    if name == "mpi":
        if importlib.util.find_spec("mpi4py") is None:
            return False, "mpi4py is not installed"
        if _mpirun() is None:
            return False, "no mpirun or mpiexec on PATH"
        return True, ""
    return False, f"unknown backend {name!r}"


@dataclass
class BackendResult:
    """What one backend's run produced: ``status`` is ``ok``, ``skipped`` or ``failed``."""

    backend: str
    status: str
    reason: str = ""
    rows: list = field(default_factory=list)  # "row" events of rank 0
    notes: list = field(default_factory=list)  # (collective, reason) for collectives not run
    versions: dict = field(default_factory=dict)
    command: str = ""
    warnings: list = field(default_factory=list)


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_env(nranks: int) -> dict:
    env = dict(os.environ)
    # The workers must import this very shmcomm, even from a source tree that is not installed.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    # As shmrun does: N ranks share the cores, so library thread pools must not oversubscribe them.
    env.setdefault("OMP_NUM_THREADS", str(max(1, _cores() // nranks)))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _is_open_mpi(mpirun: str) -> bool:
    try:
        proc = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return True  # the usual one; a wrong guess shows up as mpirun's own error message
    return "open mpi" in (proc.stdout + proc.stderr).lower() or "open-rte" in proc.stdout.lower()


def _worker_cmd(backend: str, cfg: dict) -> list[str]:
    return [sys.executable, "-m", "shmcomm.bench", "--worker", backend, "--config", json.dumps(cfg)]


def _launch(backend: str, nranks: int, cfg: dict, logdir: str, mpi_args: list[str]):
    """Start the workers; returns (processes, their stderr log paths, shown command, job name)."""
    env, job = _worker_env(nranks), None
    cmd = _worker_cmd(backend, cfg)
    procs, logs = [], []
    if backend == "mpi":
        launcher = [_mpirun(), "-n", str(nranks)]
        if _is_open_mpi(launcher[0]):  # these flags are Open MPI's; MPICH's hydra allows both anyway
            if nranks > _cores():
                launcher.append("--oversubscribe")
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                launcher.append("--allow-run-as-root")
        launcher += mpi_args
        # Open MPI warns about unused components and hwloc on many containers; the numbers stand.
        env.setdefault("OMPI_MCA_btl_base_warn_component_unused", "0")
        env.setdefault("OMPI_MCA_hwloc_base_report_bindings", "0")
        shown = " ".join(launcher) + " python -m shmcomm.bench --worker mpi ..."
        groups = [(launcher + cmd, env)]
    else:
        per_rank = {"RANK": None, "WORLD_SIZE": str(nranks), "LOCAL_WORLD_SIZE": str(nranks)}
        if backend == "shmcomm":
            job = f"bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            per_rank["SHMCOMM_JOB"] = job
        else:
            per_rank.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: never pick an outside interface
        groups = []
        for r in range(nranks):
            e = dict(env, **{k: v for k, v in per_rank.items() if v is not None})
            e["RANK"] = e["LOCAL_RANK"] = str(r)
            groups.append((cmd, e))
        shown = f"{nranks} x python -m shmcomm.bench --worker {backend} ..."
    for i, (argv, e) in enumerate(groups):
        path = os.path.join(logdir, f"{backend}.{i}.log")
        logs.append(path)
        with open(path, "wb") as err:
            procs.append(subprocess.Popen(argv, env=e, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE if i == 0 else err, stderr=err))
    return procs, logs, shown, job


def _tail(path: str, lines: int = _TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            text = f.read()[-65536:].decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 3.0
    for p in procs:
        try:
            p.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_backend(backend: str, nranks: int, cfg: dict, progress=None, timeout: float = 300.0,
                mpi_args: list[str] | None = None) -> BackendResult:
    """Run the sweep described by ``cfg`` on ``backend`` with ``nranks`` ranks; never raises for
    a failing or missing backend (see ``BackendResult.status``).

    ``progress(backend, row)`` is called for every size as it completes; ``timeout`` is how long
    the workers may go without finishing a size before they are stopped::

        res = run_backend("shmcomm", 2, cfg)
        res.status, len(res.rows)
    """
    ok, reason = backend_available(backend)
    if not ok:
        return BackendResult(backend, "skipped", reason)
    why = _static_skip(backend, cfg["dtype"], cfg["op"])
    if why:
        return BackendResult(backend, "skipped", why)
    cfg = dict(cfg, nranks=nranks)
    result = BackendResult(backend, "failed")
    with tempfile.TemporaryDirectory(prefix="shmcomm-bench-") as logdir:
        procs, logs, result.command, job = _launch(backend, nranks, cfg, logdir, mpi_args or [])
        try:
            finished = _follow(procs, logs, result, progress, timeout)
            if finished:
                try:
                    for p in procs:
                        p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    result.warnings.append("workers did not exit within 30 s after finishing; stopped")
            else:
                # A closed pipe can arrive before the exit status: give the ranks a moment so the
                # report names who failed, but never wait on a rank that hangs.
                deadline = time.monotonic() + 5.0
                while (time.monotonic() < deadline and any(p.poll() is None for p in procs)
                       and not any(p.poll() not in (None, 0) for p in procs)):
                    time.sleep(0.05)
            bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode not in (0, None)]
            if finished and not bad:
                result.status = "skipped" if result.status == "skipped" else "ok"
            elif not result.reason:
                result.reason = _failure_text(backend, procs, logs)
        finally:
            _stop(procs)
            for p in procs:
                if p.stdout:
                    p.stdout.close()
            if job is not None:
                _remove_leftovers(job, result)
    return result


def _follow(procs, logs, result: BackendResult, progress, timeout: float) -> bool:
    """Read rank 0's events until "done"; False if a worker failed or went quiet too long."""
    out = procs[0].stdout
    sel = selectors.DefaultSelector()
    sel.register(out, selectors.EVENT_READ)
    pending, last = b"", time.monotonic()
    try:
        while True:
            if sel.select(0.2):
                chunk = os.read(out.fileno(), 1 << 16)
                if not chunk:
                    return False  # rank 0 (or mpirun) closed stdout before "done": it died
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    line = raw.decode(errors="replace")
                    if not line.startswith(_MARK):
                        if line.strip():  # e.g. a library's notice; keep it visible
                            print(f"[{result.backend}] {line}", file=sys.stderr)
                        continue
                    last = time.monotonic()
                    event = json.loads(line[len(_MARK):])
                    kind = event.get("event")
                    if kind == "row":
                        result.rows.append(event)
                        if progress:
                            progress(result.backend, event)
                    elif kind == "start":
                        result.versions = event.get("versions", {})
                    elif kind == "note":
                        result.notes.append((event["collective"], event["reason"]))
                    elif kind == "skip":
                        result.status, result.reason = "skipped", event["reason"]
                        return True
                    elif kind == "done":
                        return True
            if any(p.poll() not in (None, 0) for p in procs):
                return False
            if time.monotonic() - last > timeout:
                result.reason = (f"no progress for {timeout:g} s (a hang?); workers stopped\n"
                                 + _failure_text(result.backend, procs, logs))
                return False
    finally:
        sel.close()


def _failure_text(backend: str, procs, logs) -> str:
    parts = []
    for i, (p, log) in enumerate(zip(procs, logs)):
        code = p.poll()
        if code not in (None, 0):
            who = "mpirun" if backend == "mpi" else f"rank {i}"
            state = f"signal {-code}" if code < 0 else f"exit code {code}"
            parts.append(f"{who} (pid {p.pid}) ended with {state}")
            tail = _tail(log)
            if tail:
                parts.append(tail)
        if len(parts) >= 4:
            break
    if not parts:  # nobody exited with an error yet (timeout): show what rank 0 said
        tail = _tail(logs[0])
        parts.append(tail or "workers ended without a result")
    return "\n".join(parts)


def _remove_leftovers(job: str, result: BackendResult) -> None:
    """The core unlinks its segments once every rank attached; anything left is a bug we report."""
    from shmcomm import segments

    left = segments.remove_job_segments(job)
    if left:
        result.warnings.append(f"/dev/shm held {len(left)} segment(s) of job {job} after the run "
                               f"(removed): {', '.join(left)}")


# ---------------------------------------------------------------------------------------------
# Reports: table, ratios, JSON, CSV, plot
# ---------------------------------------------------------------------------------------------
def _records(results: list[BackendResult], nranks: int, cfg: dict) -> list[dict]:
    """One flat record per (backend, collective, size, variant) that was measured."""
    dtype = _numpy_dtype(cfg["dtype"])
    records = []
    for res in results:
        for row in res.rows:
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
                    "rank_times_us": m["rank_times_us"],
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
        text = (f"[{backend}] {done}/{self.total} {row['collective']} {format_size(row['size'])}: "
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


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dtype_arg(text: str) -> str:
    name = text.strip().lower()
    for canonical, aliases in _DTYPES.items():
        if name == canonical or name in aliases:
            return canonical
    raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; choose from {', '.join(_DTYPES)}")


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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``shmcomm-bench`` argument parser (see the module docstring for examples).

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
    p.add_argument("--dtype", type=_dtype_arg, default="float32", help=f"one of {', '.join(_DTYPES)}")
    p.add_argument("--op", type=_op_arg, default="sum",
                   help=f"one of {', '.join(_OPS)} (reducing collectives)")
    p.add_argument("--iters", type=_positive_int, default=None,
                   help="timed iterations per size (default: about --target-time seconds' worth)")
    p.add_argument("--warmup", type=_nonneg_int, default=None,
                   help="untimed iterations before timing (default: a tenth of the iterations)")
    p.add_argument("--target-time", type=float, default=0.1, metavar="SECONDS",
                   help="aim of the automatic iteration count, per size and variant (default 0.1)")
    p.add_argument("--backend", type=_backends_arg, default=["shmcomm"],
                   help="comma-separated: shmcomm,gloo,mpi (default shmcomm)")
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
    if args.op == "avg" and not _is_float(args.dtype):
        parser.error(f"--op avg needs a floating-point --dtype, got {args.dtype}")
    if args.dtype == "bfloat16" and importlib.util.find_spec("ml_dtypes") is None:
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
            "timeout": args.timeout}


def _header(res: BackendResult, args, collective: str) -> str:
    version = ", ".join(f"{k} {v}" if k != "mpi" else v for k, v in res.versions.items())
    mode = ""
    if res.backend == "shmcomm":
        mode = ", zero-copy (sc.empty)" if args.zero_copy else ", numpy buffers (copy)"
    iters = f"{args.iters} iters" if args.iters else f"auto iters (~{args.target_time:g} s per size)"
    return (f"# {PROG} {collective} | backend {res.backend} ({version}{mode}) | {args.nranks} ranks on "
            f"{_cores()} cores | {iters}, check {'on' if args.check else 'off'}")


def run(args: argparse.Namespace, out=None) -> int:
    """Run the parsed command: sweep every backend, print tables and ratios, write files.

    Returns the exit status: 0, or 1 if a backend failed or ``--check`` found wrong elements.
    Example::

        sys.exit(run(parse_args(["barrier", "-n", "2"])))
    """
    out = out or sys.stdout
    collectives = list(COLLECTIVES) if args.collective == "all" else [args.collective]
    cfg = _config(args, collectives)
    itemsize = _numpy_dtype(args.dtype).itemsize
    total = sum(len(collective_sizes(c, cfg["sizes"], args.nranks, itemsize)) for c in collectives)
    progress = _Progress(total, enabled=not args.quiet)
    mpi_args = shlex.split(args.mpirun_args) if args.mpirun_args else []
    results = []
    load_before = _loadavg()
    try:
        for backend in args.backend:
            results.append(run_backend(backend, args.nranks, cfg, progress, args.timeout, mpi_args))
            progress.finish()
    except KeyboardInterrupt:
        progress.finish()
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
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
              f"on {_cores()} cores", file=out)
    peers = [res.backend for res in ran if res.backend != "shmcomm"]
    if peers and any(res.backend == "shmcomm" for res in ran):
        print("#\n" + format_ratios(records, collectives, peers), file=out)
    meta = {"tool": PROG, "argv": getattr(args, "argv", None), "nranks": args.nranks, "cores": _cores(),
            "collectives": collectives, "sizes": cfg["sizes"], "dtype": args.dtype, "op": args.op,
            "iters": args.iters, "warmup": args.warmup, "target_time": args.target_time,
            "zero_copy": args.zero_copy, "check": args.check, "loadavg_before": load_before,
            "loadavg_after": load_after, "python": platform.python_version(),
            "machine": platform.machine(), "date": datetime.datetime.now().isoformat(timespec="seconds")}
    if args.json:
        write_json(args.json, meta, results, records)
    if args.csv:
        write_csv(args.csv, records)
    if args.plot:
        try:
            title = f"{args.nranks} ranks, {args.dtype}, {_cores()} cores"
            write_plot(args.plot, records, collectives, title)
        except BenchError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            status = status or 1
    return status


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``shmcomm-bench`` and ``python -m shmcomm.bench``; returns the exit status.

    Example::

        main(["all_reduce", "-n", "2", "-b", "8", "-e", "1K", "--check"])
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--worker"]:  # internal: one rank of a sweep, started by run_backend
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


if __name__ == "__main__":
    sys.exit(main())
