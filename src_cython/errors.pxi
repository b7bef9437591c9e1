# The one error path from C status codes to the exception classes of shmcomm.errors.
from shmcomm.errors import (
    AbortedError, CollectiveMismatchError, CommTimeoutError, InvalidStateError,
    PeerFailureError, ShmcommError,
)
