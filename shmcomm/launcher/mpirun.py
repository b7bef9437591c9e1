"""What ``mpirun`` and ``mpiexec`` tell the ranks they start: rank, size, the ranks on this node,
and something that names the job, read from the environment each MPI's launcher sets. With it,
``sc.init_process_group()`` works under ``mpirun -n 4 python script.py`` as under ``shmrun``:
no ``RANK``/``WORLD_SIZE`` needed, and no mpi4py.

==================  ==============================  =======================================
launcher            rank, size (local rank, size)   the job's name
==================  ==============================  =======================================
Open MPI (prterun)  ``OMPI_COMM_WORLD_*``           ``PMIX_NAMESPACE`` (4.x: the ess job id)
Intel MPI (Hydra)   ``PMI_RANK``, ``PMI_SIZE``      ``I_MPI_HYDRA_UUID``
                    (``MPI_LOCALRANKID``,
                    ``MPI_LOCALNRANKS``)
MPICH (Hydra)       the same                        the node's ``hydra_pmi_proxy`` (pid and
                                                    start time: one per job and node)
MVAPICH2            ``MV2_COMM_WORLD_*``            ``MPIRUN_ID``
==================  ==============================  =======================================

Example::

    launch = mpi_launch()      # under mpirun -n 2: MpiLaunch(rank=0, size=2, local_size=2, job='mpi-...')
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

__all__ = ["MpiLaunch", "mpi_launch"]


class MpiLaunch(NamedTuple):
    """This rank as its MPI launcher started it. ``local_size``: ranks on this node (-1: not
    said); ``job``: a name for the job, the same on its ranks of this node and unique among
    the jobs running here ("" when the launcher gives none)."""

    launcher: str
    rank: int
    size: int
    local_size: int
    job: str


# (launcher, rank, size, local size): the variables of each family, first found wins
_FAMILIES = (
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MVAPICH2", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"),
    ("Hydra (MPICH, Intel MPI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"),
)
# the process Hydra starts on each node for a job; the ranks are its descendants
_HYDRA_PROXY = "hydra_pmi_proxy"


def mpi_launch(environ: dict | None = None) -> MpiLaunch | None:
    """This rank as mpirun/mpiexec started it, or None when no MPI launcher did. ValueError
    naming the variable when one is not an integer.

    Example::

        mpi_launch({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                    "PMIX_NAMESPACE": "prterun-host-1@1"})   # rank 1 of 2, job 'mpi-prterun-host-1-1'
    """
    env = os.environ if environ is None else environ
    for launcher, rank_var, size_var, local_var in _FAMILIES:
        if env.get(rank_var) is None or env.get(size_var) is None:
            continue
        rank, size = _int(env, rank_var), _int(env, size_var)
        local = _int(env, local_var) if env.get(local_var) else -1
        return MpiLaunch(launcher, rank, size, local, _job(env, environ is None))
    return None


def _int(env, var: str) -> int:
    raw = env[var]
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{var} must be an integer (set by the MPI launcher), got {raw!r}") from None


def _job(env, live: bool) -> str:
    """A name of the job from what its launcher set ("" when none is found)."""
    for var in ("PMIX_NAMESPACE", "I_MPI_HYDRA_UUID", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid",
                "MPIRUN_ID"):
        if env.get(var):
            return "mpi-" + re.sub(r"[^A-Za-z0-9_.-]", "-", env[var])
    return _hydra_proxy() if live and env.get("PMI_RANK") is not None else ""


def _hydra_proxy() -> str:
    """MPICH's Hydra names no job: its proxy on this node does (the ranks' ancestor), by its pid
    and start time (a pid alone may be reused)."""
    import psutil

    try:
        for process in psutil.Process().parents():
            if process.name() == _HYDRA_PROXY:
                return f"mpi-hydra-{process.pid}-{int(process.create_time() * 1000)}"
    except psutil.Error:
        pass
    return ""
