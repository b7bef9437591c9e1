"""The contract between the composed collectives and an engine between nodes, and the choice of
engine (``SHMCOMM_LINK``: ``gloo``, the default, or ``mpi``).

An engine hands out *links*: one inter-node communicator over some ranks of a group. A
hierarchical group holds two:

- its **rail**: the ranks with this rank's local index on every node (one per node);
- its **world**: every rank of the group (point to point, all_to_all, gather, scatter, and
  everything when nodes hold different numbers of ranks).

A link's currency is numpy: 1-D C-contiguous arrays of any dtype of the compiled core (bfloat16
as ``ml_dtypes.bfloat16``); each engine converts to what it sends inside itself. Its calls block
until done (the hierarchy runs them on its group's progress thread); ``op`` is a shmcomm op code
without AVG and PREMUL_SUM (the hierarchy turns those into SUM). Every rank of a link must get
the same bits from a reduction.

An engine is a module with ``BUSY_THREADS``, ``launch`` and ``connect`` (``Engine`` below);
another engine is one more module and one more row of ``ENGINES``::

    rail, world = connect(meeting, timeout=60.0, rails=[[0, 2], [1, 3]])   # meeting of 4 ranks
    rail.all_reduce(np.ones(3), 0)       # SUM over this rank's rail
"""

from __future__ import annotations

import importlib
import os
import re
import zlib
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

import shmcomm._core as _core
from shmcomm.errors import CollectiveMismatchError, PeerFailureError

if TYPE_CHECKING:
    from shmcomm.multinode.store import Meeting

__all__ = ["ENGINES", "Engine", "Launch", "Link", "Request", "check_same", "connect", "descriptor",
           "engine", "engine_name", "lost_peer"]

# SHMCOMM_LINK value -> the module of that engine
ENGINES = {
    "gloo": "shmcomm.multinode.gloo_link",
    "mpi": "shmcomm.multinode.mpi_link",
}


class Request(Protocol):
    """A point-to-point transfer in flight (what ``Link.isend``/``irecv`` return)."""

    def wait(self, timeout: float | None = None) -> None:
        """Return once done; raise the engine's error, or one past ``timeout`` seconds."""
        ...

    def done(self) -> bool:
        """Whether the transfer finished (without waiting)."""
        ...

    def source(self) -> int:
        """The sender's link rank (a finished receive)."""
        ...


class Link(Protocol):
    """One inter-node communicator over ``size`` ranks; this process is ``rank``."""

    rank: int
    size: int

    def all_reduce(self, a: np.ndarray, op: int) -> None:
        """Reduce ``a`` in place over the link's ranks (the same bits on every rank)."""
        ...

    def reduce_scatter_into(self, out: np.ndarray, a: np.ndarray, op: int) -> None:
        """``out`` on link rank r = reduction of piece r of every rank's ``a``."""
        ...

    def broadcast(self, a: np.ndarray, root: int) -> None:
        """Copy link rank ``root``'s ``a`` into every rank's."""
        ...

    def all_gather_into(self, out: np.ndarray, a: np.ndarray) -> None:
        """``out`` = every rank's ``a``, in link-rank order."""
        ...

    def all_to_all_single(self, out: np.ndarray, a: np.ndarray, out_splits: list[int],
                          in_splits: list[int]) -> None:
        """Rank q gets the ``in_splits[q]`` elements of ``a`` meant for it, into ``out``."""
        ...

    def gather(self, a: np.ndarray, outs: list[np.ndarray] | None, root: int) -> None:
        """Link rank ``root``'s ``outs[q]`` = rank q's ``a`` (``outs`` None elsewhere)."""
        ...

    def scatter(self, a: np.ndarray, ins: list[np.ndarray] | None, root: int) -> None:
        """Rank q's ``a`` = link rank ``root``'s ``ins[q]`` (``ins`` None elsewhere)."""
        ...

    def barrier(self) -> None:
        """Return once every rank of the link called it."""
        ...

    def isend(self, a: np.ndarray, dst: int, tag: int) -> Request:
        """Start sending ``a`` to link rank ``dst``."""
        ...

    def irecv(self, a: np.ndarray, src: int | None, tag: int) -> Request:
        """Start receiving into ``a`` from ``src`` (None: any rank)."""
        ...

    def close(self) -> None:
        """Release the link (idempotent)."""
        ...


