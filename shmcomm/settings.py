"""Every ``SHMCOMM_*`` environment variable shmcomm reads, in one table.

Each row names the variable, what it belongs to (its *scope*), its default, the smallest and
largest values it accepts where it is a number, and one line of why. The compiled core reads its
group tuning through this table (``shmcomm._core.group_settings``), ``shmcomm info`` prints it
whole (``--json`` too), and a test checks that no ``SHMCOMM_*`` variable is read anywhere in the
code without a row here.

Scopes:
    group      tuning of each process group, read when a group is created (``group_settings``)
    job        how ranks meet: job name, secret, timeout
    kernels    the SIMD level of the reduction kernels
    multinode  the engine between nodes, simulated nodes and NUMA nodes
    rpc        the RPC agent's rings and waits
    torch      the native kernel of torch.ops.shmcomm.all_reduce_
    bench      ``shmcomm-bench`` test hooks
    build      read by setup.py when the extension is compiled

Example::

    >>> from shmcomm.settings import SETTINGS, find
    >>> find("SHMCOMM_SLOT_BYTES").floor, find("SHMCOMM_SLOT_BYTES").ceiling
    (4096, 1073741824)
    >>> all(s.var.startswith("SHMCOMM_") for s in SETTINGS)
    True
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

__all__ = ["Setting", "SETTINGS", "GROUP_TUNING", "find", "read_int", "read_seconds", "in_effect"]


@dataclass(frozen=True)
class Setting:
    """One row of the table.

    ``default`` is the default as a reader sees it (a value or the rule that gives it);
    ``compute``, for group tuning only, gives that default from the group's facts (``size``,
    ``fits``: whether every rank's busy threads fit the usable cores, ``llc``: last-level cache
    bytes); ``key`` is the name in ``group_settings()``; ``floor`` and ``ceiling`` the smallest
    and largest integers accepted.

    Example::

        >>> Setting("EXAMPLE", "job", "1", "an example").floor is None
        True
    """

    var: str
    scope: str
    default: str
    why: str
    floor: Optional[int] = None
    key: Optional[str] = None
    compute: Optional[Callable[[Mapping[str, int]], int]] = None
    ceiling: Optional[int] = None
    secret: bool = False  # never printed: `shmcomm info` says only whether it is set


def _one_shot_bytes(size: int, fits: bool) -> int:
    """The default largest one-shot reduction. One shot makes every rank read every rank's
    message (size x ranks bytes each); two steps of reduce-scatter + all-gather read about two
    messages but wait twice. So the limit falls with the square of the group: 64 KiB / ranks^2
    while the ranks fit the cores (16 KiB at 2 ranks, the 2-core tuning; on 16 cores two steps
    won from 1 KiB at 8 ranks and 512 B at 16), 256 KiB / ranks^2 where they outnumber the cores
    (each further step waits for descheduled peers: 16 KiB at 3 and 4 ranks on 2 cores, the
    2-core tuning; 256 B at 32 ranks on 16 cores, where two steps won from 1 KiB). Rounded down
    to a cache line, at least one, at most 16 KiB.

    Example::

        >>> [_one_shot_bytes(n, True) for n in (1, 2, 3, 4, 8, 16, 32, 64)]
        [16384, 16384, 7232, 4096, 1024, 256, 64, 64]
        >>> [_one_shot_bytes(n, False) for n in (3, 4, 8, 16, 32, 64)]
        [16384, 16384, 4096, 1024, 256, 64]
    """
    budget = 65536 if fits else 262144
    size = max(size, 1)
    return min(16384, max(64, (budget // (size * size)) // 64 * 64))


# Ceilings: a number past them cannot work, or works no differently, and would only carry the
# arithmetic built on it towards wrapping (SHMCOMM_SLOT_BYTES=2**62 once wrapped the segment's
# size to one without slots: zeros on one rank, SIGSEGV on the other).
# A slot or ring of shared memory: 1 GiB is already GiBs of /dev/shm per rank (two slots each, a
# ring per ordered pair of ranks), far past the MiBs pipelining needs. One-shot reductions too:
# their data goes through a slot.
_REGION_MAX = 1 << 30
# A size that arrays are compared with: 1 PiB is more than any machine's memory, so it already
# means "never" (and sums of sizes stay far below 2**64).
_THRESHOLD_MAX = 1 << 50
# Microseconds of busy-polling or of a progress thread's rest: a whole second is far past any
# gain, and the nanoseconds made of it stay far from wrapping.
_MICROS_MAX = 1_000_000
# sched_yield rounds before sleeping: a million already take about a second (the core keeps them
# in a C int).
_YIELDS_MAX = 1_000_000
# Blocks of ranks that act as nodes: no more than the ranks shmrun starts on one machine.
_BLOCKS_MAX = 4096

SETTINGS: tuple[Setting, ...] = (
    # ---- group tuning (the compiled core; defaults measured on 2 cores, see DESIGN-NOTES) ----
    # One-shot makes every rank read every rank's message: size x ranks bytes each. On 16 cores
    # (all_reduce, us per call) one shot against two steps: 8 ranks 1 KiB 4.7-5.0 / 3.7-4.5,
    # 2 KiB 6.9-7.1 / 4.3-5.5; 16 ranks 512 B 5.9 / 4.3, 1 KiB 7.4 / 4.8; 32 ranks on 16 cores
    # 1 KiB 52-75 / 34, 4 KiB 181 / 36-50. See _one_shot_bytes.
    Setting("SHMCOMM_SMALL_BYTES", "group", "64 KiB / ranks^2 (16 KiB at 2, 1 KiB at 8, 256 B "
            "at 16, at least 64 B); 256 KiB / ranks^2 (at most 16 KiB) if the ranks outnumber "
            "the cores", "reductions up to this size go one-shot through the slots", 0,
            "small_bytes", lambda g: _one_shot_bytes(g["size"], bool(g["fits"])), _REGION_MAX),
    # Streaming stores from half the last-level cache: smaller outputs stay cached where the
    # caller reads them next (on a 32 MiB-L3 VM, all_gather: 8 MiB streamed 0.6-2.3 ms vs
    # 0.7-0.8 ms, 32 MiB 3.8-4.3 ms vs 4.7-5.2 ms). Reductions, whose outputs are their cached
    # inputs, never stream.
    Setting("SHMCOMM_STREAM_BYTES", "group", "half the last-level cache",
            "outputs this large are written with streaming stores", 0, "stream_bytes",
            lambda g: g["llc"] // 2, _THRESHOLD_MAX),
    # Slots are written by one rank and read by the others; which stores write them, and whether
    # large reductions go by single copy or the slots, is measured and chosen as the group runs
    # (src_cython/tuning.pxi has the numbers).
    Setting("SHMCOMM_TUNE_BYTES", "group", "4 KiB",
            "calls this large are tuned as the group runs: rank 0 measures, per size class, slot "
            "copies with normal or streaming stores, and large reductions by single copy or the "
            "slots, and chooses for every rank; 0: no tuning (normal stores, single copy)", 0,
            "tune_bytes", lambda g: 4096, _THRESHOLD_MAX),
    # A futex wake-up costs tens of microseconds, far more when another process holds the core;
    # a rank blocked for seconds still sleeps almost all the time. More ranks than cores: the
    # peer needs our core, so never spin.
    Setting("SHMCOMM_SPIN_US", "group", "2000 if the ranks fit the cores, else 0",
            "most a wait busy-polls before yielding and sleeping (it adapts below this)", 0,
            "spin_us", lambda g: 2000 if g["fits"] else 0, _MICROS_MAX),
    # More ranks than cores: give the core to the peer we wait for for a few hundred
    # microseconds before sleeping on the futex.
    Setting("SHMCOMM_YIELDS", "group", "16 if the ranks fit the cores, else 256",
            "sched_yield rounds of a wait between spinning and sleeping", 0, "yields",
            lambda g: 16 if g["fits"] else 256, _YIELDS_MAX),
    Setting("SHMCOMM_SLOT_BYTES", "group", "1 MiB",
            "each rank's two data slots in the group segment (chunk of the slot paths)", 4096,
            "slot_bytes", lambda g: 1 << 20, _REGION_MAX),
    Setting("SHMCOMM_RING_BYTES", "group", "256 KiB",
            "each point-to-point ring (one per ordered pair of ranks)", 4096, "ring_bytes",
            lambda g: 256 << 10, _REGION_MAX),
    Setting("SHMCOMM_CMA_BYTES", "group", "256 KiB",
            "pieces from this size use cross-memory attach (single copy); 0 turns it off", 0,
            "cma_bytes", lambda g: 256 << 10, _THRESHOLD_MAX),
    # A rank blocked in a receive reads single-copy messages no receive asked for into buffers,
    # so that two ranks that both send large messages before receiving do not wait for each
    # other for ever; past this many bytes held so, their senders wait for a matching receive
    # (MPI's rendezvous). 40 unexpected 64 MiB messages grew a rank by 2.5 GiB without it.
    Setting("SHMCOMM_UNEXPECTED_BYTES", "group", "256 MiB",
            "point to point: unexpected single-copy messages held in private buffers, at most "
            "(in all); past it, their senders wait for a matching receive", 0,
            "unexpected_bytes", lambda g: 256 << 20, _THRESHOLD_MAX),
    # Unmeasured: no machine with several NUMA nodes was at hand (shmcomm/hierarchy/numa.py). Below about
    # a megabyte the composition's four steps of waiting should cost more than the cross-node
    # traffic it saves.
    Setting("SHMCOMM_NUMA_BYTES", "group", "1 MiB",
            "all_reduce, reduce_scatter and all_gather of private arrays this large (all ranks' "
            "data) run inside each NUMA node first, where the ranks are bound to several nodes; "
            "0 turns it off", 0, "numa_bytes",
            lambda g: 1 << 20, _THRESHOLD_MAX),
    # Unmeasured on a machine with many cores per rank (none was lent; bench/bench_threads.py
    # measures it). A rank's large copies and reductions are memory-bound: one thread reaches a
    # fraction of a socket's bandwidth, and DeepSpeed's op splits them over the rank's OpenMP
    # threads (0.65 ms for 32 MiB on two Xeon sockets, 4-7x one thread here). At most 8 by
    # default: a socket's bandwidth is reached before that, and each thread is one more group
    # segment in /dev/shm.
    Setting("SHMCOMM_RANK_THREADS", "group", "0: the rank's share of the cores (its affinity "
            "over the ranks sharing it, at most 8; 1 where ranks share cores)",
            "threads each rank runs a large synchronous all_reduce with (hierarchy/threads.py): "
            "every rank splits the array into that many pieces, each reduced by one thread of "
            "its own; 1 turns it off", 0, "rank_threads", lambda g: 0, 256),
    Setting("SHMCOMM_THREADS_BYTES", "group", "1 MiB",
            "all_reduce of private arrays this large is split over the rank's threads "
            "(SHMCOMM_RANK_THREADS); 0 turns it off", 0, "threads_bytes",
            lambda g: 1 << 20, _THRESHOLD_MAX),
    Setting("SHMCOMM_PROGRESS_US", "group", "50",
            "how often the progress thread looks for queued async ops while the group is busy", 1,
            "progress_us", lambda g: 50, _MICROS_MAX),
    # ---- how ranks meet -----------------------------------------------------------------------
    Setting("SHMCOMM_JOB", "job", "TORCHELASTIC_RUN_ID + MASTER_PORT, else required",
            "the job name ranks meet under (shmrun sets it)"),
    Setting("SHMCOMM_SECRET", "job", "none (ranks started by hand make one up)",
            "the job's shared secret: segments of other jobs are refused (shmrun sets it)",
            secret=True),
    Setting("SHMCOMM_TIMEOUT", "job", "300",
            "seconds an operation waits for its peers before CommTimeoutError (torch's backend: "
            "the timeout init_process_group passes)"),
    # ---- kernels, nodes, RPC ------------------------------------------------------------------
    Setting("SHMCOMM_SIMD", "kernels", "auto (the best level this CPU runs)",
            "force a kernel level: baseline, avx2, avx512, neon (results are the same bits)"),
    Setting("SHMCOMM_LINK", "multinode", "gloo",
            "the engine between nodes: gloo (torch) or mpi (mpi4py, under mpirun)"),
    Setting("SHMCOMM_SIMULATE_NODES", "multinode", "1",
            "testing and benchmarking: split the ranks into K blocks that act as nodes", 1,
            ceiling=_BLOCKS_MAX),
    Setting("SHMCOMM_SIMULATE_NUMA", "multinode", "1",
            "testing: split each group's ranks into K blocks that act as NUMA nodes", 1,
            ceiling=_BLOCKS_MAX),
    Setting("SHMCOMM_RPC_RING_BYTES", "rpc", "about 4 MiB of rings per rank, 256 KiB-1 MiB each",
            "bytes of each RPC ring", 4096, ceiling=_REGION_MAX),
    Setting("SHMCOMM_RPC_SPIN_US", "rpc", "0",
            "microseconds an RPC wait busy-polls before yielding", 0, ceiling=_MICROS_MAX),
    Setting("SHMCOMM_RPC_YIELDS", "rpc", "64", "sched_yield rounds of an RPC wait before sleeping", 0,
            ceiling=_YIELDS_MAX),
    Setting("SHMCOMM_TORCH_NATIVE", "torch", "1",
            "0: torch.ops.shmcomm.all_reduce_ runs its Python kernel (no C++ build, no warning)"),
    # ---- tools and the build ------------------------------------------------------------------
    Setting("SHMCOMM_BENCH_MPIRUN", "bench", "mpirun or mpiexec on PATH",
            "the mpirun shmcomm-bench starts the MPI peer with"),
    Setting("SHMCOMM_BENCH_IMPI", "bench", "I_MPI_ROOT, else this Python's prefix",
            "the prefix of the Intel MPI shmcomm-bench starts the impi peer with"),
    Setting("SHMCOMM_BENCH_UNAVAILABLE", "bench", "none",
            "tests: backends shmcomm-bench treats as missing (comma list)"),
    Setting("SHMCOMM_DEBUG_BUILD", "build", "0", "1: compile the core at -O0 -g"),
    Setting("SHMCOMM_SANITIZE", "build", "none",
            "address: an AddressSanitizer build (.ci/asan); never for a release"),
    Setting("SHMCOMM_BUILD_CACHE", "build", "1",
            "0: never reuse an identical earlier build from build/shmcomm-cache"),
)

GROUP_TUNING: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.scope == "group")


def find(var: str) -> Setting:
    """The row of ``var``; KeyError if shmcomm does not read it.

    Example::

        >>> find("SHMCOMM_LINK").default
        'gloo'
    """
    for s in SETTINGS:
        if s.var == var:
            return s
    raise KeyError(f"{var} is not a shmcomm setting")


def read_int(setting: Setting, default: int) -> int:
    """``setting``'s integer value from the environment, else ``default``; a clear ValueError
    naming the variable for a value that is not an integer or is outside [floor, ceiling].

    Example::

        >>> read_int(find("SHMCOMM_SLOT_BYTES"), 1 << 20) >= 4096
        True
    """
    raw = os.environ.get(setting.var)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{setting.var} must be an integer, got {raw!r}") from None
    low, high = setting.floor, setting.ceiling
    if (low is not None and value < low) or (high is not None and value > high):
        allowed = " and ".join(f"{word} {bound}" for word, bound in (("at least", low), ("at most", high))
                               if bound is not None)
        raise ValueError(f"{setting.var} must be {allowed}, got {value}")
    return value


def read_seconds(setting: Setting, default: float) -> float:
    """``setting``'s value in seconds from the environment, else ``default``: a number > 0, or
    ``inf`` for no limit; a clear ValueError naming the variable for anything else.

    Example::

        >>> read_seconds(find("SHMCOMM_TIMEOUT"), 300.0) > 0
        True
    """
    raw = os.environ.get(setting.var)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value > 0:  # nan too
        raise ValueError(f"{setting.var} must be a number of seconds > 0 (inf: no timeout), "
                         f"got {raw!r}")
    return value


def in_effect() -> list[dict[str, object]]:
    """Every row with the value set in this environment (None where unset; a secret's value shows
    as "(set)"), for ``shmcomm info``.

    Example::

        >>> rows = in_effect(); rows[0]["var"]
        'SHMCOMM_SMALL_BYTES'
    """
    def value(s: Setting) -> Optional[str]:
        raw = os.environ.get(s.var) or None
        if raw is not None and s.secret:
            # "auto-...": made up by `import shmcomm` for this process's children, not set by you
            return None if raw.startswith("auto-") else "(set)"
        return raw

    return [{"var": s.var, "scope": s.scope, "value": value(s),
             "default": s.default, "floor": s.floor, "ceiling": s.ceiling, "why": s.why}
            for s in SETTINGS]
