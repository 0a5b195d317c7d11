# cython: language_level=3, boundscheck=False, wraparound=False
"""Native line batcher, same API and results as `denpex._native.linebatch_ref`.

One pass over each chunk in C: split at b"\\n"/b"\\r", cap, strip ANSI escapes and quote
markers, write the cleaned lines into one buffer with their starts and line numbers. No
Python object is made per line; a line becomes bytes only when the scanner asks for it.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memchr, memcpy, memmove


cdef class Batch:
    """The lines one chunk completed: a sequence of bytes (cleaned lines) over one buffer."""

    cdef readonly bytes joined
    cdef readonly int64_t newlines  # the b"\n" bytes of the chunk (0 for a flush)
    cdef Py_ssize_t _count
    cdef int64_t* _starts  # _count + 1 entries; the last is len(joined) + 1
    cdef int64_t* _newlines

    def __cinit__(self):
        self.joined = b""
        self.newlines = 0
        self._count = 0
        self._starts = NULL
        self._newlines = NULL

    def __dealloc__(self):
        free(self._starts)
        free(self._newlines)

    def __len__(self):
        return self._count

    cdef bytes _line(self, Py_ssize_t index):
        cdef int64_t begin = self._starts[index]
        cdef int64_t end = self._starts[index + 1] - 1
        return PyBytes_FromStringAndSize(PyBytes_AS_STRING(self.joined) + begin, end - begin)

    def __getitem__(self, index):
        cdef Py_ssize_t k
        if isinstance(index, slice):
            return [self._line(k) for k in range(*index.indices(self._count))]
        k = index
        if k < 0:
            k += self._count
        if k < 0 or k >= self._count:
            raise IndexError("line index out of range")
        return self._line(k)

    def __iter__(self):
        cdef Py_ssize_t k
        for k in range(self._count):
            yield self._line(k)

    def head(self, Py_ssize_t count):
        """The first `count` lines joined by b"\\n" (without a final one)."""
        if count >= self._count:
            return self.joined
        if count <= 0:
            return b""
        return self.joined[: self._starts[count] - 1]

    def line_at(self, Py_ssize_t offset):
        """The index of the line that holds byte `offset` of `joined` (its b"\\n" ending it)."""
        cdef Py_ssize_t low = 0, high = self._count, middle
        if offset < 0 or offset > len(self.joined) or self._count == 0:
            raise IndexError("offset out of range")
        while high - low > 1:  # the last start <= offset
            middle = (low + high) // 2
            if self._starts[middle] <= offset:
                low = middle
            else:
                high = middle
        return low

    def newlines_before(self, Py_ssize_t index):
        """How many b"\\n" of the chunk come before the first byte of line `index` (0 for a
        line that began in an earlier chunk)."""
        if index < 0:
            index += self._count
        if index < 0 or index >= self._count:
            raise IndexError("line index out of range")
        return self._newlines[index]


cdef struct _Out:
    char* buf
    Py_ssize_t len
    int64_t* starts
    int64_t* newlines
    Py_ssize_t count
    Py_ssize_t room  # entries allocated in starts/newlines


cdef inline bint _in(unsigned char c, unsigned char low, unsigned char high) nogil:
    return low <= c and c <= high


cdef Py_ssize_t _strip_ansi(const unsigned char* s, Py_ssize_t n, char* out) nogil:
    """Copy s to out without the escapes the reference's ANSI pattern removes; the length."""
    cdef Py_ssize_t j = 0, k, m, o = 0
    cdef unsigned char c
    while j < n:
        c = s[j]
        if c != 0x1b:
            out[o] = <char>c
            o += 1
            j += 1
            continue
        k = j + 1
        if k < n and s[k] == 0x5b:  # CSI: ESC [ params* intermediates* final
            m = k + 1
            while m < n and _in(s[m], 0x30, 0x3f):
                m += 1
            while m < n and _in(s[m], 0x20, 0x2f):
                m += 1
            if m < n and _in(s[m], 0x40, 0x7e):
                j = m + 1
                continue
        elif k < n and s[k] == 0x5d:  # OSC: ESC ] text (BEL | ESC \), else ESC ] alone
            m = k + 1
            while m < n and s[m] != 0x07 and s[m] != 0x1b:
                m += 1
            if m < n and s[m] == 0x07:
                j = m + 1
            elif m + 1 < n and s[m] == 0x1b and s[m + 1] == 0x5c:
                j = m + 2
            else:
                j = k + 1
            continue
        elif k < n and (_in(s[k], 0x40, 0x5a) or _in(s[k], 0x5c, 0x5f)):
            j = k + 1
            continue
        out[o] = <char>c  # an ESC that starts no sequence stays
        o += 1
        j += 1
    return o


