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

All backends' workers run at once and take turns: one backend measures a size while the others
sleep in a blocking read, then the next backend measures the same size (the order alternates), so
a shared machine's drift from minute to minute hits every backend alike and the ratios compare
like with like. ``--rounds K`` measures each size K times per backend that way and keeps the best.

How a time is measured: each iteration first refills the input buffers (a cheap fill with a value
that changes every iteration, outside the timed region, so no iteration reuses the previous
result), then times one call from Python to its return. After a warm-up, the mean over the
iterations is taken on every rank and the maximum over ranks is reported. Without ``--iters``,
the iteration count aims at ``--target-time`` seconds per size (at most 20000, at least 5), so
8-byte calls run many thousand times and 32 MiB ones a few dozen.

Out-of-place and in-place follow each library's own API: shmcomm and ``torch.distributed`` reduce
and broadcast in place only (``n/a`` out of place); their in-place all_gather, gather, scatter and
reduce_scatter pass a slice of the output as the input (as FSDP does); shmcomm's in-place
all_to_all passes one array as both (torch has no such form); MPI uses ``MPI.IN_PLACE``.

The package holds one concept per module: ``common`` (shared names), ``sizes`` (sizes and busbw
factors), ``verify`` (``--check`` patterns and references), ``workers`` (one class per backend),
``measure`` (one rank's sweep), ``turns`` (the gates through which backends take turns),
``launch`` (starting, following and alternating the workers), ``report``
(tables, ratios, CSV, JSON, plot, progress) and ``cli`` (arguments, ``run``, ``main``).
"""

from .cli import build_parser, main, parse_args, run
from .common import BACKENDS, COLLECTIVES, BenchError
from .runner import BackendResult, backend_available, run_backend, run_backends
from .report import format_ratios, format_table, write_csv, write_json, write_plot
from .sizes import busbw_factor, collective_sizes, format_size, parse_size, sweep_sizes

__all__ = ["COLLECTIVES", "BACKENDS", "BenchError", "BackendResult", "parse_size", "format_size",
           "sweep_sizes", "collective_sizes", "busbw_factor", "backend_available", "build_parser",
           "parse_args", "run_backend", "run_backends", "format_table", "format_ratios", "write_json", "write_csv",
           "write_plot", "run", "main"]
