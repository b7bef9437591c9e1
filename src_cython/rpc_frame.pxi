# An RPC frame: its layout, and reading one in pieces (for RpcChannel, rpc_channel.pxi).
#
# A frame is a 32-byte header (magic | kind, buffer count, request id, pickle length, flags),
# one 8-byte length per out-of-band buffer, the pickle stream, then each buffer.
#
# The receiver keeps one _FrameReader per sending rank and feeds it whatever that rank's ring
# holds now. So a frame whose sender is slow, stopped (SIGSTOP, a debugger, swapped out) or dead
# holds up no one else: the part read so far waits here while the receiver serves the other
# senders, and the frame resumes when more bytes come. A frame is never given up half read while
# its sender lives, so the ring stays in step however long the sender stops. The pickle stream is
# read into a bytes object and each buffer straight into a new numpy array: a large array is
# copied out of shared memory once.
cimport cython

cdef enum:
    RPC_HEADER_BYTES = 32
    RPC_MAGIC = 0x52504300        # "RPC\0" in the top three bytes; the low byte is the kind
    RPC_MAX_BUFFERS = 4096
    RPC_GIL_FREE_COPY = 65536     # copies at least this large release the GIL
    # the part of a frame being read; buffer i is part i
    RPC_PART_HEADER = -3
    RPC_PART_SIZES = -2
    RPC_PART_DATA = -1


@cython.final
cdef class _FrameReader:
    """One sender's frame, read as its bytes arrive (internal: RpcChannel keeps one per rank)."""
    cdef unsigned char hdr[RPC_HEADER_BYTES]
    cdef int part                  # RPC_PART_* or a buffer's index
    cdef char *dst                 # where the part's next byte goes
    cdef size_t left               # bytes of the part still to come
    cdef uint32_t nbuf
    cdef bytes sizes               # the buffers' lengths (uint64 each)
    cdef bytes data
    cdef list buffers

    def __cinit__(self):
        self.reset()

    cdef void reset(self) noexcept:
        """Drop what was read: the next byte is a frame's first."""
        self.part, self.dst, self.left = RPC_PART_HEADER, <char *>self.hdr, RPC_HEADER_BYTES
        self.sizes = self.data = self.buffers = None

    cdef bint started(self) noexcept:
        """True while a frame is partly read."""
        return self.part != RPC_PART_HEADER or self.left != RPC_HEADER_BYTES

    cdef object feed(self, capi.shm_ring_t *ring, size_t cap, int src):
        """Copy out of ``ring`` what the frame still needs and the ring holds; returns the frame
        ``(src, kind, req_id, flags, data, buffers)`` once whole, else None (the ring ran dry).
        Raises ShmcommError on a corrupt header (the ring cannot be read further)."""
        cdef uint64_t tail
        cdef size_t n
        while True:
            if self.left:
                tail = ring.tail
                n = min(self.left, capi.shm_ring_avail(ring, tail))
                if n >= RPC_GIL_FREE_COPY:
                    with nogil:
                        capi.shm_ring_read(ring, cap, tail, self.dst, n)
                elif n:
                    capi.shm_ring_read(ring, cap, tail, self.dst, n)
                self.dst += n
                self.left -= n
                if self.left:
                    return None
            frame = self._next_part(src)
            if frame is not None:
                return frame

    cdef object _next_part(self, int src):
        """The current part is whole: set up the next one, or return the frame after the last."""
        cdef uint32_t magic_kind = (<uint32_t *>self.hdr)[0]
        cdef uint64_t *head = <uint64_t *>self.hdr
        cdef uint64_t size
        cdef int i = self.part + 1
        if self.part == RPC_PART_HEADER:
            self.nbuf = (<uint32_t *>self.hdr)[1]
            if magic_kind & 0xFFFFFF00u != RPC_MAGIC or self.nbuf > RPC_MAX_BUFFERS:
                raise ShmcommError(f"corrupt RPC frame from rank {src}")
            self.buffers = []
            self.sizes = PyBytes_FromStringAndSize(NULL, 8 * <Py_ssize_t>self.nbuf)
            self._expect(RPC_PART_SIZES, PyBytes_AS_STRING(self.sizes), 8 * <size_t>self.nbuf)
        elif self.part == RPC_PART_SIZES:
            self.data = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>head[2])
            self._expect(RPC_PART_DATA, PyBytes_AS_STRING(self.data), <size_t>head[2])
        elif i < <int>self.nbuf:
            size = (<uint64_t *>PyBytes_AS_STRING(self.sizes))[i]
            arr = np.empty(<Py_ssize_t>size, np.uint8)
            self.buffers.append(arr)
            self._expect(i, <char *>cnp.PyArray_DATA(arr), <size_t>size)
        else:
            frame = (src, <int>(magic_kind & 0xFF), head[1], head[3], self.data, self.buffers)
            self.reset()
            return frame
        return None

    cdef inline void _expect(self, int part, char *dst, size_t n) noexcept:
        self.part, self.dst, self.left = part, dst, n
