# cython: language_level=3
"""XXH3-64/128 of one or many buffers, GIL released, same results as `checksum_ref`/`xxhash`.

xxHash is vendored (`vendor/xxhash`, BSD-2) because no binding works well enough: the `xxhash`
package has no C API, and Debian's libxxhash is SSE2-only (0.53x the package on large buffers);
the vendored dispatch picks SSE2/AVX2/AVX-512 at run time. It never hashes a buffer it could not
pin (buffer protocol, C-contiguous).
"""

import mmap
import os

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc

cdef extern from *:
    """
    #include "vendor/xxhash/xxh_x86dispatch.inc"
    typedef struct { unsigned long long low64, high64; } dx_xxh128;
    static inline unsigned long long dx_xxh3_64(const void *p, size_t n, unsigned long long s) {
        return (unsigned long long)XXH3_64bits_withSeed_dispatch(p, n, (XXH64_hash_t)s);
    }
    static inline dx_xxh128 dx_xxh3_128(const void *p, size_t n, unsigned long long s) {
        XXH128_hash_t h = XXH3_128bits_withSeed_dispatch(p, n, (XXH64_hash_t)s);
        dx_xxh128 r = {h.low64, h.high64};
        return r;
    }
    """
    ctypedef struct dx_xxh128:
        unsigned long long low64
        unsigned long long high64
    unsigned long long dx_xxh3_64(const void *p, size_t n, unsigned long long s) nogil
    dx_xxh128 dx_xxh3_128(const void *p, size_t n, unsigned long long s) nogil


cdef object _many(object buffers, uint64_t seed, bint wide):
    cdef list items = list(buffers)
    cdef Py_ssize_t k, count = len(items), pinned = 0
    cdef Py_buffer *views = <Py_buffer *>malloc(sizeof(Py_buffer) * (count + 1))
    cdef unsigned long long *out = <unsigned long long *>malloc(
        sizeof(unsigned long long) * 2 * (count + 1)
    )
    cdef dx_xxh128 h
    if views == NULL or out == NULL:
        free(views)
        free(out)
        raise MemoryError()
    try:
        for k in range(count):
            PyObject_GetBuffer(items[k], &views[k], PyBUF_SIMPLE)
            pinned += 1
        if wide:
            with nogil:
                for k in range(count):
                    h = dx_xxh3_128(views[k].buf, <size_t>views[k].len, seed)
                    out[2 * k] = h.low64
                    out[2 * k + 1] = h.high64
        else:
            with nogil:
                for k in range(count):
                    out[2 * k] = dx_xxh3_64(views[k].buf, <size_t>views[k].len, seed)
        if wide:
            return [(<object>out[2 * k + 1] << 64) | out[2 * k] for k in range(count)]
        return [out[2 * k] for k in range(count)]
    finally:
        for k in range(pinned):
            PyBuffer_Release(&views[k])
        free(views)
        free(out)


cdef object _one(object data, uint64_t seed, bint wide):
    cdef Py_buffer view
    cdef dx_xxh128 h
    cdef unsigned long long low
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if wide:
            with nogil:
                h = dx_xxh3_128(view.buf, <size_t>view.len, seed)
            return (<object>h.high64 << 64) | h.low64
        if view.len < 65536:  # releasing the GIL costs more than hashing this
            low = dx_xxh3_64(view.buf, <size_t>view.len, seed)
        else:
            with nogil:
                low = dx_xxh3_64(view.buf, <size_t>view.len, seed)
        return low
    finally:
        PyBuffer_Release(&view)


def xxh3_64(data, unsigned long long seed=0):
    """XXH3-64 of one buffer (`xxhash.xxh3_64_intdigest`)."""
    return _one(data, seed, False)


def xxh3_128(data, unsigned long long seed=0):
    """XXH3-128 of one buffer as an int, high 64 bits first (`xxhash.xxh3_128_intdigest`)."""
    return _one(data, seed, True)


def xxh3_64_many(buffers, unsigned long long seed=0):
    """XXH3-64 of every buffer, in one call with the GIL released."""
    return _many(buffers, seed, False)


def xxh3_128_many(buffers, unsigned long long seed=0):
    """XXH3-128 of every buffer, in one call with the GIL released."""
    return _many(buffers, seed, True)


def _file(path, unsigned long long seed, bint wide):
    with open(os.fspath(path), "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return _one(b"", seed, wide)
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                return _one(view, seed, wide)
            finally:
                view.release()


def xxh3_64_file(path, unsigned long long seed=0):
    """XXH3-64 of a file's contents, mapped (the page cache streams it), GIL released."""
    return _file(path, seed, False)


def xxh3_128_file(path, unsigned long long seed=0):
    """XXH3-128 of a file's contents, mapped (the page cache streams it), GIL released."""
    return _file(path, seed, True)
