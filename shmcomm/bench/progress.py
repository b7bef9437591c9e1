"""Progress of a sweep on stderr: one live, self-overwriting line when stderr is a terminal; in a
log, a pipe or CI a start line, a line every LOG_EVERY seconds (a sweep written to a file showed
nothing for 11 minutes) and a finish line, so logs do not fill with a line per size.

Written here rather than with tqdm or rich: the few lines below are all a sweep needs, and the
bench must run wherever shmcomm does, whose runtime needs only numpy and psutil.

Example::

    progress = Progress(total=24, enabled=True)
    progress.start("all_reduce on shmcomm, gloo")
    progress("shmcomm", row)          # for every row event, from run_backends
    progress.finish()
"""

from __future__ import annotations

import shutil
import sys
import time

from .common import PROG
from .sizes import format_size


LOG_EVERY = 30.0  # seconds between progress lines off a terminal


class Progress:
    """Counts finished steps (over every backend) against ``total``."""

    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.total, self.enabled = total, enabled
        self.stream = stream or sys.stderr
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.done = 0
        self.started = self.logged = time.monotonic()

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def start(self, what: str) -> None:
        """Say what is about to run (a line of its own where no live line can be drawn)."""
        self.started = time.monotonic()
        self.logged = self.started
        if self.enabled and not self.tty:
            self._write(f"{PROG}: measuring {what}: {self.total} steps (a line every {LOG_EVERY:g} s; "
                        "live progress on a terminal)\n")

    def __call__(self, backend: str, row: dict) -> None:
        self.done += 1
        if not self.tty:
            now = time.monotonic()
            if self.enabled and now - self.logged >= LOG_EVERY and self.done < self.total:
                self.logged = now
                self._write(f"{PROG}: {self.done} of {self.total} steps in {now - self.started:.0f} s "
                            f"(last: {backend} {row['collective']} {format_size(row['size'])})\n")
            return
        times = ", ".join(f"{'oop' if v == 'out-of-place' else 'ip'} {m['time_us']:.3g} us"
                          for v, m in row["results"].items())
        what = " ".join(str(row[k]) for k in ("collective", "dtype", "op") if row.get(k) not in (None, "none"))
        if row.get("root", -1) >= 0:
            what += f" root {row['root']}"
        text = (f"{self.done}/{self.total} [{backend}] {what} {format_size(row['size'])}: {times} "
                f"({time.monotonic() - self.started:.0f} s)")
        width = shutil.get_terminal_size((100, 20)).columns - 1
        self._write("\r" + text[:width].ljust(width))

    def finish(self) -> None:
        """End the live line, or write the finish line."""
        if self.tty and self.done:
            self._write("\n")
        elif self.enabled and not self.tty:
            self._write(f"{PROG}: {self.done} of {self.total} steps in {time.monotonic() - self.started:.1f} s\n")