class Launch(NamedTuple):
    """What an engine's ``launch`` found: the ranks' meeting, the job name and timeout, and what
    to say if every rank turns out to share one machine (None: then a shared-memory group)."""

    meeting: Meeting
    job: str
    timeout: float
    one_node_error: str | None


class Engine(Protocol):
    """What an engine module provides."""

    # threads of a rank that a busy link keeps on a core (its node group counts them when
    # deciding whether waiting may spin)
    BUSY_THREADS: int

    def launch(self, name: str | None, timeout: float | None) -> Launch | None:
        """``init_process_group()``'s start from this engine's launch environment: None when
        the environment says one node (a plain shared-memory group follows)."""
        ...

    def connect(self, meeting: Meeting, timeout: float, rails: list[list[int]] | None,
                checked: bool = True) -> tuple[Link | None, Link]:
        """This rank's rail link (None without ``rails``) and the world link; collective.
        ``checked``: each link collective compares its ranks' descriptors first."""
        ...


def engine_name() -> str:
    """``SHMCOMM_LINK``, checked: ``gloo`` when unset.

    Example::

        engine_name()   # "gloo"
    """
    raw = os.environ.get("SHMCOMM_LINK", "").strip() or "gloo"
    if raw not in ENGINES:
        raise ValueError(f"SHMCOMM_LINK must be one of {', '.join(ENGINES)} (the engine between "
                         f"nodes), got {raw!r}")
    return raw


def engine() -> Any:
    """The module of the engine ``SHMCOMM_LINK`` names (an ``Engine``).

    Example::

        engine().BUSY_THREADS   # 2 for gloo
    """
    return importlib.import_module(ENGINES[engine_name()])


def connect(meeting: Meeting, timeout: float, rails: list[list[int]] | None,
            checked: bool = True) -> tuple[Link | None, Link]:
    """This rank's rail link (None without ``rails``) and the world link, by the engine
    ``SHMCOMM_LINK`` names. ``rails`` lists the meeting's ranks of each rail; every rank of the
    meeting calls this with the same ``rails`` (each link is a collective rendezvous).
    ``checked``: before each collective, a link's ranks compare their descriptors (one small
    exchange); False for a caller that checks each of its calls once itself (the composition).

    Example::

        rail, world = connect(meeting, 60.0, [[0, 2], [1, 3]])
    """
    return engine().connect(meeting, timeout, rails, checked)


# ---- every rank called the same collective: call descriptors ------------------------------------
# A descriptor is what a rank is about to do, as 6 int64: (kind, dtype, bytes, op, root, counts).
# Ranks compare theirs before any data moves: the composition once per composed call, a link
# made with ``checked=True`` before each of its collectives.
# The kinds are the compiled registry's (src_cython/registry.pxi): one list of collective kinds.
_KIND_CODES = {name: code for code, name in _core.KIND_NAMES.items()}
_FIELDS = ("kind", "dtype", "nbytes", "op", "root", "counts")


def _dtype_code(dtype: np.dtype | str) -> int:
    """The same number for the same dtype (or dtype name) in every process (a hash of its name)."""
    return zlib.crc32((dtype if isinstance(dtype, str) else dtype.name).encode())


def _counts_code(counts) -> int:
    """The same number for the same piece sizes in every process (0: none given, or sizes the
    call's own checks will refuse)."""
    if counts is None:
        return 0
    try:
        return zlib.crc32(np.asarray(counts, np.int64).tobytes()) or 1
    except (TypeError, ValueError, OverflowError):
        return 0


