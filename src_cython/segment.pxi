# Segment: one POSIX shared-memory object mapped into this process.
#
# Created without a name (O_TMPFILE), mode 0600, space reserved up front with posix_fallocate (a
# full /dev/shm is a clear error at start-up, not a SIGBUS mid-run). The creator writes its header
# and only then gives the file its name (`publish`, an exclusive link): a named segment always says
# who made it, so a creator killed at any moment leaves either nothing or a segment that the next
# rank can tell is dead and remove. Where /dev/shm has no unnamed files (no O_TMPFILE), the file
# is made under a staging name that carries the creator's pid and start time
# (shmcomm.segments.staging_name) and linked to its name the same way: what a killed creator
# leaves there says whose it is too, and the next creator of that name, a rank that gives up
# waiting for it, and `shmcomm clean` remove it. The name goes as soon as every rank has attached:
# the mapping outlives it, so a crash later cannot leak it. Attached only after
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
    cdef int unnamed_fd  # the O_TMPFILE file until publish names it, else -1
    cdef str staged      # without O_TMPFILE: the file's staging name until publish, else None
    cdef object __weakref__

    def __cinit__(self):
        self.base = NULL
        self.size = 0
        self.unlinked = True
        self.owner_pid = os.getpid()
        self.data_offset = 0
        self.unnamed_fd = -1
        self.staged = None

    @staticmethod
    cdef Segment create(str name, size_t size, str what=None, str hint=None):
        """Make a mapped segment of ``size`` bytes that is to be called ``name``, not under that
        name yet (``publish`` gives it the name once its header is written): with no name where
        the system allows (O_TMPFILE), else under its staging name. ``what`` says what it holds
        and ``hint`` what to do when /dev/shm has no room for it (the error names both)."""
        cdef int fd = -1
        cdef str staged = None
        try:
            fd = os.open("/dev/shm", os.O_TMPFILE | os.O_RDWR, 0o600)
        except OSError as e:
            if e.errno not in (errno_mod.EOPNOTSUPP, errno_mod.EISDIR, errno_mod.EINVAL):
                raise ShmcommError(f"cannot create shared segment {name}: {e.strerror}") from None
        cdef bint unnamed = fd >= 0
        if not unnamed:
            from shmcomm.segments import remove_dead_staging, staging_name
            from shmcomm.trust import process_identity
            remove_dead_staging(name)  # what creators of this name killed before naming it left
            staged = staging_name(name, getpid(), process_identity(getpid())[1])
            fd = capi.shm_open(staged.encode(), capi.O_RDWR | capi.O_CREAT | capi.O_EXCL, 0o600)
            if fd < 0:
                err = errno
                if err == EEXIST:  # the name is guessable: another user may have planted it
                    _refuse_if_foreign(staged)
                raise ShmcommError(f"cannot create shared segment {staged}: {_os_error_text(err)}")
        cdef Segment seg = Segment.__new__(Segment)
        seg.name = name
        seg.staged = staged  # unlinked stays True: nothing is under `name` until publish
        try:
            if unnamed:
                seg.unnamed_fd = os.dup(fd)
            os.fchmod(fd, 0o600)  # exactly 0600 whatever the umask: attach checks the mode
        except OSError as e:
            close(fd)
            seg.unlink()
            raise ShmcommError(f"cannot create shared segment {name}: {e.strerror}") from None
        rc = ftruncate(fd, size)
        if rc == 0:
            rc = capi.posix_fallocate(fd, 0, size)  # returns the error number itself
        else:
            rc = errno
        if rc != 0:
            close(fd)
            seg.unlink()
            raise ShmcommError(
                f"cannot reserve {mib(size)} in /dev/shm for {what or name}: {_os_error_text(rc)} "
                f"({_shm_space_text()}); {hint or SHM_SPACE_HINT}")
        seg._map(fd, size)
        return seg

    def publish(self):
        """Give a segment made by ``create`` its name, exclusively: FileExistsError if the name is
        taken (the segment stays unnamed; call again once the name is free). Write the header
        first: attaching ranks take a named segment as complete. No-op when already named."""
        cdef bytes src
        cdef int flags = 0
        if self.unnamed_fd >= 0:
            # linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/N names an O_TMPFILE file without the
            # privilege AT_EMPTY_PATH needs. (link() would link the /proc symlink itself: EXDEV.)
            src, flags = f"/proc/self/fd/{self.unnamed_fd}".encode(), capi.AT_SYMLINK_FOLLOW
        elif self.staged is not None:
            # The file has two links until the staging name goes: attaching ranks wait that
            # out (shmcomm.segments.publishing) instead of refusing a file with two links.
            src = ("/dev/shm" + self.staged).encode()
        else:
            return
        cdef bytes dst = ("/dev/shm" + self.name).encode()
        # a link fails with EEXIST rather than replace a file
        if capi.linkat(capi.AT_FDCWD, src, capi.AT_FDCWD, dst, flags) != 0:
            err = errno
            if err == EEXIST:
                _refuse_if_foreign(self.name)
                raise FileExistsError(err, _os_error_text(err), self.name)
            raise ShmcommError(f"cannot name shared segment {self.name}: {_os_error_text(err)}")
        self.unlinked = False  # named now: the creator removes the name
        self.unlink_staging()

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
            from shmcomm.segments import publishing
            if publishing("/dev/shm" + name):
                return None  # its creator is naming it: two links for a moment
            from shmcomm.trust import problem
            try:  # or it removed its staging name between our two looks: ours now, try again
                if problem(os.lstat("/dev/shm" + name)) is None:
                    return None
            except OSError:
                return None  # gone: not there (yet)
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
            self.unlink()
            raise ShmcommError(f"cannot map shared segment {self.name}: {_os_error_text(err)}")
        self.base = <char *>p
        self.size = size

    def unlink(self):
        """Remove the segment's name (the mapping stays valid); a segment never published just
        forgets its file. Safe to call twice."""
        self.unlink_staging()
        if not self.unlinked:
            self.unlinked = True
            capi.shm_unlink(self.name.encode())

    cdef unlink_staging(self):
        """Let go of what held the file before it had its name: the O_TMPFILE descriptor, or
        the staging name."""
        if self.unnamed_fd >= 0:
            close(self.unnamed_fd)
            self.unnamed_fd = -1
        if self.staged is not None:
            capi.shm_unlink(self.staged.encode())
            self.staged = None

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
        if self.unnamed_fd >= 0:
            close(self.unnamed_fd)
        # A forked child shares the mapping but must not tear down the parent's names.
        if self.owner_pid == getpid():
            if self.staged is not None:
                capi.shm_unlink(self.staged.encode())
            if not self.unlinked:
                capi.shm_unlink(self.name.encode())
        if self.base != NULL:
            capi.munmap(self.base, self.size)
            self.base = NULL


