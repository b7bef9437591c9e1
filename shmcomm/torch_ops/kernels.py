"""The ``torch.ops.shmcomm`` operators: their schemas, CPU kernels and fake (shape) kernels.

Each op has the argument order of its ``torch.ops._c10d_functional`` counterpart and runs to
completion before it returns (no ``wait_tensor``): a result on every rank, or an error raised on
every rank that took part. ``group_name`` is a shmcomm group's ``group_name`` (None: the default
group); ``reduce_op`` a lower-case name as torch's functional collectives take it.

============================================================  =========================================
``all_reduce_(Tensor(a!) input, str reduce_op, str? group_name=None) -> Tensor(a!)``  in place
``broadcast_(Tensor(a!) input, int src, str? group_name=None) -> Tensor(a!)``        ``src``: a group rank
``all_reduce(Tensor input, str reduce_op, str? group_name=None) -> Tensor``            a reduced copy
``broadcast(Tensor input, int src, str? group_name=None) -> Tensor``                 a broadcast copy
``all_gather_into_tensor(Tensor input, int group_size, str? group_name=None)``       dim 0 x group_size
``reduce_scatter_tensor(Tensor input, str reduce_op, int group_size, str? ...)``     dim 0 / group_size
``all_to_all_single(Tensor input, SymInt[] output_split_sizes, SymInt[] input_split_sizes, str? ...)``
============================================================  =========================================

The fake kernels give ``torch.compile`` each result's shape without running anything. torch's
functionalization takes no custom op whose output aliases an input (``Tensor(a!)`` returns), so
under ``torch.compile`` the in-place ops decompose (their CompositeImplicitAutograd kernels) into
the copying op and a ``copy_`` (inductor cannot lower a custom op whose output aliases an input,
so the copy stays: one tensor copy per call in compiled code). Eagerly the CPU kernels run, in
place. A model calling them compiles with ``fullgraph=True``.

Example::

    dist.init_process_group("shmcomm")
    t = torch.ones(8, dtype=torch.bfloat16)
    torch.ops.shmcomm.all_reduce_(t)                                 # t == world_size everywhere (sum, default group)
    g = torch.ops.shmcomm.all_gather_into_tensor(torch.ones(2, 3), dist.get_world_size(), None)
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from shmcomm import _core
from shmcomm.torch_ops.groups import resolve

SCHEMAS = {
    # reduce_op defaults to "sum": `torch.ops.shmcomm.all_reduce_(t)` has the call shape of
    # DeepSpeed's inference_all_reduce_(t), and the dispatcher parses one argument, not three
    # (0.15 us less a call here)
    "all_reduce_": '(Tensor(a!) input, str reduce_op="sum", str? group_name=None) -> Tensor(a!)',
    "broadcast_": "(Tensor(a!) input, int src, str? group_name=None) -> Tensor(a!)",
    "all_reduce": '(Tensor input, str reduce_op="sum", str? group_name=None) -> Tensor',
    "broadcast": "(Tensor input, int src, str? group_name=None) -> Tensor",
    "all_gather_into_tensor": "(Tensor input, int group_size, str? group_name=None) -> Tensor",
    "reduce_scatter_tensor": "(Tensor input, str reduce_op, int group_size, str? group_name=None) -> Tensor",
    "all_to_all_single": ("(Tensor input, SymInt[] output_split_sizes, SymInt[] input_split_sizes, "
                          "str? group_name=None) -> Tensor"),
}

# reduce_op name -> shmcomm op code: the names the ops take (the core's table, which its direct
# path looks up)
_OP_CODES = _core.torch_op_codes
# op code -> the torch ReduceOp the group's general path takes
_REDUCE_OPS = {code: dist.ReduceOp(getattr(dist.ReduceOp.RedOpType, _core.OP_NAMES[code]))
               for code in set(_OP_CODES.values())}


def op_code(reduce_op) -> int:
    """The shmcomm op code of a ``reduce_op`` (a name in any case, or a ReduceOp), by
    ``shmcomm.ops.op_code``; ValueError naming the names the ops accept.

    Example::

        op_code("sum")   # 0
    """
    try:
        return _core.op_code(reduce_op)
    except ValueError:
        hint = (" (PREMUL_SUM needs its factor: dist.all_reduce(t, op=dist._make_nccl_premul_sum(f)))"
                if str(reduce_op).lower() == "premul_sum" else "")
        raise ValueError(f"reduce_op must be one of {sorted(_OP_CODES)}, got {reduce_op!r}{hint}") from None


def _sync_options(options_type, **fields):
    """torch options for a synchronous call of the group's general path."""
    opts = options_type()
    for name, value in fields.items():
        setattr(opts, name, value)
    if hasattr(opts, "asyncOp"):  # torch >= 2.8; older ones queue it, and wait() runs it here
        opts.asyncOp = False
    return opts