def descriptor(kind: str, a: np.ndarray | None = None, op: int = -1, root: int = -1,
               nbytes: int | None = None, counts=None, dtype: str | None = None) -> np.ndarray:
    """What this rank is about to do, as 6 int64: kind, dtype, bytes, op, root, and a code of
    the piece sizes ``counts`` that every rank passes alike (uneven forms; 0 without).
    ``dtype``: the dtype's name as the compiled core sees it, where ``a`` is not given.

    Example::

        >>> descriptor("broadcast", np.zeros(4, np.float32), root=1).tolist()[2:]
        [16, -1, 1, 0]
    """
    if nbytes is None:
        nbytes = a.nbytes if a is not None else 0
    code = _dtype_code(a.dtype) if a is not None else _dtype_code(dtype) if dtype else 0
    return np.array([_KIND_CODES[kind], code, nbytes, op, root, _counts_code(counts)], np.int64)


def check_same(rows: np.ndarray, who: str = "ranks on different nodes", unit: str = "link rank") -> None:
    """CollectiveMismatchError unless all ``rows`` (one ``descriptor`` per rank, row q for
    ``unit`` q) are equal, naming what differs and each rank's call (ranks that called the same
    thing on one line): every rank that compares the same rows raises the same error, as on one
    node. ``who`` and ``unit`` word the message.

    Example::

        check_same(np.stack([descriptor("barrier")] * 2))   # nothing to say
    """
    raw = rows.tobytes()  # every row equal, the common case: decided in bytes (a microsecond
    if raw == raw[:len(raw) // len(rows)] * len(rows):  # less than numpy's comparison)
        return
    DTYPE_NAMES = _core.DTYPE_NAMES

    names = {zlib.crc32(name.encode()): name for name in DTYPE_NAMES}
    names.update({_dtype_code(np.dtype(n)): n for n in DTYPE_NAMES if n != "bfloat16"})
    calls: dict[str, list[int]] = {}
    for q, row in enumerate(rows):
        calls.setdefault(_describe(row.tolist(), names), []).append(q)
    differ = [f for w, f in enumerate(_FIELDS) if (rows[:, w] != rows[0, w]).any()]
    lines = [f"{unit}{'s' if len(qs) > 1 else ''} {_spans(qs)}: {call}" for call, qs in calls.items()]
    raise CollectiveMismatchError(f"{who} called different collectives or arguments (they differ "
                                  f"in {', '.join(differ)}):\n  " + "\n  ".join(lines))


def _spans(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``'0-2, 5'``."""
    spans: list[list[int]] = []
    for r in ranks:
        if spans and spans[-1][1] == r - 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def _describe(row: list[int], dtype_names: dict[int, str]) -> str:
    OP_NAMES = _core.OP_NAMES

    kind, dtype, nbytes, op, root, counts = row
    name = _core.KIND_NAMES.get(kind, f"kind {kind}")
    args = [f"dtype={dtype_names.get(dtype, dtype)}", f"nbytes={nbytes}"]
    if op >= 0:
        args.append(f"op={OP_NAMES[op] if op < len(OP_NAMES) else op}")
    if root >= 0:
        args.append(f"root={root}")
    if counts:
        args.append(f"counts=#{counts & 0xffffffff:08x}")
    return f"{name}({', '.join(args)})"


# What a link's transport says when the process at the other end is gone (gloo's TCP pairs:
# "Connection closed by peer [addr]:port", "Connection reset by peer", a write's broken pipe).
_LOST_PEER = re.compile(r"Connection (?:closed|reset) by peer|Broken pipe")


def lost_peer(exc: BaseException) -> PeerFailureError | None:
    """A link's error that means a rank on another node died or left, as the PeerFailureError it
    is (its rank and pid are unknown here: -1); None for any other error. Users catch
    PeerFailureError for a peer's death, on one node or several.

    Example::

        lost_peer(RuntimeError("[pair.cc:534] Connection closed by peer [10.0.0.2]:4021"))
        # PeerFailureError("a rank on another node died or left the group ([pair.cc:534] ...)")
    """
    if isinstance(exc, PeerFailureError) or not isinstance(exc, (RuntimeError, OSError)):
        return None
    text = str(exc)
    if not _LOST_PEER.search(text):
        return None
    return PeerFailureError(f"a rank on another node died or left the group ({text.strip()[:300]})")