cdef _refuse_if_foreign(str name):
    """Creating ``name`` failed with EEXIST: raise UntrustedFileError at once if the file in the
    way is not ours (it can never become a segment of this job, so waiting would only hang)."""
    from shmcomm.trust import UntrustedFileError, open_checked
    from shmcomm.segments import publishing
    try:
        os.close(open_checked("/dev/shm" + name, os.O_RDONLY))
    except UntrustedFileError:
        if not publishing("/dev/shm" + name):
            raise
    except OSError:
        pass  # gone meanwhile: the caller's EEXIST handling retries


cdef str SHM_SPACE_HINT = ("enlarge /dev/shm: docker run --shm-size=1g ..., or as root mount -o "
                           "remount,size=1G /dev/shm")


cdef str mib(n):
    """Bytes for people: ``mib(3 << 20) == '3.0 MiB'``, ``mib(512) == '0.00049 MiB'``."""
    return f"{n / (1 << 20):.1f} MiB" if n >= (1 << 20) // 10 else f"{n / (1 << 20):.2g} MiB"


cdef str _shm_space_text():
    """``'12.0 MiB free of 64.0 MiB'``: what /dev/shm has now."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return "its free space unknown"
    return f"{mib(st.f_bavail * st.f_frsize)} free of {mib(st.f_blocks * st.f_frsize)}"


def _shm_free_bytes():
    try:
        st = os.statvfs("/dev/shm")
        return st.f_bavail * st.f_frsize
    except OSError:
        return -1


# Where each kind of segment keeps its nonce (a random number fixed at creation): a name can be
# taken over by a successor, and only the segment a rank saw may have its name removed.
cdef capi.shm_header_t _group_probe
cdef capi.shm_heap_header_t _heap_probe
cdef size_t _GROUP_NONCE_AT = <size_t>(<char *>&_group_probe.nonce - <char *>&_group_probe)
cdef size_t _HEAP_NONCE_AT = <size_t>(<char *>&_heap_probe.nonce - <char *>&_heap_probe)


cdef _unlink_name_if_nonce(str name, size_t at, uint64_t nonce):
    """Remove ``name`` from /dev/shm if the segment it names still holds ``nonce`` at byte ``at``:
    the one whose creator died before removing it, not a successor under the same name. A
    segment that cannot be read, or is not this user's, is left alone."""
    cdef Segment seg
    try:
        seg = Segment.attach(name)
    except (ShmcommError, OSError):
        return
    if seg is not None and seg.size >= at + sizeof(uint64_t) and (<uint64_t *>(seg.base + at))[0] == nonce:
        seg.unlink_name()
