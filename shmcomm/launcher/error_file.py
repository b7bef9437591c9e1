"""Why a rank failed, told to its launcher through torchrun's error file.

When one rank fails, the ranks waiting for it in a collective fail too, with
``PeerFailureError``, and often exit before it does: the first rank to exit is not the root
cause. So a rank records how it failed in the file its launcher names in
``TORCHELASTIC_ERROR_FILE`` (``shmrun`` and ``torchrun`` both set it), in torchrun's format (what
``torch.distributed.elastic``'s ``@record`` writes), plus whether the failure is only fallout of
a peer's. ``import shmcomm`` installs the hook that writes it for an uncaught exception; a rank
that ends otherwise (``sys.exit(3)``, a signal) leaves no file, and counts as failing for a
reason of its own::

    install()                                  # on import of shmcomm, where the variable is set
    record(exc)                                # what the hook does (sc.spawn's ranks call it)
    fallout(os.environ[ENV])                   # launcher: "PeerFailureError: ..." or None
    peer_pid(os.environ[ENV])                  # launcher: the pid of the peer it names, or None
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback

from shmcomm.errors import PeerFailureError, caused_by_peer

__all__ = ["ENV", "record", "install", "fallout", "peer_pid"]

ENV = "TORCHELASTIC_ERROR_FILE"


def record(exc: BaseException, path: str | None = None) -> None:
    """Write ``exc`` to ``path`` (default: ``$TORCHELASTIC_ERROR_FILE``; nothing when unset).

    torchrun blames the rank with the smallest whole-second timestamp: fallout of a peer's
    failure rounds its time up, as it came after its cause. Example::

        try:
            main()
        except BaseException as exc:
            record(exc)
            raise
    """
    path = path or os.environ.get(ENV)
    if not path:
        return
    now, peer = time.time(), caused_by_peer(exc)
    data = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                "timestamp": str(math.ceil(now) if peer else int(now)),
            },
        },
        "shmcomm": {"peer_failure": peer, "time": now, "peer_pid": _peer_pid(exc)},
    }
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
        os.replace(path + ".tmp", path)  # the launcher never reads half a file
    except OSError:
        pass  # the launcher then blames this rank as it would without the file


def install() -> None:
    """Record this process's uncaught exception (then print it as before) when a launcher asks
    for it through ``TORCHELASTIC_ERROR_FILE``; once per process. Example::

        install()   # run by ``import shmcomm``
    """
    if not os.environ.get(ENV) or getattr(sys.excepthook, "_shmcomm_records", False):
        return
    previous = sys.excepthook

    def hook(tp, value, tb):
        record(value)
        previous(tp, value, tb)

    hook._shmcomm_records = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def fallout(path: str) -> str | None:
    """Launcher side: the first line of the exception (``"PeerFailureError: ..."``) when the rank
    that wrote ``path`` failed only because a peer had failed; None when it failed for a reason
    of its own, or left no file that says otherwise. Example::

        if fallout(error_path) is None: blame(rank)
    """
    try:
        with open(path) as f:
            data = json.load(f)
        if data["shmcomm"]["peer_failure"] is True:
            return str(data["message"]["message"]).splitlines()[0]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass
    return None


def _peer_pid(exc: BaseException | None) -> int | None:
    """The pid of the process a PeerFailureError in ``exc``'s chain names, if it knows it."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, PeerFailureError) and exc.pid > 0:
            return exc.pid
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def peer_pid(path: str) -> int | None:
    """Launcher side: the pid of the peer whose death or departure the rank that wrote ``path``
    failed on, when its error names one; else None. A rank that exited cleanly while its peers
    still waited for it is found so. Example::

        if peer_pid(error_path) == other.proc.pid: ...   # ``other`` left the job early
    """
    try:
        with open(path) as f:
            pid = json.load(f)["shmcomm"]["peer_pid"]
        return pid if isinstance(pid, int) and pid > 0 else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
