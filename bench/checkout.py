"""Which shmcomm a script under ``bench/`` measures: this checkout where its compiled core is built
in place for the running Python (``pip install -e .``), else the installed copy (a wheel installed
on another machine, with the checkout taken along only for these scripts).

Example::

    >>> import checkout
    >>> checkout.use_checkout() in (True, False)
    True
"""
from __future__ import annotations

import importlib.machinery
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def use_checkout() -> bool:
    """Put this checkout first on ``sys.path`` and ``PYTHONPATH`` (ranks a script starts inherit
    it) if its core is built for this Python; says whether."""
    core = os.path.join(REPO, "shmcomm", "_core")
    if not any(os.path.exists(core + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES):
        return False
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    return True
