# The one error path from C status codes to the exception classes of shmcomm.errors.
import errno as errno_module

from shmcomm.errors import (
    AbortedError, CollectiveMismatchError, CommTimeoutError, InvalidStateError,
    PeerFailureError, ShmcommError,
)
from libc.errno cimport ESRCH


cdef object peer_failure(str what, int rank, int pid, str how="died or left the group"):
    """The one wording of a peer's failure: ``<what>: rank R (pid P) <how>``."""
    return PeerFailureError(f"{what}: rank {rank} (pid {pid}) {how}", rank, pid)


cdef object os_failure(str what, int err, int rank=-1, int pid=0):
    """A C call's errno as an exception: ESRCH (the peer process is gone) is a peer failure,
    anything else a ShmcommError naming the errno."""
    if err == ESRCH and rank >= 0:
        return peer_failure(what, rank, pid, "died")
    name = errno_module.errorcode.get(err, str(err))
    return ShmcommError(f"{what}: {os.strerror(err)} ({name})")
