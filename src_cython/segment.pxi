# Segment: one POSIX shared-memory object mapped into this process.
#
# Created with O_EXCL and mode 0600, space reserved up front with posix_fallocate (a full /dev/shm
# is a clear error at start-up, not a SIGBUS mid-run), unlinked as soon as every rank has attached:
# the mapping outlives the name, so a crash later cannot leak it. Attached only after
# shmcomm.trust.check_file: a file another user planted under the name (or a symlink, a hard link,
# a wrong mode) is refused at once. Whether it is this *job's* segment is the caller's check (the
# header's tag). Exposes the buffer protocol so numpy arrays can view it (sc.empty) while keeping
# the mapping alive; `data_offset` bytes of header at the start are left out of that view.
from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_FillInfo
from libc.errno cimport EEXIST, ENOENT, ENOSPC, errno
from libc.string cimport memset, strerror
from posix.unistd cimport close, ftruncate

cimport capi


cdef str _os_error_text(int err):
    return strerror(err).decode(errors="replace")


cdef class Segment:
    """A mapped POSIX shared-memory object (internal; groups and ``sc.empty`` arrays own these)."""
    cdef char *base
    cdef size_t size
    cdef readonly str name
    cdef bint unlinked
    cdef int owner_pid
    cdef readonly size_t data_offset  # the buffer protocol exposes [data_offset, size)
    cdef object __weakref__

    def __cinit__(self):
        self.base = NULL
        self.size = 0
        self.unlinked = True
        self.owner_pid = os.getpid()
        self.data_offset = 0

    @staticmethod
    cdef Segment create(str name, size_t size):
        """Create ``name`` exclusively and map it; raises FileExistsError if it exists."""
        cdef bytes bname = name.encode()
        cdef int fd = capi.shm_open(bname, capi.O_RDWR | capi.O_CREAT | capi.O_EXCL, 0o600)
        if fd < 0:
            err = errno
            if err == EEXIST:
                _refuse_if_foreign(name)
                raise FileExistsError(err, _os_error_text(err), name)
            raise ShmcommError(f"cannot create shared segment {name}: {_os_error_text(err)}")
        cdef Segment seg = Segment.__new__(Segment)
        seg.name = name
        seg.unlinked = False
        os.fchmod(fd, 0o600)  # exactly 0600 whatever the umask: attach checks the mode
        rc = ftruncate(fd, size)
        if rc == 0:
            rc = capi.posix_fallocate(fd, 0, size)  # returns the error number itself
        else:
            rc = errno
        if rc != 0:
            close(fd)
            capi.shm_unlink(bname)
            seg.unlinked = True
            free = _shm_free_bytes()
            raise ShmcommError(
                f"cannot reserve {size} bytes in /dev/shm for {name}: {_os_error_text(rc)} "
                f"({free} bytes free; enlarge /dev/shm, e.g. docker --shm-size, or lower "
                f"SHMCOMM_SLOT_BYTES)")
        seg._map(fd, size)
        return seg

    @staticmethod
    cdef Segment attach(str name):
        """Map an existing ``name`` of ours; returns None when it does not exist (yet). A file
        that is not ours raises UntrustedFileError (shmcomm.trust.check_file)."""
        from shmcomm.trust import UntrustedFileError, open_checked
        cdef int fd
        try:
            fd = open_checked("/dev/shm" + name, os.O_RDWR)
        except FileNotFoundError:
            return None
        except UntrustedFileError:
            raise
        except OSError as e:
            raise ShmcommError(f"cannot open shared segment {name}: {e.strerror}") from None
        cdef capi.stat st
        if capi.fstat(fd, &st) != 0 or st.st_size <= 0:
            close(fd)
            return None  # creator has not sized it yet
        cdef Segment seg = Segment.__new__(Segment)
        seg.name = name
        seg.unlinked = True  # only the creator side unlinks
        seg._map(fd, <size_t>st.st_size)
        return seg

    cdef _map(self, int fd, size_t size):
        cdef void *p = capi.mmap(NULL, size, capi.PROT_READ | capi.PROT_WRITE, capi.MAP_SHARED, fd, 0)
        err = errno
        close(fd)
        if p == capi.MAP_FAILED:
            if not self.unlinked:
                capi.shm_unlink(self.name.encode())
                self.unlinked = True
            raise ShmcommError(f"cannot map shared segment {self.name}: {_os_error_text(err)}")
        self.base = <char *>p
        self.size = size

    def unlink(self):
        """Remove the segment's name (the mapping stays valid). Safe to call twice."""
        if not self.unlinked:
            self.unlinked = True
            capi.shm_unlink(self.name.encode())

    def unlink_name(self):
        """Remove the segment's name even if this side did not create it."""
        self.unlinked = True
        capi.shm_unlink(self.name.encode())

    @property
    def nbytes(self):
        return self.size

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyBuffer_FillInfo(view, self, self.base + self.data_offset, self.size - self.data_offset,
                          0, flags)

    def __releasebuffer__(self, Py_buffer *view):
        pass

    def __dealloc__(self):
        # A forked child shares the mapping but must not tear down the parent's name.
        if not self.unlinked and self.owner_pid == getpid():
            capi.shm_unlink(self.name.encode())
        if self.base != NULL:
            capi.munmap(self.base, self.size)
            self.base = NULL


cdef _refuse_if_foreign(str name):
    """Creating ``name`` failed with EEXIST: raise UntrustedFileError at once if the file in the
    way is not ours (it can never become a segment of this job, so waiting would only hang)."""
    from shmcomm.trust import UntrustedFileError, open_checked
    try:
        os.close(open_checked("/dev/shm" + name, os.O_RDONLY))
    except UntrustedFileError:
        raise
    except OSError:
        pass  # gone meanwhile: the caller's EEXIST handling retries


def _shm_free_bytes():
    try:
        st = os.statvfs("/dev/shm")
        return st.f_bavail * st.f_frsize
    except OSError:
        return -1
