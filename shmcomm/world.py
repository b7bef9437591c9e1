"""The world of this process: its default group, every group made from it, and the functions
that make and destroy them (``init_process_group``, ``new_group``, ``split``, ``new_subgroups``,
``destroy_process_group``) or ask about them (``default_group``, ``get_rank``, ...).

The global state lives here and only here: the default group, the list of groups it owns, the
lock around both, and the hook through which ``shmcomm.multinode`` makes a default group that
spans nodes (``register_multinode``; this module imports nothing of it, so the dependency runs
one way, ``shmcomm.multinode`` -> here). A group itself is ``shmcomm.group``'s.

Example::

    from shmcomm import world
    pg = world.init_process_group()      # under shmrun or torchrun
    world.default_group() is pg          # True
"""

from __future__ import annotations

import numbers
import os
import threading
from typing import Callable, Sequence, cast

import shmcomm._core as _core
from shmcomm.group import DEFAULT_TIMEOUT, ProcessGroup
from shmcomm.launcher.mpirun import MpiLaunch, mpi_launch
from shmcomm.settings import find, read_seconds

__all__ = ["init_process_group", "is_initialized", "get_rank", "get_world_size", "new_group", "split",
           "new_subgroups", "destroy_process_group", "default_group", "resolve", "job_arguments",
           "timeout_arg", "register_multinode"]

_rank_arg = _core.rank_arg


# ---- the default group and module-level management ------------------------------------------
_lock = threading.Lock()
_default: ProcessGroup | None = None
_groups: list[ProcessGroup] = []


def _env_int(var: str, launch: MpiLaunch | None, mpi_value: int) -> int:
    """``var`` from the environment; else what mpirun said (``launch``'s ``mpi_value``)."""
    raw = os.environ.get(var)
    if raw is None:
        if launch is not None:
            return mpi_value
        raise ValueError(f"{var} is not set: pass it as an argument or run under shmrun, torchrun or mpirun")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{var} must be an integer, got {raw!r}") from None


def _env_job(launch: MpiLaunch | None) -> str:
    job = os.environ.get("SHMCOMM_JOB")
    if job:
        return job
    run_id, port = os.environ.get("TORCHELASTIC_RUN_ID"), os.environ.get("MASTER_PORT")
    if run_id and port:
        return f"{run_id}-{port}"
    if launch is not None and launch.job:
        return launch.job
    if launch is not None:
        raise ValueError(f"{launch.launcher}'s mpirun names no job here: pass name=, or set SHMCOMM_JOB "
                         f"for every rank (mpirun -x SHMCOMM_JOB=... or -genv SHMCOMM_JOB ...)")
    raise ValueError("SHMCOMM_JOB is not set (nor TORCHELASTIC_RUN_ID and MASTER_PORT): pass name= "
                     "or run under shmrun, torchrun or mpirun")


def _one_node(launch: MpiLaunch, size: int) -> None:
    """A job mpirun spread over several nodes needs MPI between them: say so, not a hang."""
    if launch.local_size not in (-1, size):
        raise ValueError(f"this {launch.launcher} job has {size} ranks, {launch.local_size} on this node: "
                         f"across nodes set SHMCOMM_LINK=mpi (shared memory inside each node, MPI "
                         f"between them), or start one job per node")


def job_arguments(rank: int | None, world_size: int | None, name: str | None,
                  timeout: float | None, name_arg: str = "name") -> tuple[int, int, str, float]:
    """Rank, world size, job name and timeout from the arguments, else from the environment
    (RANK, WORLD_SIZE, SHMCOMM_JOB or TORCHELASTIC_RUN_ID + MASTER_PORT, SHMCOMM_TIMEOUT), else,
    under mpirun or mpiexec, from what it set (``shmcomm.launcher.mpirun``: Open MPI's, MPICH's,
    Intel MPI's and MVAPICH's rank, size and job).

    Example::

        rank, size, job, timeout = job_arguments(None, None, None, None)   # under shmrun
    """
    launch = mpi_launch()
    rank = _env_int("RANK", launch, launch and launch.rank) if rank is None else _rank_arg(rank, "rank")
    if world_size is None:
        world_size = _env_int("WORLD_SIZE", launch, launch and launch.size)
        if launch is not None and "WORLD_SIZE" not in os.environ:
            _one_node(launch, world_size)  # (a size passed in, as SHMCOMM_LINK=mpi's, may span nodes)
    else:
        world_size = _rank_arg(world_size, "world_size")
    job = _env_job(launch) if name is None else name
    if not isinstance(job, str) or not job:
        raise ValueError(f"{name_arg} must be a non-empty string, got {job!r}")
    if timeout is None:
        return rank, world_size, job, read_seconds(find("SHMCOMM_TIMEOUT"), DEFAULT_TIMEOUT)
    return rank, world_size, job, timeout_arg(timeout)


