"""Names every part of ``shmcomm-bench`` shares: collectives, backends, variants, dtypes and ops,
the mark on worker event lines, ``BenchError`` and the numpy dtype of a ``--dtype`` name."""

from __future__ import annotations

import numpy as np

from shmcomm._core import DTYPE_NAMES, OP_NAMES

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

# dtype name -> aliases accepted on the command line; the names come from the kernels' table
# (src_cython/shm_dtypes.h). The --check patterns are small signed integers, which bool and
# complex cannot carry, and no peer has longdouble: those stay out of the bench.
_ALIASES = {"int8": ("char",), "uint8": ("byte",), "int16": ("short",), "int32": ("int",),
            "int64": ("long",), "float16": ("half", "fp16"), "bfloat16": ("bf16",),
            "float32": ("float", "fp32"), "float64": ("double", "fp64")}
_DTYPES = {name: _ALIASES.get(name, ()) for name in DTYPE_NAMES
           if name.startswith(("int", "uint", "float", "bfloat"))}
# --op name -> ReduceOp name, for the ops of the kernels' table (nccl-tests spells PRODUCT "prod").
_OPS = {("prod" if name == "PRODUCT" else name.lower()): name for name in OP_NAMES}
_OP_ALIASES = {"product": "prod", "mean": "avg"}


class BenchError(Exception):
    """A problem the user can fix (bad arguments, missing optional package); printed, exit 2."""


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # numpy has no bfloat16; ml_dtypes is what shmcomm accepts for it

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _is_float(name: str) -> bool:
    return name.startswith(("float", "bfloat"))
