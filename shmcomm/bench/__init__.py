"""``shmcomm-bench``: nccl-tests-style sweeps of every collective, with peers measured in the same run.

Same as ``python -m shmcomm.bench``::

    shmcomm-bench all_reduce -n 2 -b 8 -e 32M -f 8 --backend shmcomm,gloo,mpi
    shmcomm-bench all -n 4 -b 8 -e 1M --check --json out.json --csv out.csv --plot out.png
    shmcomm-bench all_reduce -n 2 -b 8 -e 64K --dtype all --op all --check
    shmcomm-bench broadcast -n 4 -b 1M -e 1M --root all --zero-copy --iters 50
    shmcomm-bench all_reduce -n 2 --backend shmcomm,gloo --serial --rounds 3

For each backend the tool starts N worker processes (``shmcomm``: this Python, one job name per
run; ``gloo``: ``torch.distributed`` over 127.0.0.1; ``mpi``: ``mpi4py`` under ``mpirun``). Every
worker runs the same steps (a collective, dtype, op and root at one size); rank 0 streams one
JSON line per step back to this process, which shows progress on stderr (live on a terminal) and
prints, per collective and backend, a table with the nccl-tests columns, then (when peers ran)
shmcomm's time divided by each peer's.

Nothing runs beside the backend that measures. With ``--interleave`` all backends' workers run at
once and take turns: one backend measures a step while the others sleep in a blocking read, then
the next backend measures the same step (the order alternates), so a shared machine's drift from
minute to minute hits every backend alike and the ratios compare like with like. With
``--serial`` (the default when ranks x backends exceed the cores) the backends run one after
another, each alone, the order alternating from round to round. Either way no backend leaves its
group (gloo's threads, MPI's finalize) before every backend measured its last step; the header
says which mode ran. ``--rounds K`` measures each step K times per backend and keeps the round
with the best median.

How a time is measured: each iteration first refills the input buffers (a cheap fill with a value
that changes every iteration, outside the timed region, so no iteration reuses the previous
result), then times one call from Python to its return, on every rank. An iteration's time is its
slowest rank's; a row reports the median (the time column), min and 90th percentile over the
iterations, so a noisy machine shows as a wide min-p90 spread rather than as a wrong mean.
Without ``--iters`` the iteration count aims at ``--target-time`` seconds per size (at most
20000, at least 5), so 8-byte calls run many thousand times and 32 MiB ones a few dozen.

``--dtype``, ``--op`` and ``--root`` take one value, a comma list or ``all``; combinations that
shmcomm cannot reduce (a bitwise op on floats, min/max on complex numbers, avg on bool) are
skipped with their reason in an ``all`` sweep and refused when named; a peer that cannot run a
combination skips it with its reason. ``--check`` compares every result with a numpy reference.

Out-of-place and in-place follow each library's own API: shmcomm and ``torch.distributed`` reduce
and broadcast in place only (``-`` out of place, with that reason under the table); their
in-place all_gather, gather, scatter and reduce_scatter pass a slice of the output as the input
(as FSDP does); shmcomm's in-place all_to_all passes one array as both (torch has no such form);
MPI uses ``MPI.IN_PLACE``.

The package holds one concept per module: ``common`` (shared names), ``dtypes`` (dtypes and
their arrays), ``cases`` (combinations, why one is invalid, the steps), ``sizes`` (sizes and
busbw factors), ``verify`` (``--check`` patterns and references), ``workers`` (one class per
backend), ``measure`` (one rank's sweep and the spread of its times), ``turns`` (the gates
through which backends take turns), ``runner`` (starting, following and alternating the workers),
``table`` (text tables), ``progress`` (the progress line), ``report`` (tables, ratios, skips,
CSV, JSON), ``plot`` (the figure) and ``cli`` (arguments, ``run``, ``main``).
"""

from .cases import Case, expand, peer_skip, why_invalid
from .cli import build_parser, main, parse_args, run
from .common import BACKENDS, COLLECTIVES, BenchError
from .plot import write_plot
from .report import format_ratios, format_skips, format_table, write_csv, write_json
from .runner import BackendResult, backend_available, run_backend, run_backends
from .sizes import busbw_factor, collective_sizes, format_size, parse_size, sweep_sizes

__all__ = ["COLLECTIVES", "BACKENDS", "BenchError", "BackendResult", "Case", "expand", "why_invalid",
           "peer_skip", "parse_size", "format_size", "sweep_sizes", "collective_sizes", "busbw_factor",
           "backend_available", "build_parser", "parse_args", "run_backend", "run_backends", "format_table",
           "format_ratios", "format_skips", "write_json", "write_csv", "write_plot", "run", "main"]
