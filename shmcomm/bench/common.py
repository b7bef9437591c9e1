"""Names every part of ``shmcomm-bench`` shares: collectives, backends, variants, the mark on
worker event lines and ``BenchError``."""

from __future__ import annotations

PROG = "shmcomm-bench"
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter",
               "reduce_scatter", "all_to_all", "send_recv", "barrier", "scan")
# The peers: gloo (torch.distributed), mpi (mpi4py under the mpirun on PATH: Open MPI, MPICH),
# impi (mpi4py under Intel MPI's own mpiexec), deepspeed (DeepSpeed's shared-memory all_reduce op).
BACKENDS = ("shmcomm", "gloo", "mpi", "impi", "deepspeed")
MPI_BACKENDS = ("mpi", "impi")  # one mpirun process starts the ranks
VARIANTS = ("out-of-place", "in-place")
EXIT_USAGE = 2  # what argparse uses
# Collectives whose result is a reduction; only these use --op (nccl-tests prints "none" otherwise).
_REDUCING = ("all_reduce", "reduce", "reduce_scatter", "scan")
# Collectives with a root rank (--root); -1 in the table for the others, as nccl-tests does.
_ROOTED = ("broadcast", "reduce", "gather", "scatter")
# Size-per-rank collectives: the sweep size is the total over ranks (nccl-tests convention).
_PER_RANK = ("all_gather", "gather", "scatter", "reduce_scatter", "all_to_all")

_MARK = "@@shmcomm-bench@@ "  # prefix of the worker's event lines, so stray prints cannot confuse us


class BenchError(Exception):
    """A problem the user can fix (bad arguments, missing optional package); printed, exit 2."""
