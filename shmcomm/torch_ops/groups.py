"""Which shmcomm process group a torch op's ``group_name`` names.

torch's own functional collectives (``torch.ops._c10d_functional.*``) find their group by the name
torch gave it (``pg.group_name``: "0" for the default group, "1", "2", ... for ``new_group`` ones).
The shmcomm ops take the same names. Every ``ShmcommProcessGroup`` enters itself here when torch
names it and leaves when it is shut down, so a call finds its group with one dict look-up (torch's
``_resolve_process_group`` costs a microsecond, a third of a small all_reduce).

Example::

    dist.init_process_group("shmcomm")
    sub = dist.new_group([0, 1])
    resolve(sub.group_name) is sub          # True
    resolve(None) is dist.group.WORLD       # True: None names the default group
"""

from __future__ import annotations

import weakref

from shmcomm import _core

# name -> group. Weak: a group torch dropped without a shutdown (a failed init) is not kept alive.
_BY_NAME: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_DEFAULT: list = [None]  # a weak reference to the default group (the one torch describes "default_pg")
# The same names, and the group objects themselves -> the group's Communicator, for the groups on
# one node: what the native kernel (by name) and the eager drop-in (by object) look up. The core's
# own dict: the native kernel reaches it with no Python call on its way.
COMMS: dict = _core.torch_op_comms


def enter(group, name: str, is_default: bool = False) -> None:
    """Make ``group`` what ``name`` (and None, for the default group) resolves to.

    Example::

        enter(pg, "0", is_default=True)
    """
    comm = group._comm if getattr(group, "_on_one_node", False) else None
    if comm is not None:
        COMMS[group] = comm
    if name:
        _BY_NAME[name] = group
        COMMS.pop(name, None)
        if comm is not None:
            COMMS[name] = comm
    if is_default:
        _DEFAULT[0] = weakref.ref(group)
        COMMS.pop(None, None)
        if comm is not None:
            COMMS[None] = comm


def leave(group) -> None:
    """Forget ``group`` (its shutdown): its name no longer resolves.

    Example::

        leave(pg)
    """
    COMMS.pop(group, None)
    for name, member in list(_BY_NAME.items()):
        if member is group:
            del _BY_NAME[name]
            COMMS.pop(name, None)
    if _DEFAULT[0] is not None and _DEFAULT[0]() is group:
        _DEFAULT[0] = None
        COMMS.pop(None, None)


def resolve(name: str | None):
    """The live shmcomm group called ``name`` (None: the default group).

    Raises ``ValueError`` naming the problem: no group of that name, a group of another backend
    (gloo, ...), or no default shmcomm group.

    Example::

        group = resolve("1")
    """
    group = _BY_NAME.get(name) if name is not None else (_DEFAULT[0]() if _DEFAULT[0] else None)
    if group is not None:
        return group
    raise ValueError(_unknown(name))


def _unknown(name: str | None) -> str:
    """Why ``name`` names no shmcomm group, as precisely as torch can tell."""
    import torch.distributed as dist

    if name is None:
        if not dist.is_initialized():
            return ("group_name=None names the default process group, and none is initialized: "
                    "call torch.distributed.init_process_group('shmcomm') first")
        return (f"group_name=None names the default process group, whose backend is "
                f"{dist.get_backend()!r}, not 'shmcomm': pass the group_name of a shmcomm group "
                f"(dist.new_group(backend='shmcomm').group_name)")
    try:
        from torch._C._distributed_c10d import _resolve_process_group

        other = _resolve_process_group(name)
    except Exception:  # noqa: BLE001 - torch knows no such group either
        known = sorted(_BY_NAME.keys())
        return f"no process group is named {name!r} (shmcomm groups here: {known or 'none'})"
    return (f"process group {name!r} uses backend {other.name()!r}, not 'shmcomm': torch.ops.shmcomm "
            f"serves shmcomm groups only (use torch.ops._c10d_functional for others)")
