"""shmcomm: shared-memory collective communication between local Python processes.

The single-machine counterpart of ``torch.distributed``/MPI. Start ranks with ``shmrun`` and::

    import numpy as np
    import shmcomm as sc

    sc.init_process_group()                 # rank, size and job from the environment
    x = np.full(4, sc.get_rank(), np.float32)
    sc.all_reduce(x)                        # every rank: x == sum of ranks
    sc.destroy_process_group()
"""

from typing import TYPE_CHECKING

from shmcomm.errors import (  # noqa: F401
    AbortedError,
    CollectiveMismatchError,
    CommTimeoutError,
    InvalidStateError,
    PeerFailureError,
    ShmcommError,
    UntrustedFileError,
)
from shmcomm.pickling import get_pickler, set_pickler  # noqa: F401
from shmcomm.trust import ensure_inherited_secret
from shmcomm.launcher import error_file

__version__ = "0.1.0"  # the one place of the version (pyproject.toml reads it)

# Processes this one starts (multiprocessing, subprocess) inherit the secret and so can prove
# they belong to one job; see shmcomm.trust.
ensure_inherited_secret()
# A rank whose launcher asks tells it whether it failed for a reason of its own or because a peer
# did, so that the launcher blames the root cause (shmcomm.launcher.error_file).
error_file.install()

_CORE_ERROR: ImportError | None
try:
    from shmcomm import _core  # noqa: F401
except ImportError as exc:  # a broken build must not break `import torch` (entry point) too
    _CORE_ERROR = exc
else:
    _CORE_ERROR = None

if _CORE_ERROR is None:
    from shmcomm._core import Future  # noqa: F401
    from shmcomm.ops import ReduceOp  # noqa: F401
    from shmcomm.work import Work  # noqa: F401
    from shmcomm.group import ProcessGroup  # noqa: F401
    from shmcomm.world import (  # noqa: F401
        destroy_process_group,
        get_rank,
        get_world_size,
        init_process_group,
        is_initialized,
        new_group,
        new_subgroups,
        split,
    )
    from shmcomm import multinode  # noqa: F401  # registers groups across nodes with shmcomm.world
    from shmcomm.spawn import spawn  # noqa: F401
    from shmcomm.waits import collect_all, wait_all, wait_any  # noqa: F401
    from shmcomm.collectives import *  # noqa: F401,F403
    from shmcomm.collectives import __all__ as _collectives_all
else:
    _collectives_all = []

    if not TYPE_CHECKING:  # type checkers see the built package, where a misspelt name is an error
        def __getattr__(name: str):
            raise ImportError(f"shmcomm.{name} is unavailable: the compiled core shmcomm._core failed "
                              f"to import ({_CORE_ERROR}); reinstall shmcomm for this Python and "
                              f"numpy (pip install --force-reinstall shmcomm)") from _CORE_ERROR


__all__ = [
    "AbortedError", "CollectiveMismatchError", "CommTimeoutError", "InvalidStateError",
    "PeerFailureError", "ShmcommError", "UntrustedFileError", "Future", "collect_all", "wait_all", "wait_any", "ReduceOp", "Work",
    "ProcessGroup", "destroy_process_group", "get_rank", "get_world_size", "init_process_group",
    "is_initialized", "new_group", "new_subgroups", "split", "spawn", "set_pickler", "get_pickler",
    *_collectives_all,
]
