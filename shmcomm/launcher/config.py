"""What one ``shmrun`` job is: the parsed command line (:class:`LaunchConfig`) that every other
module of the launcher reads, and the launcher's name in its messages.

    cfg = LaunchConfig(nproc=2, command=[sys.executable, "train.py"])
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PROG", "LaunchConfig"]

PROG = "shmrun"  # the launcher's name in its messages, its usage line and its job names


@dataclass
class LaunchConfig:
    """A parsed ``shmrun`` command line; ``command`` is the argv every rank executes.

    ``tee`` and ``redirects`` are torchrun's: 0 none, 1 stdout, 2 stderr, 3 both, for every local
    rank (an ``int``) or per local rank (a ``dict``). Example::

        cfg = parse_args(["-n", "2", "train.py", "--lr", "0.1"])
        cfg.nproc, cfg.command  # 2, [sys.executable, "train.py", "--lr", "0.1"]
    """

    nproc: int
    command: list[str]
    bind_to: str = "none"           # none, core, numa or socket
    prefix: bool = True
    log_dir: str | None = None      # each run writes DIR/<run id>/attempt_<k>/rank<r>.out|.err
    max_restarts: int = 0
    grace: float = 5.0
    nnodes: int = 1                 # several nodes: each runs its own shmrun (static rendezvous)
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # None: a free port (one node only)
    summary: bool = True            # False: the caller (sc.spawn) reports a failure itself
    timestamp: bool = False         # prefix every output line with the time it was shown
    report_bindings: bool = False   # print each rank's CPU set when it starts
    tee: int | dict[int, int] = 0   # streams written to the console and the log
    redirects: int | dict[int, int] = 0  # streams written to the log only
    local_ranks_filter: frozenset[int] | None = None  # None: every rank's output on the console
    env: dict[str, str] = field(default_factory=dict)  # set for every rank (-x NAME=VALUE)
