"""``shmrun``'s entry point: ``python -m shmcomm.launch`` and the ``shmrun`` script run
:func:`shmcomm.launcher.run.main`; the launcher itself is the package ``shmcomm.launcher``.

    python -m shmcomm.launch -n 4 train.py --lr 0.1
"""

from __future__ import annotations

import sys

from shmcomm.launcher.run import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
