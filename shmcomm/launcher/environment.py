"""What each rank is started with: the job's name and port, the CPU cores it is pinned to
(``--bind-to``), its thread count, and its environment (torchrun's variables, ``SHMCOMM_JOB``,
the job's secret, the error file it reports a failure in)::

    plan = binding_plan(cfg)                                  # None for --bind-to none
    env = rank_environment(cfg, 1, job_name(cfg, 0), free_port(), plan=plan)
"""

from __future__ import annotations

import os
import secrets
import socket

from shmcomm import trust
from shmcomm.launcher import error_file
from shmcomm.launcher.config import PROG, LaunchConfig
from shmcomm.cpus import cpu_domains, usable_cores

__all__ = ["free_port", "job_name", "threads_per_rank", "binding_plan", "rank_environment"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for MASTER_PORT). It is released before rank 0 binds
    it; the window is tiny and torchrun does the same. Example::

        env["MASTER_PORT"] = str(free_port())
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair() -> int:
    """A port P such that P and P + 1 are both free on 127.0.0.1 now: ``--master-port`` for
    ``shmrun --nnodes``, whose node 0 also listens on P + 1 (the link between nodes). Example::

        port = free_port_pair()   # for --master-port of every node
    """
    while True:
        port = free_port()
        if port + 1 > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


def job_name(cfg: LaunchConfig, attempt: int) -> str:
    """The job's name (``SHMCOMM_JOB``, ``TORCHELASTIC_RUN_ID``) for attempt ``attempt``: on one
    node a name no other job has; on several, one name every node derives alike, as the numpy
    API meets there under it. Example::

        job_name(parse_args(["-n", "2", "true"]), 0)   # 'shmrun-4242-9f86d081'
    """
    if cfg.nnodes == 1:
        return f"{PROG}-{os.getpid()}-{secrets.token_hex(4)}"
    return f"shmrun-{cfg.master_port}-{attempt}"


def threads_per_rank(nranks: int, bind_to: str = "none") -> int:
    """``OMP_NUM_THREADS`` for ``nranks`` ranks sharing this process's cores: a rank pinned to
    one core gains nothing from more threads than that core. Example::

        env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(4)))
    """
    return 1 if bind_to == "core" else max(1, len(usable_cores()) // nranks)


def binding_plan(cfg: LaunchConfig) -> list[tuple[set[int], str]] | None:
    """Per local rank, the cores it is pinned to and where they are (``"core 3"``, ``"numa node
    0"``, ``"socket 1"``): rank r gets group r mod #groups of :func:`cpu_domains`. ``None`` for
    ``--bind-to none``. Example::

        binding_plan(parse_args(["-n", "2", "--bind-to", "core", "true"]))  # [({0}, 'core 0'), ({1}, 'core 1')]
    """
    if cfg.bind_to == "none":
        return None
    domains = cpu_domains(cfg.bind_to)
    what = {"core": "core", "numa": "numa node", "socket": "socket"}[cfg.bind_to]
    plan = []
    for r in range(cfg.nproc):
        ident, cpus = domains[r % len(domains)]
        plan.append((set(cpus), f"{what} {ident}"))
    return plan


def _threads(cfg: LaunchConfig, rank: int, plan: list[tuple[set[int], str]] | None) -> int:
    """``OMP_NUM_THREADS`` of ``rank``: its cores shared among the ranks bound to the same ones."""
    if plan is None or cfg.bind_to == "core":
        return threads_per_rank(cfg.nproc, cfg.bind_to)
    cpus, where = plan[rank]
    sharing = sum(1 for _, w in plan if w == where)
    return max(1, len(cpus) // sharing)


# What shmrun sets for every rank, whatever the environment or -x says: torchrun's variables, the
# job's name and secret (rank_environment). A -x naming one is warned about (cli.py).
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE",
                      "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                      "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "SHMCOMM_JOB",
                      trust.SECRET_ENV)


def rank_environment(cfg: LaunchConfig, rank: int, job: str, port: int, attempt: int = 0,
                     base: dict[str, str] | None = None, secret: str | None = None,
                     plan: list[tuple[set[int], str]] | None = None,
                     error_path: str | None = None) -> dict[str, str]:
    """The environment of ``rank``: ``base`` (default ``os.environ``) plus the torchrun variables
    and, when given, the job's ``SHMCOMM_SECRET`` (one per attempt; see shmcomm.trust) and the
    rank's ``TORCHELASTIC_ERROR_FILE`` (see shmcomm.launcher.error_file). ``plan`` is
    :func:`binding_plan`'s (computed when omitted), for ``OMP_NUM_THREADS``.

    Example::

        env = rank_environment(parse_args(["-n", "2", "true"]), 1, "job-1", 29500)
        env["RANK"], env["WORLD_SIZE"], env["SHMCOMM_JOB"]  # '1', '2', 'job-1'
    """
    env = dict(os.environ if base is None else base)
    env.update(cfg.env)
    n = cfg.nproc
    world, global_rank = n * cfg.nnodes, cfg.node_rank * n + rank  # ``rank`` is the local rank
    env.update({
        "RANK": str(global_rank), "LOCAL_RANK": str(rank), "GROUP_RANK": str(cfg.node_rank),
        "ROLE_RANK": str(global_rank), "ROLE_NAME": "default", "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(n), "GROUP_WORLD_SIZE": str(cfg.nnodes), "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": cfg.master_addr, "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": job, "TORCHELASTIC_RESTART_COUNT": str(attempt),
        "TORCHELASTIC_MAX_RESTARTS": str(cfg.max_restarts),
        # torch's env:// would otherwise wait for an agent-hosted store that shmrun does not run
        # (this matters when shmrun itself is started by torchrun).
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "SHMCOMM_JOB": job,
    })
    if secret is not None:
        env[trust.SECRET_ENV] = secret
    env.pop(error_file.ENV, None)  # an outer launcher's file, not ours
    if error_path is not None:
        env[error_file.ENV] = error_path
    if "OMP_NUM_THREADS" not in env:
        if plan is None and cfg.bind_to in ("numa", "socket"):
            plan = binding_plan(cfg)
        env["OMP_NUM_THREADS"] = str(_threads(cfg, rank, plan))
    env.setdefault("PYTHONUNBUFFERED", "1")  # otherwise Python ranks' output arrives in bursts
    # torch's CPU allocator then backs tensors of 2 MiB and more with huge pages (numpy does so by
    # default). Every large collective touches each page of its tensors, and single-copy reads
    # pin each page of the peer's: with 4 KiB pages that took about 40% of a 32 MiB all_reduce of
    # torch tensors on two ranks (3.9 ms against 2.3, bench_torch_backend.py).
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    return env