def timeout_arg(timeout: float) -> float:
    """A group's ``timeout`` argument in seconds: a number > 0; ``inf`` (or any span past the
    deadlines' range, as torch's ``timedelta.max``) waits without limit. TypeError or ValueError
    naming the argument otherwise.

    Example::

        timeout_arg(float("inf"))   # inf: collectives never time out
    """
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, got {type(timeout).__name__}")
    if not timeout > 0:  # nan too
        raise ValueError(f"timeout must be > 0 seconds (inf: no timeout), got {timeout!r}")
    return float(timeout)


# Groups across nodes: shmcomm.multinode registers its start-up here when it is imported (as
# ``import shmcomm`` does), so that the dependency runs one way, shmcomm.multinode -> this module.
# ``start(name, timeout)`` returns the default group when the launch environment spans nodes (or
# is MPI's, with SHMCOMM_LINK=mpi), else None.
_multinode_start: Callable[[str | None, float | None], ProcessGroup | None] | None = None


def register_multinode(start: Callable[[str | None, float | None], ProcessGroup | None]) -> None:
    """Make ``start`` decide, when ``init_process_group`` reads the environment, whether the
    default group spans nodes (``shmcomm.multinode`` registers itself at import).

    Example::

        register_multinode(shmcomm.multinode.group.start)
    """
    global _multinode_start
    _multinode_start = start


def init_process_group(rank: int | None = None, world_size: int | None = None, name: str | None = None,
                       timeout: float | None = None) -> ProcessGroup:
    """Join the default group of this job; returns it once every rank has joined.

    Every rank of the job calls it with the same job name and world size. Missing arguments
    come from the environment ``shmrun`` and ``torchrun`` set: ``RANK``, ``WORLD_SIZE``, and the
    job name from ``SHMCOMM_JOB``, else ``TORCHELASTIC_RUN_ID`` + ``MASTER_PORT``; under
    ``mpirun``/``mpiexec`` on one node (Open MPI, MPICH, Intel MPI, MVAPICH), the rank, size and
    job that launcher sets (no mpi4py needed). Launched on
    several nodes (``LOCAL_WORLD_SIZE`` != ``WORLD_SIZE``, as torchrun and ``shmrun --nnodes``
    set, with rank and world size from the environment), the group is hierarchical: shared
    memory inside each node, torch's gloo between nodes (``shmcomm.multinode``; needs the
    ``shmcomm[torch]`` extra), or MPI with ``SHMCOMM_LINK=mpi`` under ``mpirun`` (rank and
    world size from MPI).

    Args:
        rank (int | None): this process's rank in ``[0, world_size)``; None (the default):
            ``RANK``.
        world_size (int | None): the number of ranks; None (the default): ``WORLD_SIZE``.
        name (str | None): the job name, the same on every rank and unique among the jobs
            running on this machine; None (the default): from the environment.
        timeout (float | None): seconds a collective of this group, and this call, may wait for
            the other ranks; ``inf`` (or torch's ``timedelta.max`` in seconds): no limit; None
            (the default): ``SHMCOMM_TIMEOUT``, else 300.

    Returns:
        ProcessGroup: the default group, also used by every call made with ``group=None``.

    Raises:
        ValueError: it was already called (without ``destroy_process_group``); a variable
            needed is not set or not an integer (the message names it); ``rank`` is outside
            ``[0, world_size)``, ``world_size`` < 1, ``timeout`` <= 0 or nan (or
            ``SHMCOMM_TIMEOUT`` not such a number), or ``name`` empty.
        TypeError: ``rank`` or ``world_size`` is not an int, or ``timeout`` not a number.
        CommTimeoutError: not every rank joined within ``timeout``.
        PeerFailureError: rank 0 died during the start-up.
        ShmcommError: the ranks disagree on the world size, a rank is taken by a live process,
            the job name is in use by another live job, or a peer is not the process that joined;
            on several nodes, torch is missing.
        UntrustedFileError: the group's shared file is not this user's or not this job's.

    Example::

        pg = sc.init_process_group()               # under shmrun or torchrun
        pg = sc.init_process_group(rank=0, world_size=2, name="job-42", timeout=60.0)
    """
    global _default
    with _lock:
        if _default is not None:
            raise ValueError("init_process_group was already called; destroy_process_group() first")
        from_env = rank is None and world_size is None
        if from_env and _multinode_start is not None:
            _default = _multinode_start(name, timeout)
        if _default is None:
            rank, world_size, job, timeout = job_arguments(rank, world_size, name, timeout)
            comm = _core.Communicator(job, "g0", rank, world_size, timeout)
            _default = ProcessGroup(comm, range(world_size), f"{job}.g0")
        _core.set_default_group(_default)
        _groups.append(_default)
        return _default


