# cython: language_level=3
"""XXH3-64/128 of one or many buffers, GIL released, same results as `checksum_ref`/`xxhash`.

xxHash is vendored (`vendor/xxhash`, BSD-2) because no binding works well enough: the `xxhash`
package has no C API, and Debian's libxxhash is SSE2-only (0.53x the package on large buffers);
the vendored dispatch picks SSE2/AVX2/AVX-512 at run time. It never hashes a buffer it could not
pin: `bytes` are immutable and held by the call, anything else is pinned through the buffer
protocol (C-contiguous) until the hashing is done.

The `*_many` calls gather every pointer and length with the GIL held, then hash them all with the
GIL released, split across threads when there are enough bytes to pay for them (`threads`).
`packed=True` returns the digests as an `array('Q')` instead of one Python int per buffer.
"""

import mmap
import os
from array import array

from cpython.array cimport array as carray, clone
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_Check, PyBytes_GET_SIZE
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_FromUnsignedLongLong
from cpython.ref cimport Py_INCREF
from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc

cdef extern from *:
    """
    #include "vendor/xxhash/xxh_x86dispatch.inc"
    #if defined(_WIN32)
    #  define DX_THREADS 0
    #else
    #  define DX_THREADS 1
    #  include <pthread.h>
    #  include <unistd.h>
    #  if defined(__linux__)
    #    include <sched.h>
    #  endif
    #endif
    #define DX_MAX_THREADS 16
    /* bytes one extra thread must get before it is worth starting (start + join ~ tens of us) */
    #define DX_BYTES_PER_THREAD (1 << 20)
    /* weight of one buffer beyond its bytes, so that many tiny buffers are split evenly too */
    #define DX_ITEM_WEIGHT 64

    typedef struct { unsigned long long low64, high64; } dx_xxh128;
    static inline unsigned long long dx_xxh3_64(const void *p, size_t n, unsigned long long s) {
        return (unsigned long long)XXH3_64bits_withSeed_dispatch(p, n, (XXH64_hash_t)s);
    }
    static inline dx_xxh128 dx_xxh3_128(const void *p, size_t n, unsigned long long s) {
        XXH128_hash_t h = XXH3_128bits_withSeed_dispatch(p, n, (XXH64_hash_t)s);
        dx_xxh128 r = {h.low64, h.high64};
        return r;
    }

    /* 128-bit digest as a Python int, without building it from two ints and a shift */
    static PyObject *dx_u128(unsigned long long high, unsigned long long low) {
    #if PY_LITTLE_ENDIAN
        unsigned long long w[2] = {low, high};
        return _PyLong_FromByteArray((const unsigned char *)w, 16, 1, 0);
    #else
        unsigned long long w[2] = {high, low};
        return _PyLong_FromByteArray((const unsigned char *)w, 16, 0, 0);
    #endif
    }

    typedef struct {
        const char *const *ptrs;
        const size_t *lens;
        size_t lo, hi;
        unsigned long long seed;
        int wide;
        unsigned long long *out;  /* one word per buffer, or two (high, low) when wide */
    } dx_job;

    static void dx_run(const dx_job *j) {
        size_t k;
        if (j->wide) {
            for (k = j->lo; k < j->hi; k++) {
                XXH128_hash_t h = XXH3_128bits_withSeed_dispatch(j->ptrs[k], j->lens[k], j->seed);
                j->out[2 * k] = h.high64;
                j->out[2 * k + 1] = h.low64;
            }
        } else {
            for (k = j->lo; k < j->hi; k++)
                j->out[k] = XXH3_64bits_withSeed_dispatch(j->ptrs[k], j->lens[k], j->seed);
        }
    }

    static int dx_cpu_count(void) {
    #if DX_THREADS && defined(__linux__)
        cpu_set_t set;
        if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
    #endif
    #if DX_THREADS && defined(_SC_NPROCESSORS_ONLN)
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        if (n > 0) return (int)n;
    #endif
        return 1;
    }

    #if DX_THREADS
    static void *dx_thread_main(void *arg) { dx_run((const dx_job *)arg); return NULL; }
    #endif

    /* Hashes every buffer; called without the GIL. `threads` >= 1 is the most threads to use,
       the calling one included; fewer run when the bytes would not pay for them. */
    static void dx_hash_many(const char *const *ptrs, const size_t *lens, size_t n,
                             unsigned long long seed, int wide, unsigned long long *out,
                             int threads) {
        dx_job jobs[DX_MAX_THREADS];
        size_t k, total = 0, t, want, lo, acc;
        for (k = 0; k < n; k++) total += lens[k] + DX_ITEM_WEIGHT;
        if (threads > DX_MAX_THREADS) threads = DX_MAX_THREADS;
        if ((size_t)threads > total / DX_BYTES_PER_THREAD) threads = (int)(total / DX_BYTES_PER_THREAD);
        if ((size_t)threads > n) threads = (int)n;
        if (threads < 1) threads = 1;
        for (t = 0; t < (size_t)threads; t++) {
            jobs[t].ptrs = ptrs; jobs[t].lens = lens; jobs[t].seed = seed;
            jobs[t].wide = wide; jobs[t].out = out;
        }
        /* contiguous slices of about equal weight */
        lo = 0; acc = 0; k = 0;
        for (t = 0; t < (size_t)threads; t++) {
            want = (t + 1 == (size_t)threads) ? total : total / threads * (t + 1);
            while (k < n && acc < want) { acc += lens[k] + DX_ITEM_WEIGHT; k++; }
            if (t + 1 == (size_t)threads) k = n;
            jobs[t].lo = lo; jobs[t].hi = k; lo = k;
        }
    #if DX_THREADS
        if (threads > 1) {
            pthread_t tid[DX_MAX_THREADS];
            int started[DX_MAX_THREADS];
            for (t = 1; t < (size_t)threads; t++)
                started[t] = pthread_create(&tid[t], NULL, dx_thread_main, &jobs[t]) == 0;
            dx_run(&jobs[0]);
            for (t = 1; t < (size_t)threads; t++) {
                if (started[t]) pthread_join(tid[t], NULL);
                else dx_run(&jobs[t]);  /* no thread: do its share here */
            }
            return;
        }
    #endif
        dx_run(&jobs[0]);
    }
    """
    ctypedef struct dx_xxh128:
        unsigned long long low64
        unsigned long long high64
    unsigned long long dx_xxh3_64(const void *p, size_t n, unsigned long long s) nogil
    dx_xxh128 dx_xxh3_128(const void *p, size_t n, unsigned long long s) nogil
    object dx_u128(unsigned long long high, unsigned long long low)
    int dx_cpu_count() nogil
    void dx_hash_many(const char *const *ptrs, const size_t *lens, size_t n,
                      unsigned long long seed, int wide, unsigned long long *out,
                      int threads) nogil


