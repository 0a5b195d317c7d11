# cython: language_level=3
"""Native line splitter, same API and results as `denpex._native.linesplit_ref`.

One pass over each chunk in C, copying only the bytes of lines that span chunks.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.string cimport memcpy
from libc.stdlib cimport malloc, free


cdef class LineSplitter:
    cdef public Py_ssize_t cap
    cdef public long long truncated_bytes
    cdef public long long discarded_bytes
    cdef char* _pending
    cdef Py_ssize_t _len

    def __cinit__(self, Py_ssize_t cap=65536):
        if cap < 1:
            raise ValueError("cap must be at least 1 byte")
        self.cap = cap
        self._pending = <char*>malloc(cap)
        if self._pending == NULL:
            raise MemoryError()
        self._len = 0
        self.truncated_bytes = 0
        self.discarded_bytes = 0

    def __dealloc__(self):
        free(self._pending)

    cdef inline void _take(self, const char* src, Py_ssize_t n):
        cdef Py_ssize_t room = self.cap - self._len
        if n > room:
            self.truncated_bytes += n - room
            n = room
        if n > 0:
            memcpy(self._pending + self._len, src, n)
            self._len += n

    def feed(self, const unsigned char[:] data):
        cdef list lines = []
        cdef Py_ssize_t n = data.shape[0]
        cdef Py_ssize_t i = 0, start = 0
        cdef const char* base
        cdef unsigned char c
        if n == 0:
            return lines
        base = <const char*>&data[0]
        while i < n:
            c = data[i]
            if c == 10 or c == 13:
                if self._len == 0 and i - start <= self.cap:
                    if i > start:
                        lines.append(PyBytes_FromStringAndSize(base + start, i - start))
                else:
                    self._take(base + start, i - start)
                    if self._len:
                        lines.append(PyBytes_FromStringAndSize(self._pending, self._len))
                        self._len = 0
                start = i + 1
            i += 1
        if start < n:
            self._take(base + start, n - start)
        return lines

    def flush(self):
        if self._len == 0:
            return []
        line = PyBytes_FromStringAndSize(self._pending, self._len)
        self._len = 0
        return [line]

    def reset(self):
        self.discarded_bytes += self._len
        self._len = 0
