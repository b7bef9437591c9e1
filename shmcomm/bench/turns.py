"""Turns: how several backends' workers, all started at once, take turns measuring size by size.

Shared machines drift: the same command can run 3x slower for minutes at a time. Backends measured
one after another can therefore land in different "modes" and their ratio says more about the
machine than about the libraries. So every backend's workers start together and the parent lets one
backend measure one size (one round of it) at a time, then the next backend the same size.

The parent makes a named pipe (FIFO) per worker rank and keeps it open read-write, so neither side
ever blocks opening it. Before each size a worker reads one byte from its pipe: a blocking read,
which costs no CPU while the other backend measures (MPI's own waits would busy-poll a core). It
reads once more after its last size, and leaves its group (gloo's threads, MPI's finalize) only
when the parent lets it, after every backend measured its last size. The parent closing its end
(or dying) gives the worker end-of-file, and the worker stops.

Parent::

    gates = Gates(tmpdir, "mpi", 2)      # cfg["gate"] = gates.template
    gates.open()                          # every rank of "mpi" may measure its next size
    gates.close()

Worker::

    gate = Gate(cfg.get("gate"), rank)
    gate.wait()                           # returns when allowed; raises GateClosed at end of file
"""

from __future__ import annotations

import os


class GateClosed(Exception):
    """The parent closed the gate (it finished, failed or died): the worker should stop."""


class Gates:
    """The parent's side: one FIFO per rank of one backend, opened read-write (never blocks)."""

    def __init__(self, directory: str, backend: str, nranks: int):
        self.template = os.path.join(directory, f"gate-{backend}-{{rank}}")
        self._fds = []
        try:
            for r in range(nranks):
                path = self.template.format(rank=r)
                os.mkfifo(path, 0o600)
                self._fds.append(os.open(path, os.O_RDWR))
        except OSError:
            self.close()
            raise

    def open(self) -> None:
        """Let every rank pass its gate once (one byte each; a pipe holds thousands)."""
        for fd in self._fds:
            os.write(fd, b"g")

    def close(self) -> None:
        """Close the parent's ends: ranks waiting at a gate, or reaching one later, stop."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []


class Gate:
    """A worker rank's side; ``template`` None (started without a parent's gates) never waits."""

    def __init__(self, template: str | None, rank: int):
        self._fd = None if template is None else os.open(template.format(rank=rank), os.O_RDONLY)

    def wait(self) -> None:
        """Block until the parent opens the gate; ``GateClosed`` if it closed its end instead."""
        if self._fd is None:
            return
        if not os.read(self._fd, 1):
            raise GateClosed("the benchmark's parent process closed the gate")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
