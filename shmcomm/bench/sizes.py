"""Sizes: parsing and printing byte counts, the sweep's sizes, element counts per collective and
the nccl-tests bus-bandwidth factors."""

from __future__ import annotations

import re

from .common import _PER_RANK

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes in ``text``: a number with an optional binary K/M/G/T suffix (``B``/``iB`` allowed).

    As in nccl-tests, K means 1024. Raises ValueError for anything else::

        >>> parse_size("64M"), parse_size("8"), parse_size("1.5K"), parse_size("2KiB")
        (67108864, 8, 1536, 2048)
    """
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(f"invalid size {text!r}: use a number with an optional K, M, G or T suffix "
                         f"(binary units, e.g. 8, 32K, 64M)")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value != int(value):
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    return int(value)


def format_size(nbytes: int) -> str:
    """Short human form of a byte count, exact where possible.

    Example::

        >>> format_size(8), format_size(32768), format_size(33554432), format_size(1500)
        ('8 B', '32 KiB', '32 MiB', '1500 B')
    """
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def sweep_sizes(minbytes: int, maxbytes: int, factor: float) -> list[int]:
    """Sizes from ``minbytes`` to ``maxbytes`` (inclusive), each ``factor`` times the previous.

    Example::

        >>> sweep_sizes(8, 1024, 8)
        [8, 64, 512]
    """
    if minbytes < 1 or maxbytes < minbytes or factor <= 1:
        raise ValueError(f"need 1 <= minbytes <= maxbytes and factor > 1, "
                         f"got {minbytes}, {maxbytes}, {factor}")
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        size = max(size + 1, int(size * factor))  # a factor like 1.1 must still move forward
    return sizes


def collective_sizes(collective: str, sizes: list[int], nranks: int, itemsize: int) -> list[tuple[int, int]]:
    """``(count, chunk)`` pairs the sweep runs for ``collective``: total and per-rank element counts.

    The size of a row is ``count * itemsize`` bytes. For all_gather, gather, scatter,
    reduce_scatter and all_to_all the size is the total over ranks (nccl-tests convention), so
    each rank's part is ``chunk = count / nranks`` elements, at least one. Sizes that round to the
    same count are measured once; barrier has a single row of size 0::

        >>> collective_sizes("all_gather", [8, 16, 64], 4, 4)
        [(4, 1), (16, 4)]
    """
    if collective == "barrier":
        return [(0, 0)]
    pairs = []
    for size in sizes:
        if collective in _PER_RANK:
            chunk = max(1, size // (itemsize * nranks))
            pair = (chunk * nranks, chunk)
        else:
            count = max(1, size // itemsize)
            pair = (count, count)
        if pair not in pairs:
            pairs.append(pair)
    return pairs


def busbw_factor(collective: str, nranks: int) -> float:
    """Bus bandwidth / algorithm bandwidth for ``collective`` on ``nranks`` ranks (as nccl-tests).

    ``all_reduce`` moves 2(n-1)/n of the data per rank; all_gather, reduce_scatter, gather,
    scatter and all_to_all (n-1)/n of the total; broadcast, reduce, send_recv and scan (MPI's
    prefix reduction, which nccl-tests lacks: each rank's array in, its prefix out) 1; barrier 0::

        >>> busbw_factor("all_reduce", 4), busbw_factor("all_gather", 4), busbw_factor("broadcast", 4)
        (1.5, 0.75, 1.0)
    """
    n = nranks
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in _PER_RANK:
        return (n - 1) / n
    if collective in ("broadcast", "reduce", "send_recv", "scan"):
        return 1.0
    if collective == "barrier":
        return 0.0
    raise ValueError(f"unknown collective {collective!r}")