def _check_size(group, group_size: int, op: str) -> None:
    if group_size != group.size():
        raise ValueError(f"{op}: group_size={group_size} but the group has {group.size()} ranks")


# the eager path: the core, where it takes the call as it is (False: nothing ran)
direct_all_reduce = _core.torch_all_reduce_direct


# ---- CPU kernels ------------------------------------------------------------------------------------
def all_reduce_(input: torch.Tensor, reduce_op: str = "sum", group_name: str | None = None) -> torch.Tensor:
    """Reduce ``input`` in place across the group; returns it.

    Example::

        torch.ops.shmcomm.all_reduce_(t, "max", sub.group_name)
    """
    if direct_all_reduce(input, reduce_op, group_name):
        return input
    group = resolve(group_name)
    opts = _sync_options(_c10d.AllreduceOptions, reduceOp=_REDUCE_OPS[op_code(reduce_op)])
    group.allreduce([input], opts).wait()
    return input



def broadcast_(input: torch.Tensor, src: int, group_name: str | None = None) -> torch.Tensor:
    """Copy group rank ``src``'s ``input`` into every rank's; returns it.

    Example::

        torch.ops.shmcomm.broadcast_(weights, 0, None)
    """
    group = resolve(group_name)
    if not 0 <= src < group.size():
        raise ValueError(f"broadcast_: src must be a group rank in [0, {group.size()}), got {src}")
    group.broadcast([input], _sync_options(_c10d.BroadcastOptions, rootRank=src)).wait()
    return input


def all_gather_into_tensor(input: torch.Tensor, group_size: int, group_name: str | None = None) -> torch.Tensor:
    """Every rank's ``input`` stacked along dim 0, in rank order.

    Example::

        torch.ops.shmcomm.all_gather_into_tensor(torch.ones(2, 3), world, None).shape   # (2*world, 3)
    """
    group = resolve(group_name)
    _check_size(group, group_size, "all_gather_into_tensor")
    out = input.new_empty(_gathered_shape(input, group_size))
    group.all_gather_single(out, input, _sync_options(_c10d.AllgatherOptions)).wait()
    return out


def reduce_scatter_tensor(input: torch.Tensor, reduce_op: str, group_size: int,
                          group_name: str | None = None) -> torch.Tensor:
    """Rank r's block r (along dim 0) of the reduction of every rank's ``input``.

    Example::

        torch.ops.shmcomm.reduce_scatter_tensor(torch.ones(world * 4), "sum", world, None)  # 4 x world
    """
    group = resolve(group_name)
    _check_size(group, group_size, "reduce_scatter_tensor")
    opts = _sync_options(_c10d.ReduceScatterOptions, reduceOp=_REDUCE_OPS[op_code(reduce_op)])
    out = input.new_empty(_scattered_shape(input, group_size))
    group.reduce_scatter_single(out, input, opts).wait()
    return out


def all_to_all_single(input: torch.Tensor, output_split_sizes: list, input_split_sizes: list,
                      group_name: str | None = None) -> torch.Tensor:
    """Rank r sends rows ``input_split_sizes[q]`` of ``input`` to rank q and receives
    ``output_split_sizes[q]`` rows from it; empty lists mean equal parts.

    Example::

        torch.ops.shmcomm.all_to_all_single(x, [], [], None)   # equal parts
    """
    group = resolve(group_name)
    out = input.new_empty(_exchanged_shape(input, output_split_sizes))
    group.all_to_all_single(out, input, list(output_split_sizes), list(input_split_sizes),
                            _sync_options(_c10d.AllToAllOptions)).wait()
    return out


def all_reduce(input: torch.Tensor, reduce_op: str = "sum", group_name: str | None = None) -> torch.Tensor:
    """A reduced copy of ``input`` (``input`` itself is left as it is).

    Example::

        total = torch.ops.shmcomm.all_reduce(t, "sum", None)
    """
    return all_reduce_(input.clone(memory_format=torch.contiguous_format), reduce_op, group_name)