# Resolve the dispatch tables now, in one thread, before any worker thread can race to do it.
dx_xxh3_64(NULL, 0, 0)
dx_xxh3_128(NULL, 0, 0)

cdef int _CPUS = max(1, dx_cpu_count())
cdef carray _WORDS = array("Q")


cdef int _threads(object threads) except -1:
    if threads is None:
        return _CPUS
    cdef Py_ssize_t n = threads
    if n < 1:
        raise ValueError(f"threads must be >= 1 or None, not {n}")
    return <int>min(n, 1 << 16)


cdef object _many(object buffers, uint64_t seed, bint wide, bint packed, object threads):
    cdef int nthreads = _threads(threads)
    cdef list items = list(buffers)  # holds every buffer alive until the hashing is done
    cdef Py_ssize_t k, count = len(items), pinned = 0, words = (2 if wide else 1) * count
    cdef object item, value
    cdef const char **ptrs = <const char **>malloc(sizeof(char *) * (count + 1))
    cdef size_t *lens = <size_t *>malloc(sizeof(size_t) * (count + 1))
    cdef Py_buffer *views = <Py_buffer *>malloc(sizeof(Py_buffer) * (count + 1))
    cdef carray result = clone(_WORDS, words, False)
    cdef unsigned long long *out = result.data.as_ulonglongs
    cdef list ints
    if ptrs == NULL or lens == NULL or views == NULL:
        free(ptrs)
        free(lens)
        free(views)
        raise MemoryError()
    try:
        for k in range(count):
            item = items[k]
            if PyBytes_Check(item):  # immutable and held by `items`: no pin needed
                ptrs[k] = PyBytes_AS_STRING(item)
                lens[k] = <size_t>PyBytes_GET_SIZE(item)
            else:
                PyObject_GetBuffer(item, &views[pinned], PyBUF_SIMPLE)
                ptrs[k] = <const char *>views[pinned].buf
                lens[k] = <size_t>views[pinned].len
                pinned += 1
        with nogil:
            dx_hash_many(ptrs, lens, <size_t>count, seed, wide, out, nthreads)
    finally:
        for k in range(pinned):
            PyBuffer_Release(&views[k])
        free(ptrs)
        free(lens)
        free(views)
    if packed:
        return result
    ints = PyList_New(count)
    for k in range(count):
        if wide:
            value = dx_u128(out[2 * k], out[2 * k + 1])
        else:
            value = PyLong_FromUnsignedLongLong(out[k])
        Py_INCREF(value)  # PyList_SET_ITEM steals a reference
        PyList_SET_ITEM(ints, k, value)
    return ints


cdef object _one(object data, uint64_t seed, bint wide):
    cdef Py_buffer view
    cdef dx_xxh128 h
    cdef unsigned long long low
    cdef const char *p
    cdef size_t n
    if PyBytes_Check(data):  # immutable and held by the caller: no pin needed
        p = PyBytes_AS_STRING(data)
        n = <size_t>PyBytes_GET_SIZE(data)
        if n < 65536:  # releasing the GIL costs more than hashing this
            if wide:
                h = dx_xxh3_128(p, n, seed)
                return dx_u128(h.high64, h.low64)
            return dx_xxh3_64(p, n, seed)
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if wide:
            with nogil:
                h = dx_xxh3_128(view.buf, <size_t>view.len, seed)
            return dx_u128(h.high64, h.low64)
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


def xxh3_64_many(buffers, unsigned long long seed=0, *, bint packed=False, threads=None):
    """XXH3-64 of every buffer, in one call with the GIL released.

    A list of ints, or with `packed=True` an `array('Q')` holding one digest per buffer. `threads`
    caps the threads that hash (None: the CPUs this process may use; 1: the calling one only).
    """
    return _many(buffers, seed, False, packed, threads)


def xxh3_128_many(buffers, unsigned long long seed=0, *, bint packed=False, threads=None):
    """XXH3-128 of every buffer, in one call with the GIL released.

    A list of ints (high 64 bits first), or with `packed=True` an `array('Q')` holding two words
    per buffer, high 64 bits then low 64 bits. `threads` as for `xxh3_64_many`.
    """
    return _many(buffers, seed, True, packed, threads)


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
