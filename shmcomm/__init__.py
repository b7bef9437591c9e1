"""shmcomm: shared-memory collective communication between local Python processes."""
from shmcomm.errors import *  # noqa: F401,F403
from shmcomm import _core  # noqa: F401

__version__ = "0.1.0"
