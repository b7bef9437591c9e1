"""Reduction operations for all_reduce, reduce and reduce_scatter.

Example::

    import shmcomm as sc
    sc.all_reduce(x, op=sc.ReduceOp.MAX)
"""

from __future__ import annotations

import enum

__all__ = ["ReduceOp"]


class ReduceOp(enum.IntEnum):
    """Element-wise reductions. Values match the compiled kernels' op codes.

    ``AVG`` needs a floating-point or complex dtype; ``BAND``/``BOR``/``BXOR`` need integer or
    bool; complex numbers have no ``MIN``/``MAX``. Half types accumulate in float32::

        sc.all_reduce(grads, op=sc.ReduceOp.AVG)
    """

    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3
    AVG = 4
    BAND = 5
    BOR = 6
    BXOR = 7


def op_code(op) -> int:
    """Code of ``op`` (a ReduceOp, its name, or torch's ReduceOp); ValueError names bad input.

    Example::

        >>> op_code("max"), op_code(ReduceOp.SUM)
        (3, 0)
    """
    code = _CODES.get(op) if op.__class__ is ReduceOp else None
    if code is not None:
        return code
    if isinstance(op, str):
        try:
            return int(ReduceOp[op.upper()])
        except KeyError:
            pass
    elif isinstance(op, int) and not isinstance(op, bool) and 0 <= op < len(ReduceOp):
        return op
    else:  # torch.distributed.ReduceOp and its RedOpType members carry a name
        name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
        if name.upper() in ReduceOp.__members__:
            return int(ReduceOp[name.upper()])
    raise ValueError(f"op must be one of {[m.name for m in ReduceOp]}, got {op!r}")


_CODES = {member: int(member) for member in ReduceOp}