def default_group() -> ProcessGroup:
    """The default group; ValueError if ``init_process_group`` was not called.

    Example::

        pg = default_group()
    """
    if _default is None:
        raise ValueError("shmcomm is not initialized: call shmcomm.init_process_group() first")
    return _default


def resolve(group: ProcessGroup | None) -> ProcessGroup:
    """``group`` itself, or the default group for None (TypeError for anything else)."""
    if group is None:
        if _default is None:
            return default_group()  # raises the "not initialized" error
        return _default
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group must be a shmcomm.ProcessGroup or None, got {type(group).__name__}")
    return group


def is_initialized() -> bool:
    """Whether this process has a default group.

    Returns:
        bool: True between ``init_process_group`` and ``destroy_process_group``.

    Example::

        if not sc.is_initialized():
            sc.init_process_group()
    """
    return _default is not None


def get_rank(group: ProcessGroup | None = None) -> int:
    """This process's rank in ``group``.

    Args:
        group (ProcessGroup | None): the group; default None, the default group.

    Returns:
        int: the rank, in ``[0, get_world_size(group))``.

    Raises:
        ValueError: ``group`` is None and shmcomm is not initialized.
        TypeError: ``group`` is not a ProcessGroup.

    Example::

        if sc.get_rank() == 0:
            print("world size", sc.get_world_size())
    """
    return resolve(group).rank


def get_world_size(group: ProcessGroup | None = None) -> int:
    """The number of ranks in ``group``.

    Args:
        group (ProcessGroup | None): the group; default None, the default group.

    Returns:
        int: the group's size, at least 1.

    Raises:
        ValueError: ``group`` is None and shmcomm is not initialized.
        TypeError: ``group`` is not a ProcessGroup.

    Example::

        n = sc.get_world_size()
    """
    return resolve(group).size


def new_group(ranks: Sequence[int] | None = None, timeout: float | None = None) -> ProcessGroup | None:
    """Make a group of some ranks of the default group (collective over the default group).

    Every rank of the default group calls it, with the same ``ranks``, also those that are not
    members. Ranks are sorted (as torch does): group rank i is the i-th smallest of ``ranks``.

    Args:
        ranks (Sequence[int] | None): ranks of the default group, distinct; None (the default):
            all of them.
        timeout (float | None): the new group's timeout in seconds; None (the default): the
            default group's.

    Returns:
        ProcessGroup | None: the new group on its members, None on the other ranks.

    Raises:
        ValueError: shmcomm is not initialized; ``ranks`` is empty, holds a rank twice or one
            outside the default group.
        TypeError: a rank is not an int.
        CommTimeoutError: not every member joined within the timeout.

    Example::

        sub = sc.new_group(ranks=[0, 2])
        if sub is not None:
            sc.all_reduce(x, group=sub)
    """
    parent = default_group()
    members = list(range(parent.size)) if ranks is None else sorted(_rank_arg(r, "ranks[i]") for r in ranks)
    return _subgroup(parent, members, timeout, f"ranks must be distinct and non-empty, got {ranks}")