def broadcast(input: torch.Tensor, src: int, group_name: str | None = None) -> torch.Tensor:
    """A copy of group rank ``src``'s ``input`` on every rank.

    Example::

        weights = torch.ops.shmcomm.broadcast(w, 0, None)
    """
    return broadcast_(input.clone(memory_format=torch.contiguous_format), src, group_name)


# ---- what torch.compile traces the in-place ops as (see the module's docstring) --------------------
def _all_reduce_traced(input, reduce_op="sum", group_name=None):
    return input.copy_(torch.ops.shmcomm.all_reduce(input, reduce_op, group_name))


def _broadcast_traced(input, src, group_name=None):
    return input.copy_(torch.ops.shmcomm.broadcast(input, src, group_name))


# ---- shapes: shared by the kernels and the fake kernels ---------------------------------------------
def _gathered_shape(input: torch.Tensor, group_size: int) -> list:
    if input.dim() == 0:
        return [group_size]
    return [input.shape[0] * group_size, *input.shape[1:]]


def _scattered_shape(input: torch.Tensor, group_size: int) -> list:
    if input.dim() == 0 or input.shape[0] % group_size:
        raise ValueError(f"reduce_scatter_tensor: dim 0 of the input (shape {tuple(input.shape)}) must "
                         f"split into group_size={group_size} equal blocks")
    return [input.shape[0] // group_size, *input.shape[1:]]


def _exchanged_shape(input: torch.Tensor, output_split_sizes) -> list:
    if input.dim() == 0:
        raise ValueError("all_to_all_single needs an input with at least one dimension")
    rows = sum(output_split_sizes) if len(output_split_sizes) else input.shape[0]
    return [rows, *input.shape[1:]]


# ---- fake kernels (torch.compile, meta tensors) ----------------------------------------------------
def _fake_in_place(input, *args):
    return input


def _fake_all_gather(input, group_size, group_name=None):
    return input.new_empty(_gathered_shape(input, group_size))


def _fake_reduce_scatter(input, reduce_op, group_size, group_name=None):
    return input.new_empty(_scattered_shape(input, group_size))


def _fake_all_to_all(input, output_split_sizes, input_split_sizes, group_name=None):
    return input.new_empty(_exchanged_shape(input, output_split_sizes))


def _fake_copy(input, *args):
    return torch.empty_like(input, memory_format=torch.contiguous_format)


_KERNELS = {
    "all_reduce_": (all_reduce_, _fake_in_place),
    "broadcast_": (broadcast_, _fake_in_place),
    "all_reduce": (all_reduce, _fake_copy),
    "broadcast": (broadcast, _fake_copy),
    "all_gather_into_tensor": (all_gather_into_tensor, _fake_all_gather),
    "reduce_scatter_tensor": (reduce_scatter_tensor, _fake_reduce_scatter),
    "all_to_all_single": (all_to_all_single, _fake_all_to_all),
}

_LIBRARY: list = []  # the torch.library.Library: dropping it would unregister the ops


def register() -> None:
    """Define ``torch.ops.shmcomm.*`` once per process (the first shmcomm group does it).

    Example::

        register(); torch.ops.shmcomm.all_reduce_
    """
    if _LIBRARY:
        return
    from shmcomm.torch_ops import native  # here: the build is only wanted once ops are defined

    lib = torch.library.Library("shmcomm", "DEF")
    for name, schema in SCHEMAS.items():
        lib.define(name + schema)
        torch.library.register_fake(f"shmcomm::{name}", _KERNELS[name][1], lib=lib)
    _LIBRARY.append(lib)
    # all_reduce_ is the hot one (~100 calls per token in tensor-parallel decoding), and all_reduce
    # what compiled graphs call instead: their native kernels when they build (they register
    # themselves for CPU), else the Python ones
    native_ops = {"all_reduce_", "all_reduce"} if native.load() else set()
    for name in SCHEMAS:
        if name not in native_ops:
            lib.impl(name, _KERNELS[name][0], "CPU")
    # Only traced code reaches these: eagerly the CPU kernels above take precedence (a backend's
    # own kernel beats CompositeImplicitAutograd on its autograd key too).
    lib.impl("all_reduce_", _all_reduce_traced, "CompositeImplicitAutograd")
    lib.impl("broadcast_", _broadcast_traced, "CompositeImplicitAutograd")

