"""shmcomm's collectives as torch operators, for code that calls a collective as an op.

CPU tensor-parallel inference (vLLM's CPU backend, SGLang on Xeon, DeepSpeed AutoTP) calls a
shared-memory all_reduce about a hundred times per generated token, as a torch op, so that it also
runs inside ``torch.compile`` graphs. ``torch.ops.shmcomm`` gives them shmcomm's: on any shmcomm
group (sub-groups too), every dtype and reduce op of the core, the same bits on every rank, a
timeout and a clear error instead of a hang or a silent no-op, nothing left in ``/dev/shm``.

The ops (``kernels.SCHEMAS``) are defined when the first shmcomm group is created, by
``dist.init_process_group("shmcomm")`` or ``dist.new_group(backend="shmcomm")``.

Example::

    import torch, torch.distributed as dist
    from shmcomm.torch_ops import all_reduce_

    dist.init_process_group("shmcomm")                # under shmrun or torchrun
    t = torch.ones(4096, dtype=torch.bfloat16)
    all_reduce_(t)                                    # t == world_size on every rank
    torch.ops.shmcomm.all_reduce_(t)                  # the same, as an op ("sum", default group; compiles too)
"""

from __future__ import annotations

import torch

from shmcomm import _core
from shmcomm.torch_ops import kernels
from shmcomm.torch_ops.groups import resolve

__all__ = ["all_reduce_", "group_name_of", "register", "resolve"]

register = kernels.register


def group_name_of(group) -> str | None:
    """The ``group_name`` the ops take for ``group``: a torch process group, its name, or None
    (the default group).

    Example::

        group_name_of(dist.new_group([0, 1]))   # "1"
    """
    if group is None or isinstance(group, str):
        return group
    name = getattr(group, "group_name", None)
    if not isinstance(name, str):
        raise TypeError(f"group must be a torch process group, its group_name or None, got "
                        f"{type(group).__name__}")
    return name


def all_reduce_(tensor: torch.Tensor, group=None, op="sum") -> torch.Tensor:
    """All-reduce ``tensor`` in place over ``group`` (None: the default group); returns it.

    The drop-in for the shared-memory all_reduce ops of CPU inference engines
    (``torch.ops.deepspeed.inference_all_reduce_(t)``, sglang's ``shm_allreduce``, vLLM's
    ``shm_allreduce``): the same call shape, any shmcomm group instead of the world group only,
    ``op`` any reduce op ("sum", "avg", "max", "min", "product", "band", "bor", "bxor", or a
    ``dist.ReduceOp``), every dtype (bfloat16 and float16 with AVX2 or AVX-512 alike), errors
    instead of silent no-ops. Eagerly it calls the core directly (no dispatcher in between); under
    ``torch.compile`` it is the op ``torch.ops.shmcomm.all_reduce_``, captured in the graph.

    Example::

        class Communicator:                   # a vLLM/SGLang-style communicator
            def all_reduce(self, x):
                return all_reduce_(x, self.group)
    """
    compiling = _is_compiling()
    if not compiling and _direct(tensor, op, group):  # the common case, eagerly
        return tensor
    if not isinstance(op, str):  # a ReduceOp (shmcomm's or torch's): the name the ops take
        op = _core.OP_NAMES[kernels.op_code(op)].lower()
    if compiling:
        return torch.ops.shmcomm.all_reduce_(tensor, op, group_name_of(group))
    return kernels.all_reduce_(tensor, op, group_name_of(group))


_is_compiling = torch.compiler.is_compiling
_direct = kernels.direct_all_reduce
