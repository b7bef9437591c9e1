"""``python -m shmcomm.bench``: the ``shmcomm-bench`` command line, also how its worker processes start."""

import sys

from shmcomm.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
