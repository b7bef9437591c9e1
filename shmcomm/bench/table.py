"""Text tables as nccl-tests prints them: header lines starting with ``#`` (group titles over
column spans, column titles, units), then data lines of right-aligned cells, every cell of a
column ending where its title ends. Every table of the tool is drawn here.

Written here rather than with tabulate or rich: these few lines are all the tool needs, the
``#``-prefixed layout (which scripts reading nccl-tests output rely on) is not theirs, and the
bench must run wherever shmcomm does, whose runtime needs only numpy and psutil.

Example::

    >>> cols = [Column("size", "(B)", 6), Column("time", "(us)")]
    >>> print("\\n".join(render(cols, [["8", "1.25"], ["1024", "3.50"]])))
    #   size  time
    #    (B)  (us)
           8  1.25
        1024  3.50
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    """A column's title, unit line, least width and alignment (right unless ``left``)."""

    title: str
    unit: str = ""
    width: int = 0
    left: bool = False

    def cell(self, text: str, width: int) -> str:
        return f"{text:<{width}}" if self.left else f"{text:>{width}}"


def render(columns: list[Column], rows: list[list[str]], groups: list[tuple[str, int]] = ()) -> list[str]:
    """Header and data lines. ``groups`` are ``(title, columns spanned)`` in order, drawn centred
    above their columns (an empty title leaves its span blank); cells wider than their column
    widen it, so nothing ever shifts."""
    widths = [max([c.width, len(c.title), len(c.unit)] + [len(r[i]) for r in rows])
              for i, c in enumerate(columns)]

    def line(cells) -> str:
        return "  ".join(c.cell(text, w) for c, text, w in zip(columns, cells, widths)).rstrip()

    head = []
    if groups:
        spans, at = [], 0
        for title, span in groups:
            width = sum(widths[at:at + span]) + 2 * (span - 1)
            spans.append(f"{title:^{width}}" if title else " " * width)
            at += span
        head.append("  ".join(spans).rstrip())
    head += [line([c.title for c in columns]), line([c.unit for c in columns])]
    return ["# " + h for h in head if h.strip()] + ["  " + line(r) for r in rows]
