"""The launcher's console: rank output shown live on this process's stdout/stderr, prefixed
``[rank]`` (and a timestamp) at each line start, whole lines kept together across ranks, and
unfinished lines (prompts, ``\\r`` progress bars) shown after a short hold::

    console = Console()
    stream = Stream(console, 1, b"[0] ", log=None, tail=None)
    stream.feed(b"epoch 1\\n")        # printed at once as "[0] epoch 1"
"""

from __future__ import annotations

import collections
import os
import re
import select
import sys
import time

from shmcomm.launcher.config import PROG

__all__ = ["Console", "Stream"]

# An unfinished line waits this long for its end before it is shown as it is: briefly on a
# terminal, where a person waits for a prompt or a progress bar; longer into a pipe or a file,
# read by programs and logs that want whole lines (a rank stalled mid-line for more than the hold
# while others print has its line split in two; under load 0.1 s was seen to pass).
_HOLD_S = 0.1
_PIPE_HOLD_S = 1.0
_MAX_LINE = 1 << 20  # an unfinished line longer than this is shown (and kept in the tail) at once


def _write_all(stream, data: bytes) -> None:
    """Write all of ``data`` to a binary stream.

    Under PYTHONUNBUFFERED (set in many containers) ``sys.stdout.buffer`` is a raw file, whose
    ``write`` may take only part of the data: when a signal (a rank's SIGCHLD, which the
    supervisor handles) interrupts a write into a full pipe. What it did not take was lost:
    a reader of ``shmrun ... | ...`` missed whole lines of output.
    """
    view = memoryview(data)
    while view:
        n = stream.write(view)
        if n is None:  # a non-blocking file that is full: wait until it takes more
            select.select([], [stream.fileno()], [])
            continue
        view = view[n:]


def _hold_for(stream) -> float:
    """How long an unfinished line for ``stream`` is held (``_HOLD_S`` on a terminal)."""
    try:
        return _HOLD_S if stream.isatty() else _PIPE_HOLD_S
    except (ValueError, AttributeError):  # closed, or a notebook's stream
        return _HOLD_S


def _same_file(a, b) -> bool:
    """Whether streams ``a`` and ``b`` write to one file (a terminal, ``2>&1``)."""
    try:
        sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (OSError, ValueError, AttributeError):  # a notebook's streams have no file descriptor
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class Console:
    """Writes launcher and rank output to this process's stdout/stderr.

    It remembers which rank stream left the console's current line unfinished (a prompt, a
    progress bar): before anything else is written on that line, the line is ended with a newline,
    so another rank's output never continues it. stdout and stderr share one current line when
    they are the same file (a terminal, ``2>&1``), else each has its own.
    """

    def __init__(self) -> None:
        self.broken = {1: False, 2: False}
        self.shared = _same_file(sys.stdout, sys.stderr)
        self.owner: dict[int, Stream] = {}  # console line -> the stream that left it unfinished
        self.hold = {1: _hold_for(sys.stdout), 2: _hold_for(sys.stderr)}

    def _line(self, fd: int) -> int:
        return 0 if self.shared else fd

    def take_line(self, fd: int, stream: Stream | None) -> None:
        """Before ``stream`` (None: shmrun itself) writes on ``fd``: end a line another stream
        left unfinished there."""
        cur = self.owner.get(self._line(fd))
        if cur is not None and cur is not stream:
            self.write(cur.fd, b"\n")
            cur.line_ended()
            del self.owner[self._line(fd)]

    def set_owner(self, fd: int, stream: Stream, unfinished: bool) -> None:
        """Note whether ``stream`` left the console's line on ``fd`` unfinished."""
        key = self._line(fd)
        if unfinished:
            self.owner[key] = stream
        elif self.owner.get(key) is stream:
            del self.owner[key]

    def owns(self, fd: int, stream: Stream) -> bool:
        """Whether the console's line on ``fd`` is an unfinished one of ``stream``."""
        return self.owner.get(self._line(fd)) is stream

    def write(self, fd: int, data: bytes) -> None:
        """Write ``data`` to stdout (``fd`` 1) or stderr (2) at once; nothing once it is closed."""
        if not data or self.broken[fd]:
            return
        out = sys.stdout if fd == 1 else sys.stderr
        try:
            out.flush()
            if hasattr(out, "buffer"):
                _write_all(out.buffer, data)
                out.buffer.flush()
            else:  # a text-only stream: a notebook's cell output (sc.spawn)
                out.write(data.decode(errors="replace"))
                out.flush()
        except BrokenPipeError:
            # e.g. `shmrun ... | head`: the supervisor stops the job, as SIGPIPE would stop a
            # program writing there directly. Later writes (and Python's flush at exit) go to
            # /dev/null instead of raising again.
            self.broken[fd] = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
        except ValueError:  # closed stream
            self.broken[fd] = True

    def say(self, msg: str) -> None:
        """shmrun's own message, on a line of its own on stderr: ``say("x")`` -> ``shmrun: x``."""
        self.take_line(2, None)
        self.write(2, f"{PROG}: {msg}\n".encode(errors="replace"))