cdef int _emit(_Out* out, const char* src, Py_ssize_t n, int64_t newlines) nogil:
    """Append one line, cleaned; -1 when memory ran out."""
    cdef Py_ssize_t begin, p, reps
    cdef int64_t* grown
    if out.count + 1 >= out.room:
        out.room = out.room * 2 + 64
        grown = <int64_t*>realloc(out.starts, sizeof(int64_t) * out.room)
        if grown == NULL:
            return -1
        out.starts = grown
        grown = <int64_t*>realloc(out.newlines, sizeof(int64_t) * out.room)
        if grown == NULL:
            return -1
        out.newlines = grown
    if out.count:
        out.buf[out.len] = b"\n"
        out.len += 1
    begin = out.len
    if memchr(src, 0x1b, n) == NULL:
        memcpy(out.buf + begin, src, n)
        out.len += n
    else:
        out.len += _strip_ansi(<const unsigned char*>src, n, out.buf + begin)
    p, reps = begin, 0
    while reps < 8 and p < out.len and out.buf[p] == b">":
        if p + 1 == out.len:
            p += 1
        elif out.buf[p + 1] == b" ":
            p += 2
        else:
            break
        reps += 1
    if p > begin:
        memmove(out.buf + begin, out.buf + p, out.len - p)
        out.len -= p - begin
    out.starts[out.count] = begin
    out.newlines[out.count] = newlines
    out.count += 1
    return 0


cdef inline Py_ssize_t _find(const char* base, int byte, Py_ssize_t start, Py_ssize_t n) nogil:
    """Index of the first `byte` in base[start:n], or n."""
    cdef const char* hit
    if start >= n:
        return n
    hit = <const char*>memchr(base + start, byte, n - start)
    return n if hit == NULL else hit - base


cdef Batch _batch(_Out* out, int64_t newlines):
    cdef Batch batch = Batch.__new__(Batch)
    batch.joined = PyBytes_FromStringAndSize(out.buf, out.len)
    batch.newlines = newlines
    if out.starts == NULL:
        out.starts = <int64_t*>malloc(sizeof(int64_t))
        if out.starts == NULL:
            raise MemoryError()
    out.starts[out.count] = out.len + 1
    batch._count = out.count
    batch._starts = out.starts
    batch._newlines = out.newlines
    out.starts = NULL
    out.newlines = NULL
    return batch


cdef class LineBatcher:
    """Per stream: the partial line between chunks, and the bytes cut off long lines."""

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
        """The lines completed by `data`."""
        cdef Py_ssize_t n = data.shape[0]
        cdef Py_ssize_t i = 0, start = 0, length, nl, cr
        cdef int64_t seen = 0
        cdef const char* base = <const char*>&data[0] if n else NULL
        cdef int failed = 0
        cdef _Out out
        out.buf = <char*>malloc(n + self._len + 1)
        out.len = out.count = out.room = 0
        out.starts = out.newlines = NULL
        if out.buf == NULL:
            raise MemoryError()
        try:
            # the next b"\n" and the next b"\r", each found with memchr (a log without
            # carriage returns pays for one memchr over the whole chunk)
            nl = _find(base, 10, 0, n)
            cr = _find(base, 13, 0, n)
            while not failed:
                i = nl if nl < cr else cr
                if i >= n:
                    break
                length = i - start
                if self._len == 0:
                    if length > self.cap:
                        self.truncated_bytes += length - self.cap
                        length = self.cap
                    if length > 0:
                        failed = _emit(&out, base + start, length, seen)
                else:
                    self._take(base + start, length)
                    failed = _emit(&out, self._pending, self._len, 0)
                    self._len = 0
                start = i + 1
                if i == nl:
                    seen += 1
                    nl = _find(base, 10, start, n)
                else:
                    cr = _find(base, 13, start, n)
            if failed:
                raise MemoryError()
            if start < n:
                self._take(base + start, n - start)
            return _batch(&out, seen)
        finally:
            free(out.buf)
            free(out.starts)
            free(out.newlines)

    def flush(self):
        """The unterminated last line, if any (at end of input)."""
        cdef _Out out
        out.buf = <char*>malloc(self._len + 1)
        out.len = out.count = out.room = 0
        out.starts = out.newlines = NULL
        if out.buf == NULL:
            raise MemoryError()
        try:
            if self._len and _emit(&out, self._pending, self._len, 0) < 0:
                raise MemoryError()
            self._len = 0
            return _batch(&out, 0)
        finally:
            free(out.buf)
            free(out.starts)
            free(out.newlines)

    def reset(self):
        """Forget the partial line (input was lost before the next chunk); counted."""
        self.discarded_bytes += self._len
        self._len = 0
