# cython: language_level=3
"""Native ingest ring buffer, same API and results as `denpex._native.ringbuf_ref`.

A fixed C ring behind a short lock held only for index updates and the copy (GIL released for
large copies). A write never blocks the producer: on overflow the oldest bytes are dropped.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.pythread cimport (
    WAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from denpex._native import load
from denpex._native.ringbuf_ref import _frame

cdef Py_ssize_t NOGIL_COPY = 65536  # releasing the GIL costs more than copying less than this


cdef class RingBuffer:
    """A byte FIFO of `capacity` bytes that drops its oldest bytes on overflow, plus lines."""

    cdef readonly Py_ssize_t capacity
    cdef readonly long long overflows
    cdef long long _overflow_dropped
    cdef public long long _resync_dropped
    cdef public bint _resyncing
    cdef public object _splitter
    cdef unsigned char *_ring
    cdef Py_ssize_t _head  # index of the oldest byte
    cdef Py_ssize_t _used
    cdef bint _gap
    cdef bint _gap_mid_line
    cdef PyThread_type_lock _lock

    def __cinit__(self, Py_ssize_t capacity=1 << 22, Py_ssize_t line_cap=65536):
        if capacity < 1:
            raise ValueError("capacity must be at least 1 byte")
        self._ring = <unsigned char *>malloc(capacity)
        self._lock = PyThread_allocate_lock()
        if self._ring == NULL or self._lock == NULL:
            raise MemoryError()
        self.capacity = capacity

    def __init__(self, Py_ssize_t capacity=1 << 22, Py_ssize_t line_cap=65536):
        self._splitter = load("linesplit").LineSplitter(line_cap)

    def __dealloc__(self):
        free(self._ring)
        if self._lock != NULL:
            PyThread_free_lock(self._lock)

    @property
    def dropped_bytes(self):
        """Bytes lost to overflow, plus the rest of each line a drop cut."""
        return self._overflow_dropped + self._resync_dropped

    @property
    def used(self):
        return self._used

    @property
    def truncated_bytes(self):
        return self._splitter.truncated_bytes

    cdef void _put(self, const unsigned char *src, Py_ssize_t size) noexcept nogil:
        """Append under the lock, dropping the oldest bytes to make room."""
        cdef Py_ssize_t excess, from_old, from_new, tail, first
        cdef unsigned char last
        PyThread_acquire_lock(self._lock, WAIT_LOCK)
        excess = self._used + size - self.capacity
        if excess > 0:
            from_old = excess if excess < self._used else self._used
            from_new = excess - from_old
            if from_new:
                last = src[from_new - 1]
            else:
                last = self._ring[(self._head + from_old - 1) % self.capacity]
            self._head = (self._head + from_old) % self.capacity
            self._used -= from_old
            src += from_new
            size -= from_new
            self._overflow_dropped += excess
            self.overflows += 1
            self._gap = True
            self._gap_mid_line = last != 10 and last != 13
        if size:
            tail = (self._head + self._used) % self.capacity
            first = self.capacity - tail
            if first > size:
                first = size
            memcpy(self._ring + tail, src, first)
            memcpy(self._ring, src + first, size - first)
            self._used += size
        PyThread_release_lock(self._lock)

    def write(self, data):
        """Append `data` (all of it, always, dropping the oldest bytes); returns its length."""
        cdef const unsigned char[::1] view = data
        cdef Py_ssize_t size = view.shape[0]
        if size == 0:
            return 0
        if size >= NOGIL_COPY:
            with nogil:
                self._put(&view[0], size)
        else:
            self._put(&view[0], size)
        return size

    cdef tuple _read(self, Py_ssize_t max_bytes):
        cdef Py_ssize_t n, first
        cdef bytes out
        cdef char *dst
        cdef bint gap, mid
        PyThread_acquire_lock(self._lock, WAIT_LOCK)
        try:
            n = self._used if max_bytes < 0 or max_bytes > self._used else max_bytes
            out = PyBytes_FromStringAndSize(NULL, n)
            dst = PyBytes_AS_STRING(out)
            first = self.capacity - self._head
            if first > n:
                first = n
            memcpy(dst, self._ring + self._head, first)
            memcpy(dst + first, self._ring, n - first)
            self._head = (self._head + n) % self.capacity
            self._used -= n
            gap, mid = self._gap, self._gap_mid_line
            self._gap = False
            self._gap_mid_line = False
        finally:
            PyThread_release_lock(self._lock)
        return out, gap, mid

    def read(self, Py_ssize_t max_bytes=-1):
        """Take up to `max_bytes` (all if negative) of the oldest buffered bytes."""
        return self._read(max_bytes)[0]

    def read_lines(self):
        """The complete lines buffered so far; after a drop, cut lines are discarded, counted."""
        data, gap, mid_line = self._read(-1)
        return _frame(self, data, gap, mid_line)

    def flush(self):
        """Everything left, the unterminated last line included (at end of input)."""
        return self.read_lines() + self._splitter.flush()