_EOL = re.compile(rb"([\r\n])")
# Where a stream's console output stands (None: in the middle of a line): at a new line, after a
# carriage return, or at a new line because another stream ended this one's unfinished line (its
# own newline then only ends what is already ended, and is not written again).
_AT_NL, _AT_CR, _AT_ENDED = 1, 2, 3


def _timestamp() -> bytes:
    """The ``--timestamp-output`` prefix: ``[2025-01-01 12:00:00.123] ``."""
    t = time.time()
    return time.strftime("[%Y-%m-%d %H:%M:%S", time.localtime(t)).encode() + b".%03d] " % (int(t * 1000) % 1000)


class Stream:
    """One pipe of one rank: tees the raw bytes to a log file, keeps the complete lines of the
    stderr tail, and passes the output live to the console, prefixed at each line start.

    Complete lines are shown at once. An unfinished line (a prompt, ``\\r`` progress) is held up
    to the console's hold (``_HOLD_S`` on a terminal, ``_PIPE_HOLD_S`` else) for its end, so
    that a line read in two pieces is still shown whole, and is then shown as it is; what
    follows it on the same line is shown at once while the console's line is still this
    stream's. After a ``\\r`` the prefix is written again, so a progress bar
    keeps its ``[rank]``.
    """

    def __init__(self, console: Console, fd: int, prefix: bytes, log, tail: collections.deque | None,
                 show: bool = True, timestamp: bool = False):
        self.console, self.fd, self.prefix, self.log, self.tail = console, fd, prefix, log, tail
        self.show, self.timestamp = show, timestamp
        self.line = b""  # the unfinished line of the tail
        self.held = b""  # unfinished output not shown yet
        self.held_since = 0.0
        self.at: int | None = _AT_NL  # None: in the middle of a line

    def feed(self, data: bytes) -> None:
        """Take bytes the rank wrote: to the log and the tail at once, to the console by line."""
        if self.log is not None:
            self.log.write(data)
            self.log.flush()
        if self.tail is not None:
            self._keep_tail(data)
        if not self.show:
            return
        if not self.held and b"\n" not in data and self.console.owns(self.fd, self):
            self._show(data)  # more of the line it left unfinished on the console: at once
            return
        since = self.held_since if self.held else time.monotonic()  # held since its first piece
        data, self.held = self.held + data, b""
        cut = data.rfind(b"\n") + 1
        if cut:
            self._show(data[:cut])
            data, since = data[cut:], time.monotonic()
        if data:
            self.held, self.held_since = data, since
            if len(data) > _MAX_LINE:
                self.flush()

    def due(self) -> float | None:
        """When the held unfinished line is to be shown; None when nothing is held."""
        return self.held_since + self.console.hold[self.fd] if self.held else None

    def flush(self) -> None:
        """Show the held unfinished line now."""
        if self.held:
            data, self.held = self.held, b""
            self._show(data)

    def close(self) -> None:
        """The pipe ended: keep its last line in the tail, show what is held, end the line."""
        if self.tail is not None and self.line:  # a last line without its newline
            self.tail.append(self.line)
            self.line = b""
        self.flush()
        if self.console.owns(self.fd, self):  # it ended unfinished: end the console's line
            self.console.write(self.fd, b"\n")
            self.console.set_owner(self.fd, self, False)
            self.at = _AT_NL

    def line_ended(self) -> None:
        """Another stream ended this stream's unfinished line on the console."""
        self.at = _AT_ENDED

    def _keep_tail(self, data: bytes) -> None:
        self.line += data
        if b"\n" in self.line:
            head, _, self.line = self.line.rpartition(b"\n")
            self.tail.extend(head.split(b"\n"))
        if len(self.line) > _MAX_LINE:
            self.tail.append(self.line)
            self.line = b""

    def _show(self, data: bytes) -> None:
        self.console.take_line(self.fd, self)
        prefix = (_timestamp() if self.timestamp else b"") + self.prefix
        out = []
        at = self.at
        for i, part in enumerate(_EOL.split(data)):
            if i % 2:  # a separator
                if part == b"\n":
                    if at == _AT_ENDED:
                        at = _AT_NL  # the line this newline ends was ended on the console already
                        continue
                    if at == _AT_NL:
                        out.append(prefix)  # an empty line still says whose it is
                    at = _AT_NL
                elif at != _AT_ENDED:  # (after an ended line, a \r\n still adds no empty line)
                    at = _AT_CR  # \r at a line start is written before the prefix
                out.append(part)
            elif part:
                if at is not None:
                    out.append(prefix)
                    at = None
                out.append(part)
        self.at = at
        self.console.write(self.fd, b"".join(out))
        self.console.set_owner(self.fd, self, at not in (_AT_NL, _AT_ENDED))