def split(color: int | None, key: int = 0, timeout: float | None = None,
          group: ProcessGroup | None = None) -> ProcessGroup | None:
    """Split ``group`` (the default group) by ``color``, as MPI's ``Comm_split`` (collective).

    Every rank of ``group`` calls it. Ranks that pass the same ``color`` form one new group,
    ordered by ``key``, then by their rank in ``group``. ``group.split(color, key)`` is the same
    call; splitting a group made by a split works as ``Comm_split`` of a split communicator.

    Args:
        color (int | None): the new group's label, >= 0; None (MPI's ``UNDEFINED``): join none.
        key (int): this rank's sort key in its new group; default 0.
        timeout (float | None): the new groups' timeout in seconds; None (the default): the
            default group's.
        group (ProcessGroup | None): the group to split; None (the default): the default group.

    Returns:
        ProcessGroup | None: this rank's new group; None for ``color=None``.

    Raises:
        ValueError: shmcomm is not initialized; ``color`` is not an int >= 0 or None.
        TypeError: ``key`` is not an int.
        CommTimeoutError: not every rank arrived within the timeout.
        PeerFailureError: a rank of the group died or left it.

    Example::

        row = sc.split(color=sc.get_rank() // 2, key=sc.get_rank())   # ranks 0-1, 2-3, ...
        sc.all_reduce(x, group=row)
        pair = row.split(color=0)                                      # a split of the split
    """
    parent = resolve(group)
    if color is not None and (isinstance(color, bool) or not isinstance(color, int) or color < 0):
        raise ValueError(f"color must be an integer >= 0 or None, got {color!r}")
    if isinstance(key, bool) or not isinstance(key, int):
        raise TypeError(f"key must be an integer, got {type(key).__name__}")
    everyone: list = [None] * parent.size
    parent.all_gather_object(everyone, (color, key))
    mine = None
    for c in sorted({c for c, _ in everyone if c is not None}):  # the same order on every rank
        members = sorted((r for r, (rc, _) in enumerate(everyone) if rc == c),
                         key=lambda r: (everyone[r][1], r))
        group = _subgroup(parent, members, timeout, "")
        mine = group if c == color else mine
    return mine


def new_subgroups(group_size: int | None = None, timeout: float | None = None
                  ) -> tuple[ProcessGroup, list[ProcessGroup | None]]:
    """Cut the default group into consecutive groups of ``group_size`` ranks (collective).

    As ``torch.distributed.new_subgroups``: every rank of the default group calls it; group k
    holds ranks ``k * group_size`` to ``(k + 1) * group_size - 1``.

    Args:
        group_size (int | None): ranks per group, dividing the world size; None (the default):
            the ranks on this machine (the whole default group on one node).
        timeout (float | None): the new groups' timeout in seconds; None (the default): the
            default group's.

    Returns:
        tuple[ProcessGroup, list[ProcessGroup | None]]: this rank's group, and every group in
        order (None for those this rank is not in).

    Raises:
        ValueError: shmcomm is not initialized; ``group_size`` is not an int >= 1 or does not
            divide the world size.
        CommTimeoutError: not every member joined within the timeout.

    Example::

        mine, every = sc.new_subgroups(group_size=2)    # 4 ranks: [0, 1] and [2, 3]
    """
    parent = default_group()
    size = parent.size
    if group_size is None:
        topology = getattr(parent, "topology", None)
        group_size = len(topology.nodes[topology.node_of[parent.rank]]) if topology else size
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
    if size % group_size:
        raise ValueError(f"the group's {size} ranks do not divide into groups of {group_size}")
    every = [_subgroup(parent, list(range(start, start + group_size)), timeout, "")
             for start in range(0, size, group_size)]
    return cast(ProcessGroup, every[parent.rank // group_size]), every  # this rank is a member


def _subgroup(parent: ProcessGroup, members: list[int], timeout: float | None,
              empty_message: str) -> ProcessGroup | None:
    """The group of ``members`` (in this order: group rank i is ``members[i]``) under
    ``parent``; collective over ``parent``; None on non-members."""
    if len(set(members)) != len(members) or not members:
        raise ValueError(empty_message or f"members must be distinct and non-empty, got {members}")
    bad = [r for r in members if not 0 <= r < parent.size]
    if bad:
        raise ValueError(f"ranks {bad} are outside the group of size {parent.size}")
    with _lock:
        parent._subgroups += 1
        index = parent._subgroups
    group = parent.subgroup(members, index, float(timeout or parent._comm.timeout))
    if group is not None:
        with _lock:
            _groups.append(group)
    return group


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Release a group's shared memory, once its queued operations ran.

    With None it destroys the default group and every group made from it, and
    ``init_process_group`` may be called again. A destroyed group refuses every later call.
    Destroying a group twice does nothing.

    Args:
        group (ProcessGroup | None): the group; None (the default): the default group and all
            its sub-groups.

    Raises:
        TypeError: ``group`` is not a ProcessGroup.
        ShmcommError: called from inside one of the group's own queued operations.

    Example::

        sc.destroy_process_group()
    """
    global _default
    with _lock:
        victims = list(_groups) if group is None else [resolve(group)]
        for g in victims:  # before the registry forgets any of them
            g._refuse_destroy_here()
        if group is None:
            _groups.clear()
            _default = None
            _core.set_default_group(None)
        else:
            group = victims[0]
            if group in _groups:
                _groups.remove(group)
            if group is _default:
                _default = None
                _core.set_default_group(None)
    for g in victims:
        g.destroy()
